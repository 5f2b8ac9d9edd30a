"""Metric families as the export stage fills them: names, labels and values, in no format yet.

Hand-written because prometheus_client's way builds a Sample namedtuple and a labels dict
for every series, then generate_latest escapes and formats them one by one. Measured on a
fleet's 57,600 series, built and written as text: ~2 µs a series here against 14.4-14.9 µs
with prometheus_client 0.26 and 6.2-8.0 µs with 0.17 (about 7x and 3-4x), paid by the
first scrape after every cycle; ``bench/exposition.py`` repeats the comparison on
synthetic families of the same shapes (docs/benchmarks.md). These families take the same
constructor and ``add_metric`` calls as prometheus_client's (export.py is written against
either) and keep each sample as a tuple; a format writes them when a scrape asks for it
(``render.text``: Prometheus text 0.0.4 and 1.0.0, OpenMetrics 1.0.0; ``render.protobuf``:
the delimited protobuf Prometheus asks for first when native histograms are on).
``to_prometheus`` reads the text back with prometheus_client's parser, for a
CollectorRegistry (tests, and anyone who wants the library's view of the very same output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import Metric



class NativeBuckets(Protocol):
    """A native histogram's buckets, as the protobuf writer reads them (what
    estimate/nativehistogram.py's NativeCounts holds; named here so that render/ needs
    nothing from the stages above it)."""

    @property
    def schema(self) -> int: ...
    @property
    def zero_threshold(self) -> float: ...
    @property
    def zero_count(self) -> int: ...
    @property
    def buckets(self) -> tuple[tuple[int, int], ...]: ...  # (index, its own count), in no order


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
    """One metric family: its name, help, label names and samples, as added.

    ``samples`` holds one tuple per label set, its shape the kind's (a gauge's
    ``(labels, value)``, a histogram's ``(labels, buckets, sum, native)``...); a gauge's
    ``groups`` holds the label sets that differ only in their last label, added together
    (``add_metrics``)."""

    kind = "gauge"
    __slots__ = ("documentation", "groups", "labelnames", "name", "samples", "series", "template")
    series: str  # the name its samples carry: a counter's _total, an info's _info
    template: str  # its labels for str.format: cluster="{}",replica="{}" (values escaped)
    samples: list[Any]
    groups: list[tuple[tuple[str, ...], list[tuple[str, float]]]]

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
        if hasattr(self, "samples"):  # made before under this name (collecting): just the sample
            if value is not None:
                self.samples.append(((), float(value)))
            return
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labels or ())
        shape = _SHAPES.get((name, self.kind, self.labelnames))
        if shape is None:
            # As prometheus_client names them: an info's series is NAME_info, a counter's NAME_total.
            series = f"{name}_info" if self.kind == "info" else f"{name}_total" if self.kind == "counter" else name
            template = ",".join(f'{n}="{{}}"' for n in self.labelnames)
            shape = _SHAPES[(name, self.kind, self.labelnames)] = (series, template)
        self.series, self.template = shape
        self.samples = []
        self.groups = []
        if value is not None:
            self.samples.append(((), float(value)))


class Gauge(Family):
    kind = "gauge"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append((tuple(labels), value))

    def add_metrics(self, labels: Sequence[str], last: Iterable[tuple[str, float]]) -> None:
        """Several samples that differ only in the last label (a state, a stage, a view):
        ``add_metric([*labels, value_of_last], number)`` for each pair, the shared labels
        kept (and written) once: one-hot states are a fleet's most numerous series."""
        self.groups.append((tuple(labels), list(last)))


class Counter(Gauge):
    kind = "counter"
    __slots__ = ()


class Info(Family):
    kind = "info"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], value: object = None) -> None:  # value: the info dict, unused
        self.samples.append((tuple(labels), 1.0))


class Histogram(Family):
    kind = "histogram"
    __slots__ = ()

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                   sum_value: float | None = None, native: NativeBuckets | None = None) -> None:
        """Classic buckets as ``(le, cumulative count)``, +Inf last; ``native``: the same
        samples in a native histogram's exponential buckets (written only by the formats
        that carry them: protobuf)."""
        self.samples.append((tuple(labels), buckets, sum_value, native))


# The units a family may declare (OpenMetrics' ``# UNIT``, protobuf's ``unit``): those of
# lagwatch's names that end in one, as both require of a unit.
UNITS = ("seconds", "bytes", "ratio", "xids")


def unit_of(name: str) -> str | None:
    """A family's unit: the suffix its name ends in, where that is a unit."""
    suffix = name.rpartition("_")[2]
    return suffix if suffix in UNITS else None


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
        self.samples.append((tuple(labels), list(quantiles), count, sum_value))


def to_prometheus(families: Iterable[Family]) -> Iterator[Metric]:
    """The families as prometheus_client's own: their very text, read back by its parser
    (imported here: the daemon itself never needs it)."""
    from prometheus_client.parser import text_string_to_metric_families

    from lagwatch.render.text import render_text

    yield from text_string_to_metric_families(render_text(families).decode())
