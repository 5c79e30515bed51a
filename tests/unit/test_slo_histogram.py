"""histogram_quantile and histogram arithmetic against hand-computed Prometheus results."""

from __future__ import annotations

import math

import pytest

from sglang_pd_operator.metrics.histogram import (
    INF,
    Histogram,
    add,
    bucket_width_at,
    cumulative_at,
    histogram_quantile,
    subtract,
)

B = (0.1, 0.2, 0.4, INF)


@pytest.mark.parametrize(("q", "counts", "expected"), [
    (0.5, (10, 30, 40, 40), 0.15),     # rank 20 in (0.1, 0.2]: 0.1 + 0.1 * 10/20
    (0.99, (10, 30, 40, 40), 0.392),   # rank 39.6 in (0.2, 0.4]: 0.2 + 0.2 * 9.6/10
    (0.05, (10, 30, 40, 40), 0.02),    # first bucket starts at 0
    (0.9, (10, 30, 40, 50), 0.4),      # rank 45 lands in +Inf: highest finite bound
    (1.0, (10, 30, 40, 40), 0.4),
    (0.5, (10, 8, 20, 20), 0.1),       # 8 < 10 is lifted to 10 (monotonicity fix)
])
def test_quantile_matches_prometheus_rules(q, counts, expected):
    assert histogram_quantile(q, B, counts) == pytest.approx(expected, rel=1e-12)


def test_quantile_undefined_cases():
    assert histogram_quantile(0.5, B, (0, 0, 0, 0)) is None          # no observations
    assert histogram_quantile(0.5, (0.1, 0.2), (1, 2)) is None       # no +Inf bucket
    assert histogram_quantile(0.5, (INF,), (5,)) is None             # fewer than two buckets
    assert histogram_quantile(float("nan"), B, (1, 2, 3, 3)) is None
    assert histogram_quantile(1.5, B, (1, 2, 3, 3)) == INF
    assert histogram_quantile(-0.1, B, (1, 2, 3, 3)) == -INF


def test_quantile_non_positive_first_bound_and_unsorted_input():
    assert histogram_quantile(0.2, (-1.0, 0.0, INF), (5, 10, 10)) == -1.0
    # unsorted and duplicated bounds are sorted and coalesced first
    assert histogram_quantile(0.5, (0.2, INF, 0.1, 0.2), (20, 40, 10, 10)) == pytest.approx(0.15)


def test_cumulative_at_inverts_quantile():
    counts = (10, 30, 40, 40)
    for q in (0.1, 0.3, 0.5, 0.8, 0.95):
        x = histogram_quantile(q, B, counts)
        assert cumulative_at(x, B, counts) == pytest.approx(q * 40)
    h = Histogram(bounds=B, counts=counts, count=40)
    assert h.fraction_above(0.2) == pytest.approx(0.25)
    assert h.fraction_above(0.3) == pytest.approx(0.125)


def test_subtract_and_counter_reset():
    old = Histogram(B, (5, 10, 20, 20), sum=4.0, count=20)
    new = Histogram(B, (6, 15, 30, 31), sum=7.0, count=31)
    d = subtract(new, old)
    assert d.counts == (1, 5, 10, 11) and d.count == 11 and d.sum == pytest.approx(3.0)
    restarted = Histogram(B, (1, 2, 3, 3), sum=0.5, count=3)   # lower than before: a reset
    assert subtract(restarted, old) == restarted


def test_add_aligns_missing_bounds_from_below():
    full = Histogram(B, (1, 2, 4, 4), count=4)
    sparse = Histogram((0.1, 0.4, INF), (1, 3, 3), count=3)   # lacks le=0.2
    total = add([full, sparse])
    assert total.bounds == B
    # sparse contributes its le=0.1 count (1) at le=0.2
    assert total.counts == (2, 3, 7, 7)
    assert add([]) is None


def test_bucket_width():
    assert bucket_width_at(0.05, B) == pytest.approx(0.1)
    assert bucket_width_at(0.3, B) == pytest.approx(0.2)
    assert bucket_width_at(0.2, B) == pytest.approx(0.1)   # on a bound: the bucket it closes
    assert math.isinf(bucket_width_at(5.0, B))
