"""Compute a PDDeployment's status from the plan, what was observed and the rollout decision (pure).

Conditions follow Kubernetes API conventions: ``type``, ``status``, ``reason``,
``message``, ``observedGeneration`` and a ``lastTransitionTime`` that changes only when
``status`` changes. Types:

- ``Valid``: the spec passed every rule (False: every problem, one per line);
- ``Reconciled``: every child object was applied for the current generation (False: the
  API call that failed and the API server's answer, e.g. an admission denial);
- ``Ready``: the serving group is the current generation's group and its prefill,
  decode and gateway are fully ready (False with WaitingForCapacity and Kueue's reasons
  while Kueue holds replicas of the target group; False with InvalidSpec or ReconcileError when the
  current generation was refused or could not be applied; the message then names the
  group of the earlier generation that still serves);
- ``Progressing``: a group is being created, cut over or drained (False/Complete when
  done, False/ProgressDeadlineExceeded when the new group missed its deadline);
- ``Degraded``: the rollout failed, or no prefill is ready (or answers the operator's
  scrape) while decode is (NoPrefill), or KV transfers / bootstraps failed within the SLO
  window (KVTransferFailing);
- ``SLOMet``: from the operator's SLO source (``metrics/scraper.py``, or with
  ``--slo-source prometheus`` ``metrics/prometheus_source.py``), only when ``spec.slo`` is
  set: True, False naming each missed target and by how much, Unknown when no request
  finished in the window, when the source could not read figures this interval (the
  Health's ``problem``: PrometheusUnavailable, NoSeries, StaleSeries), or
  (NoRecentMeasurement) when the operator has had no figures for longer than the
  runtime's bound; ``status.scrape`` says which source measured and when (``measuredAt``);
- ``Warning``: the spec is served but the catalog cannot vouch for something (each
  warning, one per line).

``merge_conditions`` keeps the other condition types (KVStoreReady ...) that other parts
of the operator own.

Figures from the scraper (:class:`~sglang_pd_operator.metrics.scraper.Health`) are
rounded (``SLOResult.to_status``) so that an idle deployment's status does not change
between intervals; without fresh figures (operator just started, or a reconcile run
outside the operator) the previous ones are kept as they are, until the runtime says
they are stale (``health_stale``): then they are removed and SLOMet is Unknown.

All conditions of one write come from one observation and one rollout decision
(``reconcilers/pddeployment.py`` decides again after its own writes), so Ready=False never
sits beside Progressing=False/Complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..metrics.health import Health
from ..metrics.slo import format_duration, slo_condition
from ..planning.problems import Problem, errors, warnings
from ..planning.rollout import RolloutDecision
from .observe import Observed, ObservedGroup, WorkloadState

MAX_MESSAGE_PROBLEMS = 20
#: Longest condition message written from an API server's answer (characters).
MAX_CONDITION_MESSAGE = 1024
#: Conditions present only while the feature they describe is used (kernel caches, Mooncake storage).
OPTIONAL_CONDITIONS = ("KernelsReady", "KVStoreReady", "UpgradePending")
#: Degraded reasons a Warning event announces when Degraded turns to them.
DEGRADED_WARNINGS = ("NoPrefill", "NoDecode", "KVTransferFailing")
_NO_PREFILL_ANSWERS = "no prefill pod answers the operator"


def rfc3339(ts: float) -> str:
    """Epoch seconds as an RFC 3339 UTC timestamp with second precision."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    """RFC 3339 (``...Z``) to epoch seconds, None for None or unparsable text."""
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class Cond:
    """A condition to set: type, status (True/False/Unknown), reason, message."""

    type: str
    status: str
    reason: str
    message: str = ""


def merge_conditions(
    previous: list[dict[str, Any]], updates: list[Cond], *, generation: int, now: float
) -> list[dict[str, Any]]:
    """Previous conditions with ``updates`` applied; lastTransitionTime kept unless status changed.

    Condition types not in ``updates`` are kept as they were. Order: previous order,
    new types appended.
    """
    by_type = {c["type"]: dict(c) for c in previous}
    order = [c["type"] for c in previous]
    for u in updates:
        old = by_type.get(u.type)
        transition = old["lastTransitionTime"] if old and old.get("status") == u.status and old.get("lastTransitionTime") else rfc3339(now)
        by_type[u.type] = {
            "type": u.type,
            "status": u.status,
            "reason": u.reason,
            "message": u.message,
            "observedGeneration": generation,
            "lastTransitionTime": transition,
        }
        if u.type not in order:
            order.append(u.type)
    return [by_type[t] for t in order]


def problems_message(problems: list[Problem]) -> str:
    """Problems as one line each (field first, fix last), at most MAX_MESSAGE_PROBLEMS lines."""
    lines = [p.line() for p in problems[:MAX_MESSAGE_PROBLEMS]]
    if len(problems) > MAX_MESSAGE_PROBLEMS:
        lines.append(f"... and {len(problems) - MAX_MESSAGE_PROBLEMS} more (see status.problems)")
    return "\n".join(lines)


def _role(w: WorkloadState | None) -> dict[str, Any]:
    """One workload's status: replicas (a multi-node role's replicas are LeaderWorkerSet groups,
    Ready only when every pod of the group is) and its pods (``ready/desired``)."""
    if w is None:
        return {"desired": 0, "ready": 0, "updated": 0, "replicas": "0/0", "pods": "0/0"}
    return {"desired": w.desired, "ready": w.ready, "updated": w.updated, "replicas": f"{w.ready}/{w.desired}",
            "pods": f"{w.pods_ready}/{w.desired * w.pods_per_replica}"}


def _engine_pods(target: ObservedGroup | None) -> str:
    """``ready/desired`` engine pods (prefill and decode, every node of every replica) of the target group."""
    ready = desired = 0
    for component in ("prefill", "decode"):
        w = target.workloads.get(component) if target else None
        if w is not None:
            ready, desired = ready + w.pods_ready, desired + w.desired * w.pods_per_replica
    return f"{ready}/{desired}"


def _group_summary(g: ObservedGroup, *, serving: str | None, target: str | None) -> dict[str, Any]:
    return {
        "key": g.key,
        "serving": g.key == serving,
        "target": g.key == target,
        "ready": g.ready,
        **{c: _role(g.workloads.get(c))["replicas"] for c in ("prefill", "decode", "gateway")},
    }


def applied_generation(previous: dict[str, Any]) -> int | None:
    """The last generation a reconcile fully applied, as a previous status records it.

    ``status.rollout.generation`` (written with every successful reconcile of a valid
    spec); for a status written before that field existed, ``observedGeneration`` while
    ``Valid`` was True. None before any success.
    """
    gen = (previous.get("rollout") or {}).get("generation")
    if gen is None and (_previous_cond(previous, "Valid") or {}).get("status") == "True":
        gen = previous.get("observedGeneration")
    return gen


def served_by(previous: dict[str, Any]) -> tuple[str | None, int | None]:
    """(serving group key, the generation last applied) as a previous status records them; (None, None) before any group served."""
    key = (previous.get("rollout") or {}).get("servingKey")
    return (key, applied_generation(previous)) if key else (None, None)


def _still_serves(previous: dict[str, Any]) -> str:
    key, gen = served_by(previous)
    if key is None:
        return "nothing serves yet"
    return f"group {key[:6]}" + (f" of generation {gen}" if gen is not None else "") + " still serves, untouched"


def still_serves(previous: dict[str, Any]) -> str:
    """What serves while a new generation is held: "group <key> of generation <n> still serves, untouched", or "nothing serves yet"."""
    return _still_serves(previous)


def invalid_conditions(problems: list[Problem], *, generation: int, previous: dict[str, Any]) -> list[Cond]:
    """Conditions for a refused generation: Valid False with every error, Ready and Progressing False.

    Ready speaks for the current generation (``observedGeneration`` advances to it), and a
    refused generation is not served, so Ready is False with reason InvalidSpec even while
    an earlier generation's group serves: its message names that group and generation
    (the operator never touches it for an invalid spec). Progressing is False too: nothing
    rolls out until the spec is fixed.
    """
    errs = errors(problems)
    serves = _still_serves(previous)
    conds = [
        Cond("Valid", "False", "InvalidSpec", problems_message(errs)),
        Cond("Ready", "False", "InvalidSpec", f"generation {generation} was refused (see the Valid condition); {serves}"),
        Cond("Progressing", "False", "InvalidSpec", f"generation {generation} is not rolled out until its spec is fixed"),
    ]
    warns = warnings(problems)
    conds.append(Cond("Warning", "True" if warns else "False", "CatalogWarnings" if warns else "NoWarnings", problems_message(warns)))
    return conds


#: Reason of the conditions a multi-node spec gets on a cluster without LeaderWorkerSets.
REASON_LWS_MISSING = "LeaderWorkerSetMissing"
#: Reason when a multi-node role on GB200 / GB300 needs ComputeDomains (NVIDIA's DRA driver) the cluster does not serve.
REASON_CD_MISSING = "ComputeDomainMissing"


def missing_dependency_conditions(
    *, reason: str, message: str, problems: list[Problem], generation: int, previous: dict[str, Any]
) -> list[Cond]:
    """Conditions for a valid generation the cluster cannot run (an API it needs is not served).

    ``Valid`` True (with the warnings as usual); ``Reconciled``, ``Ready`` and
    ``Progressing`` False with ``reason`` and ``message`` (what to install); Ready's
    message also names the group that still serves, untouched.
    """
    serves = _still_serves(previous)
    warns = warnings(problems)
    return [
        Cond("Valid", "True", "Valid", ""),
        Cond("Reconciled", "False", reason, message),
        Cond("Ready", "False", reason, f"generation {generation} cannot be created: {message}; {serves}"),
        Cond("Progressing", "False", reason, f"generation {generation} is not rolled out until the cluster serves "
             "what it needs (see the Reconciled condition)"),
        Cond("Warning", "True" if warns else "False", "CatalogWarnings" if warns else "NoWarnings",
             problems_message(warns)),
    ]


def reconcile_error_conditions(
    *, reason: str, message: str, generation: int, previous: dict[str, Any]
) -> list[Cond]:
    """Conditions for a reconcile that failed on an API call: Reconciled False naming what failed.

    ``reason``: CamelCase class of the error (AdmissionDenied, Invalid, Forbidden ...),
    ``message``: the call and the API server's answer. When the failure hit a generation
    that was never fully applied (:func:`applied_generation`), Ready and Progressing are
    False with reason ReconcileError too: the generation is not served, while the serving group (named in
    Ready's message) keeps running. A failure at rest, on a generation already applied,
    leaves Ready and Progressing as they were: they describe pods that still serve.
    """
    conds = [Cond("Reconciled", "False", reason, message)]
    if applied_generation(previous) != generation:
        serves = _still_serves(previous).replace(", untouched", "")
        conds += [
            Cond("Ready", "False", "ReconcileError",
                 f"generation {generation} could not be applied (see the Reconciled condition); {serves}"),
            Cond("Progressing", "False", "ReconcileError",
                 f"generation {generation} is not rolled out: {message}"[:MAX_CONDITION_MESSAGE]),
        ]
    return conds


#: Ready's reason while Kueue holds a group of the target compat group (spec.scheduling.queueName).
REASON_WAITING_FOR_CAPACITY = "WaitingForCapacity"


def admission_condition(group: ObservedGroup) -> Cond:
    """Ready False, WaitingForCapacity: Kueue has not admitted some replicas of ``group`` (their pods are all
    held behind its scheduling gate); the message names each one and Kueue's reason from its Workload."""
    waits = group.awaiting_admission
    shown = "; ".join(waits[:MAX_MESSAGE_PROBLEMS]) + (f"; ... and {len(waits) - MAX_MESSAGE_PROBLEMS} more"
                                                      if len(waits) > MAX_MESSAGE_PROBLEMS else "")
    return Cond("Ready", "False", REASON_WAITING_FOR_CAPACITY,
                (f"group {group.key[:6]}: Kueue has not admitted {len(waits)} replica(s), every pod of each held "
                 f"unbound until the whole replica fits: {shown}")[:MAX_CONDITION_MESSAGE])


def _replicas_are(n: int, role: str) -> str:
    """``1 decode replica is`` / ``2 decode replicas are``."""
    return f"1 {role} replica is" if n == 1 else f"{n} {role} replicas are"


def degraded_condition(
    serving: ObservedGroup | None, decision: RolloutDecision | None, health: Health | None = None,
    target_key: str | None = None,
) -> Cond:
    """Degraded: failed rollout; decode ready (or answering) with no prefill ready (or
    answering), so requests cannot be disaggregated (NoPrefill); prefill ready with no decode
    replica ready although some are asked for, once the group was created (NoDecode: nothing
    answers; not while the first group surges); KV transfer or bootstrap
    failures within the SLO window (KVTransferFailing). ``health`` counts only when it
    is about the serving group; ``target_key``: the group the spec asks for (a serving group
    that is also the target and surges is the first group being created)."""
    if decision is not None and decision.phase == "Failed":
        return Cond("Degraded", "True", "ProgressDeadlineExceeded", decision.message)
    if serving is not None:
        p, d = serving.workloads.get("prefill"), serving.workloads.get("decode")
        if p is not None and d is not None and p.ready == 0 and d.ready > 0:
            return Cond(
                "Degraded", "True", "NoPrefill",
                f"no prefill replica is ready while {_replicas_are(d.ready, 'decode')}: requests cannot be disaggregated",
            )
        # not while the group is being created (its serving key still surging): prefill is often Ready first
        # (a fresh user saw a Warning NoDecode on every new deployment, a second before it was Complete)
        creating = (decision is not None and decision.phase == "Surging"
                    and decision.serving_key == serving.key == target_key)  # the group surging is the one serving
        if p is not None and d is not None and d.ready == 0 and d.desired > 0 and p.ready > 0 and not creating:
            return Cond(
                "Degraded", "True", "NoDecode",
                f"no decode replica is ready while {_replicas_are(p.ready, 'prefill')}: no request can be answered",
            )
    if health is not None and health.problem is None and (serving is None or health.serving_key == serving.key):
        p_ready, p_up = health.ready.get("prefill", 0), health.reachable.get("prefill", 0)
        d_up = health.reachable.get("decode", 0)
        if p_up == 0 and d_up > 0:
            return Cond(
                "Degraded", "True", "NoPrefill",
                f"{_NO_PREFILL_ANSWERS} ({p_ready} ready, 0 reachable) while {d_up} decode pods do; "
                "requests cannot be disaggregated",
            )
        kv = health.kv_transfer
        if kv.failures > 0:
            window = format_duration(health.slo.window_seconds) if health.slo else "5m"
            ratio = f" ({kv.failure_ratio:.0%} of the requests decode finished)" if kv.failure_ratio is not None else ""
            return Cond(
                "Degraded", "True", "KVTransferFailing",
                f"{kv.transfer_failures:.0f} KV transfer and {kv.bootstrap_failures:.0f} bootstrap failures in the "
                f"last {window}{ratio}; check the transfer backend and IB devices",
            )
    return Cond("Degraded", "False", "AsExpected", "")


def scrape_summary(health: Health, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """``status.scrape``: which source produced the figures (``scrape`` | ``prometheus``),
    ``measuredAt`` (RFC 3339), the serving group's id and, per role, ``reachable/ready``
    pods; with ``health.problem`` (no figures this interval) ``problem`` (its reason)
    instead of the pod counts.

    ``previous``: the current ``status.scrape``; its ``measuredAt`` is kept when everything
    else is unchanged (the measurement that first found these figures), so unchanged
    figures cause no write at rest; that they are current is SLOMet's to say (Unknown,
    NoRecentMeasurement, once no measurement is younger than the runtime's bound).
    """
    out: dict[str, Any] = {"source": health.source, "group": (health.serving_key or "")[:6]}
    if health.problem is not None:
        out["problem"] = health.problem[0]
    else:
        for role in ("prefill", "decode", "gateway"):
            out[role] = f"{health.reachable.get(role, 0)}/{health.ready.get(role, 0)}"
    measured_at = rfc3339(health.evaluated_at)
    if previous:
        kept = previous.get("measuredAt")
        if parse_rfc3339(kept) is not None and {k: v for k, v in previous.items() if k != "measuredAt"} == out:
            measured_at = kept
    out["measuredAt"] = measured_at
    return out


def health_views(health: Health) -> tuple[tuple, tuple]:
    """What status shows of ``health``, split for "did anything change?": (transitions, figures).

    Transitions: the status and reason of SLOMet, Degraded (NoPrefill,
    KVTransferFailing) and KVStoreReady, whether each SLO target is met, and which roles
    have pods that answer. Figures:
    everything else status shows: the rounded ``status.slo`` block, the ``status.scrape``
    counts and the condition messages (which quote figures).
    """
    slo = health.slo
    slo_met = slo_condition(slo) if slo else None
    degraded = degraded_condition(None, None, health)
    kvstore = health.kvstore.view() if health.kvstore is not None else None  # KVStoreReady
    conditions = (
        tuple((r, health.reachable.get(r, 0) > 0) for r in ("prefill", "decode", "gateway")),
        (slo_met["status"], slo_met["reason"]) if slo_met else None,
        tuple((t.metric, t.percentile, t.met) for t in slo.targets) if slo else None,  # SLOTargetMissed events
        (degraded.status, degraded.reason),
        kvstore[:-1] if kvstore else None,
        health.problem[0] if health.problem else None,  # SLOMet Unknown: PrometheusUnavailable, NoSeries ...
    )
    summary = {k: v for k, v in scrape_summary(health).items() if k != "measuredAt"}
    figures = (repr(summary), repr(slo.to_status()) if slo else None,
               slo_met["message"] if slo_met else None, degraded.message, kvstore[-1] if kvstore else None,
               health.problem[1] if health.problem else None)
    return conditions, figures


def _from_health(cond: dict[str, Any] | None) -> bool:
    """A Degraded condition set from the scraper's figures (not from Deployment readiness)."""
    if not cond or cond.get("status") != "True":
        return False
    reason, message = cond.get("reason"), cond.get("message") or ""
    return reason == "KVTransferFailing" or (reason == "NoPrefill" and message.startswith(_NO_PREFILL_ANSWERS))


def _previous_cond(previous: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in previous.get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def phase_transitions(previous_rollout: dict[str, Any], decision: RolloutDecision, *, target_key: str,
                      now: float) -> dict[str, str]:
    """``status.rollout.phaseTransitions``: phase name -> RFC 3339 time this rollout last entered it.

    ``previous_rollout``: the last written ``status.rollout`` ({} for none). A new target
    compat key starts a new map. A phase that continues keeps its time; a phase entered
    now (a transition, or seen again after another phase, as a second in-place update
    surges again after Complete) gets the time it was entered: ``decision.phase_started``,
    except ``Failed``, whose ``phase_started`` is when the failed surge began (the progress
    deadline's clock), so it gets ``now``, the reconcile that saw the deadline pass.
    Entering ``Draining`` also stamps ``Cutover`` (the two happen together).
    """
    times = dict(previous_rollout.get("phaseTransitions") or {})
    if previous_rollout.get("targetKey") != target_key:
        times = {}
    entered = previous_rollout.get("phase") != decision.phase or decision.phase not in times
    if entered:
        at = rfc3339(now if decision.phase == "Failed" else decision.phase_started)
        times[decision.phase] = at
        if decision.phase == "Draining":
            times["Cutover"] = at
    return times


def valid_status(
    *,
    previous: dict[str, Any],
    generation: int,
    problems: list[Problem],
    observed: Observed,
    decision: RolloutDecision,
    target_key: str,
    kv_layouts: dict[str, str | None],
    attention_backends: dict[str, str | None],
    endpoint: str,
    now: float,
    health: Health | None = None,
    slo_enabled: bool = False,
    extra_conditions: list[Cond] = (),
    health_stale: str | None = None,
    valid: Cond | None = None,
) -> dict[str, Any]:
    """The full status of a valid generation (observedGeneration = generation).

    ``valid``: the Valid condition when someone besides the rules decided (SGLang's
    verdict, ``reconcilers.sglang_gate``); default True with reason Valid.

    ``health``: the scraper's latest figures for this deployment (None: keep the previous
    ``slo`` / ``scrape`` blocks, SLOMet and a scrape-based Degraded as they are, unless
    ``health_stale``); ``health_stale``: with ``health`` None, why no figures are fresh
    enough any more (the runtime's bound on their age passed): SLOMet turns Unknown with
    reason NoRecentMeasurement and that message, the ``slo`` and ``scrape`` blocks go, and
    a scrape-based Degraded is not kept;
    ``slo_enabled``: ``spec.slo`` is set (otherwise SLOMet and ``status.slo`` are removed).
    ``extra_conditions``: conditions other parts own (KernelsReady, KVStoreReady); a type
    that stops being reported is removed.
    """
    target = observed.groups.get(target_key)
    serving_group = observed.groups.get(decision.serving_key)
    ready = decision.serving_key == target_key and target is not None and target.ready
    if ready:
        ready_c = Cond("Ready", "True", "Ready", f"group {target_key[:6]} serves at generation {generation}")
    elif decision.phase == "Failed":
        ready_c = Cond("Ready", "False", "RolloutFailed", decision.message)
    elif decision.phase == "Complete":  # complete but not ready: a role scaled to 0 (rollout.decide)
        ready_c = Cond("Ready", "False", "ScaledToZero", decision.message)
    elif target is not None and target.awaiting_admission:
        ready_c = admission_condition(target)
    else:
        ready_c = Cond("Ready", "False", "NotReady", decision.message)
    if decision.phase == "Complete":
        prog = Cond("Progressing", "False", "Complete", decision.message)
    elif decision.phase == "Failed":
        prog = Cond("Progressing", "False", "ProgressDeadlineExceeded", decision.message)
    else:
        prog = Cond("Progressing", "True", decision.phase, decision.message)
    warns = warnings(problems)
    degraded = degraded_condition(serving_group, decision, health, target_key=target_key)
    prev_degraded = _previous_cond(previous, "Degraded")
    if health is None and health_stale is None and degraded.status == "False" and _from_health(prev_degraded):
        degraded = Cond("Degraded", "True", prev_degraded["reason"], prev_degraded.get("message", ""))
    conds = [
        valid or Cond("Valid", "True", "Valid", ""),
        Cond("Reconciled", "True", "Reconciled", f"every child object is applied at generation {generation}"),
        ready_c,
        prog,
        degraded,
        Cond("Warning", "True" if warns else "False", "CatalogWarnings" if warns else "NoWarnings", problems_message(warns)),
    ]
    if slo_enabled and health is not None and health.problem is not None:
        conds.append(Cond("SLOMet", "Unknown", health.problem[0], health.problem[1]))
    elif slo_enabled and health is not None and health.slo is not None:
        c = slo_condition(health.slo)
        conds.append(Cond(c["type"], c["status"], c["reason"], c["message"]))
    elif slo_enabled and health is None and health_stale is not None:
        conds.append(Cond("SLOMet", "Unknown", "NoRecentMeasurement", health_stale))
    conds += list(extra_conditions)
    previous_conditions = previous.get("conditions") or []
    if not slo_enabled:
        previous_conditions = [c for c in previous_conditions if c.get("type") != "SLOMet"]
    reported = {c.type for c in extra_conditions}
    previous_conditions = [c for c in previous_conditions if c.get("type") not in OPTIONAL_CONDITIONS or c.get("type") in reported]
    phase_times = phase_transitions(previous.get("rollout") or {}, decision, target_key=target_key, now=now)
    rollout: dict[str, Any] = {
        "generation": generation,
        "servingKey": decision.serving_key,
        "targetKey": target_key,
        "phase": decision.phase,
        "phaseStarted": rfc3339(decision.phase_started),
        "phaseTransitions": phase_times,
        "groups": [
            _group_summary(g, serving=decision.serving_key, target=target_key)
            for g in sorted(observed.groups.values(), key=lambda g: g.key)
        ],
        "drainingKey": decision.draining_key,
        "drainStarted": rfc3339(decision.drain_started) if decision.drain_started else None,
    }
    roles = {}
    for component in ("prefill", "decode"):
        w = target.workloads.get(component) if target else None
        roles[component] = {
            **_role(w),
            "nodesPerReplica": w.pods_per_replica if w is not None else None,
            "kvLayout": kv_layouts.get(component),
            "attentionBackend": attention_backends.get(component),
        }
    gw = target.workloads.get("gateway") if target else None
    if health is not None:
        slo_block = health.slo.to_status() if slo_enabled and health.slo is not None else None
        # measuredAt moves with the figures: keep it only while status.slo stays as it was too
        scrape = scrape_summary(health, previous.get("scrape") if slo_block == previous.get("slo") else None)
    elif health_stale is not None:
        slo_block = scrape = None
    else:
        slo_block, scrape = previous.get("slo"), previous.get("scrape")
    return {
        "observedGeneration": generation,
        "conditions": merge_conditions(previous_conditions, conds, generation=generation, now=now),
        "prefill": roles["prefill"],
        "decode": roles["decode"],
        "gateway": {**_role(gw), "endpoint": endpoint},
        "pods": _engine_pods(target),
        "compatKey": target_key,
        "kvLayout": kv_layouts.get("prefill"),
        "problems": [p.to_dict() for p in problems],
        "rollout": rollout,
        "slo": slo_block if slo_enabled else None,
        "scrape": scrape,
    }


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """Status without volatile parts, for "did anything change?" (kopf's own bookkeeping dropped)."""
    return {k: v for k, v in status.items() if k != "kopf"}
