"""Human durations in config files: ``250ms``, ``1s``, ``1.5m``, ``1h``."""

from __future__ import annotations

import math
import re

from lagwatch.escape import secret_shapes

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")


def parse_duration(value: object) -> float:
    """Return seconds for ``250ms``/``1s``/``1m``/``1h`` (or a bare number of seconds).

    Raises ValueError with a message fit for a config error; negative and zero values are
    the caller's business (some settings allow 0, none allow negatives).
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration like 250ms, 1s, 1m or 1h, got a boolean")
    if isinstance(value, int) and abs(value) > 10**15:  # 31 million years; float() overflows past 1e308
        raise ValueError(f"must be a finite number of seconds, got {_shown(value)}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(f"expected a duration like 250ms, 1s, 1m or 1h, got {_shown(value)}")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration like 250ms, 1s, 1m or 1h, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"must be a finite number of seconds, got {_shown(value)}")
    if seconds < 0:
        raise ValueError(f"must not be negative, got {_shown(value)}")
    return seconds


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        return "a number of more than 4300 digits"
    text = secret_shapes(text)  # a password or a URL's token put here by mistake is not echoed
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def format_duration(seconds: float) -> str:
    """The shortest readable form that keeps milliseconds where lag SLAs live: ``0.4ms``,
    ``63ms``, ``1.25s``, ``1.5m``. For logs, ``lagwatch check`` and the status page."""
    if seconds <= 0:
        return "0ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + "s"
    if seconds < 120:
        return f"{seconds:.1f}s".replace(".0s", "s")
    if seconds < 7200:
        return f"{seconds / 60:.1f}m".replace(".0m", "m")
    return f"{seconds / 3600:.1f}h".replace(".0h", "h")
