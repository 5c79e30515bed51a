"""SLO evaluation of a PDDeployment from its pods' scraped SGLang metrics.

The reconciler scrapes every ready pod each interval and hands the text to
:meth:`SLOEvaluator.observe`; once per interval it calls :meth:`SLOEvaluator.evaluate`
with the deployment's ``spec.slo`` and gets a frozen :class:`SLOResult` to write into
status, conditions and events, and to publish through ``operator_metrics``. This module
keeps the only state of the SLO machinery; it does no I/O and reads no clock (``now`` is
always passed in, in seconds, any monotonic or Unix time base used consistently).

How a percentile is measured (the same as ``histogram_quantile(q, sum by (le)
(increase(<metric>_bucket[window])))`` in Prometheus, without extrapolation):

1. Each pod's exposition is summed over its labels (``exposition.parse_exposition``).
2. The increase since that pod's previous scrape is taken bucket by bucket; a count that
   went down, a newer ``*_created`` timestamp or a new pod UID means the process restarted,
   and the new cumulative value is then the increase (Prometheus ``increase()``).
   The first scrape of a pod is only a baseline, unless its ``*_created`` timestamp says
   the series started inside the retained window (then everything counts).
3. Increases of all pods of a role that arrive within ``resolution_s`` of each other are
   added into one time slot; the window's histogram is the sum of the slots newer than
   ``now - window``. This is equivalent to keeping each pod's cumulative snapshots and
   subtracting the one at the window start, at a fraction of the memory.
4. ``histogram.histogram_quantile`` interpolates as Prometheus does.

Which role each metric is read from, and why, is in :data:`SOURCES` and docs/slo.md.

Objective, attainment and burn rate: every :meth:`evaluate` call is one evaluation
interval; it is *good* when every target that has data is met, *bad* when one is missed,
and not counted when there was no traffic. ``attainment`` is the fraction of good
intervals among the counted ones over the last ``window``. The error budget is
``1 - objective``; the burn rate over a period is (bad fraction in it) / (1 - objective).
Burn windows follow the multi-window method of Google's SRE Workbook ("Alerting on
SLOs": page on 1h and 5m both above 14.4, ticket on 6h and 30m both above 6, for a 30-day
SLO), scaled so that the short page window equals the spec's ``window``: page = (12 W, W),
ticket = (72 W, 6 W); with W = 5m these are exactly 1h/5m and 6h/30m, and the implied
compliance period is 8640 W (30 days at 5m), so the thresholds keep their meaning
(14.4 = 2% of the budget in 12 W, 6 = 5% in 72 W).

Memory is bounded whatever the window and the scrape interval: increases sit in at most
:data:`SLOTS_PER_WINDOW` slots per window and role, outcomes in at most
:data:`OUTCOME_BINS_PER_WINDOW` bins per window for the last :data:`FINE_OUTCOME_WINDOWS`
(12) windows and in bins one window wide before that (72 windows kept, 32 bytes a bin);
a slot or fine bin is never narrower than ``resolution_s``, so at the default 5m window
both are exactly as before (one per scrape) and only the 72-window burn window's edge
moves, by at most one window. ``spec.slo.window`` is at most ``MAX_SLO_WINDOW`` (1h) besides.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sglang_pd_operator.api.v1alpha1 import SLOSpec, parse_duration
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import Histogram, add, align, bucket_width_at, subtract

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_AGGREGATED = "aggregated"
ROLE_GATEWAY = "gateway"
ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_AGGREGATED, ROLE_GATEWAY)

PERCENTILES: Mapping[str, float] = {"p50": 0.50, "p90": 0.90, "p99": 0.99}

UNIT_SECONDS = "seconds"
UNIT_TOKENS_PER_SECOND = "tokens_per_second"


@dataclass(frozen=True)
class Source:
    """Where one SLO metric is read: a histogram family, from the first role that has pods."""

    family: str
    roles: tuple[str, ...]


#: SLO metric (the ``spec.slo`` field name) -> source. Under PD every request latency
#: comes from decode: SGLang 0.5.23's tokenizer manager never records TTFT, ITL or TPOT
#: on a PD prefill server ("PD prefill workers never observe TTFT"), and the e2e latency a
#: prefill server records covers only its prefill. smg sends each request to prefill and
#: decode at the same moment, so decode's clock starts when the request arrives and its
#: first token comes after prefill + KV transfer: decode's TTFT is the user's TTFT minus
#: the gateway hop. Aggregated (non-PD) servers record everything themselves.
SOURCES: Mapping[str, Source] = {
    "ttft": Source(ex.TTFT, (ROLE_DECODE, ROLE_AGGREGATED)),
    "itl": Source(ex.ITL, (ROLE_DECODE, ROLE_AGGREGATED)),
    "e2e": Source(ex.E2E, (ROLE_DECODE, ROLE_AGGREGATED)),
    "perUserSpeed": Source(ex.TPOT, (ROLE_DECODE, ROLE_AGGREGATED)),
}
#: Alternative source: the gateway's own TTFT (includes the gateway hop; smg 1.13).
GATEWAY_TTFT_SOURCE = Source(ex.SMG_TTFT, (ROLE_GATEWAY,))

_FAILURES = {ex.TRANSFER_FAILED: ex.Kind.COUNTER, ex.BOOTSTRAP_FAILED: ex.Kind.COUNTER}
#: Families read from each role's pods besides the SLO sources (added per spec, see
#: :meth:`SLOEvaluator.families_for`), exactly what the evaluator uses: the PD failure
#: counters on both roles (each side counts what it detects, every scheduler rank of a DP
#: shard the same requests: read once per shard, see ``exposition``), the KV transfer latency
#: histogram on prefill (only prefill records it), and on decode the finished-request
#: counter (denominator of the failure ratio) and the speculative accept length.
#: Queue gauges are not read by default: they are per DP rank (and per priority with
#: priority scheduling) and feed only dashboards, which read them through the PodMonitor.
#: ``SLOEvaluator.families`` can add them back (``families_for`` then includes them).
ROLE_FAMILIES: Mapping[str, Mapping[str, ex.Kind]] = {
    ROLE_PREFILL: {**_FAILURES, ex.KV_TRANSFER_LATENCY_MS: ex.Kind.HISTOGRAM},
    ROLE_DECODE: {**_FAILURES, ex.REQUESTS: ex.Kind.COUNTER, ex.SPEC_ACCEPT_LENGTH: ex.Kind.GAUGE},
    ROLE_AGGREGATED: {**_FAILURES, ex.REQUESTS: ex.Kind.COUNTER, ex.SPEC_ACCEPT_LENGTH: ex.Kind.GAUGE},
    ROLE_GATEWAY: {},
}
SLO_METRICS = ("ttft", "itl", "e2e", "perUserSpeed")
#: The load gauges the built-in planner reads per role (``spec.autoscaling``), SGLang 0.5.23's
#: SchedulerMetricsCollector (sglang/srt/observability/metrics_collector.py): the running batch,
#: the waiting queue and the KV pool fill on both roles; the PD bootstrap and inflight queues on
#: prefill, the prealloc and transfer queues on decode (disaggregation/prefill.py, decode.py).
#: planning/planner.py says what each one tells. Added to a role's families only for a
#: deployment with ``spec.autoscaling`` (``scraper.deployment_targets``).
LOAD_FAMILIES: Mapping[str, Mapping[str, ex.Kind]] = {
    ROLE_PREFILL: {ex.RUNNING_REQS: ex.Kind.GAUGE, ex.QUEUE_REQS: ex.Kind.GAUGE, ex.TOKEN_USAGE: ex.Kind.GAUGE,
                   ex.PREFILL_BOOTSTRAP_QUEUE: ex.Kind.GAUGE, ex.PREFILL_INFLIGHT_QUEUE: ex.Kind.GAUGE},
    ROLE_DECODE: {ex.RUNNING_REQS: ex.Kind.GAUGE, ex.QUEUE_REQS: ex.Kind.GAUGE, ex.TOKEN_USAGE: ex.Kind.GAUGE,
                  ex.DECODE_PREALLOC_QUEUE: ex.Kind.GAUGE, ex.DECODE_TRANSFER_QUEUE: ex.Kind.GAUGE},
}


@dataclass(frozen=True)
class BurnWindow:
    """One window of the multi-window burn-rate method.

    ``name``: ``page_short`` | ``page_long`` | ``ticket_short`` | ``ticket_long``;
    ``seconds``: its length; ``threshold``: the burn rate above which (in both windows of
    the pair) the alert fires.
    """

    name: str
    seconds: float
    threshold: float

    @property
    def pair(self) -> str:
        """``page`` or ``ticket``."""
        return self.name.split("_")[0]

    @property
    def length(self) -> str:
        """``short`` or ``long``."""
        return self.name.split("_")[1]


#: Multiples of the spec window and thresholds (SRE Workbook, ch. 5, table 5-8).
PAGE_LONG_WINDOWS, PAGE_SHORT_WINDOWS, PAGE_THRESHOLD = 12, 1, 14.4
TICKET_LONG_WINDOWS, TICKET_SHORT_WINDOWS, TICKET_THRESHOLD = 72, 6, 6.0


def burn_windows(window_s: float) -> tuple[BurnWindow, ...]:
    """The four burn-rate windows for a spec window of ``window_s`` seconds (see module doc)."""
    return (
        BurnWindow("page_short", PAGE_SHORT_WINDOWS * window_s, PAGE_THRESHOLD),
        BurnWindow("page_long", PAGE_LONG_WINDOWS * window_s, PAGE_THRESHOLD),
        BurnWindow("ticket_short", TICKET_SHORT_WINDOWS * window_s, TICKET_THRESHOLD),
        BurnWindow("ticket_long", TICKET_LONG_WINDOWS * window_s, TICKET_THRESHOLD),
    )


def format_duration(seconds: float) -> str:
    """Shortest ``h``/``m``/``s``/``ms`` spelling of a duration (e.g. 3600 -> ``1h``)."""
    if seconds <= 0:
        return "0s"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


# ---------------------------------------------------------------------- result types
@dataclass(frozen=True)
class TargetResult:
    """One SLO target (e.g. TTFT p90) over the window.

    ``metric``: the spec field (``ttft`` | ``itl`` | ``e2e`` | ``perUserSpeed``);
    ``percentile``: ``p50`` | ``p90`` | ``p99``; ``unit``: ``seconds`` for latencies,
    ``tokens_per_second`` for speed. ``measured``: None without observations.
    ``met``: latency ``measured <= target``, speed ``measured >= target``; None unknown.
    ``margin``: how far on the good side, in ``unit`` (latency ``target - measured``,
    speed ``measured - target``); negative means missed by that much.
    ``resolution``: width of the histogram bucket the measurement fell in (the bound of
    its interpolation error), in ``unit``. ``observations``: requests (or tokens for ITL)
    counted in the window. ``source_role`` / ``source_metric``: where it was read.
    """

    metric: str
    percentile: str
    unit: str
    target: float
    measured: float | None
    met: bool | None
    margin: float | None
    resolution: float | None
    observations: float
    source_role: str | None
    source_metric: str

    def describe(self) -> str:
        """Human text, e.g. ``ttft p90 1.2s > target 800ms by 400ms``."""
        fmt = _fmt_value if self.unit == UNIT_SECONDS else (lambda v: f"{v:.3g} tokens/s")
        if self.measured is None:
            return f"{self.metric} {self.percentile}: no data"
        cmp = ("<=" if self.met else ">") if self.unit == UNIT_SECONDS else (">=" if self.met else "<")
        text = f"{self.metric} {self.percentile} {fmt(self.measured)} {cmp} target {fmt(self.target)}"
        if not self.met and self.margin is not None:
            text += f" by {fmt(abs(self.margin))}"
        return text


def _fmt_value(seconds: float) -> str:
    if math.isinf(seconds):
        return "+Inf"
    if seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    return f"{seconds:.3g}s"


@dataclass(frozen=True)
class BurnRate:
    """Burn rate over one :class:`BurnWindow`; ``value`` None when no interval was counted."""

    window: BurnWindow
    value: float | None
    intervals: int


@dataclass(frozen=True)
class KVTransferResult:
    """PD KV transfer health over the window.

    Latency percentiles in SECONDS (converted from ``sglang:kv_transfer_latency_ms`` of the
    prefill pods), None without transfers. ``transfers``: requests whose KV moved.
    ``failures``: transfer + bootstrap failures counted on prefill and decode pods in the
    window; ``failures_per_second`` over the window; ``failure_ratio``: failures per request
    finished by decode (None when decode finished none). Each request counts once although
    every scheduler of its DP shard records it (its attention-TP ranks, and its PP stages:
    disaggregation/prefill.py ``handle_inflight_transfer_failure``, decode.py
    ``_record_transfer_failure``, each after an all-reduced poll, on every rank since
    ``metrics_reporter.enable_metrics`` is engine-wide): ``exposition.parse_exposition``
    reads one series per DP shard (``exposition.group_by_shard``).
    """

    latency_seconds: Mapping[str, float | None]
    transfers: float
    transfer_failures: float
    bootstrap_failures: float
    failures_per_second: float
    failure_ratio: float | None

    @property
    def failures(self) -> float:
        """All transfer and bootstrap failures in the window."""
        return self.transfer_failures + self.bootstrap_failures


@dataclass(frozen=True)
class RoleSummary:
    """Latest gauges of one role, summed over its pods seen within the window.

    ``queues``: gauge name without ``sglang:`` -> requests (``num_queue_reqs``,
    ``num_running_reqs``, the PD bootstrap/inflight/prealloc/transfer queues), each DP
    rank's total once (with priority scheduling its ``priority=""`` series, see
    ``exposition.parse_exposition``).
    ``spec_accept_length``: mean over pods and DP ranks, None when not exposed.
    ``token_usage``: the KV pool's fill (``sglang:token_usage``), mean over pods and DP
    ranks, None when not read.
    """

    role: str
    pods: int
    queues: Mapping[str, float]
    spec_accept_length: float | None
    token_usage: float | None = None


@dataclass(frozen=True)
class SLOResult:
    """The outcome of one evaluation of a PDDeployment's SLO (see the module doc).

    ``deployment``: the key given to the evaluator (``namespace/name``). ``met``: True
    when every target with data is met, False when one is missed, None (Unknown) when no
    target has data. ``no_traffic``: no request finished in the window on the source role.
    ``attainment``: good intervals / counted intervals over the window, None when none
    was counted. ``burn_rates``: the four :class:`BurnRate` (see ``burn_windows``).
    """

    deployment: str
    evaluated_at: float
    window_seconds: float
    objective: float
    targets: tuple[TargetResult, ...]
    met: bool | None
    no_traffic: bool
    attainment: float | None
    burn_rates: tuple[BurnRate, ...]
    kv_transfer: KVTransferResult
    roles: Mapping[str, RoleSummary] = field(default_factory=dict)

    @property
    def violations(self) -> tuple[TargetResult, ...]:
        """Targets that were missed, worst (most negative relative margin) first."""
        missed = [t for t in self.targets if t.met is False]
        return tuple(sorted(missed, key=lambda t: (t.margin or 0.0) / t.target))

    def burn_rate(self, name: str) -> float | None:
        """Value of the burn rate named ``page_short``, ``page_long``, ... (None unknown)."""
        for b in self.burn_rates:
            if b.window.name == name:
                return b.value
        raise KeyError(name)

    @property
    def burn_rate_short(self) -> float | None:
        """Burn rate over the short page window (= the spec window)."""
        return self.burn_rate("page_short")

    @property
    def burn_rate_long(self) -> float | None:
        """Burn rate over the long page window (12 x the spec window)."""
        return self.burn_rate("page_long")

    def alert_firing(self, pair: str) -> bool:
        """True when both windows of ``pair`` (``page`` | ``ticket``) exceed its threshold."""
        rates = [b for b in self.burn_rates if b.window.pair == pair]
        return bool(rates) and all(b.value is not None and b.value > b.window.threshold for b in rates)

    def to_status(self) -> dict[str, Any]:
        """The compact ``status.slo`` block (camelCase, durations as strings, rounded).

        Latencies are formatted like the spec with three significant digits (``812ms``),
        speeds in tokens/s to three significant digits, attainment to 0.001, burn rates to
        two significant digits, so that a status write happens only when a figure moved
        visibly. Unknown values are left out (no ``null`` in status).
        """
        targets = []
        for t in self.targets:
            fmt = _fmt_value if t.unit == UNIT_SECONDS else _round_speed
            entry: dict[str, Any] = {"metric": t.metric, "percentile": t.percentile, "target": fmt(t.target)}
            if t.measured is not None:
                entry["measured"] = fmt(t.measured)
            if t.met is not None:
                entry["met"] = t.met
            if t.source_role:
                entry["sourceRole"] = t.source_role
            targets.append({k: v for k, v in entry.items() if v is not None})
        kv_p90 = self.kv_transfer.latency_seconds.get("p90")
        block = {
            "met": self.met,
            "noTraffic": self.no_traffic,
            "window": format_duration(self.window_seconds),
            "attainment": None if self.attainment is None else round(self.attainment, 3),
            "objective": self.objective,
            "burnRateShort": _significant(self.burn_rate_short, 2),
            "burnRateLong": _significant(self.burn_rate_long, 2),
            "targets": targets,
            "kvTransferFailures": int(round(self.kv_transfer.failures)),
            "kvTransferLatencyP90": None if kv_p90 is None else _fmt_value(kv_p90),
        }
        return {k: v for k, v in block.items() if v is not None}


def _significant(value: float | None, digits: int) -> float | None:
    """``value`` rounded to ``digits`` significant digits (None and non-finite values: None)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _round_speed(value: float) -> float | None:
    return _significant(value, 3)


def slo_condition(result: SLOResult) -> dict[str, str]:
    """The ``SLOMet`` condition (type/status/reason/message) for a result.

    True / ``TargetsMet``; False / ``TargetMissed`` naming every missed target and by how
    much; Unknown / ``NoTraffic`` when nothing was measured.
    """
    window = format_duration(result.window_seconds)
    if result.met is None:
        # true of a deployment younger than the window too (a fresh user's finding), and the same
        # words at any age: a message that changed once a window had passed would be a status
        # write per deployment a window after every operator start
        return {"type": "SLOMet", "status": "Unknown", "reason": "NoTraffic",
                "message": f"no request finished in the last {window} (or since measuring began, if later); "
                           "nothing to measure"}
    if result.met:
        return {"type": "SLOMet", "status": "True", "reason": "TargetsMet",
                "message": "; ".join(t.describe() for t in result.targets if t.met) + f" (window {window})"}
    return {"type": "SLOMet", "status": "False", "reason": "TargetMissed",
            "message": "; ".join(t.describe() for t in result.violations) + f" (window {window})"}


# ---------------------------------------------------------------------- internal state
@dataclass
class _Pod:
    uid: str | None
    seen_at: float
    histograms: dict[str, Histogram]
    counters: dict[str, float]
    created: dict[str, float]
    gauges: Mapping[str, ex.GaugeValue]


@dataclass
class _Slot:
    t: float
    histograms: dict[str, Histogram]
    counters: dict[str, float]


@dataclass
class _Role:
    pods: dict[str, _Pod] = field(default_factory=dict)
    slots: list[_Slot] = field(default_factory=list)  # ordered by t


class _OutcomeBins:
    """One deployment's evaluation outcomes in time bins, oldest first, as parallel arrays.

    Bin ``i``: ``first[i]`` / ``last[i]`` evaluation time in it, ``good[i]`` and
    ``counted[i]`` intervals. The first ``coarse`` bins are coarse (one window wide: older
    than the page alert's long window, only the ticket's long window reads them), the rest
    fine (``OUTCOME_BINS_PER_WINDOW`` per window). ``last_outcome`` is the newest
    interval's outcome, so that the same ``now`` again replaces it. 32 bytes a bin (a
    bin as a Python object with two floats took about 100).
    """

    __slots__ = ("first", "last", "good", "counted", "coarse", "last_outcome")

    def __init__(self) -> None:
        self.first, self.last = array("d"), array("d")
        self.good, self.counted = array("q"), array("q")
        self.coarse = 0
        self.last_outcome: bool | None = None

    def __len__(self) -> int:
        return len(self.first)

    def record(self, now: float, met: bool | None, width: float) -> None:
        """Add the outcome of the interval ending at ``now`` to the newest fine bin when it is
        less than ``width`` seconds old, else to a new one; the same ``now`` again replaces it.
        An interval that is not counted (``met`` None) adds no bin: it changes no count."""
        n = len(self.first)
        if n > self.coarse and self.last[-1] == now:
            if self.last_outcome is not None:
                self.counted[-1] -= 1
                self.good[-1] -= self.last_outcome
            if self.first[-1] == now:  # the bin holds only this interval
                self._delete(n - 1)
                n -= 1
            self.last_outcome = None
        if met is None:  # not counted: no bin (an idle deployment's outcomes hold nothing)
            return
        if not (n > self.coarse and now - self.first[-1] < width and now >= self.last[-1]):
            for a, v in ((self.first, now), (self.last, now), (self.good, 0), (self.counted, 0)):
                a.append(v)
        self.last[-1], self.last_outcome = now, met
        if met is not None:
            self.counted[-1] += 1
            self.good[-1] += met

    def age(self, now: float, *, fine_s: float, coarse_width: float) -> None:
        """Fine bins that began ``fine_s`` or more before ``now`` become coarse: merged into the
        newest coarse bin while it spans less than ``coarse_width``."""
        while self.coarse < len(self.first) and self.first[self.coarse] <= now - fine_s:
            i = self.coarse
            if i and self.first[i] - self.first[i - 1] < coarse_width:
                self.last[i - 1] = max(self.last[i - 1], self.last[i])
                self.good[i - 1] += self.good[i]
                self.counted[i - 1] += self.counted[i]
                self._delete(i)
            else:
                self.coarse += 1

    def expire(self, now: float, horizon_s: float) -> None:
        """Drop the bins whose last interval ended ``horizon_s`` or more before ``now``."""
        k = 0
        while k < len(self.last) and self.last[k] <= now - horizon_s:
            k += 1
        if k:
            for a in (self.first, self.last, self.good, self.counted):
                del a[:k]
            self.coarse = max(0, self.coarse - k)

    def count(self, now: float, window_s: float) -> tuple[int, int]:
        """(good, counted) intervals in ``(now - window_s, now]``, by bin (a bin counts when its
        first evaluation is inside: edges are exact to one bin width)."""
        good = counted = 0
        for i in range(len(self.first) - 1, -1, -1):
            if self.first[i] <= now - window_s:
                break
            if self.first[i] > now:
                continue
            counted += self.counted[i]
            good += self.good[i]
        return good, counted

    def _delete(self, i: int) -> None:
        for a in (self.first, self.last, self.good, self.counted):
            del a[i]


@dataclass
class _Deployment:
    roles: dict[str, _Role] = field(default_factory=dict)
    outcomes: _OutcomeBins = field(default_factory=_OutcomeBins)
    retention_s: float = 0.0
    first_seen: float | None = None
    #: (spec, result) of the last evaluation while the deployment held no data (:meth:`SLOEvaluator.evaluate`)
    quiet: tuple[SLOSpec, SLOResult] | None = None

    def holds_data(self) -> bool:
        """Whether anything an evaluation reads is here: a pod's snapshot, an increase, a counted outcome."""
        return bool(len(self.outcomes)) or any(s.pods or s.slots for s in self.roles.values())


#: Memory bound: increases are kept in at most this many time slots per window and role,
#: and outcomes in at most this many bins per window for the last
#: ``FINE_OUTCOME_WINDOWS`` windows, then in bins one window wide (72 windows are kept
#: for the burn rates), whatever the window and the scrape interval. A slot or bin is
#: never narrower than the evaluator's ``resolution_s``; window edges are exact to one
#: slot or bin width: the attainment window and the burn windows up to 12 windows to a
#: fine bin, the ticket's 72-window burn window to one window (1/72 of it).
SLOTS_PER_WINDOW = 120
OUTCOME_BINS_PER_WINDOW = 60
#: Windows of fine outcome bins: the page alert's long window (12 W), the longest but one.
FINE_OUTCOME_WINDOWS = PAGE_LONG_WINDOWS


def _merge_hist(into: dict[str, Histogram], name: str, h: Histogram) -> None:
    old = into.get(name)
    into[name] = h if old is None else add((old, h))  # type: ignore[assignment]


def _delta(new: Histogram, old: Histogram) -> Histogram:
    if new.bounds != old.bounds:
        union = tuple(sorted(set(new.bounds) | set(old.bounds)))
        return subtract(align(new, union), align(old, union))
    return subtract(new, old)


class SLOEvaluator:
    """Windowed SLO state for all PDDeployments; see the module docstring.

    ``default_retention_s``: how long per-interval increases are kept for a deployment
    that was never evaluated (afterwards: its spec window). ``resolution_s``: scrapes of
    one role closer than this are added into one time slot (window edges are exact to
    this much). Not thread-safe: call from one task (kopf timers run on one event loop).
    """

    def __init__(self, *, default_retention_s: float = 900.0, resolution_s: float = 5.0,
                 sources: Mapping[str, Source] | None = None) -> None:
        self._deployments: dict[str, _Deployment] = {}
        self._default_retention_s = default_retention_s
        self._resolution_s = resolution_s
        self.sources: Mapping[str, Source] = dict(sources or SOURCES)
        #: role -> the families parsed from its pods (ROLE_FAMILIES plus the SLO sources)
        self.families: dict[str, dict[str, ex.Kind]] = {r: dict(f) for r, f in ROLE_FAMILIES.items()}
        for source in self.sources.values():
            for role in source.roles:
                self.families[role][source.family] = ex.Kind.HISTOGRAM

    def families_for(self, role: str, slo_spec: SLOSpec | None) -> dict[str, ex.Kind]:
        """The families to read from ``role``'s pods for ``slo_spec``: :attr:`families` of
        the role (:data:`ROLE_FAMILIES` plus whatever was added, e.g. the queue gauges)
        without the SLO source histograms ``slo_spec`` does not target (all of them without
        a spec). The scraper parses exactly these from each pod's page and asks a target
        that honours ``name[]`` for ``exposition.sample_names`` of them. Raises
        ``KeyError`` for an unknown role."""
        out = dict(self.families[role])
        for metric in SLO_METRICS:
            source = self.sources[metric]
            if role not in source.roles:
                continue
            if slo_spec is not None and getattr(slo_spec, metric) is not None:
                out[source.family] = ex.Kind.HISTOGRAM
            elif not any(m != metric and self.sources[m].family == source.family and slo_spec is not None
                         and getattr(slo_spec, m) is not None for m in SLO_METRICS):
                out.pop(source.family, None)
        return out

    # ------------------------------------------------------------------ observe
    def observe(self, deployment_key: str, role: str, pod_name: str, exposition_text: str,
                now: float, *, pod_uid: str | None = None) -> ex.Scrape:
        """Take one pod's ``/metrics`` text scraped at ``now`` (seconds).

        ``deployment_key``: ``namespace/name``; ``role``: one of :data:`ROLES`;
        ``pod_uid``: when given, a changed UID for the same pod name is a restart.
        ``now`` should be Unix time when targets expose ``*_created`` series (then the first
        scrape of a series born within the retained window counts whole); with another
        time base those timestamps are ignored and a first scrape is only a baseline.
        Returns the parsed :class:`exposition.Scrape`. Raises ``ValueError`` for an
        unknown role and ``exposition.ExpositionError`` for unparsable text (the pod's
        previous state is kept).
        """
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        scrape = ex.parse_exposition(exposition_text, families=self.families[role])
        return self.observe_scrape(deployment_key, role, pod_name, scrape, now, pod_uid=pod_uid)

    def observe_scrape(self, deployment_key: str, role: str, pod_name: str, scrape: ex.Scrape,
                       now: float, *, pod_uid: str | None = None) -> ex.Scrape:
        """:meth:`observe` for an already parsed scrape."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        dep = self._deployments.setdefault(deployment_key, _Deployment(retention_s=self._default_retention_s))
        if dep.first_seen is None:
            dep.first_seen = now
        state = dep.roles.setdefault(role, _Role())
        prev = state.pods.get(pod_name)
        restarted = prev is not None and pod_uid is not None and prev.uid is not None and pod_uid != prev.uid
        hist_delta: dict[str, Histogram] = {}
        counter_delta: dict[str, float] = {}
        early: list[tuple[float, str, Histogram | float]] = []  # increases of series born in the window
        for name, h in scrape.histograms.items():
            old = None if prev is None or restarted else prev.histograms.get(name)
            if old is not None and scrape.created.get(name, 0.0) > prev.created.get(name, math.inf):
                old = None  # newer _created: the process restarted
                hist_delta[name] = h
            elif old is not None:
                hist_delta[name] = _delta(h, old)
            elif restarted or (prev is not None and name not in prev.histograms):
                hist_delta[name] = h  # a new process / a series that appeared since
            elif (c := scrape.created.get(name)) is not None and now - dep.retention_s < c <= now:
                early.append((c, name, h))
        for name, v in scrape.counters.items():
            old_v = None if prev is None or restarted else prev.counters.get(name)
            if old_v is not None and scrape.created.get(name, 0.0) > prev.created.get(name, math.inf):
                counter_delta[name] = v
            elif old_v is not None:
                counter_delta[name] = v - old_v if v >= old_v else v
            elif restarted or (prev is not None and name not in prev.counters):
                counter_delta[name] = v
            elif (c := scrape.created.get(name)) is not None and now - dep.retention_s < c <= now:
                early.append((c, name, v))
        width = self._slot_width(dep.retention_s)
        for t, name, value in early:
            if isinstance(value, Histogram):
                self._add_slot(state, t, {name: value}, {}, width)
            else:
                self._add_slot(state, t, {}, {name: value}, width)
        if hist_delta or counter_delta:
            self._add_slot(state, now, hist_delta, counter_delta, width)
        state.pods[pod_name] = _Pod(uid=pod_uid, seen_at=now, histograms=dict(scrape.histograms),
                                    counters=dict(scrape.counters), created=dict(scrape.created),
                                    gauges=scrape.gauges)
        self._prune(dep, now)
        return scrape

    def _slot_width(self, window_s: float) -> float:
        """Seconds one slot (or outcome bin) of a ``window_s`` window covers: the resolution,
        widened for long windows so that a window holds at most :data:`SLOTS_PER_WINDOW`."""
        return max(self._resolution_s, window_s / SLOTS_PER_WINDOW)

    def _add_slot(self, state: _Role, t: float, hists: Mapping[str, Histogram],
                  counters: Mapping[str, float], width: float) -> None:
        slots = state.slots
        times = [s.t for s in slots]
        i = bisect.bisect_right(times, t)
        # coalesce with the slot just before (or at) t when close enough
        if i > 0 and t - slots[i - 1].t < width:
            slot = slots[i - 1]
        else:
            slot = _Slot(t=t, histograms={}, counters={})
            slots.insert(i, slot)
        for name, h in hists.items():
            _merge_hist(slot.histograms, name, h)
        for name, v in counters.items():
            slot.counters[name] = slot.counters.get(name, 0.0) + v

    def forget(self, deployment_key: str, *, role: str | None = None, pod_name: str | None = None) -> None:
        """Drop a deployment's state (deleted), or one pod's last snapshot (pod gone).

        Increases a pod already contributed stay in the window.
        """
        if pod_name is None:
            self._deployments.pop(deployment_key, None)
            return
        dep = self._deployments.get(deployment_key)
        if dep is None:
            return
        for r, state in dep.roles.items():
            if role in (None, r):
                state.pods.pop(pod_name, None)

    def rebaseline(self, deployment_key: str) -> None:
        """Forget every pod's last snapshot of a deployment (increases already counted stay).

        Call it when the set of families asked from the pods changes: a family that
        appears in a pod's scrape for the first time would otherwise count its whole
        history as an increase. The next scrape of each pod is a baseline.
        """
        dep = self._deployments.get(deployment_key)
        if dep is not None:
            for state in dep.roles.values():
                state.pods.clear()

    def holds_data(self, deployment_key: str) -> bool:
        """Whether the evaluator keeps anything of the deployment that an evaluation reads (a pod's
        last snapshot, an increase in a window, a counted outcome)."""
        dep = self._deployments.get(deployment_key)
        return dep is not None and dep.holds_data()

    def deployments(self) -> list[str]:
        """Keys of every deployment with state."""
        return sorted(self._deployments)

    def _prune(self, dep: _Deployment, now: float) -> None:
        horizon = now - dep.retention_s - self._resolution_s
        for state in dep.roles.values():
            drop = 0
            while drop < len(state.slots) and state.slots[drop].t <= horizon:
                drop += 1
            if drop:
                del state.slots[:drop]

    # ------------------------------------------------------------------ queries
    def window_histogram(self, deployment_key: str, role: str, family: str, now: float,
                         window_s: float) -> Histogram | None:
        """Sum of the increases of ``family`` over ``(now - window_s, now]`` on ``role``.

        None when the role has no increase of that family in the window.
        """
        state = self._role(deployment_key, role)
        if state is None:
            return None
        parts = [s.histograms[family] for s in state.slots
                 if now - window_s < s.t <= now and family in s.histograms]
        return add(parts)

    def window_counter(self, deployment_key: str, role: str, name: str, now: float,
                       window_s: float) -> float:
        """Sum of the increases of counter ``name`` over ``(now - window_s, now]`` on ``role``."""
        state = self._role(deployment_key, role)
        if state is None:
            return 0.0
        return math.fsum(s.counters.get(name, 0.0) for s in state.slots if now - window_s < s.t <= now)

    def _role(self, deployment_key: str, role: str) -> _Role | None:
        dep = self._deployments.get(deployment_key)
        return None if dep is None else dep.roles.get(role)

    def _source_role(self, dep: _Deployment, source: Source, now: float, window_s: float) -> str | None:
        for role in source.roles:
            state = dep.roles.get(role)
            if state and any(p.seen_at > now - window_s for p in state.pods.values()):
                return role
        return None

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, deployment_key: str, slo_spec: SLOSpec, now: float) -> SLOResult:
        """Evaluate ``slo_spec`` over its window ending at ``now`` and record the interval.

        Calling it twice with the same ``now`` replaces that interval's outcome. Raises
        ``ValueError`` when ``slo_spec.window`` is not a duration. A deployment that holds
        no data (no pod answered yet, nothing counted) evaluates to the same result at any
        time: the last one is handed back with ``evaluated_at`` moved while the spec is the
        same object (the scraper's parsed spec), so a pass over a thousand silent
        deployments reads no windows.
        """
        dep = self._deployments.get(deployment_key)
        if dep is not None and dep.quiet is not None and dep.quiet[0] is slo_spec and not dep.holds_data():
            # nothing to read and nothing counted: the inputs of the last evaluation, whatever the time
            return replace(dep.quiet[1], evaluated_at=now)
        result = self._evaluate(deployment_key, slo_spec, now)
        dep = self._deployments[deployment_key]
        dep.quiet = (slo_spec, result) if not dep.holds_data() else None
        return result

    def _evaluate(self, deployment_key: str, slo_spec: SLOSpec, now: float) -> SLOResult:
        """:meth:`evaluate` read from the state (no shortcut for a deployment without data)."""
        window_s = parse_duration(slo_spec.window)
        dep = self._deployments.setdefault(deployment_key, _Deployment(retention_s=window_s))
        dep.retention_s = window_s
        self._prune(dep, now)
        targets: list[TargetResult] = []
        traffic = False
        for metric in SLO_METRICS:
            spec_targets = getattr(slo_spec, metric)
            if spec_targets is None:
                continue
            source = self.sources[metric]
            role = self._source_role(dep, source, now, window_s)
            hist = (self.window_histogram(deployment_key, role, source.family, now, window_s)
                    if role else None)
            if hist is not None and hist.total > 0:
                traffic = True
            for pname, q in PERCENTILES.items():
                raw = getattr(spec_targets, pname)
                if raw is None:
                    continue
                targets.append(_target_result(metric, pname, q, raw, hist, role, source.family))
        known = [t for t in targets if t.met is not None]
        met = None if not known else all(t.met for t in known)
        attainment, burn = self.record_interval(deployment_key, window_s, slo_spec.objective, met, now)
        return SLOResult(
            deployment=deployment_key, evaluated_at=now, window_seconds=window_s,
            objective=slo_spec.objective, targets=tuple(targets), met=met,
            no_traffic=not traffic, attainment=attainment, burn_rates=burn,
            kv_transfer=self._kv_transfer(deployment_key, dep, now, window_s),
            roles=self._roles(dep, now, window_s),
        )

    def record_interval(self, deployment_key: str, window_s: float, objective: float, met: bool | None,
                        now: float) -> tuple[float | None, tuple[BurnRate, ...]]:
        """Record the outcome of the evaluation interval ending at ``now`` and count the window.

        ``met``: True good, False bad, None not counted (no traffic or no figures).
        Returns (attainment over ``window_s``, the four :class:`BurnRate` of
        ``burn_windows(window_s)`` for ``objective``). :meth:`evaluate` calls it; a source
        that measures the percentiles elsewhere (``prometheus_source``) calls it with its
        own verdict, so attainment and burn rates follow one rule whatever the source.
        """
        dep = self._deployments.setdefault(deployment_key, _Deployment(retention_s=window_s))
        outcomes = dep.outcomes
        outcomes.record(now, met, max(self._resolution_s, window_s / OUTCOME_BINS_PER_WINDOW))
        windows = burn_windows(window_s)
        outcomes.age(now, fine_s=FINE_OUTCOME_WINDOWS * window_s, coarse_width=window_s)
        outcomes.expire(now, max(w.seconds for w in windows))
        good, counted = outcomes.count(now, window_s)
        attainment = good / counted if counted else None
        budget = 1.0 - objective
        burn = []
        for w in windows:
            g, n = outcomes.count(now, w.seconds)
            burn.append(BurnRate(window=w, value=((n - g) / n) / budget if n else None, intervals=n))
        return attainment, tuple(burn)

    def _kv_transfer(self, key: str, dep: _Deployment, now: float, window_s: float) -> KVTransferResult:
        hist = self.window_histogram(key, ROLE_PREFILL, ex.KV_TRANSFER_LATENCY_MS, now, window_s)
        latency = {p: (None if hist is None or (v := hist.quantile(q)) is None else v / 1000.0)
                   for p, q in PERCENTILES.items()}
        transfer = bootstrap = 0.0
        for role in (ROLE_PREFILL, ROLE_DECODE):
            transfer += self.window_counter(key, role, ex.TRANSFER_FAILED, now, window_s)
            bootstrap += self.window_counter(key, role, ex.BOOTSTRAP_FAILED, now, window_s)
        span = window_s if dep.first_seen is None else max(min(window_s, now - dep.first_seen), 1e-9)
        requests = self.window_counter(key, ROLE_DECODE, ex.REQUESTS, now, window_s)
        return KVTransferResult(
            latency_seconds=latency, transfers=0.0 if hist is None else hist.total,
            transfer_failures=transfer, bootstrap_failures=bootstrap,
            failures_per_second=(transfer + bootstrap) / span,
            failure_ratio=(transfer + bootstrap) / requests if requests > 0 else None,
        )

    @staticmethod
    def _roles(dep: _Deployment, now: float, window_s: float) -> dict[str, RoleSummary]:
        out: dict[str, RoleSummary] = {}
        queue_names = (ex.QUEUE_REQS, ex.RUNNING_REQS, ex.PREFILL_BOOTSTRAP_QUEUE, ex.PREFILL_INFLIGHT_QUEUE,
                       ex.DECODE_PREALLOC_QUEUE, ex.DECODE_TRANSFER_QUEUE)
        for role, state in dep.roles.items():
            pods = [p for p in state.pods.values() if p.seen_at > now - window_s]
            queues = {}
            for name in queue_names:
                values = [p.gauges[name].sum for p in pods if name in p.gauges]
                if values:
                    queues[name.removeprefix("sglang:")] = math.fsum(values)
            accept = [p.gauges[ex.SPEC_ACCEPT_LENGTH] for p in pods if ex.SPEC_ACCEPT_LENGTH in p.gauges]
            series = sum(g.series for g in accept)
            usage = [p.gauges[ex.TOKEN_USAGE] for p in pods if ex.TOKEN_USAGE in p.gauges]
            usage_series = sum(g.series for g in usage)
            out[role] = RoleSummary(role=role, pods=len(pods), queues=queues,
                                    spec_accept_length=(math.fsum(g.sum for g in accept) / series
                                                        if series else None),
                                    token_usage=(math.fsum(g.sum for g in usage) / usage_series
                                                 if usage_series else None))
        return out


def _target_result(metric: str, pname: str, q: float, raw: Any, hist: Histogram | None,
                   role: str | None, family: str) -> TargetResult:
    """Measure one target from the window histogram (see :class:`TargetResult`)."""
    observations = 0.0 if hist is None else hist.total
    if metric == "perUserSpeed":
        tpot = None if hist is None else hist.quantile(q)
        measured = resolution = None
        if tpot is not None:
            measured = math.inf if tpot <= 0 else 1.0 / tpot
            resolution = _speed_resolution(tpot, hist.bounds) if hist is not None else None
    else:
        measured = None if hist is None else hist.quantile(q)
        resolution = None if measured is None or hist is None else bucket_width_at(measured, hist.bounds)
    return target_result(metric, pname, raw, measured, observations=observations, resolution=resolution,
                         role=role, family=family)


def target_result(metric: str, pname: str, raw: Any, measured: float | None, *, observations: float,
                  resolution: float | None, role: str | None, family: str) -> TargetResult:
    """One target's verdict from its measured value (see :class:`TargetResult`).

    ``raw``: the spec's target (a duration string, or tokens/s for ``perUserSpeed``);
    ``measured``: seconds, or tokens/s for ``perUserSpeed``; None without observations.
    Latency is met when ``measured <= target``, speed when ``measured >= target``.
    Raises ``ValueError`` for a target that is not a duration.
    """
    if metric == "perUserSpeed":
        target = float(raw)
        met = None if measured is None else measured >= target
        margin = None if measured is None else measured - target
        return TargetResult(metric, pname, UNIT_TOKENS_PER_SECOND, target, measured, met, margin,
                            resolution, observations, role, family)
    target = parse_duration(raw)
    met = None if measured is None else measured <= target
    margin = None if measured is None else target - measured
    return TargetResult(metric, pname, UNIT_SECONDS, target, measured, met, margin, resolution,
                        observations, role, family)


def _speed_resolution(tpot: float, bounds: Sequence[float]) -> float:
    """Width in tokens/s of the speed range a TPOT bucket maps to: 1/lower - 1/upper."""
    finite = [b for b in bounds if not math.isinf(b)]
    i = bisect.bisect_left(finite, tpot)
    if i >= len(finite) or i == 0:
        return math.inf
    return 1.0 / finite[i - 1] - 1.0 / finite[i]


def per_user_speed(tpot_seconds: float | None) -> float | None:
    """Output tokens/s of one request from its time per output token (seconds)."""
    if tpot_seconds is None:
        return None
    return math.inf if tpot_seconds <= 0 else 1.0 / tpot_seconds
