"""TLS and basic auth for the HTTP endpoints, configured with the web config file format
Prometheus exporters use (exporter-toolkit), so operators can reuse theirs:

    tls_server_config:
      cert_file: /etc/lagwatch/tls.crt
      key_file: /etc/lagwatch/tls.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt (htpasswd -nBC 10 "" | tr -d ':\\n')
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from pathlib import Path
from typing import Literal

import bcrypt
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from lagwatch.config import ConfigError, validation_problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsServerConfig(_Strict):
    cert_file: Path
    key_file: Path
    client_auth_type: Literal["NoClientCert", "RequireAndVerifyClientCert", "VerifyClientCertIfGiven"] = \
        "NoClientCert"
    client_ca_file: Path | None = None
    min_version: Literal["TLS12", "TLS13"] = "TLS12"


class HttpServerConfig(_Strict):
    headers: dict[str, str] = {}


class WebConfig(_Strict):
    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] = {}
    http_server_config: HttpServerConfig | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
                raise ValueError(f"{user}: expected a bcrypt hash ($2y$...), not a plain password")
        return users


def load_web_config(path: Path) -> WebConfig:
    source = str(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML ({exc})"]) from None
    try:
        config = WebConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, validation_problems(exc)) from None
    if config.tls_server_config is not None:
        try:
            ssl_context(config)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(source, [f"tls_server_config: cannot load the certificate or key: {exc}"]) from None
    return config


def ssl_context(config: WebConfig) -> ssl.SSLContext | None:
    tls = config.tls_server_config
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS13" else ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    if tls.client_ca_file is not None:
        context.load_verify_locations(str(tls.client_ca_file))
    context.verify_mode = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                           "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}[tls.client_auth_type]
    return context


class BasicAuth:
    """Checks Authorization headers against bcrypt hashes. bcrypt is slow on purpose, so a
    successful check is remembered (as a keyed digest, never the password) for later scrapes."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = {u: h.encode() for u, h in users.items()}
        self._key = hashlib.sha256(b"".join(self.users.values()) + b"lagwatch").digest()
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def allows(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        token = hmac.new(self._key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._lock:
            if token in self._good:
                return True
        if not bcrypt.checkpw(password.encode(), hashed):
            return False
        with self._lock:
            if len(self._good) > 1000:
                self._good.clear()
            self._good.add(token)
        return True
