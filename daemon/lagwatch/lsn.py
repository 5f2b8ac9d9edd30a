"""PostgreSQL LSNs ('16/B374D848') as plain integers, so differences are byte counts."""

from __future__ import annotations


def parse_lsn(text: str | None) -> int | None:
    """'16/B374D848' -> 0x16B374D848; NULL stays None."""
    if text is None:
        return None
    high, sep, low = str(text).partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(value: int | None) -> str | None:
    if value is None:
        return None
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
