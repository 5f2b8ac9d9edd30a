"""The expositions /metrics can answer in, and the content type each is answered with.

A ``Format`` is one body (rendered once per snapshot, whichever scrapes ask for it); a
``Choice`` is that body and the exact ``Content-Type`` a scraper's ``Accept`` earned: the
text formats 0.0.4 and 1.0.0 are one body for lagwatch's names, and so are OpenMetrics
1.0.0 and its 0.0.1 draft (no exemplars, no ``_created``: nothing in which they differ).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lagwatch.render.exposition import Family
from lagwatch.render.protobuf import render_protobuf
from lagwatch.render.text import render_openmetrics, render_text

# The escaping schemes (Prometheus's escaping= parameter) whose output for a legacy name
# (every name lagwatch writes) is the name as it is: said back when asked. "dots" is not
# among them: it escapes underscores too (lagwatch_up would be lagwatch__up), so a scraper
# asking for it is told "underscores", which is what it is sent.
AS_WRITTEN = ("allow-utf-8", "underscores", "values")


@dataclass(frozen=True)
class Format:
    key: str  # one per body: the rendered cache's key
    render: Callable[[Iterable[Family]], bytes]


TEXT = Format("text", render_text)
OPENMETRICS = Format("openmetrics", render_openmetrics)
PROTOBUF = Format("protobuf", render_protobuf)


@dataclass(frozen=True)
class Choice:
    format: Format
    content_type: str


def text(version: str = "0.0.4", escaping: str | None = None) -> Choice:
    return Choice(TEXT, f"text/plain; version={version}; charset=utf-8" + _escaping(version, escaping))


def openmetrics(version: str = "1.0.0", escaping: str | None = None) -> Choice:
    return Choice(OPENMETRICS, f"application/openmetrics-text; version={version}; charset=utf-8"
                  + _escaping(version, escaping))


def protobuf(escaping: str | None = None) -> Choice:
    return Choice(PROTOBUF, "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
                  "encoding=delimited" + _escaping("1.0.0", escaping))


def _escaping(version: str, escaping: str | None) -> str:
    """The escaping said back, where the format has it (text and OpenMetrics 1.0.0,
    protobuf) and the scraper named a scheme: the one it asked for when lagwatch's names are
    what that scheme makes of them, else "underscores" (what they are); nothing for a
    scheme there is not."""
    if version != "1.0.0" or escaping is None:
        return ""
    if escaping in AS_WRITTEN:
        return f"; escaping={escaping}"
    return "; escaping=underscores" if escaping == "dots" else ""


DEFAULT = text()
