"""The families in Prometheus's protobuf exposition: ``io.prometheus.client.MetricFamily``
messages, each after its length (``encoding=delimited``).

The only exposition that carries native histograms to a Prometheus 2.x or 3.x. Written by
hand, from the five message types lagwatch needs (MetricFamily, Metric, LabelPair, the
gauge/counter value, Summary, Histogram with its BucketSpan), rather than through the
``protobuf`` runtime and classes generated from ``metrics.proto``: at a fleet's 57,600
series the runtime builds a message object per series and label and took several times as
long (``bench/exposition.py --protobuf`` measures both on the same families:
docs/benchmarks.md). The encoding rules used (RFC-like in the protobuf docs, "Encoding"):
a field's key is ``field << 3 | wire type`` as a varint; varints carry unsigned integers
and enums, zigzag varints the ``sint`` fields, 8 little-endian bytes a double, and a
length-delimited field (strings, sub-messages, packed repeated ints) its byte length
first. ``tests/unit/test_protobuf.py`` reads every message back with the ``protobuf``
runtime and ``tests/proto/metrics.proto`` (vendored from prometheus/client_model).

Classic histograms are written as client_golang writes them: the buckets without +Inf
(Prometheus adds it from the count). A histogram with native buckets has both: its
schema, zero bucket and spans of positive buckets with each count as a delta from the
one before; one with no sample yet also gets client_golang's no-op span (metrics.proto asks
for it where the zero threshold is 0; lagwatch's is not, so it is only belt and braces).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from lagwatch.render.exposition import Family, NativeBuckets, unit_of

_DOUBLE = struct.Struct("<d").pack
# MetricType enum values
_TYPES = {"counter": 0, "gauge": 1, "summary": 2, "histogram": 4, "info": 1}  # an info is a gauge of 1


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n] if n >= 0 else _varint(n + (1 << 64))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes([i]) for i in range(0x80)]


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class _LabelPairs(dict[tuple[str, str], bytes]):
    """Each label pair as Metric's field 1, encoded once: the same cluster, replica and node
    names recur in every family. Emptied now and then so that it stays small."""

    def __missing__(self, key: tuple[str, str]) -> bytes:
        if len(self) > 100_000:
            self.clear()
        name, value = key
        encoded = self[key] = _field(1, _field(1, name.encode()) + _field(2, value.encode()))
        return encoded


_PAIRS = _LabelPairs()
_GAUGE_KEY, _COUNTER_KEY = b"\x12\x09\x09", b"\x1a\x09\x09"  # field 2 / 3, 9 bytes: field 1, a double


def _labels(names: tuple[str, ...], values: Iterable[str]) -> bytes:
    return b"".join([_PAIRS[pair] for pair in zip(names, values, strict=True)])


def _metric(body: bytes) -> bytes:
    return b"\x22" + _varint(len(body)) + body  # MetricFamily field 4


def _value_metrics(f: Family) -> list[bytes]:
    key = _COUNTER_KEY if f.kind == "counter" else _GAUGE_KEY
    names = f.labelnames
    out = [_metric(_labels(names, labels) + key + _DOUBLE(value)) for labels, value in f.samples]
    if f.groups:
        shared_names, last = names[:-1], names[-1]
        for labels, pairs in f.groups:
            shared = _labels(shared_names, labels)
            out.extend(_metric(shared + _PAIRS[(last, label)] + key + _DOUBLE(value)) for label, value in pairs)
    return out


def _count(field: int, float_field: int, count: float) -> bytes:
    """A count: a varint where it is whole (``sample_count``), else the ``_float`` field."""
    if count.__class__ is int or float(count).is_integer():
        return _varint(field << 3) + _varint(int(count))
    return _varint(float_field << 3 | 1) + _DOUBLE(count)


def _summary_metrics(f: Family) -> list[bytes]:
    out = []
    for labels, quantiles, count, sum_value in f.samples:
        body = [b"\x08" + _varint(int(count)), b"\x11" + _DOUBLE(sum_value)]  # sample_count, sample_sum
        body.extend(_field(3, b"\x09" + _DOUBLE(float(q)) + b"\x11" + _DOUBLE(value)) for q, value in quantiles)
        out.append(_metric(_labels(f.labelnames, labels) + _field(4, b"".join(body))))
    return out


def _native(native: NativeBuckets) -> bytes:
    """Schema (5), zero threshold (6), zero count (7), positive spans (12) and deltas (13)."""
    parts = [b"\x28" + _varint(_zigzag(native.schema)), b"\x31" + _DOUBLE(native.zero_threshold),
             b"\x38" + _varint(native.zero_count)]
    spans: list[bytes] = []
    deltas: list[bytes] = []
    previous_index: int | None = None
    previous_count = 0
    span_start, span_length = 0, 0
    for index, count in sorted(native.buckets):
        if previous_index is not None and index == previous_index + 1:
            span_length += 1
        else:
            if span_length:
                spans.append(_span(span_start, span_length))
            # the first span's offset is its first index; a later one's the gap since the last
            span_start = index if previous_index is None else index - previous_index - 1
            span_length = 1
        deltas.append(_varint(_zigzag(count - previous_count)))
        previous_index, previous_count = index, count
    if span_length:
        spans.append(_span(span_start, span_length))
    else:
        spans.append(_span(0, 0))  # no sample yet: client_golang's no-op span says "native"
    parts.extend(_field(12, span) for span in spans)
    if deltas:
        parts.append(_field(13, b"".join(deltas)))
    return b"".join(parts)


def _span(offset: int, length: int) -> bytes:
    return b"\x08" + _varint(_zigzag(offset)) + b"\x10" + _varint(length)


def _histogram_metrics(f: Family) -> list[bytes]:
    out = []
    for labels, buckets, sum_value, native in f.samples:
        count = buckets[-1][1] if buckets else 0
        body = [_count(1, 4, count)]
        if sum_value is not None:
            body.append(b"\x11" + _DOUBLE(sum_value))
        for le, cumulative in buckets:
            if le == "+Inf":
                continue
            body.append(_field(3, _count(1, 4, cumulative) + b"\x11" + _DOUBLE(float(le))))
        if native is not None:
            body.append(_native(native))
        out.append(_metric(_labels(f.labelnames, labels) + _field(7, b"".join(body))))
    return out


_WRITERS = {"gauge": _value_metrics, "counter": _value_metrics, "info": _value_metrics,
            "histogram": _histogram_metrics, "summary": _summary_metrics}


def family_message(f: Family) -> bytes:
    """One MetricFamily, encoded (without its length)."""
    head = _field(1, f.series.encode()) + _field(2, f.documentation.encode()) + b"\x18" + _varint(_TYPES[f.kind])
    unit = unit_of(f.name)
    return head + b"".join(_WRITERS[f.kind](f)) + (_field(5, unit.encode()) if unit else b"")


def render_protobuf(families: Iterable[Family]) -> bytes:
    """The families as delimited MetricFamily messages. A family with no sample is left out
    (a MetricFamily needs a metric; the text formats still declare it)."""
    out = []
    for f in families:
        if not f.samples and not f.groups:
            continue
        message = family_message(f)
        out.append(_varint(len(message)))
        out.append(message)
    return b"".join(out)
