"""Metric families written straight to the Prometheus text format as they are built.

Hand-written because prometheus_client's way builds a Sample namedtuple and a labels dict
for every series, then generate_latest escapes and formats them one by one. Measured on a
fleet's 57,600 series: 2.0-2.2 µs a series here against 14.4-14.9 µs with
prometheus_client 0.26 and 6.2-8.0 µs with 0.17 (about 7x and 3-4x), paid by the first
scrape after every cycle; ``bench/exposition.py`` repeats the comparison on synthetic
families of the same shapes (docs/benchmarks.md). These
families take the same constructor and ``add_metric`` calls as prometheus_client's
(export.py is written against either) and write each sample's line at once (text format
0.0.4, as prometheus_client writes it, but for the order of labels and Python's way of
writing floats); ``render_text`` only joins them. ``to_prometheus`` reads the text back
with prometheus_client's parser, for a CollectorRegistry (tests, and anyone who wants the
library's view of the very same output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def _value(value: float) -> str:
    """A sample value as Prometheus reads it: Python's shortest repr of the float, with
    +Inf, -Inf and NaN spelled as Prometheus does (Go writes large numbers with an
    exponent sooner than Python; both parse the same)."""
    text = repr(float(value))
    return _SPECIAL.get(text, text)


class _Escaped(dict[str, str]):
    """Label values as written (escaped), each worked out once: the same cluster, replica
    and node names recur in every family. Emptied now and then so that it stays small."""

    def __missing__(self, value: str) -> str:
        if len(self) > 100_000:
            self.clear()
        escaped = value
        if "\\" in value or '"' in value or "\n" in value:
            escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        self[value] = escaped
        return escaped


_ESCAPED = _Escaped()
_SHAPES: dict[tuple[str, str, tuple[str, ...]], tuple[str, str]] = {}  # (name, kind, labels) -> (series, template)


_COLLECTING: ContextVar[dict[str, Family] | None] = ContextVar("lagwatch_families", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, Family]]:
    """Inside, a family made under a name already made is that same family: each cluster's
    samples join the one family (a fleet would otherwise build and merge 60 per cluster).
    Yields the families by name, in the order first made."""
    made: dict[str, Family] = {}
    token = _COLLECTING.set(made)
    try:
        yield made
    finally:
        _COLLECTING.reset(token)


class Family:
    """One metric family: its HELP and TYPE lines and each sample's line, written as added."""

    kind = "gauge"
    __slots__ = ("documentation", "labelnames", "lines", "name", "series", "template")
    series: str
    template: str
    lines: list[str]

    def __new__(cls, name: str, documentation: str, value: float | None = None,
                labels: Sequence[str] | None = None) -> Family:
        made = _COLLECTING.get()
        if made is not None:
            existing = made.get(name)
            if existing is None:
                existing = made[name] = super().__new__(cls)
            return existing
        return super().__new__(cls)

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None) -> None:
        if hasattr(self, "lines"):  # made before under this name (collecting): just the sample
            if value is not None:
                self.lines.append(f"{self.series} {_value(value)}\n")
            return
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels or ())
        shape = _SHAPES.get((name, self.kind, self.labelnames))
        if shape is None:
            # As prometheus_client writes them: an info is a gauge named _info, a counter's
            # help and type name its _total series.
            series = f"{name}_info" if self.kind == "info" else f"{name}_total" if self.kind == "counter" else name
            template = ",".join(f'{n}="{{}}"' for n in self.labelnames)  # cluster="{}",replica="{}"
            shape = _SHAPES[(name, self.kind, self.labelnames)] = (series, template)
        self.series, self.template = shape
        self.lines = []
        if value is not None:
            self.lines.append(f"{self.series} {_value(value)}\n")

    def head(self) -> str:
        help_text = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        kind = "gauge" if self.kind == "info" else self.kind
        return f"# HELP {self.series} {help_text}\n# TYPE {self.series} {kind}\n"

    def _labels(self, values: Sequence[str]) -> str:
        return self.template.format(*map(_ESCAPED.__getitem__, values))


class Gauge(Family):
    kind = "gauge"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        text = repr(float(value))  # _value(), inlined: this runs once per series
        if text in _SPECIAL:
            text = _SPECIAL[text]
        if labels:
            self.lines.append(f"{self.series}{{{self.template.format(*map(_ESCAPED.__getitem__, labels))}}} {text}\n")
        else:
            self.lines.append(f"{self.series} {text}\n")


    def add_metrics(self, labels: Sequence[str], last: Iterable[tuple[str, float]]) -> None:
        """Several samples that differ only in the last label (a state, a stage, a view):
        ``add_metric([*labels, value_of_last], number)`` for each pair, the shared labels
        written once (one-hot states are a fleet's most numerous series)."""
        base = self.template.rsplit(",", 1)[0].format(*map(_ESCAPED.__getitem__, labels)) if labels else ""
        head = f"{self.series}{{{base}," if base else f"{self.series}{{"
        name = self.labelnames[-1]
        add = self.lines.append
        for label, value in last:
            text = repr(float(value))
            if text in _SPECIAL:
                text = _SPECIAL[text]
            add(f'{head}{name}="{_ESCAPED[label]}"}} {text}\n')


class Counter(Gauge):
    kind = "counter"
    __slots__ = ()


class Info(Family):
    kind = "info"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], value: object = None) -> None:  # value: the info dict, unused
        self.lines.append(f"{self.series}{{{self._labels(labels)}}} 1.0\n")


class Histogram(Family):
    kind = "histogram"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                   sum_value: float | None = None) -> None:
        base = self._labels(labels)
        head, plain = (f"{self.name}_bucket{{{base},", f"{{{base}}}") if base else (f"{self.name}_bucket{{", "")
        add = self.lines.append
        count: float = 0
        for le, count in buckets:
            # Bucket counts are whole numbers: "12.0", as prometheus_client writes them.
            add(f'{head}le="{le}"}} {count}.0\n' if count.__class__ is int else f'{head}le="{le}"}} {_value(count)}\n')
        add(f"{self.name}_count{plain} {_value(count)}\n")
        if sum_value is not None:
            add(f"{self.name}_sum{plain} {_value(sum_value)}\n")


def quantile_label(q: float) -> str:
    """A quantile as its label value: ``0.95``, and ``1`` for the maximum."""
    return "1" if q == 1.0 else repr(q)


class Summary(Family):
    """Quantiles over a window (``quantile`` samples), with ``_count`` and ``_sum`` over
    everything since start, as a summary's are (client libraries' sliding-window summaries
    keep them the same way)."""

    kind = "summary"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], quantiles: Iterable[tuple[str, float]], count: float,
                   sum_value: float) -> None:
        base = self._labels(labels)
        head, plain = (f"{self.name}{{{base},", f"{{{base}}}") if base else (f"{self.name}{{", "")
        add = self.lines.append
        for q, value in quantiles:
            add(f'{head}quantile="{q}"}} {_value(value)}\n')
        add(f"{self.name}_count{plain} {_value(count)}\n")
        add(f"{self.name}_sum{plain} {_value(sum_value)}\n")


def render_text(families: Iterable[Family]) -> bytes:
    """The families in the Prometheus text format, version 0.0.4 (CONTENT_TYPE); a family
    with no sample is declared all the same (its HELP and TYPE lines)."""
    out: list[str] = []
    for f in families:
        out.append(f.head())
        out.extend(f.lines)
    return "".join(out).encode()


def to_prometheus(families: Iterable[Family]) -> Iterator[Metric]:
    """The families as prometheus_client's own: their very text, read back by its parser
    (imported here: the daemon itself never needs it)."""
    from prometheus_client.parser import text_string_to_metric_families

    yield from text_string_to_metric_families(render_text(families).decode())
