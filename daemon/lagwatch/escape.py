"""One rule for text lagwatch does not own on its way into a log line or an error message:
control characters escaped, so that one event is one line and no terminal obeys it.

Patroni's member names, the names of files in ``clusters_dir``, what a pooler or a server
answers: any of it may hold a newline (a forged log line after it) or an escape sequence
(a terminal recoloured, a line erased). The log formatters (cli.py) pass every line
through ``escape_controls``; an error message that quotes a value takes ``excerpt`` of
it, bounded as well, and with what is shaped like a secret hidden (``secret_shapes``: a
URL shows only its scheme, host and port, a ``password=`` only ``***``), since a value
under the wrong key may be a password or a token.
"""

from __future__ import annotations

import re

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    r"""``text`` with every character that does not print written out (``\n``, ``\x1b``,
    ``\u2028``): controls, line and paragraph separators, and the other invisible ones
    (``str.isprintable``; the plain space prints)."""
    if text.isprintable():
        return text  # the usual case, at C speed
    return "".join(ch if ch.isprintable() else _escaped(ch) for ch in text)


def excerpt(text: str, limit: int = 40) -> str:
    """At most ``limit`` characters of ``text``, secret shapes hidden (``secret_shapes``),
    escaped, marked where cut: what an error message may show of a value it did not
    expect (an operator's password or token put under the wrong key among them)."""
    text = secret_shapes(text)
    cut = text if len(text) <= limit else text[:limit] + "…"
    return escape_controls(cut)


def shown_url(url: str) -> str:
    """What a message may show of ``url``: its scheme, host and port, and nothing else. A
    URL's user part may be a token (``https://TOKEN@host``), and so may its path, query or
    fragment (``?token=``, ``#key``): none is shown (``***@`` and ``/…`` say they were
    there). The host is what follows the *last* ``@``: a password holding ``/``, ``?``,
    ``#`` or ``@`` ends the authority early for a URL parser, and its tail would show."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    _userinfo, at, after = rest.rpartition("@")
    host = re.split(r"[/?#]", after, maxsplit=1)[0]
    more = "/…" if len(host) < len(after) else ""
    return f"{scheme}{sep}{'***@' if at else ''}{host}{more}"


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def secret_shapes(text: str) -> str:
    """``text`` with what is shaped like a secret hidden: every URL as ``shown_url`` shows
    it, every ``password=`` value as ``***``. The one rule for a value a message echoes."""
    return _PASSWORD.sub(r"\1***", _URL.sub(lambda m: shown_url(m.group()), text))
