"""Keep passwords out of everything lagwatch prints, serves or raises."""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg.conninfo

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
    """``url`` with whatever stands before its last ``@`` past the scheme hidden but a
    plain user name (``https://u:***@host``): for a URL lagwatch refuses and names in the
    refusal. Cut at the last ``@`` of the whole URL, not of its authority: a password
    holding ``/``, ``?``, ``#`` or ``@`` would end the authority early for a URL parser,
    and its tail would show."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return url
    user = re.match(r"[A-Za-z0-9._~-]*", userinfo)
    name = user.group() if user else ""
    return f"{scheme}{sep}{name}{'' if name == userinfo else ':***'}@{after}"
