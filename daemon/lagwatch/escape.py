"""One rule for text lagwatch does not own on its way into a log line or an error message:
control characters escaped, so that one event is one line and no terminal obeys it.

Patroni's member names, the names of files in ``clusters_dir``, what a pooler or a server
answers: any of it may hold a newline (a forged log line after it) or an escape sequence
(a terminal recoloured, a line erased). The log formatters (cli.py) pass every line
through ``escape_controls``; an error message that quotes a value takes ``excerpt`` of
it, bounded as well.
"""

from __future__ import annotations

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
    """At most ``limit`` characters of ``text``, escaped, marked where cut: what an error
    message may show of a value it did not expect."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return escape_controls(cut)
