"""TLS and basic auth for the HTTP endpoints, configured with the web config file format
Prometheus exporters use (exporter-toolkit), so operators can reuse theirs (node_exporter's):

    tls_server_config:
      cert_file: /etc/lagwatch/tls.crt
      key_file: /etc/lagwatch/tls.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt (htpasswd -nBC 10 "" | tr -d ':\\n')

Every exporter-toolkit key below is accepted. What Python's ssl module can do is done
(TLS versions, client certificate modes, cipher suites mapped from Go's names to
OpenSSL's, server cipher preference, client_allowed_sans, response headers); what it
cannot is said once in the log, with why. Keys exporter-toolkit does not know are errors.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import ssl
import threading
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from lagwatch.errors import ConfigError, validation_problems
from lagwatch.escape import excerpt
from lagwatch.yamlfile import load_yaml

log = logging.getLogger("lagwatch.config.web")

TlsVersion = Literal["TLS10", "TLS11", "TLS12", "TLS13"]
_TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                 "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

# Go's crypto/tls values; "RequireClientCert" is exporter-toolkit's old name for RequireAnyClientCert.
ClientAuthType = Literal["NoClientCert", "RequestClientCert", "RequireAnyClientCert", "RequireClientCert",
                         "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]

# Go's cipher suite names (tls.CipherSuites() and tls.InsecureCipherSuites()) -> OpenSSL's.
# None: a TLS 1.3 suite, which neither Go nor Python's ssl lets a config choose.
GO_CIPHER_SUITES: dict[str, str | None] = {
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    # Insecure, but valid in an exporter web config.
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}

# Go's curve names -> OpenSSL's.
GO_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}

# The response headers exporter-toolkit lets a web config set, with the values it allows.
EXTRA_HTTP_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

# Keys newer exporter-toolkits know that lagwatch does not implement: a clearer message
# than "unknown key".
_UNSUPPORTED = {
    "tls_server_config.cert": "inline certificates are not supported: put it in a file and set cert_file",
    "tls_server_config.key": "inline keys are not supported: put it in a file and set key_file",
    "tls_server_config.client_ca": "inline client CAs are not supported: put them in a file and set client_ca_file",
    "rate_limit": "not supported by lagwatch (exporter-toolkit's request rate limiter)",
}

_warned: set[str] = set()
_warned_lock = threading.Lock()


def bcrypt_cost(hashed: str) -> int | None:
    """A bcrypt hash's cost (its log2 rounds), None if it is no bcrypt hash."""
    match = re.fullmatch(r"\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}", hashed)
    return int(match.group(1)) if match else None


def warn_once(message: str, level: int = logging.WARNING) -> None:
    """Log ``message`` the first time only: the web config is loaded more than once."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    log.log(level, "%s", message)


def forget_warnings() -> None:
    """Every message may be said once more (a test's fresh start)."""
    with _warned_lock:
        _warned.clear()


MAX_BCRYPT_COST = 16


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: TlsVersion = "TLS12"
    max_version: TlsVersion = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    curve_preferences: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @field_validator("cipher_suites")
    @classmethod
    def _known_ciphers(cls, suites: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [s for s in suites if s not in GO_CIPHER_SUITES]
        if unknown:
            raise ValueError(f"unknown cipher suite(s) {', '.join(unknown)}: expected Go's names, "
                             "e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256")
        return suites

    @field_validator("curve_preferences")
    @classmethod
    def _known_curves(cls, curves: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in curves if c not in GO_CURVES]
        if unknown:
            raise ValueError(f"unknown curve(s) {', '.join(unknown)}: expected {', '.join(GO_CURVES)}")
        return curves

    @model_validator(mode="after")
    def _consistent(self) -> TlsServerConfig:
        if _TLS_VERSIONS[self.min_version] > _TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        if self.client_ca_file is not None and self.client_auth_type == "NoClientCert":
            raise ValueError("client_ca_file is set but client_auth_type is NoClientCert: "
                             "set client_auth_type (e.g. RequireAndVerifyClientCert)")
        if self.client_allowed_sans is not None and self.client_auth_type not in (
                "RequireAnyClientCert", "RequireClientCert", "RequireAndVerifyClientCert"):
            raise ValueError("client_allowed_sans needs client_auth_type RequireAnyClientCert or "
                             "RequireAndVerifyClientCert (a client must present a certificate)")
        return self


class HttpServerConfig(_Strict):
    http2: bool = True
    headers: dict[str, str] = {}

    @field_validator("headers")
    @classmethod
    def _allowed_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in EXTRA_HTTP_HEADERS:
                # A name is shown as any unexpected value is (``excerpt``): a token pasted here is hidden.
                raise ValueError(f"HTTP header '{excerpt(name)}' can not be configured: one of "
                                 f"{', '.join(EXTRA_HTTP_HEADERS)}")
            allowed = EXTRA_HTTP_HEADERS[name]
            if allowed and value not in allowed:
                raise ValueError(f"invalid value for {name}: expected one of {', '.join(allowed)}, "
                                 f"got '{excerpt(value)}'")
            if not all(" " <= ch <= "~" for ch in value):
                # HTTP/1.1 headers are Latin-1 (h11 writes them so); anything else would fail every
                # response (/healthz too), and control characters could split the header.
                raise ValueError(f"{name}: the value must be printable ASCII on one line")
        return headers


class WebConfig(_Strict):
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = {}
    http_server_config: HttpServerConfig | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            cost = bcrypt_cost(hashed)
            if cost is None:
                # The user name is shown as ``excerpt`` shows a value: a password put in the
                # name's place (``"user:secret": ...``) is not echoed.
                raise ValueError(f"{excerpt(user)}: expected a bcrypt hash ($2y$...), not a plain password")
            if not 4 <= cost <= MAX_BCRYPT_COST:
                # bcrypt allows 31, but each step doubles the work: 17 takes ~10 s of CPU
                # (Prometheus's scrape timeout) per check here, 31 takes days.
                raise ValueError(f"{excerpt(user)}: bcrypt cost {cost:02d} is out of range (4 to {MAX_BCRYPT_COST}; "
                                 "10 to 12 is usual)")
        return users


def load_web_config(path: Path) -> WebConfig:
    source = str(path)
    data = load_yaml(path, max_bytes=64 * 1024) or {}
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of settings"])
    try:
        config = WebConfig.model_validate(_relative_to(data, path.parent))
    except ValidationError as exc:
        problems = []
        for problem in validation_problems(exc):
            key, _, msg = problem.partition(": ")
            problems.append(f"{key}: {_UNSUPPORTED[key]}" if msg == "unknown key" and key in _UNSUPPORTED
                            else problem)
        raise ConfigError(source, problems) from None
    if config.tls_server_config is not None:
        try:
            ssl_context(config)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(source, [f"tls_server_config: cannot load the certificate or key: {exc}"]) from None
    http = config.http_server_config
    if http is not None and http.http2 and "http2" in http.model_fields_set:
        warn_once("web config: http2 is ignored: lagwatch serves HTTP/1.1 (httpserver.py, on h11), "
                  "which Prometheus scrapes as well", logging.INFO)
    return config


def _relative_to(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """As exporter-toolkit does: relative file paths are relative to the web config file."""
    tls = data.get("tls_server_config")
    if not isinstance(tls, dict):
        return data
    tls = dict(tls)
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = tls.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            tls[key] = str(folder / value)
    return {**data, "tls_server_config": tls}


def ssl_context(config: WebConfig) -> ssl.SSLContext | None:
    tls = config.tls_server_config
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1/TLSv1_1: said below, once
        context.minimum_version = _TLS_VERSIONS[tls.min_version]
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
    if tls.min_version in ("TLS10", "TLS11"):
        warn_once(f"web config: min_version {tls.min_version} lets TLS 1.0/1.1 in, but OpenSSL's security "
                  "level may still refuse those handshakes")
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.cipher_suites:
        _set_ciphers(context, tls)
    if tls.curve_preferences:
        _set_curves(context, tls.curve_preferences)
    _client_auth(context, tls)
    return context


def _set_ciphers(context: ssl.SSLContext, tls: TlsServerConfig) -> None:
    # Like Go, the list only applies to TLS 1.2 and below; TLS 1.3's suites are fixed.
    names = [n for n in (GO_CIPHER_SUITES[s] for s in tls.cipher_suites) if n is not None]
    if not names:
        if tls.max_version != "TLS13":
            raise ssl.SSLError(f"cipher_suites has only TLS 1.3 suites, but max_version is {tls.max_version}")
        # Go would find no suite for an older version either: TLS 1.3 only.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        warn_once("web config: cipher_suites lists only TLS 1.3 suites, which are not configurable: "
                  "TLS 1.3 only, with its standard suites")
        return
    context.set_ciphers(":".join(names))  # SSLError when OpenSSL offers none of them
    offered = {c["name"] for c in context.get_ciphers()}
    missing = [s for s in tls.cipher_suites if GO_CIPHER_SUITES[s] not in offered and GO_CIPHER_SUITES[s]]
    if missing:
        warn_once(f"web config: this OpenSSL does not offer {', '.join(missing)}: left out of cipher_suites")
    if tls.max_version == "TLS13":
        warn_once("web config: cipher_suites applies to TLS 1.2 and below; TLS 1.3 keeps its standard "
                  "suites (as with exporter-toolkit)", logging.INFO)


def _set_curves(context: ssl.SSLContext, curves: tuple[str, ...]) -> None:
    if len(curves) == 1:
        context.set_ecdh_curve(GO_CURVES[curves[0]])  # that curve only, as in Go
        return
    warn_once(f"web config: curve_preferences ({', '.join(curves)}) is ignored: Python's ssl module can "
              "set one curve, not a list; OpenSSL's default groups and order are used")


def _client_auth(context: ssl.SSLContext, tls: TlsServerConfig) -> None:
    mode = tls.client_auth_type
    if mode == "NoClientCert":
        context.verify_mode = ssl.CERT_NONE
        return
    if mode == "RequestClientCert":
        # Go asks for a certificate and checks nothing. Python's ssl cannot ask without
        # verifying, and an unchecked certificate proves nothing: none is asked for.
        warn_once("web config: client_auth_type RequestClientCert: no client certificate is requested "
                  "(Python's ssl cannot request one without verifying it; Go would not check it either)")
        context.verify_mode = ssl.CERT_NONE
        return
    if mode in ("RequireAnyClientCert", "RequireClientCert"):
        warn_once(f"web config: client_auth_type {mode}: the client certificate must also verify against "
                  f"{tls.client_ca_file or 'the system CAs'} (Python's ssl cannot require a certificate "
                  "without verifying it); for self-signed client certificates list them in client_ca_file")
    if tls.client_ca_file is not None:
        context.load_verify_locations(str(tls.client_ca_file))
    else:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go verifies against the system roots too
    context.verify_mode = ssl.CERT_OPTIONAL if mode == "VerifyClientCertIfGiven" else ssl.CERT_REQUIRED


def _normal_san(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return value.strip()


def client_has_allowed_san(cert: dict[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate has one of ``allowed`` among its subject
    alternative names (DNS, IP, email, URI), as exporter-toolkit's client_allowed_sans
    checks; a connection without one is closed before its first request is read."""
    sans: Any = (cert or {}).get("subjectAltName", ())
    found = {_normal_san(str(value)) for _, value in sans}
    if found & {_normal_san(a) for a in allowed}:
        return True
    log.warning("refused a TLS client: its certificate has none of client_allowed_sans (it has: %s)",
                ", ".join(sorted(found)) or "no SANs")
    return False
