"""Benchmark: lagwatch.render.exposition against prometheus_client, on the same series.

Builds a fleet's worth of series (300 clusters by default, each with a primary and two
replicas: 52,800 series in lagwatch's shapes: per-node gauges, per-replica stage and
state series, a window summary and a histogram per replica) twice, with the same
constructor and ``add_metric`` calls: once with lagwatch.render.exposition's families and
``render_text``, once with prometheus_client's ``*MetricFamily`` classes and
``generate_latest`` on a registry. Rounds alternate between the two, so that both see the
same machine; it prints microseconds a series for each round and the ratio of the
medians. Then what gzip does to lagwatch's text (what /metrics sends a scraper that asks
for it, compressed once per snapshot: serve/web.py): its size and the time to compress it
at levels 1 (lagwatch's) and 6 (gzip's default), each beside the time to render the same
text, the median of ``--rounds``. It prints; it asserts nothing. docs/benchmarks.md keeps
what it measured.

Then each format /metrics answers in (serve/negotiation.py), written from the same
families (their histograms with native buckets too, as a held replica's fill them): text
(0.0.4 and 1.0.0 are one body), OpenMetrics 1.0.0, and protobuf twice, lagwatch's
hand-written encoder (render/protobuf.py) against the ``protobuf`` runtime building the
classes protoc generates from Prometheus's metrics.proto (tests/proto) and serializing
them: the time to write each, alternated round by round, its size and its size in gzip.

    python3 bench/exposition.py [--clusters 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))

import prometheus_client  # noqa: E402
from lagwatch.estimate.windows import LagHistogram  # noqa: E402
from lagwatch.render import exposition, protobuf, text  # noqa: E402
from prometheus_client.core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import CollectorRegistry  # noqa: E402

THEIRS_VERSION = importlib.metadata.version("prometheus-client")
NODES = ("primary", "replica1", "replica2")
REPLICAS = NODES[1:]
STAGES = ("sent", "write", "flush", "replay")
STATES = ("streaming", "catchup", "backup", "stopping", "startup", "down")
BUCKETS = ("0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1.0", "5.0", "10.0", "60.0", "+Inf")
NODE_GAUGES = 20  # per-node gauges (up, role, timeline, connects, view health...)
REPLICA_GAUGES = 24  # per-replica gauges (staleness, rates, forecasts, pool state...)


def build(kinds: dict[str, Any], clusters: int) -> tuple[list[Any], int]:
    """The families of a ``clusters``-cluster fleet, built with ``kinds``' classes; and how
    many series they hold."""
    gauge, counter, summary, histogram = kinds["gauge"], kinds["counter"], kinds["summary"], kinds["histogram"]
    names = [f"c{i:03d}" for i in range(clusters)]
    families: list[Any] = []
    series = 0
    for g in range(NODE_GAUGES):
        f = gauge(f"lagwatch_node_gauge_{g}", "A per-node gauge", labels=["cluster", "node"])
        for c in names:
            for n in NODES:
                f.add_metric([c, n], 1.0 + g)
                series += 1
        families.append(f)
    for g in range(REPLICA_GAUGES):
        f = gauge(f"lagwatch_replica_gauge_{g}", "A per-replica gauge", labels=["cluster", "replica"])
        for c in names:
            for r in REPLICAS:
                f.add_metric([c, r], 0.0123 * g)
                series += 1
        families.append(f)
    stage = gauge("lagwatch_replica_lag_bytes", "Bytes behind by stage", labels=["cluster", "replica", "stage"])
    state = gauge("lagwatch_replica_state", "One-hot walsender state", labels=["cluster", "replica", "state"])
    errors = counter("lagwatch_view_errors", "View errors", labels=["cluster", "node", "view"])
    window = summary("lagwatch_replica_lag_window_seconds", "Window quantiles", labels=["cluster", "replica"])
    sampled = histogram("lagwatch_replica_lag_sampled_seconds", "Lag histogram", labels=["cluster", "replica"])
    for c in names:
        for n in NODES:
            for v in ("server", "replication", "slots", "wal"):
                errors.add_metric([c, n, v], 0.0)
                series += 1
        for r in REPLICAS:
            for s in STAGES:
                stage.add_metric([c, r, s], 8192.0)
            for s in STATES:
                state.add_metric([c, r, s], 1.0 if s == "streaming" else 0.0)
            series += len(STAGES) + len(STATES)
            kinds["summary_add"](window, [c, r], [("0.5", 0.01), ("0.95", 0.02), ("0.99", 0.03)], 1000, 12.5)
            kinds["histogram_add"](sampled, [c, r], [(le, 10 * i) for i, le in enumerate(BUCKETS)], 12.5)
            series += 5 + len(BUCKETS) + 2
    families += [stage, state, errors, window, sampled]
    return families, series


def _ours_summary(f: Any, labels: list[str], quantiles: list[tuple[str, float]], count: int, total: float) -> None:
    f.add_metric(labels, quantiles, count, total)


def _theirs_summary(f: Any, labels: list[str], quantiles: list[tuple[str, float]], count: int, total: float) -> None:
    # prometheus_client's SummaryMetricFamily takes count and sum; the quantile samples are
    # added as the Sample tuples it would make for them.
    f.add_metric(labels, count, total)
    for q, value in quantiles:
        f.add_sample(f.name, dict(zip([*f._labelnames, "quantile"], [*labels, q], strict=True)), value)


OURS = {"gauge": exposition.Gauge, "counter": exposition.Counter, "summary": exposition.Summary,
        "histogram": exposition.Histogram, "summary_add": _ours_summary,
        "histogram_add": lambda f, labels, buckets, total: f.add_metric(labels, buckets, total)}
THEIRS = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "summary": SummaryMetricFamily,
          "histogram": HistogramMetricFamily, "summary_add": _theirs_summary,
          "histogram_add": lambda f, labels, buckets, total: f.add_metric(labels, buckets, total)}


def render_ours(clusters: int) -> tuple[int, int]:
    with exposition.collecting():
        families, series = build(OURS, clusters)
    return len(text.render_text(families)), series


def render_theirs(clusters: int) -> tuple[int, int]:
    families, series = build(THEIRS, clusters)

    class Fleet:
        def collect(self) -> Iterator[Any]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fleet())  # type: ignore[arg-type]
    return len(prometheus_client.generate_latest(registry)), series


def gzip_figures(clusters: int, rounds: int) -> None:
    """lagwatch's text compressed at levels 1 and 6, beside its render, alternated."""
    import gzip

    def written() -> bytes:
        with exposition.collecting():
            families, _ = build(OURS, clusters)
        return text.render_text(families)

    body = written()
    times: dict[str, list[float]] = {"render": [], "gzip 1": [], "gzip 6": []}
    sizes = {}
    for _ in range(rounds):
        started = time.perf_counter()
        written()
        times["render"].append(time.perf_counter() - started)
        for level in (1, 6):
            started = time.perf_counter()
            sizes[level] = len(gzip.compress(body, level, mtime=0))
            times[f"gzip {level}"].append(time.perf_counter() - started)
    print(f"gzip of lagwatch's text ({len(body) / 1e6:.1f} MB), median of {rounds}: render "
          f"{statistics.median(times['render']) * 1000:.0f} ms; " + "; ".join(
              f"level {level} {statistics.median(times[f'gzip {level}']) * 1000:.0f} ms, "
              f"{sizes[level] / 1e6:.2f} MB ({len(body) / sizes[level]:.1f}x smaller)" for level in (1, 6)))


def _native_counts() -> Any:
    """A held replica's native buckets: 2,000 samples around 1 s, a few caught up."""
    h = LagHistogram()
    for i in range(2000):
        h.observe(0.0 if i % 50 == 0 else 1.0 + (i % 97) / 10_000)
    return h.snapshot().native


def _with_native(families: list[Any]) -> list[Any]:
    native = _native_counts()
    for f in families:
        if f.kind == "histogram":
            f.samples = [(labels, buckets, total, native) for labels, buckets, total, _ in f.samples]
    return families


def library_protobuf(families: list[Any]) -> bytes:
    """The same families through the protobuf runtime and protoc's classes: a message object
    per family, series and label, then SerializeToString."""
    from google.protobuf.internal.encoder import _VarintBytes

    pb = _metrics_pb2()
    kinds = {"counter": pb.COUNTER, "gauge": pb.GAUGE, "info": pb.GAUGE, "summary": pb.SUMMARY,
             "histogram": pb.HISTOGRAM}
    out = []
    for f in families:
        if not f.samples and not f.groups:
            continue
        mf = pb.MetricFamily(name=f.series, help=f.documentation, type=kinds[f.kind])
        unit = exposition.unit_of(f.name)
        if unit:
            mf.unit = unit
        names = f.labelnames
        rows = [(labels, sample) for labels, *sample in f.samples]
        rows += [((*labels, last), [value]) for labels, pairs in f.groups for last, value in pairs]
        for labels, sample in rows:
            m = mf.metric.add()
            for name, value in zip(names, labels, strict=True):
                m.label.add(name=name, value=value)
            if f.kind in ("gauge", "info"):
                m.gauge.value = sample[0]
            elif f.kind == "counter":
                m.counter.value = sample[0]
            elif f.kind == "summary":
                quantiles, count, total = sample
                m.summary.sample_count, m.summary.sample_sum = count, total
                for q, v in quantiles:
                    m.summary.quantile.add(quantile=float(q), value=v)
            else:
                buckets, total, native = sample
                h = m.histogram
                h.sample_count, h.sample_sum = buckets[-1][1], total
                for le, c in buckets[:-1]:
                    h.bucket.add(cumulative_count=c, upper_bound=float(le))
                if native is not None:
                    h.schema, h.zero_threshold, h.zero_count = native.schema, native.zero_threshold, native.zero_count
                    previous_index, previous = None, 0
                    for index, c in sorted(native.buckets):
                        if previous_index is not None and index == previous_index + 1:
                            h.positive_span[-1].length += 1
                        else:
                            h.positive_span.add(offset=index if previous_index is None else index - previous_index - 1,
                                                length=1)
                        h.positive_delta.append(c - previous)
                        previous_index, previous = index, c
        body = mf.SerializeToString()
        out += [_VarintBytes(len(body)), body]
    return b"".join(out)


def _messages(body: bytes) -> list[Any]:
    from google.protobuf.internal.decoder import _DecodeVarint32

    pb, out, pos = _metrics_pb2(), [], 0
    while pos < len(body):
        size, pos = _DecodeVarint32(body, pos)
        out.append(pb.MetricFamily.FromString(body[pos:pos + size]))
        pos += size
    return out


def _metrics_pb2() -> Any:
    sys.path.insert(0, str(ROOT / "tests" / "proto"))
    import metrics_pb2

    return metrics_pb2


def format_figures(clusters: int, rounds: int) -> None:
    """Each format written from the same families, alternated; sizes plain and in gzip."""
    import gzip

    def families() -> list[Any]:
        with exposition.collecting():
            built, _ = build(OURS, clusters)
        return _with_native(built)

    writers: dict[str, Callable[[list[Any]], bytes]] = {
        "text": text.render_text, "openmetrics": text.render_openmetrics,
        "protobuf (lagwatch's)": protobuf.render_protobuf, "protobuf (runtime)": library_protobuf}
    check = families()
    # The same messages (not the same bytes: lagwatch packs the native deltas, which proto2's
    # runtime writes one field each; every protobuf parser takes both).
    assert _messages(library_protobuf(check)) == _messages(protobuf.render_protobuf(check)), "the encoders disagree"
    times: dict[str, list[float]] = {name: [] for name in writers}
    sizes: dict[str, tuple[int, int]] = {}
    for round_ in range(rounds):
        order = list(writers) if round_ % 2 == 0 else list(reversed(writers))
        for name in order:
            fams = families()  # fresh: the text formats keep their lines on the family
            started = time.perf_counter()
            body = writers[name](fams)
            times[name].append(time.perf_counter() - started)
            sizes[name] = (len(body), len(gzip.compress(body, 1, mtime=0)))
    build_times = []
    for _ in range(rounds):
        started = time.perf_counter()
        families()
        build_times.append(time.perf_counter() - started)
    print(f"formats, {clusters} clusters, median of {rounds} (building the families: "
          f"{statistics.median(build_times) * 1000:.0f} ms, not counted below):")
    for name in writers:
        plain, packed = sizes[name]
        print(f"  {name:<22} {statistics.median(times[name]) * 1000:6.0f} ms "
              f"({min(times[name]) * 1000:.0f}-{max(times[name]) * 1000:.0f}), {plain / 1e6:5.2f} MB, "
              f"gzip level 1 {packed / 1e6:5.2f} MB")


def timed(render: Callable[[int], tuple[int, int]], clusters: int) -> tuple[float, int, int]:
    started = time.perf_counter()
    size, series = render(clusters)
    return time.perf_counter() - started, size, series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    timed(render_ours, 10)  # warm both up (imports, format caches)
    timed(render_theirs, 10)
    ours: list[float] = []
    theirs: list[float] = []
    series = 0
    for round_ in range(args.rounds):
        for name, render, out in (("lagwatch.render.exposition", render_ours, ours),
                                  (f"prometheus_client {THEIRS_VERSION}", render_theirs, theirs)):
            seconds, size, series = timed(render, args.clusters)
            out.append(seconds / series * 1e6)
            print(f"round {round_ + 1}: {name:<28} {series:,} series, {size / 1e6:.1f} MB, "
                  f"{seconds * 1000:.0f} ms, {out[-1]:.2f} µs a series")
    ours_median, theirs_median = statistics.median(ours), statistics.median(theirs)
    print(f"median: lagwatch.render.exposition {ours_median:.2f} µs a series ({min(ours):.2f}-{max(ours):.2f}), "
          f"prometheus_client {THEIRS_VERSION} {theirs_median:.2f} µs ({min(theirs):.2f}-{max(theirs):.2f}): "
          f"{theirs_median / ours_median:.1f}x")
    gzip_figures(args.clusters, args.rounds)
    format_figures(args.clusters, args.rounds)


if __name__ == "__main__":
    main()
