"""Native histograms (estimate/nativehistogram.py): which bucket a sample falls in, and how
the resolution halves when the buckets would pass the limit. A table, then a property."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lagwatch.estimate.nativehistogram import (
    START_SCHEMA,
    ZERO_THRESHOLD,
    NativeHistogram,
    bucket_index,
    upper_bound,
)


@pytest.mark.parametrize("value, schema, index", [
    (1.0, 0, 0),  # (0.5, 1]: each power of two is a bucket's upper bound, at every schema
    (1.0, 8, 0),
    (2.0, 0, 1),
    (2.0, 8, 256),
    (1.5, 0, 1),
    (1.0001, 8, 1),  # just over 1: the next bucket, (1, 2**(1/256)]
    (2.0 ** (1 / 256), 8, 1),  # exactly a bound: the bucket it closes
    (0.75, 1, 0),  # schema 1: bounds ..., 2**-0.5 = 0.707, 1, ...
    (0.7, 1, -1),
    (0.3, 8, math.ceil(math.log2(0.3) * 256)),
    (600.0, 3, math.ceil(math.log2(600.0) * 8)),
])
def test_a_sample_falls_in_the_bucket_whose_bounds_hold_it(value: float, schema: int, index: int) -> None:
    assert bucket_index(value, schema) == index
    assert upper_bound(index - 1, schema) < value <= upper_bound(index, schema) * (1 + 1e-12)


def test_caught_up_readings_count_in_the_zero_bucket() -> None:
    h = NativeHistogram()
    for value in (0.0, 0.0, ZERO_THRESHOLD, 0.0004):
        h.observe(value)
    h.observe(0.001)
    counts = h.snapshot()
    assert (counts.zero_count, counts.zero_threshold, counts.schema) == (4, 2.0 ** -11, START_SCHEMA)
    assert counts.buckets == ((bucket_index(0.001, 8), 1),)


def test_past_the_limit_the_resolution_halves_and_keeps_every_sample() -> None:
    h = NativeHistogram(limit=4)
    values = [1.0 + i / 256 for i in range(1, 6)]  # five neighbouring schema-8 buckets
    for v in values:
        h.observe(v)
    counts = h.snapshot()
    assert counts.schema == 7 and len(counts.buckets) <= 4
    assert sum(c for _, c in counts.buckets) == 5
    for v in values:  # every sample is in the coarser bucket that holds it
        assert any(i == bucket_index(v, 7) for i, _ in counts.buckets)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-4, max_value=1e4, allow_nan=False), min_size=1, max_size=400))
def test_whatever_comes_the_counts_are_those_of_the_schema_it_ends_at(values: list[float]) -> None:
    """Observed at a fine schema and coarsened as it went, the histogram holds exactly what
    bucketing every sample straight at its final schema gives (the merge is exact)."""
    h = NativeHistogram(limit=20)
    for v in values:
        h.observe(v)
    counts = h.snapshot()
    assert len(counts.buckets) <= 20 or counts.schema == 0
    expected: dict[int, int] = {}
    for v in values:
        if v > ZERO_THRESHOLD:
            key = bucket_index(v, counts.schema)
            expected[key] = expected.get(key, 0) + 1
    assert dict(counts.buckets) == expected
    assert counts.zero_count == sum(1 for v in values if v <= ZERO_THRESHOLD)



def test_a_sample_without_a_bucket_is_left_to_the_count() -> None:
    """NaN and infinities have no native bucket (the classic histogram counts them in +Inf,
    and the exposition's count is the classic one's)."""
    h = NativeHistogram()
    for value in (math.nan, math.inf, 0.5):
        h.observe(value)
    counts = h.snapshot()
    assert counts.zero_count == 0 and counts.buckets == ((bucket_index(0.5, 8), 1),)
