"""Compute a PDDeployment's status from the plan, what was observed and the rollout decision (pure).

Conditions follow Kubernetes API conventions: ``type``, ``status``, ``reason``,
``message``, ``observedGeneration`` and a ``lastTransitionTime`` that changes only when
``status`` changes. Types:

- ``Valid``: the spec passed every rule (False: every problem, one per line);
- ``Ready``: the serving group is the current generation's group and its prefill,
  decode and gateway are fully ready;
- ``Progressing``: a group is being created, cut over or drained (False/Complete when
  done, False/ProgressDeadlineExceeded when the new group missed its deadline);
- ``Degraded``: the rollout failed, or no prefill is ready while decode is (NoPrefill);
- ``Warning``: the spec is served but the catalog cannot vouch for something (each
  warning, one per line).

``merge_conditions`` keeps the other condition types (SLOMet, KVStoreReady ...) that
other parts of the operator own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..planning.problems import Problem, errors, warnings
from ..planning.rollout import RolloutDecision
from .observe import Observed, ObservedGroup, WorkloadState

MAX_MESSAGE_PROBLEMS = 20


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
    if w is None:
        return {"desired": 0, "ready": 0, "updated": 0, "replicas": "0/0"}
    return {"desired": w.desired, "ready": w.ready, "updated": w.updated, "replicas": f"{w.ready}/{w.desired}"}


def _group_summary(g: ObservedGroup, *, serving: str | None, target: str | None) -> dict[str, Any]:
    return {
        "key": g.key,
        "serving": g.key == serving,
        "target": g.key == target,
        "ready": g.ready,
        **{c: _role(g.workloads.get(c))["replicas"] for c in ("prefill", "decode", "gateway")},
    }


def invalid_conditions(problems: list[Problem], *, ever_valid: bool) -> list[Cond]:
    """Conditions for a refused generation: Valid False with every error.

    When an earlier generation was served (``ever_valid``), Ready and Progressing keep
    describing it; otherwise Ready is False with reason InvalidSpec.
    """
    errs = errors(problems)
    conds = [Cond("Valid", "False", "InvalidSpec", problems_message(errs))]
    if not ever_valid:
        conds.append(Cond("Ready", "False", "InvalidSpec", "the spec was refused; see the Valid condition"))
    warns = warnings(problems)
    conds.append(Cond("Warning", "True" if warns else "False", "CatalogWarnings" if warns else "NoWarnings", problems_message(warns)))
    return conds


def degraded_condition(serving: ObservedGroup | None, decision: RolloutDecision | None) -> Cond:
    """Degraded: failed rollout, or decode ready with no prefill ready (requests cannot be disaggregated)."""
    if decision is not None and decision.phase == "Failed":
        return Cond("Degraded", "True", "ProgressDeadlineExceeded", decision.message)
    if serving is not None:
        p, d = serving.workloads.get("prefill"), serving.workloads.get("decode")
        if p is not None and d is not None and p.ready == 0 and d.ready > 0:
            return Cond(
                "Degraded", "True", "NoPrefill", f"no prefill replica is ready while {d.ready} decode replicas are"
            )
    return Cond("Degraded", "False", "AsExpected", "")


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
) -> dict[str, Any]:
    """The full status of a valid generation (observedGeneration = generation)."""
    target = observed.groups.get(target_key)
    serving_group = observed.groups.get(decision.serving_key)
    ready = decision.serving_key == target_key and target is not None and target.ready
    if ready:
        ready_c = Cond("Ready", "True", "Ready", f"group {target_key[:6]} serves at generation {generation}")
    elif decision.phase == "Failed":
        ready_c = Cond("Ready", "False", "RolloutFailed", decision.message)
    else:
        ready_c = Cond("Ready", "False", "NotReady", decision.message)
    if decision.phase == "Complete":
        prog = Cond("Progressing", "False", "Complete", decision.message)
    elif decision.phase == "Failed":
        prog = Cond("Progressing", "False", "ProgressDeadlineExceeded", decision.message)
    else:
        prog = Cond("Progressing", "True", decision.phase, decision.message)
    warns = warnings(problems)
    conds = [
        Cond("Valid", "True", "Valid", ""),
        ready_c,
        prog,
        degraded_condition(serving_group, decision),
        Cond("Warning", "True" if warns else "False", "CatalogWarnings" if warns else "NoWarnings", problems_message(warns)),
    ]
    phase_times = dict((previous.get("rollout") or {}).get("phaseTransitions") or {})
    if (previous.get("rollout") or {}).get("targetKey") != target_key:
        phase_times = {}
    phase_times.setdefault(decision.phase, rfc3339(decision.phase_started))
    if decision.phase == "Draining":
        phase_times.setdefault("Cutover", rfc3339(decision.phase_started))
    rollout: dict[str, Any] = {
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
        roles[component] = {
            **_role(target.workloads.get(component) if target else None),
            "kvLayout": kv_layouts.get(component),
            "attentionBackend": attention_backends.get(component),
        }
    gw = target.workloads.get("gateway") if target else None
    return {
        "observedGeneration": generation,
        "conditions": merge_conditions(previous.get("conditions") or [], conds, generation=generation, now=now),
        "prefill": roles["prefill"],
        "decode": roles["decode"],
        "gateway": {**_role(gw), "endpoint": endpoint},
        "compatKey": target_key,
        "kvLayout": kv_layouts.get("prefill"),
        "problems": [p.to_dict() for p in problems],
        "rollout": rollout,
    }


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """Status without volatile parts, for "did anything change?" (kopf's own bookkeeping dropped)."""
    return {k: v for k, v in status.items() if k != "kopf"}
