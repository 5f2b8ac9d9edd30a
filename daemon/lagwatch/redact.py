"""Keep passwords out of everything lagwatch prints, serves or raises."""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg.conninfo

from lagwatch.escape import shown_url

_PASSWORD_IN_DSN = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_PASSWORD_IN_URI = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)(@)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by '***' (works on DSNs libpq cannot parse too)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        params = None
    if params is not None and "password" in params:
        params["password"] = "***"
        return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    text = _PASSWORD_IN_DSN.sub(r"\1***", dsn)
    return _PASSWORD_IN_URI.sub(r"\1***\3", text)


def redact_text(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every known secret replaced; for error messages from libpq."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _PASSWORD_IN_URI.sub(r"\1***\3", _PASSWORD_IN_DSN.sub(r"\1***", text))


def redact_url(url: str) -> str:
    """What a message may show of ``url`` (escape.shown_url: scheme, host and port)."""
    return shown_url(url)
