"""What every part of /status writes its HTML with: escaping and durations (rooms write their
/status parts with it, so it sits below them)."""

from __future__ import annotations

import html

from lagwatch.durations import format_duration


def esc(value: object) -> str:
    """Anything shown, escaped (a name or an error from a server is never HTML)."""
    return html.escape(str(value), quote=True)


def dur(value: float | None) -> str:
    return "?" if value is None else format_duration(value)
