"""Classic (bucketed) Prometheus histograms: the value type and ``histogram_quantile``.

This is the bottom layer of ``sglang_pd_operator.metrics``: pure functions on plain
numbers, imported by ``exposition`` (which builds :class:`Histogram` values from scraped
text) and by ``slo`` (which subtracts and adds them over a window and asks for
percentiles). Nothing here knows about SGLang or Kubernetes.

A histogram is the cumulative form Prometheus exposes: ``bounds`` are the ``le`` upper
bounds in ascending order ending with ``+Inf``, ``counts[i]`` is the number of
observations ``<= bounds[i]``. Units are whatever the metric says (seconds for
``*_seconds``, milliseconds for ``sglang:kv_transfer_latency_ms``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

INF = math.inf

#: Relative difference under which two adjacent bucket counts are treated as equal
#: (floating point noise); the same constant as Prometheus' ``smallDeltaTolerance``
#: (promql/quantile.go).
SMALL_DELTA_TOLERANCE = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308


@dataclass(frozen=True, slots=True)
class Histogram:
    """One classic histogram, cumulative, as exposed (or a delta of two such).

    ``bounds``: ascending ``le`` upper bounds, the last is ``+Inf``.
    ``counts``: cumulative observation counts per bound (same length as ``bounds``).
    ``sum``: sum of observed values, in the metric's unit; ``count``: total observations
    (equal to ``counts[-1]`` for a consistent exposition).
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if len(self.bounds) != len(self.counts):
            raise ValueError(f"{len(self.bounds)} bounds but {len(self.counts)} counts")

    @property
    def total(self) -> float:
        """Number of observations: the ``+Inf`` bucket (or ``count`` without buckets)."""
        return self.counts[-1] if self.counts else self.count

    def quantile(self, q: float) -> float | None:
        """``histogram_quantile(q, self)``; None when there are no observations."""
        return histogram_quantile(q, self.bounds, self.counts)

    def fraction_above(self, threshold: float) -> float | None:
        """Estimated fraction of observations greater than ``threshold`` (0..1).

        Linear interpolation inside the bucket that holds ``threshold``, the same
        assumption ``histogram_quantile`` makes; None without observations.
        """
        total = self.total
        if total <= 0:
            return None
        return max(0.0, min(1.0, 1.0 - cumulative_at(threshold, self.bounds, self.counts) / total))


def cumulative_at(x: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Estimated number of observations ``<= x`` by linear interpolation in its bucket.

    The inverse of :func:`histogram_quantile` (the lowest bucket starts at 0 when its
    bound is positive; above the highest finite bound the ``+Inf`` count is returned).
    """
    i = bisect.bisect_left(bounds, x)
    if i >= len(bounds):
        return counts[-1]
    if bounds[i] == x:
        return counts[i]
    if math.isinf(bounds[i]):  # above the highest finite bound: no resolution there
        return counts[i - 1] if i else 0.0
    lo_bound = bounds[i - 1] if i else 0.0
    lo_count = counts[i - 1] if i else 0.0
    if x <= lo_bound:
        return lo_count
    return lo_count + (counts[i] - lo_count) * (x - lo_bound) / (bounds[i] - lo_bound)


def _almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus' util/almost.Equal for finite, non-negative counts."""
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < _MIN_NORMAL:
        return diff < epsilon * _MIN_NORMAL
    return diff / abs_sum < epsilon


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """The q-quantile of a classic histogram, computed as PromQL's ``histogram_quantile``.

    ``bounds``/``counts`` are cumulative buckets (any order; equal bounds are added up).
    Follows ``BucketQuantile`` in prometheus/prometheus promql/quantile.go (v0.316.0 =
    Prometheus 3.x): q < 0 gives -Inf and q > 1 gives +Inf; without a ``+Inf`` bucket,
    with fewer than two buckets or with zero observations the answer is undefined (Prometheus
    returns NaN, we return None); adjacent counts that differ by a relative 1e-12 are made
    equal and decreasing counts are lifted to the previous one (monotonicity fix); the
    rank ``q * total`` is looked up among all but the ``+Inf`` bucket; a rank that falls in
    the ``+Inf`` bucket returns the highest finite bound; a rank in the first bucket
    interpolates from 0 unless that bound is <= 0 (then the bound itself); otherwise it
    interpolates linearly between the bucket's lower and upper bound.
    Units are those of the bounds (e.g. seconds).
    """
    if math.isnan(q):
        return None
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if not bounds:
        return None
    pairs = sorted(zip(bounds, counts), key=lambda p: p[0])
    if not math.isinf(pairs[-1][0]):
        return None
    # coalesce equal upper bounds
    merged: list[list[float]] = []
    for bound, count in pairs:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, float(count)])
    # ensureMonotonicAndIgnoreSmallDeltas
    prev = merged[0][1]
    for item in merged[1:]:
        curr = item[1]
        if curr == prev:
            continue
        if _almost_equal(prev, curr, SMALL_DELTA_TOLERANCE) or curr < prev:
            item[1] = prev
            continue
        prev = curr
    if len(merged) < 2:
        return None
    observations = merged[-1][1]
    if observations == 0:
        return None
    rank = q * observations
    last = len(merged) - 1
    b = last
    for i in range(last):  # sort.Search over all but the +Inf bucket
        if merged[i][1] >= rank:
            b = i
            break
    if b == last:
        return merged[last - 1][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start = 0.0
    end = merged[b][0]
    count = merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    if count == 0:  # only reachable for q == 0 on an empty first bucket
        return start
    return start + (end - start) * (rank / count)


def bucket_width_at(x: float, bounds: Sequence[float]) -> float:
    """Width of the bucket that holds ``x`` (the resolution of a quantile there).

    The first bucket spans ``[0, bounds[0]]``; a value above the highest finite bound
    has unbounded resolution (``inf``).
    """
    finite = [b for b in bounds if not math.isinf(b)]
    i = bisect.bisect_left(finite, x)
    if i >= len(finite):
        return INF
    return finite[i] - (finite[i - 1] if i else 0.0)


def _add(a: Sequence[float], b: Sequence[float], sign: float) -> tuple[float, ...]:
    return tuple(x + sign * y for x, y in zip(a, b))


def subtract(newer: Histogram, older: Histogram) -> Histogram:
    """``newer - older`` bucket by bucket, with counter-reset handling like ``increase()``.

    When any cumulative count (or the sum's count) went down, the target restarted
    between the two scrapes: the newer value is then the increase since the reset
    (Prometheus promql/functions.go ``extrapolatedRate`` adds the pre-reset value back,
    which for two samples amounts to the same). Both must share ``bounds``; when they
    do not (the target changed its buckets, i.e. a new process), the newer value is
    returned whole. Returns a delta :class:`Histogram` with non-negative counts.
    """
    if newer.bounds != older.bounds:
        return newer
    if newer.count < older.count or any(n < o for n, o in zip(newer.counts, older.counts)):
        return newer
    return Histogram(
        bounds=newer.bounds,
        counts=_add(newer.counts, older.counts, -1.0),
        sum=max(0.0, newer.sum - older.sum),
        count=newer.count - older.count,
    )


def add(histograms: Iterable[Histogram]) -> Histogram | None:
    """Sum of histograms (``sum by (le)``); buckets are aligned on the union of bounds.

    A histogram that lacks a bound contributes its count at the next lower bound it has
    (cumulative counts only grow with the bound, so that is a lower estimate that keeps
    the sum monotonic). Returns None for an empty input.
    """
    items = list(histograms)
    if not items:
        return None
    first = items[0]
    if all(h.bounds == first.bounds for h in items[1:]):
        counts = list(first.counts)
        total_sum, total_count = first.sum, first.count
        for h in items[1:]:
            for i, c in enumerate(h.counts):
                counts[i] += c
            total_sum += h.sum
            total_count += h.count
        return Histogram(bounds=first.bounds, counts=tuple(counts), sum=total_sum, count=total_count)
    union = tuple(sorted({b for h in items for b in h.bounds}))
    counts = [0.0] * len(union)
    for h in items:
        for i, bound in enumerate(union):
            counts[i] += _count_at_or_below(bound, h)
    return Histogram(
        bounds=union, counts=tuple(counts),
        sum=sum(h.sum for h in items), count=sum(h.count for h in items),
    )


def _count_at_or_below(bound: float, h: Histogram) -> float:
    i = bisect.bisect_right(h.bounds, bound)
    return h.counts[i - 1] if i else 0.0


def align(h: Histogram, bounds: tuple[float, ...]) -> Histogram:
    """``h`` re-expressed on ``bounds`` (a superset of its own), as :func:`add` does."""
    if h.bounds == bounds:
        return h
    return Histogram(bounds=bounds, counts=tuple(_count_at_or_below(b, h) for b in bounds),
                     sum=h.sum, count=h.count)
