"""The protobuf exposition (render/protobuf.py), written by hand, read back by the protobuf
runtime with the classes protoc generates from Prometheus's own metrics.proto (vendored in
tests/proto, and checked here to be what that .proto generates)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lagwatch.estimate.nativehistogram import bucket_index
from lagwatch.estimate.windows import LAG_BUCKETS, LagHistogram
from lagwatch.render.exposition import Counter, Family, Gauge, Histogram, Info, Summary, collecting
from lagwatch.render.protobuf import render_protobuf

PROTO = Path(__file__).resolve().parent.parent / "proto"
sys.path.insert(0, str(PROTO))
metrics_pb2: Any = pytest.importorskip("metrics_pb2")
from google.protobuf.internal.decoder import _DecodeVarint32  # noqa: E402


def decode(body: bytes) -> list[Any]:
    """Delimited MetricFamily messages, as Prometheus reads them."""
    out, pos = [], 0
    while pos < len(body):
        size, pos = _DecodeVarint32(body, pos)
        family = metrics_pb2.MetricFamily()
        family.ParseFromString(body[pos:pos + size])
        out.append(family)
        pos += size
    return out


def test_the_generated_module_is_what_protoc_makes_of_the_vendored_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}", f"--python_out={tmp_path}",
                    str(PROTO / "metrics.proto")], check=True, capture_output=True, timeout=60)
    descriptor = re.compile(r"AddSerializedFile\((b'.*?')\)")
    fresh = descriptor.search((tmp_path / "metrics_pb2.py").read_text())
    committed = descriptor.search((PROTO / "metrics_pb2.py").read_text())
    assert fresh and committed and fresh.group(1) == committed.group(1)


NASTY = 'a "quoted"\\back\nslash é'


def families() -> list[Family]:
    h = LagHistogram()
    for value in (0.0, 0.0, 0.001, 0.0012, 0.3, 0.3001, 0.31, 2.0, 300.0):
        h.observe(value)
    counts = h.snapshot()
    les = ["+Inf" if b == math.inf else repr(b) for b in counts.bounds]
    with collecting() as made:
        for cluster in ("c1", NASTY):
            g = Gauge("lagwatch_x_seconds", "help", labels=["cluster", "state"])
            g.add_metric([cluster, "up"], math.inf)
            g.add_metrics([cluster], [("a", 1.5), ("b", math.nan)])
            Counter("lagwatch_n", "a counter", labels=["cluster"]).add_metric([cluster], 7)
            Info("lagwatch_i", "an info", labels=["cluster", "v"]).add_metric([cluster, "15"], {})
            Histogram("lagwatch_h_seconds", "a histogram", labels=["cluster"]).add_metric(
                [cluster], list(zip(les, counts.cumulative, strict=True)), counts.total, counts.native)
            Histogram("lagwatch_classic_seconds", "classic only", labels=["cluster"]).add_metric(
                [cluster], [("0.5", 1), ("+Inf", 3)], 2.25)
            Summary("lagwatch_s_seconds", "a summary", labels=["cluster"]).add_metric(
                [cluster], [("0.5", 0.25), ("1", 2.0)], 3, 4.5)
        Gauge("lagwatch_empty", "declared, no series", labels=["cluster"])
        Gauge("lagwatch_plain", "no labels", 4.0)
    return list(made.values())


def test_every_kind_reads_back_as_written() -> None:
    fams = families()
    read = {f.name: f for f in decode(render_protobuf(fams))}
    assert "lagwatch_empty" not in read  # a MetricFamily needs a metric: declared by the text formats only
    kinds = metrics_pb2.MetricType
    x = read["lagwatch_x_seconds"]
    assert (x.type, x.help, x.unit) == (kinds.Value("GAUGE"), "help", "seconds")
    values = {tuple((p.name, p.value) for p in m.label): m.gauge.value for m in x.metric}
    assert values[(("cluster", NASTY), ("state", "up"))] == math.inf
    assert values[(("cluster", NASTY), ("state", "a"))] == 1.5
    assert math.isnan(values[(("cluster", "c1"), ("state", "b"))]) and len(values) == 6
    n = read["lagwatch_n_total"]  # a counter's family carries its samples' name, as client_golang's does
    assert n.type == kinds.Value("COUNTER") and [m.counter.value for m in n.metric] == [7.0, 7.0]
    i = read["lagwatch_i_info"]
    assert i.type == kinds.Value("GAUGE") and [m.gauge.value for m in i.metric] == [1.0, 1.0]
    assert [(p.name, p.value) for p in i.metric[1].label] == [("cluster", NASTY), ("v", "15")]
    s = read["lagwatch_s_seconds"].metric[0].summary
    assert (s.sample_count, s.sample_sum) == (3, 4.5)
    assert [(q.quantile, q.value) for q in s.quantile] == [(0.5, 0.25), (1.0, 2.0)]
    assert read["lagwatch_plain"].metric[0].gauge.value == 4.0 and not read["lagwatch_plain"].metric[0].label
    classic = read["lagwatch_classic_seconds"].metric[0].histogram
    assert (classic.sample_count, classic.sample_sum) == (3, 2.25)
    assert [(b.upper_bound, b.cumulative_count) for b in classic.bucket] == [(0.5, 1)]  # +Inf: from the count
    assert not classic.positive_span and classic.zero_threshold == 0  # no native buckets: a classic histogram


def test_a_native_histogram_reads_back_bucket_for_bucket() -> None:
    h = read_histogram()
    assert h.sample_count == 9 and h.sample_sum == pytest.approx(0.0 + 0.001 + 0.0012 + 0.3 + 0.3001 + 0.31 + 302)
    assert [b.upper_bound for b in h.bucket] == list(LAG_BUCKETS)  # the classic buckets beside
    assert (h.schema, h.zero_threshold, h.zero_count) == (8, 2.0 ** -11, 2)
    # Spans and deltas back to (index, count): what Prometheus does with them.
    buckets, index, count = {}, 0, 0
    deltas = iter(h.positive_delta)
    for n, span in enumerate(h.positive_span):
        index = span.offset if n == 0 else index + span.offset + 1
        for k in range(span.length):
            count += next(deltas)
            buckets[index + k] = count
        index += span.length - 1
    expected: dict[int, int] = {}
    for value in (0.001, 0.0012, 0.3, 0.3001, 0.31, 2.0, 300.0):
        expected[bucket_index(value, 8)] = expected.get(bucket_index(value, 8), 0) + 1
    assert buckets == expected


def read_histogram() -> Any:
    return {f.name: f for f in decode(render_protobuf(families()))}["lagwatch_h_seconds"].metric[0].histogram


def test_a_native_histogram_with_no_sample_is_still_native() -> None:
    h = LagHistogram()
    counts = h.snapshot()
    with collecting() as made:
        Histogram("lagwatch_h_seconds", "empty", labels=["cluster"]).add_metric(
            ["c"], [("+Inf" if b == math.inf else repr(b), c) for b, c in zip(counts.bounds, counts.cumulative,
                                                                             strict=True)],
            counts.total, counts.native)
    (family,) = decode(render_protobuf(made.values()))
    histogram = family.metric[0].histogram
    assert histogram.sample_count == 0 and histogram.zero_threshold > 0
    assert [(s.offset, s.length) for s in histogram.positive_span] == [(0, 0)]
