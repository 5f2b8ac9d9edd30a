"""What a scraper's request headers ask of /metrics: whether it takes gzip.

HTTP content-coding negotiation (RFC 9110, section 12.5.3) is small enough to write here:
``Accept-Encoding`` is a list of codings with optional ``q`` weights; a coding with ``q=0``
is refused, ``*`` stands for every coding not named, and an absent header means the client
takes any coding but has asked for none (identity is then the answer). Prometheus sends
``Accept-Encoding: gzip`` on every scrape.
"""

from __future__ import annotations


def _weight(params: list[str]) -> float:
    """A coding's q value (1 when not given; 0 for a malformed one: refused, never guessed)."""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether a response compressed with gzip may be sent (``gzip`` or ``x-gzip`` named
    with a weight above 0, or ``*`` above 0 and gzip not named)."""
    if not accept_encoding:
        return False
    named: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            named = max(named or 0.0, _weight(params))
        elif coding == "*":
            star = _weight(params)
    if named is not None:
        return named > 0.0
    return star is not None and star > 0.0
