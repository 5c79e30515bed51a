"""SGLang histogram buckets that make every SLO target a bucket boundary (pure).

SGLang 0.5.23 takes the boundaries of its request-latency histograms from three launch
flags (``sglang/srt/arg_groups/fields/observability.py``; ``nargs="+"`` lists of floats,
in seconds, SGLang's defaults when unset), which tokenizer_manager.py
``init_metric_collector_watchdog`` hands to ``TokenizerMetricsCollector``
(``sglang/srt/observability/metrics_collector.py``):

- ``--bucket-time-to-first-token``: ``sglang:time_to_first_token_seconds``;
- ``--bucket-inter-token-latency``: ``sglang:inter_token_latency_seconds`` **and**
  ``sglang:request_time_per_output_token_seconds`` (the per-request TPOT the per-user
  speed SLO reads: a speed target of S tokens/s is a TPOT boundary of 1/S seconds);
- ``--bucket-e2e-request-latency``: ``sglang:e2e_request_latency_seconds``.

The defaults are coarse where sub-second targets live (TTFT 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2
s ...). :func:`slo_buckets` keeps every default boundary and adds, for each target ``t``
of ``spec.slo`` that a histogram serves, the grid ``t x GRID`` (:data:`GRID`); the target
itself is written exactly. Why this grid, and what it buys:

- **The verdict is exact.** ``t`` is a boundary, and ``histogram_quantile`` interpolates
  inside the bucket that holds the true order statistic ``x`` (docs/slo.md, section 2), so
  the estimate is ``<= t`` exactly when ``x <= t``: ``SLOMet`` never flips on
  interpolation.
- **The error near the target is bounded and stated** (:func:`relative_grid_bound`): the bucket
  holding ``x`` is at most ``0.1 t`` wide for ``x`` in ``(0.9 t, 1.1 t]``, ``0.15 t`` in
  ``(0.75 t, 0.9 t]`` and ``(1.1 t, 1.25 t]``, ``0.25 t`` in ``(0.5 t, 0.75 t]`` and
  ``(1.25 t, 1.5 t]``, ``0.5 t`` in ``(1.5 t, 2 t]``; merged defaults only narrow them.
  The steps grow away from the target because the margin reported there ("missed by
  ...") needs less relative precision than the verdict; beyond ``2 t`` and below
  ``0.5 t`` SGLang's defaults hold.
- **It stays small**: at most 8 boundaries per target, i.e. a few lines per label set.

The flags change only the histograms' boundaries, nothing the PD handshake compares
(disaggregation/common/conn.py), so they stay out of the compat key. An edit of ``spec.slo``
alone restarts no engine: the running decode engines keep the buckets they started with
(``reconcilers/slo_buckets.py``, :func:`replace_bucket_args`) until the role's pods change
for another reason or the user opts in (``spec.rollout.operatorChanges: apply``). They are rendered on
**decode** only: a PD prefill server never records TTFT, ITL or TPOT
(tokenizer_manager.py ``collect_metrics``) and its e2e histogram is not read
(``metrics/slo.py`` ``SOURCES``), so prefill pods do not restart for an SLO edit.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping

from ..api.v1alpha1 import SLOSpec, parse_duration

TTFT_FLAG = "--bucket-time-to-first-token"
ITL_FLAG = "--bucket-inter-token-latency"
E2E_FLAG = "--bucket-e2e-request-latency"
#: The bucket flags, in the order rendered.
BUCKET_FLAGS = (TTFT_FLAG, ITL_FLAG, E2E_FLAG)

#: SGLang 0.5.23's defaults (``TokenizerMetricsCollector.__init__``), seconds; the contract
#: tests compare them with the real collector's histograms.
SGLANG_DEFAULTS: Mapping[str, tuple[float, ...]] = {
    TTFT_FLAG: (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400),
    ITL_FLAG: (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000),
    E2E_FLAG: (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200,
               1800, 2400),
}

#: Multiples of a target added as boundaries (see the module docstring).
GRID = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
#: Grid points are rounded to this many significant digits (relative error <= 5e-6), and
#: boundaries closer than :data:`_SAME` (relative) are one; a target is kept exactly and
#: wins over a default or a grid point.
SIGNIFICANT_DIGITS = 6
_SAME = 1e-5
#: The SLO metrics each flag serves (``spec.slo`` field names).
FLAG_METRICS: Mapping[str, tuple[str, ...]] = {
    TTFT_FLAG: ("ttft",),
    ITL_FLAG: ("itl", "perUserSpeed"),
    E2E_FLAG: ("e2e",),
}
#: The role whose pods get the flags (see the module docstring).
BUCKET_ROLE = "decode"


def target_boundaries(slo: SLOSpec, flag: str) -> tuple[float, ...]:
    """The SLO targets histogram ``flag`` must carry as boundaries, seconds, sorted.

    Latency targets (``ttft``/``itl``/``e2e`` at p50/p90/p99) as durations; per-user speed
    targets S (tokens/s) as the TPOT 1/S (``--bucket-inter-token-latency`` also sets the
    TPOT histogram's buckets). Raises ``KeyError`` for an unknown flag and ``ValueError``
    for a target that is not a duration.
    """
    out: set[float] = set()
    for metric in FLAG_METRICS[flag]:
        targets = getattr(slo, metric)
        if targets is None:
            continue
        for pname in ("p50", "p90", "p99"):
            raw = getattr(targets, pname)
            if raw is None:
                continue
            out.add(1.0 / float(raw) if metric == "perUserSpeed" else parse_duration(raw))
    return tuple(sorted(t for t in out if t > 0 and math.isfinite(t)))


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def merge_boundaries(defaults: Iterable[float], targets: Iterable[float],
                     grid: Iterable[float] = GRID) -> tuple[float, ...]:
    """``defaults`` plus ``t x grid`` for each target ``t``, sorted and deduplicated.

    Targets are kept exactly; grid points are rounded to :data:`SIGNIFICANT_DIGITS`; of
    two boundaries within a relative 1e-5 of each other one stays (a target over any
    other). Non-positive and non-finite values are dropped. Seconds in, seconds out.
    """
    exact = {float(t) for t in targets if t > 0 and math.isfinite(t)}
    others = {float(d) for d in defaults} | {_round(t * g) for t in exact for g in grid if g != 1.0}
    out: list[float] = []
    for v in sorted((v for v in exact | others if v > 0 and math.isfinite(v)), key=lambda v: (v, v not in exact)):
        if out and v - out[-1] <= _SAME * v:
            if v in exact and out[-1] not in exact:
                out[-1] = v
            continue
        out.append(v)
    return tuple(out)


def slo_buckets(slo: SLOSpec | None) -> dict[str, tuple[float, ...]]:
    """Flag -> boundaries (seconds, ascending) for every bucket flag a target of ``slo`` needs.

    A flag whose histograms serve no target of ``slo`` is left out (SGLang keeps its
    default), so does everything without ``slo``. Raises ``ValueError`` for a target that
    is not a duration (the API's pattern refuses those first).
    """
    if slo is None:
        return {}
    out: dict[str, tuple[float, ...]] = {}
    for flag in BUCKET_FLAGS:
        targets = target_boundaries(slo, flag)
        if targets:
            out[flag] = merge_boundaries(SGLANG_DEFAULTS[flag], targets)
    return out


def format_boundary(value: float) -> str:
    """A boundary as a launch-flag token: the shortest text that parses back to ``value``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def bucket_args(slo: SLOSpec | None, role: str) -> list[str]:
    """The ``--bucket-*`` launch flags of ``role`` for ``slo``: ``[flag, v1, v2, ...]`` per
    flag of :func:`slo_buckets`, on :data:`BUCKET_ROLE` only (``[]`` for other roles and
    without targets). Values in seconds, ascending, as SGLang's ``nargs="+"`` float lists
    take them."""
    if role != BUCKET_ROLE:
        return []
    args: list[str] = []
    for flag, bounds in slo_buckets(slo).items():
        args += [flag, *(format_boundary(b) for b in bounds)]
    return args


def replace_bucket_args(args: Iterable[str], slo: SLOSpec | None, role: str) -> tuple[str, ...]:
    """``args`` (a role's SGLang arguments) with its ``--bucket-*`` flags rendered for ``slo`` instead.

    The flags of :func:`bucket_args` are taken out with their values and the ones for
    ``slo`` are put where the first stood (at the end when there was none); every other
    argument keeps its place. Used to keep the buckets the running decode engines were
    started with across an edit of ``spec.slo`` alone (``reconcilers/slo_buckets.py``).
    """
    out: list[str] = []
    at: int | None = None
    skipping = False
    for a in args:
        if a in BUCKET_FLAGS:
            skipping = True
            at = len(out) if at is None else at
            continue
        if skipping and not a.startswith("--"):
            continue
        skipping = False
        out.append(a)
    at = len(out) if at is None else at
    return tuple(out[:at] + bucket_args(slo, role) + out[at:])


def relative_grid_bound(ratio: float, grid: Iterable[float] = GRID) -> float | None:
    """The guaranteed error bound, as a fraction of the target, for a true value at
    ``ratio`` x target: the width of the grid step holding ``ratio`` (None outside the
    grid's span, where SGLang's defaults decide). E.g. 0.1 for ratios in (0.9, 1.1]."""
    g = sorted(grid)
    i = bisect.bisect_left(g, ratio)
    if i == 0 or i >= len(g):
        return None
    return g[i] - g[i - 1]
