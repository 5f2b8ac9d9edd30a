"""What every part of /status writes its HTML with: escaping, durations, a condition's colour."""

from __future__ import annotations

import html

from lagwatch.durations import format_duration
from lagwatch.snapshot import Condition

CONDITION_CSS: dict[Condition, str] = {"down": "bad", "cannot_see": "warn", "not_streaming": "bad", "paused": "warn",
                                       "unknown": "warn", "behind": "warn", "streaming": "ok"}


def esc(value: object) -> str:
    """Anything shown, escaped (a name or an error from a server is never HTML)."""
    return html.escape(str(value), quote=True)


def dur(value: float | None) -> str:
    return "?" if value is None else format_duration(value)
