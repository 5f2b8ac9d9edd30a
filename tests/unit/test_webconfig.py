"""The exporter-toolkit web config format: a node_exporter-style file loads and does what it
says where Python's ssl can; unknown keys are errors with their path; basic auth does not
tell by timing which usernames exist."""

from __future__ import annotations

import base64
import http.client
import logging
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from lagwatch.config import web as webconfig
from lagwatch.config.web import WebConfig, load_web_config, ssl_context
from lagwatch.errors import ConfigError
from lagwatch.serve import webauth
from lagwatch.serve.webauth import BasicAuth


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True)
class Pki:
    folder: Path
    ca: Path
    server_cert: Path
    server_key: Path
    # client certificates signed by the CA: (cert, key)
    prometheus: tuple[Path, Path]  # SAN DNS:prometheus.example.com
    intruder: tuple[Path, Path]  # SAN DNS:intruder.example.com


def _client(folder: Path, name: str, san: str) -> tuple[Path, Path]:
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=folder)
    return folder / f"{name}.crt", folder / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign", "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", "tls.key", "-out", "tls.crt",
            cwd=folder)
    return Pki(folder, folder / "ca.crt", folder / "tls.crt", folder / "tls.key",
               _client(folder, "prometheus", "DNS:prometheus.example.com,IP:10.0.0.5"),
               _client(folder, "intruder", "DNS:intruder.example.com"))


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    webconfig.forget_warnings()
    yield
    webconfig.forget_warnings()


def hashed(password: str, rounds: int = 4) -> str:
    # $2y$ as htpasswd and the exporter-toolkit docs write it.
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds)).decode().replace("$2b$", "$2y$", 1)


def node_exporter_style(pki: Pki) -> str:
    """A web config as one would write it for node_exporter, paths relative to the file."""
    return f"""\
tls_server_config:
  cert_file: tls.crt
  key_file: tls.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans:
    - prometheus.example.com
  min_version: TLS12
  max_version: TLS13
  cipher_suites:
    - TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    - TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
    - TLS_AES_128_GCM_SHA256
  curve_preferences: [X25519]
  prefer_server_cipher_suites: true
http_server_config:
  http2: false
  headers:
    Strict-Transport-Security: max-age=31536000; includeSubDomains
    X-Content-Type-Options: nosniff
    X-Frame-Options: deny
    X-XSS-Protection: "1; mode=block"
    Content-Security-Policy: default-src 'self'
basic_auth_users:
  prometheus: {hashed("s3cret")}
"""


def write_web(pki: Pki, text: str, name: str = "web.yml") -> Path:
    path = pki.folder / name
    path.write_text(text)
    return path


def problems(pki: Pki, data: dict[str, Any]) -> list[str]:
    path = write_web(pki, yaml.safe_dump(data), "bad.yml")
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    return caught.value.problems


def base_tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **extra}


def test_node_exporter_style_file_loads(pki: Pki) -> None:
    config = load_web_config(write_web(pki, node_exporter_style(pki)))
    tls = config.tls_server_config
    assert tls is not None and tls.client_auth_type == "RequireAndVerifyClientCert"
    assert tls.cert_file == pki.server_cert and tls.client_ca_file == pki.ca  # relative to the file
    assert config.http_server_config is not None and config.http_server_config.http2 is False
    assert config.http_server_config.headers["X-Frame-Options"] == "deny"

    context = ssl_context(config)
    assert context is not None
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    # Go's names became OpenSSL's; TLS 1.3 keeps its fixed suites (as in Go).
    tls12 = {c["name"] for c in context.get_ciphers() if c["protocol"] != "TLSv1.3"}
    assert tls12 == {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384"}


@pytest.mark.parametrize("mode,verify", [
    ("NoClientCert", ssl.CERT_NONE),
    ("RequestClientCert", ssl.CERT_NONE),
    ("RequireAnyClientCert", ssl.CERT_REQUIRED),
    ("RequireClientCert", ssl.CERT_REQUIRED),
    ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
    ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
])
def test_client_auth_types(pki: Pki, mode: str, verify: ssl.VerifyMode, caplog: pytest.LogCaptureFixture) -> None:
    ca = {} if mode == "NoClientCert" else {"client_ca_file": str(pki.ca)}
    path = write_web(pki, yaml.safe_dump({"tls_server_config": base_tls(pki, client_auth_type=mode, **ca)}))
    with caplog.at_level(logging.INFO, logger="lagwatch.config.web"):
        context = ssl_context(load_web_config(path))
    assert context is not None and context.verify_mode == verify
    if mode in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert"):
        # What Python's ssl cannot do exactly is said, with why.
        assert f"client_auth_type {mode}" in caplog.text and "Python's ssl" in caplog.text


@pytest.mark.parametrize("low,high,expected", [("TLS10", "TLS11", (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1)),
                                               ("TLS13", "TLS13", (ssl.TLSVersion.TLSv1_3,) * 2),
                                               ("TLS11", "TLS12", (ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_2))])
def test_tls_versions(pki: Pki, low: str, high: str, expected: tuple[ssl.TLSVersion, ssl.TLSVersion]) -> None:
    config = WebConfig.model_validate({"tls_server_config": base_tls(pki, min_version=low, max_version=high)})
    context = ssl_context(config)
    assert context is not None and (context.minimum_version, context.maximum_version) == expected


def test_only_tls13_suites_means_tls13_only(pki: Pki) -> None:
    config = WebConfig.model_validate({"tls_server_config": base_tls(pki, cipher_suites=["TLS_AES_256_GCM_SHA384"])})
    context = ssl_context(config)
    assert context is not None and context.minimum_version == ssl.TLSVersion.TLSv1_3


def test_prefer_client_ciphers(pki: Pki) -> None:
    config = WebConfig.model_validate({"tls_server_config": base_tls(pki, prefer_server_cipher_suites=False)})
    context = ssl_context(config)
    assert context is not None and not context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_what_cannot_be_done_is_said_once(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    path = write_web(pki, yaml.safe_dump({
        "tls_server_config": base_tls(pki, curve_preferences=["X25519", "CurveP256", "CurveP384", "CurveP521"]),
        "http_server_config": {"http2": True}}))
    with caplog.at_level(logging.INFO, logger="lagwatch.config.web"):
        for _ in range(3):  # loaded, then the server builds its context again
            ssl_context(load_web_config(path))
    curves = [r for r in caplog.records if "curve_preferences" in r.getMessage()]
    assert len(curves) == 1 and "ignored" in curves[0].getMessage() and curves[0].levelno == logging.WARNING
    assert len([r for r in caplog.records if "http2 is ignored" in r.getMessage()]) == 1


def test_unknown_and_invalid_keys_are_errors_with_their_path(pki: Pki) -> None:
    got = problems(pki, {"tls_server_config": base_tls(pki, client_auth_typ="NoClientCert"),
                         "basic_auth_user": {}, "http_server_config": {"http3": True}})
    assert "tls_server_config.client_auth_typ: unknown key" in got
    assert "basic_auth_user: unknown key" in got
    assert "http_server_config.http3: unknown key" in got

    got = problems(pki, {"tls_server_config": base_tls(pki, cert="PEM", min_version="TLS14",
                                                       client_auth_type="Whatever",
                                                       cipher_suites=["TLS_RSA_WITH_NULL_SHA"],
                                                       curve_preferences=["CurveP224"]),
                         "rate_limit": {"burst": 10}})
    text = "\n".join(got)
    assert "tls_server_config.cert: inline certificates are not supported" in text
    assert "rate_limit: not supported by lagwatch" in text
    assert "tls_server_config.min_version:" in text and "TLS13" in text
    assert "tls_server_config.client_auth_type:" in text and "RequireAnyClientCert" in text
    assert "tls_server_config.cipher_suites: unknown cipher suite(s) TLS_RSA_WITH_NULL_SHA" in text
    assert "tls_server_config.curve_preferences: unknown curve(s) CurveP224" in text

    got = problems(pki, {"http_server_config": {"headers": {"X-Powered-By": "lagwatch"}}})
    assert got[0].startswith("http_server_config.headers:") and "'X-Powered-By' can not be configured" in got[0]
    got = problems(pki, {"http_server_config": {"headers": {"X-Frame-Options": "allow-from x"}}})
    assert "invalid value for X-Frame-Options" in got[0]


@pytest.mark.parametrize("tls,needle", [
    ({"min_version": "TLS13", "max_version": "TLS12"}, "min_version TLS13 is above max_version TLS12"),
    ({"client_ca_file": "ca.crt"}, "client_ca_file is set but client_auth_type is NoClientCert"),
    ({"client_auth_type": "VerifyClientCertIfGiven", "client_allowed_sans": ["x"]}, "client_allowed_sans needs"),
])
def test_inconsistent_tls_settings(pki: Pki, tls: dict[str, Any], needle: str) -> None:
    got = problems(pki, {"tls_server_config": base_tls(pki, **tls)})
    assert any(p.startswith("tls_server_config:") and needle in p for p in got), got


def test_plain_password_and_broken_hash_are_rejected(pki: Pki) -> None:
    got = problems(pki, {"basic_auth_users": {"a": "plaintext-Secret-7", "b": "$2y$10$tooshort"}})
    assert any("basic_auth_users" in p and "bcrypt" in p for p in got), got
    assert not any("Secret-7" in p or "tooshort" in p for p in got), got  # a password is never repeated


# -- basic auth -----------------------------------------------------------------------------


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_answers() -> None:
    auth = BasicAuth({"prometheus": hashed("s3cret")})
    assert auth.allows(header("prometheus", "s3cret"))
    assert auth.allows(header("prometheus", "s3cret"))  # from the cache
    assert not auth.allows(header("prometheus", "wrong"))
    assert not auth.allows(header("nobody", "s3cret"))
    assert not auth.allows(None) and not auth.allows("Bearer x") and not auth.allows("Basic !!!")
    assert BasicAuth({}).allows(None)


def test_unknown_user_costs_a_bcrypt_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown user is not told apart by the time its refusal takes: it costs one bcrypt
    check at the cost of the real hashes, as a wrong password does (the work counted, not
    timed: a timing test needs an idle host)."""
    auth = BasicAuth({"prometheus": hashed("s3cret", rounds=5)})
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def spy(password: bytes, hashed_password: bytes) -> bool:
        checked.append(hashed_password)
        return real(password, hashed_password)

    monkeypatch.setattr(webauth.bcrypt, "checkpw", spy)
    assert not auth.allows(header("nobody", "s3cret"))
    assert len(checked) == 1
    # A decoy of the same cost as the real hashes: the same work.
    assert checked[0].startswith(b"$2b$05$") and checked[0] != auth.users["prometheus"]
    assert not auth.allows(header("prometheus", "wrong"))
    assert checked[1] == auth.users["prometheus"]


def test_long_password_does_not_crash() -> None:
    auth = BasicAuth({"prometheus": hashed("x" * 72)})
    # bcrypt uses 72 bytes (as Go and htpasswd do); bcrypt 5 would raise on more.
    assert auth.allows(header("prometheus", "x" * 100))
    assert not auth.allows(header("nobody", "x" * 100))


# -- a real server: headers on every response, client_allowed_sans ----------------------------


@pytest.fixture
def server(pki: Pki) -> Iterator[int]:
    from lagwatch.config import parse_config
    from lagwatch.estimate.snapshot import SnapshotHolder
    from lagwatch.serve.web import WebServer

    config = parse_config({"clusters": [{"name": "m", "primary": {"dsn": "host=a"}}]},
                          web=load_web_config(write_web(pki, node_exporter_style(pki))))
    web = WebServer("127.0.0.1", 0, SnapshotHolder(), lambda: config)
    web.start()
    try:
        yield web.port
    finally:
        web.stop()


def request(pki: Pki, port: int, client: tuple[Path, Path] | None, path: str = "/healthz",
            auth: str | None = None) -> http.client.HTTPResponse:
    context = ssl.create_default_context(cafile=str(pki.server_cert))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    conn.request("GET", path, headers={"Authorization": auth} if auth else {})
    response = conn.getresponse()
    response.read()
    return response


def test_allowed_client_gets_answers_with_the_configured_headers(pki: Pki, server: int) -> None:
    response = request(pki, server, pki.prometheus, auth=header("prometheus", "s3cret"))
    assert response.status == 200
    assert response.getheader("X-Frame-Options") == "deny"
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    assert response.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains"
    assert response.getheader("Content-Security-Policy") == "default-src 'self'"
    for path in ("/", "/readyz", "/nope"):
        assert request(pki, server, pki.prometheus, path, header("prometheus", "s3cret")).getheader(
            "X-Frame-Options") == "deny", path
    # A refused login gets them too, with the basic-auth challenge.
    refused = request(pki, server, pki.prometheus, auth=header("prometheus", "wrong"))
    assert refused.status == 401 and refused.getheader("WWW-Authenticate") == 'Basic realm="lagwatch"'
    assert refused.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains"


def test_client_without_an_allowed_san_is_refused(pki: Pki, server: int) -> None:
    # Signed by the trusted CA, but its SAN is not in client_allowed_sans.
    with pytest.raises((http.client.HTTPException, ConnectionError, ssl.SSLError)):
        request(pki, server, pki.intruder, auth=header("prometheus", "s3cret"))
    # No certificate at all: the TLS handshake itself fails.
    with pytest.raises((http.client.HTTPException, ConnectionError, ssl.SSLError)):
        request(pki, server, None, auth=header("prometheus", "s3cret"))
    assert request(pki, server, pki.prometheus, auth=header("prometheus", "s3cret")).status == 200


def test_unknown_users_cost_what_some_real_user_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With users of different costs, an unknown name is checked at the cost of one real
    user (the same one each time), so a fast answer does not single out the cheap user."""
    auth = BasicAuth({"cheap": hashed("a", rounds=4), "dear": hashed("b", rounds=6)})
    costs: list[bytes] = []
    real = bcrypt.checkpw

    def spy(password: bytes, hashed_password: bytes) -> bool:
        costs.append(hashed_password[4:6])
        return real(password, hashed_password)

    monkeypatch.setattr(webauth.bcrypt, "checkpw", spy)
    for i in range(40):
        assert not auth.allows(header(f"nobody{i}", "x"))
    assert set(costs) == {b"04", b"06"}, costs  # both costs are used for unknown names
    first = costs[:]
    costs.clear()
    for i in range(40):
        auth.allows(header(f"nobody{i}", "y"))
    assert costs == first  # and each name always gets the same one


def test_no_bcrypt_work_before_the_first_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """A high cost must not spin the CPU before the server listens: decoys are made on use."""
    cost16 = hashed("a", rounds=4).replace("$04$", "$16$", 1)  # never checked: its cost is what counts
    made: list[int] = []
    gensalt = bcrypt.gensalt
    monkeypatch.setattr(webauth.bcrypt, "gensalt", lambda rounds=12: made.append(rounds) or gensalt(4))
    auth = BasicAuth({"p": cost16})
    assert made == []
    assert not auth.allows(header("nobody", "x"))
    assert made == [16]
