"""TLS and basic auth from an exporter-style web config file, with a real TLS client."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
from pathlib import Path

import bcrypt
import pytest
import yaml
from chaoscluster import ChaosCluster
from harness import Lagwatch, cluster_config
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def get(port: int, cert: Path, path: str, auth: tuple[str, str] | None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def test_tls_and_basic_auth(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    # A $2y$ hash as htpasswd/exporter-toolkit docs produce it.
    hashed = bcrypt.hashpw(b"s3cret-scrape", bcrypt.gensalt(rounds=10)).decode().replace("$2b$", "$2y$", 1)
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                                   "basic_auth_users": {"prometheus": hashed}}))
    config = cluster_config(pg_cluster, free_port(["127.0.0.1"]), web_config_file=str(web))
    with Lagwatch(tmp_path, config) as lw:
        import time

        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = get(lw.port, cert, "/readyz", ("prometheus", "s3cret-scrape"))
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, lw.log_text()
            time.sleep(0.2)
        status, body = get(lw.port, cert, "/metrics", ("prometheus", "s3cret-scrape"))
        assert status == 200 and b"lagwatch_replica_lag_seconds" in body
        for path in ("/metrics", "/status", "/api/status", "/healthz"):
            assert get(lw.port, cert, path, ("prometheus", "wrong"))[0] == 401
            assert get(lw.port, cert, path, None)[0] == 401
            assert get(lw.port, cert, path, ("nobody", "s3cret-scrape"))[0] == 401
        # Plain HTTP to the TLS port gets no HTTP answer.
        plain = http.client.HTTPConnection("127.0.0.1", lw.port, timeout=5)
        with pytest.raises((http.client.HTTPException, ConnectionError, socket.timeout, OSError)):
            plain.request("GET", "/metrics")
            plain.getresponse()
        assert "https://" in lw.log_text()
        assert "no web_config_file" not in lw.log_text()


def test_without_web_config_says_plain_http_on_loopback(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    with Lagwatch(tmp_path, cluster_config(pg_cluster, free_port(["127.0.0.1"]))) as lw:
        lw.wait_ready()
        assert lw.get("/metrics")[0] == 200  # no auth asked
        log = lw.log_text()
        assert f"listening on http://127.0.0.1:{lw.port}/" in log
        lines = [line for line in log.splitlines() if "no web_config_file" in line]
        assert len(lines) == 1, log
        assert lines[0].endswith("INFO lagwatch: no web_config_file: HTTP without TLS or authentication, "
                                 "loopback only"), lines


def test_bad_web_config_is_a_config_error(pg_cluster: ChaosCluster, tmp_path: Path) -> None:
    from harness import run_cli

    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: plaintext\ntls_server_config:\n  cert_file: /nope\n")
    config_path = tmp_path / "lagwatch.yaml"
    config_path.write_text(yaml.safe_dump(cluster_config(pg_cluster, free_port(["127.0.0.1"]),
                                                         web_config_file=str(web))))
    result = run_cli("run", "-c", str(config_path))
    assert result.returncode == 2
    assert "basic_auth_users.prometheus" in result.stderr or "bcrypt" in result.stderr
    assert "tls_server_config.key_file" in result.stderr
