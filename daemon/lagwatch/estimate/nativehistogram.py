"""A native (sparse, exponential) histogram of samples since start, as Prometheus keeps them.

Bucket ``i`` of schema ``s`` holds the samples in ``(base**(i-1), base**i]``, where
``base = 2**(2**-s)``: each bucket is a fixed fraction wider than the one below, so one
histogram resolves a caught-up replica's milliseconds and a stopped one's minutes alike,
and PromQL adds histograms of different replicas, clusters and schemas without anyone
having chosen bounds.

The choices, for staleness and cycle durations:

- **Schema 8 to start** (the finest Prometheus takes: each bucket 0.27 % wide, 0.05 ms at
  20 ms, 2.7 ms at 1 s), halved (two buckets merged into one, ``schema - 1``) whenever more
  than ``BUCKET_LIMIT`` buckets hold samples. A replica held near its SLA fills a few
  dozen buckets and keeps sub-millisecond resolution there; one whose lag has ranged from
  milliseconds to minutes settles at schema 3-4 (4-9 %). Cumulative counts only grow, so
  the schema only ever steps down, and Prometheus merges series across such steps.
- **A limit of 160 buckets** a histogram: OpenTelemetry's default for its exponential
  histograms, so that a fleet's 600 replicas stay ~100 kB each scrape in protobuf.
- **A zero bucket up to 2**-11 s (0.49 ms)**: a caught-up replica reads exactly 0, and
  nothing below half a millisecond is lag anyone pages on (the classic histogram's first
  bound is 0.5 ms, too). A power of two, so the threshold is a bucket boundary at every
  schema.

Pure: no clock, no I/O. Hand-written because no maintained Python library keeps native
histograms (prometheus_client does not; OpenTelemetry's SDK keeps its own exponential
histograms for OTLP, not Prometheus's exposition).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from lagwatch.fastinit import fast_init

START_SCHEMA = 8
BUCKET_LIMIT = 160
ZERO_THRESHOLD = 2.0 ** -11

# For schema s: the 2**s lower edges of the buckets within one power of two, as fractions
# in [0.5, 1) (math.frexp's mantissa), so a sample's bucket is found without a log.
_BOUNDS = {s: [2.0 ** (j / 2 ** s - 1) for j in range(2 ** s)] for s in range(START_SCHEMA + 1)}


def bucket_index(value: float, schema: int) -> int:
    """The index of the bucket holding ``value`` (> 0) at ``schema`` (0 to 8): the ``i``
    with ``base**(i-1) < value <= base**i``, exact at every power of two."""
    fraction, exponent = math.frexp(value)
    return bisect.bisect_left(_BOUNDS[schema], fraction) + (exponent - 1) * (1 << schema)


def upper_bound(index: int, schema: int) -> float:
    """The upper bound of bucket ``index`` at ``schema``."""
    return float(2.0 ** (index / (1 << schema)))


@fast_init
@dataclass(frozen=True)
class NativeCounts:
    """One histogram at one moment: its schema, the zero bucket, and each bucket's own count
    (not cumulative) by index, in no particular order."""

    schema: int
    zero_threshold: float
    zero_count: int
    buckets: tuple[tuple[int, int], ...]


class NativeHistogram:
    """Samples since start, in the buckets of the finest schema that keeps them under the limit."""

    def __init__(self, limit: int = BUCKET_LIMIT) -> None:
        self.schema = START_SCHEMA
        self._limit = limit
        self._zero = 0
        self._buckets: dict[int, int] = {}

    def observe(self, value: float) -> None:
        """One sample. A NaN or an infinity has no bucket: it is counted in the histogram's
        count only (the classic buckets' +Inf), as Prometheus's native histograms allow."""
        if not math.isfinite(value):
            return
        if value <= ZERO_THRESHOLD:  # negatives too: staleness and durations never are
            self._zero += 1
            return
        index = bucket_index(value, self.schema)
        buckets = self._buckets
        buckets[index] = buckets.get(index, 0) + 1
        if len(buckets) > self._limit and self.schema > 0:
            self._coarsen()

    def _coarsen(self) -> None:
        """Halve the resolution until the buckets fit: buckets ``2j-1`` and ``2j`` of a schema
        are bucket ``j`` of the next coarser one (``((i - 1) >> 1) + 1``, negatives too)."""
        while len(self._buckets) > self._limit and self.schema > 0:
            merged: dict[int, int] = {}
            for index, count in self._buckets.items():
                target = ((index - 1) >> 1) + 1
                merged[target] = merged.get(target, 0) + count
            self._buckets = merged
            self.schema -= 1

    def snapshot(self) -> NativeCounts:
        # A copy, not sorted: every replica's is taken every cycle, and only a protobuf
        # scrape reads them (render/protobuf.py sorts them then).
        return NativeCounts(self.schema, ZERO_THRESHOLD, self._zero, tuple(self._buckets.items()))
