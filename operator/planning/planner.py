"""The built-in SLO planner: which role to scale, by how much, and when (pure).

Inputs are plain values: the SLO figures the operator already computes (each target's
measured percentile, the error-budget burn rates) and each role's load gauges, as
:class:`Signals` (``reconcilers/scaling.py`` builds them from either SLO source's
``Health``); the planner's memory from the previous status (:class:`RoleMemory`); the
counts, bounds and GPU budget (:class:`Settings`); and the clock. The output is a
:class:`Decision`: the new count per role with the figures behind it, events, and when
to look again. No I/O, no clock of its own.

**Which role a breach belongs to.** Under PD every latency target is measured at decode
(docs/slo.md section 1), so the figure alone does not say which role is short. SGLang
0.5.23's scheduler gauges do (``sglang/srt/observability/metrics_collector.py``, set in
``managers/scheduler_components/metrics_reporter.py``; the queues are those of
``disaggregation/prefill.py`` and ``decode.py``):

- prefill: ``num_queue_reqs`` = bootstrapped requests waiting for a prefill forward
  (prefill compute is short), ``num_prefill_bootstrap_queue_reqs`` = requests waiting
  for decode to pre-allocate their KV (decode is short of memory),
  ``num_prefill_inflight_queue_reqs`` = KV being sent;
- decode: ``num_decode_prealloc_queue_reqs`` = requests waiting for KV memory on decode
  (decode is short), ``num_decode_transfer_queue_reqs`` = pre-allocated requests waiting
  for prefill's KV (prefill is short), ``num_queue_reqs`` = requests with KV waiting to
  join the running batch, ``num_running_reqs`` = the decode batch, ``token_usage`` = the
  KV pool's fill.

So: ITL and per-user speed (TPOT) grow with the decode batch -> decode (unless decode holds at
most one request per replica: then its step time is the engine's floor, and the planner
holds and says so). TTFT is prefill
queueing + prefill + transfer + decode admission: prefill when its waiting queue holds
requests (decode's transfer queue stands in without prefill's gauges), decode when its prealloc queue, prefill's
bootstrap queue or its KV pool say decode cannot admit, both when both do comparably (each
side at least half the other's), and prefill when neither does (TTFT's PD share is prefill's). e2e goes with TTFT's attribution when
prefill queues, else to decode.

**When.** A role is under pressure (*up*) when a target attributed to it is missed,
when the error budget burns faster than the objective allows (short-window burn rate
>= 1) while its worst target is within 20% of the target and one of its targets was missed
within the window (the burn rate counts bad intervals of any target: it must be this role's),
or when its own queue holds at least one request per replica while its worst target is at
60% of the target or more: the queue and the burn rate act before the window's percentile
crosses the target. It is *idle*
(*down*) when no target of it is missed or burning, its queues are (nearly) empty, and
one replica fewer would carry at most 70% of the load per replica at which the planner
last had to add one (learned: ``RoleMemory.up_load``), or, before any was learned, its
targets scaled by n/(n-1) stay below 90% of target. Anything else is *hold*.

Hysteresis: *up* acts once it has lasted ``scaleUpStabilization`` (at once when the burn
rate is at the page threshold, 14.4); after a step up, the window's percentile still
holds the requests from before it, so for one SLO window only the role's own queue
(an instantaneous signal) may add more. *down* acts once it has lasted
``scaleDownStabilization`` and as long since the role was last scaled, one replica at a
time. A step up multiplies the count by the worst miss ratio (measured / target), at least
+1 and at most 2x or +4 replicas, whichever is more (the HPA's default scale-up policy);
early steps (burn, queue) add one.

Bounds: [minReplicas, maxReplicas] (minReplicas >= 1: a serving role never goes to zero),
and ``maxGPUs`` over every group that exists: an added replica costs its GPUs once per
group that receives the count (the serving group and a surging one), on top of what all
groups (a draining one included) request now. A step that does not fit is cut to what
fits; none fits -> *blocked*, said in status and one Warning event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from .scaling import ROLES, ceil_step

Pressure = Literal["up", "down", "hold"]

#: Requests waiting per replica that mean a role is at capacity (a queue of one per replica).
QUEUE_HIGH = 1.0
#: Requests waiting per replica below which a role counts as idle.
QUEUE_LOW = 0.25
#: KV pool fill (``sglang:token_usage``) at which decode cannot admit more.
TOKEN_USAGE_HIGH = 0.9
#: A target is "close" at this fraction of its value (early action on a burning budget).
NEAR_TARGET = 0.8
#: With the role's own queue at one request per replica, a target counts as close from this fraction:
#: queueing grows latency fast, and the window's percentile lags behind it.
QUEUE_NEAR_TARGET = 0.6
#: Both roles share a TTFT miss when each side's queue is at least this fraction of the other's.
BOTH_SIDES = 0.5
#: Short-window burn rate from which the planner acts early (the budget burns faster than allowed).
BURN_EARLY = 1.0
#: Short-window burn rate that skips the scale-up stabilization (the page threshold, metrics/slo.py).
BURN_FAST = 14.4
#: One replica fewer may carry at most this fraction of the per-replica load that last needed a step up.
DOWN_LOAD_FRACTION = 0.7
#: Without a learned load: every target scaled by n/(n-1) must stay below this fraction of its value.
DOWN_RATIO = 0.9
#: One step up adds at most this factor of the count, or :data:`MAX_STEP_PODS` replicas when that is more
#: (the HorizontalPodAutoscaler's default scale-up policy: 100% or 4 pods per period, whichever is more).
MAX_STEP_FACTOR = 2.0
MAX_STEP_PODS = 4


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class TargetSignal:
    """One SLO target's figure over the window.

    ``metric``: ``ttft`` | ``itl`` | ``e2e`` | ``perUserSpeed``; ``measured`` / ``target``:
    seconds, or tokens/s for ``perUserSpeed``; ``measured`` None without observations;
    ``met``: None unknown.
    """

    metric: str
    percentile: str
    measured: float | None
    target: float
    met: bool | None

    @property
    def ratio(self) -> float | None:
        """How far from target on the bad side: measured/target for latencies, target/measured for
        speed (> 1: missed). None without a measurement."""
        if self.measured is None:
            return None
        if self.metric == "perUserSpeed":
            return math.inf if self.measured <= 0 else self.target / self.measured
        return self.measured / self.target if self.target > 0 else math.inf

    def describe(self) -> str:
        """``ttft p90 1.42s > 800ms`` (a figure for status and events)."""
        if self.measured is None:
            return f"{self.metric} {self.percentile}: no data"
        bad = self.ratio is not None and self.ratio > 1
        if self.metric == "perUserSpeed":
            fmt, cmp = (lambda v: f"{v:.3g} tok/s"), ("<" if bad else ">=")
        else:
            fmt, cmp = _seconds, (">" if bad else "<=")
        return f"{self.metric} {self.percentile} {fmt(self.measured)} {cmp} {fmt(self.target)}"


@dataclass(frozen=True)
class RoleLoad:
    """One role's SGLang gauges summed over its pods (each DP shard once), and the pods that answered.

    ``known``: the gauges were read at all (False: the source has none, e.g. no pod answered).
    ``token_usage``: mean KV pool fill over pods, None when not exposed.
    """

    pods: int = 0
    running: float = 0.0
    waiting: float = 0.0
    bootstrap: float = 0.0
    inflight: float = 0.0
    prealloc: float = 0.0
    transfer: float = 0.0
    token_usage: float | None = None
    known: bool = False

    def per_pod(self, value: float) -> float:
        """``value`` per pod that answered (per one pod when none did)."""
        return value / max(1, self.pods)

    def load(self, role: str) -> float:
        """Requests the role holds, per pod: prefill running + waiting; decode everything it admitted or must."""
        if role == "prefill":
            return self.per_pod(self.running + self.waiting)
        return self.per_pod(self.running + self.waiting + self.prealloc + self.transfer)


@dataclass(frozen=True)
class Signals:
    """What the SLO source measured for the deployment at ``at`` (Unix seconds).

    ``problem``: why there are no figures (then the planner holds); ``window_s``: the SLO
    window; ``burn_short`` / ``burn_long``: page-window burn rates (None unknown).
    """

    at: float
    window_s: float
    targets: tuple[TargetSignal, ...] = ()
    burn_short: float | None = None
    burn_long: float | None = None
    no_traffic: bool = False
    roles: Mapping[str, RoleLoad] = field(default_factory=dict)
    problem: str | None = None

    def role(self, role: str) -> RoleLoad:
        """The role's load (empty when not measured)."""
        return self.roles.get(role) or RoleLoad()


@dataclass(frozen=True)
class RoleBounds:
    """``spec.autoscaling.<role>``: the planner's bounds; None in :class:`Settings` = the planner leaves the role alone."""

    min_replicas: int
    max_replicas: int


@dataclass(frozen=True)
class Settings:
    """What the planner needs of the spec and the cluster.

    ``bounds``: per planned role; ``gpus_per_replica``: per role; ``max_gpus``: the budget
    (None: none); ``gpus_in_use``: GPUs every existing group's engine pods request now;
    ``receivers``: how many groups receive a count change (1, or 2 while a new group
    surges beside the serving one); ``ready``: per role, the serving group's ready pods
    (a step up waits for the last one's pods); stabilization windows in seconds;
    ``external``: per role, the external autoscaler that owns it (the planner steps aside).
    """

    bounds: Mapping[str, RoleBounds]
    gpus_per_replica: Mapping[str, int]
    max_gpus: int | None = None
    gpus_in_use: int = 0
    receivers: int = 1
    ready: Mapping[str, int] = field(default_factory=dict)
    up_stabilization_s: float = 30.0
    down_stabilization_s: float = 300.0
    external: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RoleMemory:
    """What the planner remembers of a role between reconciles (kept in status.autoscaling).

    ``pressure`` and ``since``: the last reading and when it began (stabilization);
    ``last_scale``: when the planner last changed the count; ``up_load``: load per pod
    (:meth:`RoleLoad.load`) when it last had to add a replica; ``blocked``: the last step up
    was refused by maxReplicas or the GPU budget (its Warning was sent); ``last_miss``: when a
    target attributed to the role was last missed (the burn rate then speaks for this role).
    """

    pressure: Pressure = "hold"
    since: float | None = None
    last_scale: float | None = None
    up_load: float | None = None
    blocked: bool = False
    last_miss: float | None = None


# --------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class Reading:
    """The stateless reading of one role: pressure, the step factor it asks for, why (with figures),
    whether only lagging figures (window percentiles, burn rates) back an *up*, and whether a target
    attributed to the role is missed now."""

    pressure: Pressure
    factor: float = 1.0
    why: str = ""
    lagging_only: bool = False
    missed: bool = False


@dataclass(frozen=True)
class RoleDecision:
    """The planner's outcome for one role: ``replicas`` (new count), ``memory``, ``reason`` (the
    reading with its figures, for status), ``acted`` (the count changed)."""

    replicas: int
    memory: RoleMemory
    reason: str
    acted: bool = False


@dataclass(frozen=True)
class Decision:
    """Per planned role a :class:`RoleDecision`; ``events``: (type, reason, message);
    ``next_look_s``: seconds until a stabilization window ends (None: only new figures matter)."""

    roles: Mapping[str, RoleDecision]
    events: tuple[tuple[str, str, str], ...] = ()
    next_look_s: float | None = None

    def replicas(self, role: str, default: int) -> int:
        """The role's new count, ``default`` when the planner does not plan it."""
        d = self.roles.get(role)
        return default if d is None else d.replicas


# --------------------------------------------------------------------------- reading
def _seconds(v: float) -> str:
    if math.isinf(v):
        return "+Inf"
    return f"{v * 1000:.3g}ms" if v < 1 else f"{v:.3g}s"


def _queue_sides(s: Signals) -> tuple[float, float, str]:
    """(prefill-side, decode-side) queue per replica and the figures, for attributing TTFT.

    Prefill's side is its waiting queue (decode's transfer queue stands in only when prefill's
    gauges were not read: it also holds every request while prefill computes it). Decode's side
    is its prealloc and waiting queues, prefill's bootstrap queue, and a full KV pool.
    """
    p, d = s.role("prefill"), s.role("decode")
    prefill_side = p.per_pod(p.waiting) if p.known else d.per_pod(d.transfer)
    decode_side = max(d.per_pod(d.prealloc), p.per_pod(p.bootstrap), d.per_pod(d.waiting))
    if d.token_usage is not None and d.token_usage >= TOKEN_USAGE_HIGH:
        decode_side = max(decode_side, QUEUE_HIGH)
    figures = (f"prefill waiting {p.per_pod(p.waiting):.2g}/pod, bootstrap {p.per_pod(p.bootstrap):.2g}/pod; "
               f"decode transfer {d.per_pod(d.transfer):.2g}/pod, prealloc {d.per_pod(d.prealloc):.2g}/pod, "
               f"running {d.per_pod(d.running):.3g}/pod"
               + (f", KV {d.token_usage:.0%}" if d.token_usage is not None else ""))
    return prefill_side, decode_side, figures


def attribute(metric: str, s: Signals) -> tuple[tuple[str, ...], str]:
    """The roles a missed (or burning) ``metric`` belongs to, and the figures that say so (see module doc)."""
    if metric in ("itl", "perUserSpeed"):
        d = s.role("decode")
        return ("decode",), f"decode batch {d.per_pod(d.running):.3g}/pod"
    prefill_side, decode_side, figures = _queue_sides(s)
    if metric == "e2e":
        return (("prefill",) if prefill_side >= QUEUE_HIGH else ("decode",)), figures
    # a side counts when it queues, and is not dwarfed by the other (a transient bootstrap entry beside a
    # long prefill queue is not decode's shortage)
    top = max(prefill_side, decode_side)
    roles = tuple(r for r, q in (("prefill", prefill_side), ("decode", decode_side))
                  if q >= QUEUE_HIGH and q >= BOTH_SIDES * top)
    if not roles:
        roles = ("prefill",)
        figures += " (no queue on either side: TTFT's PD share is prefill's)"
    return roles, figures


def _own_queue(role: str, s: Signals) -> float:
    """The role's own queue per replica: prefill's waiting queue; decode's prealloc and waiting queues (and a
    full KV pool). Prefill's bootstrap queue is decode's side for attribution, but every request passes
    through it for a moment, so it does not keep decode from being idle."""
    if role == "prefill":
        return _queue_sides(s)[0]
    d = s.role("decode")
    own = max(d.per_pod(d.prealloc), d.per_pod(d.waiting))
    if d.token_usage is not None and d.token_usage >= TOKEN_USAGE_HIGH:
        own = max(own, QUEUE_HIGH)
    return own


def read(s: Signals, *, replicas: Mapping[str, int], memory: Mapping[str, RoleMemory]) -> dict[str, Reading]:
    """Each role's :class:`Reading` from the figures; of the memory only the learned ``up_load`` (the way
    down) and ``last_miss`` (whose the burn rate is) count.

    ``replicas``: each role's count now (the projection of one replica fewer).
    """
    out: dict[str, Reading] = {}
    if s.problem is not None:
        return {r: Reading("hold", why=f"no figures: {s.problem}") for r in ROLES}
    missed: dict[str, list[tuple[TargetSignal, str]]] = {r: [] for r in ROLES}
    worst: dict[str, TargetSignal | None] = {r: None for r in ROLES}
    for t in s.targets:
        if t.ratio is None:
            continue
        roles, figures = attribute(t.metric, s)
        for r in roles:
            if worst[r] is None or (t.ratio or 0) > (worst[r].ratio or 0):
                worst[r] = t
            if t.met is False:
                missed[r].append((t, figures))
    burning = s.burn_short is not None and s.burn_short >= BURN_EARLY
    for role in ROLES:
        load = s.role(role)
        queue = _own_queue(role, s)
        w = worst[role]
        close = w is not None and (w.ratio or 0) >= NEAR_TARGET
        burn_txt = f"burn rate {s.burn_short:.2g}" if s.burn_short is not None else "burn rate unknown"
        if missed[role] and _at_the_floor(role, missed[role], load):
            text = "; ".join(t.describe() for t, _ in missed[role])
            out[role] = Reading("hold", why=f"{text}, but decode's batch is {load.load(role):.2g}/replica: at a batch "
                                "of one the step time is the engine's floor, more replicas would not lower it",
                                missed=True)
            continue
        if missed[role]:
            factor = max((t.ratio or 1.0) for t, _ in missed[role])
            text = "; ".join(t.describe() for t, _ in missed[role])
            out[role] = Reading("up", factor, f"{text} ({burn_txt}); {missed[role][0][1]}",
                                lagging_only=queue < QUEUE_HIGH, missed=True)
            continue
        if w is not None and (w.ratio or 0) >= QUEUE_NEAR_TARGET and queue >= QUEUE_HIGH:
            out[role] = Reading("up", 1.0, f"{w.describe()} is close and {role} queues {queue:.2g}/replica "
                                f"({burn_txt})")
            continue
        # the burn rate counts bad intervals of any target: it speaks for a role that missed within the window
        mem = memory.get(role)
        own_burn = mem is not None and mem.last_miss is not None and s.at - mem.last_miss <= s.window_s
        if close and burning and own_burn:
            out[role] = Reading("up", 1.0, f"{w.describe()} is close and the error budget burns at {s.burn_short:.2g}x "
                                "the sustainable rate", lagging_only=True)
            continue
        out[role] = _idle_or_hold(role, s, load, queue, replicas.get(role, 1), memory.get(role), w, burning, burn_txt)
    return out


def _at_the_floor(role: str, missed: list[tuple[TargetSignal, str]], load: RoleLoad) -> bool:
    """Decode misses only step-time targets (ITL, per-user speed) while it holds at most one request per
    replica: a decode step's time grows with the batch, and at a batch of one it is what the engine does
    alone (model, GPU, parallelism), which another replica does not change."""
    return (role == "decode" and load.known and load.load(role) <= 1.0
            and all(t.metric in ("itl", "perUserSpeed") for t, _ in missed))


def _idle_or_hold(role: str, s: Signals, load: RoleLoad, queue: float, n: int, mem: RoleMemory | None,
                  worst: TargetSignal | None, burning: bool, burn_txt: str) -> Reading:
    if burning:
        return Reading("hold", why=f"targets met, but {burn_txt} (a window after the last miss)")
    if queue > QUEUE_LOW:
        return Reading("hold", why=f"{role} queues {queue:.2g}/replica")
    if n <= 1:
        return Reading("hold", why=f"{role} has one replica")
    projected = load.load(role) * n / (n - 1)
    if load.known and mem is not None and mem.up_load is not None:
        limit = DOWN_LOAD_FRACTION * mem.up_load
        if projected <= limit:
            return Reading("down", why=f"one replica fewer would carry {projected:.3g} requests/pod, at most "
                           f"{DOWN_LOAD_FRACTION:.0%} of the {mem.up_load:.3g} that last needed one more")
        return Reading("hold", why=f"one replica fewer would carry {projected:.3g} requests/pod (more than "
                       f"{DOWN_LOAD_FRACTION:.0%} of {mem.up_load:.3g})")
    if worst is None or worst.ratio is None:
        if s.no_traffic or (load.known and load.load(role) == 0):
            return Reading("down", why="no traffic and no queue")
        return Reading("hold", why="no figure of this role's targets")
    scaled = worst.ratio * n / (n - 1)
    if scaled <= DOWN_RATIO:
        return Reading("down", why=f"{worst.describe()}; x{n}/{n - 1} would still be {scaled:.0%} of target")
    return Reading("hold", why=f"{worst.describe()}; x{n}/{n - 1} would be {scaled:.0%} of target")


def pressure_view(s: Signals) -> tuple:
    """What of the figures can move the planner (for "queue a reconcile now?"): per role, the
    stateless pressure of :func:`read` without learned loads. Cheap; no memory."""
    readings = read(s, replicas={r: 2 for r in ROLES}, memory={})
    return tuple((r, readings[r].pressure) for r in ROLES)


# --------------------------------------------------------------------------- decision
def decide(
    *,
    signals: Signals | None,
    replicas: Mapping[str, int],
    memory: Mapping[str, RoleMemory],
    settings: Settings,
    now: float,
) -> Decision:
    """The planner's step: new counts for the planned roles (``settings.bounds``), see the module doc.

    ``signals``: None when the operator has no fresh figures (the planner holds and says
    so); ``replicas``: each role's count now; ``memory``: from the previous status.
    Never returns a count outside [minReplicas, maxReplicas] for a planned role, never
    one that takes the GPUs beyond ``settings.max_gpus``, never changes a role an external
    autoscaler owns.
    """
    planned = [r for r in ROLES if r in settings.bounds]
    if signals is None:
        readings = {r: Reading("hold", why="waiting for the first SLO figures") for r in ROLES}
    else:
        readings = read(signals, replicas=replicas, memory=memory)
    events: list[tuple[str, str, str]] = []
    out: dict[str, RoleDecision] = {}
    gpus = settings.gpus_in_use
    next_look: list[float] = []
    # the role that misses by most goes first for the GPU budget
    order = sorted(planned, key=lambda r: -(readings[r].factor if readings[r].pressure == "up" else 0.0))
    for role in order:
        n = replicas.get(role, 1)
        b = settings.bounds[role]
        mem = memory.get(role) or RoleMemory()
        rd = readings[role]
        if role in settings.external:
            out[role] = RoleDecision(n, replace(mem, pressure="hold", since=None, blocked=False),
                                     f"{settings.external[role]} scales {role}; the planner steps aside")
            continue
        since = mem.since if mem.pressure == rd.pressure and mem.since is not None else now
        mem = replace(mem, pressure=rd.pressure, since=since, last_miss=now if rd.missed else mem.last_miss)
        if n < b.min_replicas or n > b.max_replicas:  # kubectl scale (or a new bound) left the range
            want = min(max(n, b.min_replicas), b.max_replicas)
            gpus, want, fit = _fit(gpus, n, want, role, settings)
            out[role] = RoleDecision(want, replace(mem, last_scale=now), f"{role} {n} -> {want}: back within "
                                     f"[{b.min_replicas}, {b.max_replicas}]{fit}", acted=want != n)
            if want != n:
                events.append(("Normal", "PlannerScaled", out[role].reason))
            continue
        if rd.pressure == "up":
            out[role], gpus, ev, look = _step_up(role, n, b, mem, rd, signals, settings, gpus, now)
            events += ev
            if look is not None:
                next_look.append(look)
            continue
        mem = replace(mem, blocked=False)
        if rd.pressure == "down" and n > b.min_replicas:
            held = now - since
            quiet = now - mem.last_scale if mem.last_scale is not None else math.inf
            wait = max(settings.down_stabilization_s - held, settings.down_stabilization_s - quiet)
            if wait <= 0:
                gpus -= settings.gpus_per_replica.get(role, 0) * settings.receivers
                reason = f"{role} {n} -> {n - 1}: {rd.why} for {_dur(held)}"
                out[role] = RoleDecision(n - 1, replace(mem, last_scale=now, since=now), reason, acted=True)
                events.append(("Normal", "PlannerScaled", reason + _gpu_text(gpus, settings)))
                continue
            next_look.append(wait)
            out[role] = RoleDecision(n, mem, f"idle: {rd.why}; one replica fewer in {_dur(wait)}")
            continue
        why = rd.why if rd.pressure != "down" else f"{rd.why} (at minReplicas {b.min_replicas})"
        out[role] = RoleDecision(n, mem, why)
    return Decision(roles=out, events=tuple(events), next_look_s=min(next_look) if next_look else None)


def _step_up(role: str, n: int, b: RoleBounds, mem: RoleMemory, rd: Reading, signals: Signals | None,
             settings: Settings, gpus: int, now: float
             ) -> tuple[RoleDecision, int, list[tuple[str, str, str]], float | None]:
    held = now - (mem.since if mem.since is not None else now)
    fast = signals is not None and signals.burn_short is not None and signals.burn_short >= BURN_FAST
    wait = 0.0 if fast else settings.up_stabilization_s - held
    if wait > 0:
        return RoleDecision(n, mem, f"under pressure: {rd.why}; acting in {_dur(wait)}"), gpus, [], wait
    if settings.ready.get(role, n) < n:
        return (RoleDecision(n, mem, f"under pressure: {rd.why}; waiting for {role}'s {n} replicas to be ready"),
                gpus, [], None)
    window = signals.window_s if signals is not None else 0.0
    since_scale = now - mem.last_scale if mem.last_scale is not None else math.inf
    if rd.lagging_only and since_scale < window:
        look = window - since_scale
        return (RoleDecision(n, mem, f"under pressure: {rd.why}; the window still holds requests from before the "
                             f"last step ({_dur(since_scale)} ago), and {role} does not queue"), gpus, [], look)
    cap = max(MAX_STEP_FACTOR, (n + MAX_STEP_PODS) / n)
    want = min(ceil_step(n, min(rd.factor, cap)), b.max_replicas)
    gpus_after, want, fit = _fit(gpus, n, want, role, settings)
    if want <= n:
        why = (f"at maxReplicas {b.max_replicas}" if n >= b.max_replicas else
               f"the GPU budget: {gpus} of {settings.max_gpus} GPUs in use, one more {role} replica needs "
               f"{settings.gpus_per_replica.get(role, 0) * settings.receivers}")
        reason = f"under pressure but blocked by {why}: {rd.why}"
        events = [] if mem.blocked else [("Warning", "PlannerBlocked", f"{role}: {reason}")]
        return RoleDecision(n, replace(mem, blocked=True), reason), gpus, events, None
    load = signals.role(role).load(role) if signals is not None and signals.role(role).known else None
    up_load = load if load is not None and load > 0 else mem.up_load
    reason = f"{role} {n} -> {want}: {rd.why}{fit}"
    new_mem = replace(mem, last_scale=now, since=now, up_load=up_load, blocked=False)
    return (RoleDecision(want, new_mem, reason, acted=True), gpus_after,
            [("Normal", "PlannerScaled", reason + _gpu_text(gpus_after, settings))], None)


def _fit(gpus: int, n: int, want: int, role: str, settings: Settings) -> tuple[int, int, str]:
    """(GPUs in use after, the count that fits the budget, a note when cut)."""
    per = settings.gpus_per_replica.get(role, 0) * settings.receivers
    if want <= n or settings.max_gpus is None or per == 0:
        return gpus + (want - n) * per, want, ""
    fits = n + max(0, (settings.max_gpus - gpus) // per)
    if fits >= want:
        return gpus + (want - n) * per, want, ""
    return gpus + (fits - n) * per, fits, f" (cut from {want} by maxGPUs {settings.max_gpus})"


def _gpu_text(gpus: int, settings: Settings) -> str:
    return f"; GPUs {gpus}" + (f" of {settings.max_gpus}" if settings.max_gpus is not None else "")


def _dur(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}m"
