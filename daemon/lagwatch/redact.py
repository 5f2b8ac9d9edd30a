"""Keep passwords out of everything lagwatch prints, serves or raises: the known secrets
(a node's password, a pooler's) replaced, and what is shaped like one hidden by the one
rule every message follows (escape.secret_shapes: a URL shows its scheme, host and port,
a ``password=`` value ``***``)."""

from __future__ import annotations

from collections.abc import Iterable

from lagwatch.escape import secret_shapes


def redact_text(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every known secret replaced, and what is shaped like one hidden; for
    error messages from libpq, PgBouncer and the heartbeat."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return secret_shapes(text)
