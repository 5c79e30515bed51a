"""Each role's count: its PDRoleScale, the built-in planner, and the groups the count reaches.

One step of the PDDeployment reconcile (``pddeployment.py`` step 3b), three parts:

1. **The scale targets.** For every role whose ``spec.<role>.replicas`` is omitted
   (``planning.scaling.scaled_roles``), the PDRoleScale ``<name>-<role>`` exists: created
   once with ``spec.replicas`` at the seed count (``Kube.create``), otherwise applied
   without ``spec.replicas`` (labels, owner), so server-side apply never owns the count
   and never takes it back from kubectl scale, an HPA or KEDA. A PDRoleScale of a role
   that has a fixed count again is deleted (an HPA on it then reports FailedGetScale).
2. **Who owns the count.** An ``autoscaling/v2`` HorizontalPodAutoscaler in the namespace
   whose ``scaleTargetRef`` names the PDRoleScale (KEDA's ScaledObject makes exactly such
   an HPA) is the role's external autoscaler, and the built-in planner steps aside for
   that role. HPAs are not the operator's objects and carry no label it could select on,
   so they are read from the API server (one LIST per namespace, at most every
   ``Runtime.autoscaler_ttl_s``, as the admin's catalog ConfigMap is), not watched. A
   manual ``kubectl scale`` is no autoscaler: the planner continues from the count it was given.
3. **The planner** (``spec.autoscaling``; ``planning.planner``): its inputs are built here
   from the SLO source's :class:`~..metrics.health.Health` (:func:`signals_from_health`,
   the same for the scraper and the Prometheus source), the previous
   ``status.autoscaling`` (its memory) and the observed groups (GPUs in use, ready pods);
   a count it changes is written through ``/scale`` as field manager
   ``sglang-pd-operator-planner``, with an Event and the figures in status.

:func:`apply_counts` then carries the counts to the groups: the serving group's
Deployments are scaled through ``/scale`` while another group surges beside it (the new
group is rendered with ``planning.scaling.surge_replicas``); :func:`write_role_scale_status`
writes each PDRoleScale's status (serving group's pods, the selector, the controller).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..api import lws
from ..api import rolescale
from ..api.v1alpha1 import API_VERSION, parse_duration
from ..metrics.health import Health
from ..planning import planner as P
from ..planning.scaling import ROLES, role_counts, scaled_roles, seed_replicas
from ..planning.structs import Plan
from ..render import labels as L
from ..render.rolescale import render_role_scale, role_scale_name, role_selector
from .drift import merge_patch
from .kube import Kube
from .observe import Observed
from .status import Cond, merge_conditions, parse_rfc3339, rfc3339

HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"
#: Planner states in ``status.autoscaling.planner``.
ACTIVE, WAITING, ASIDE, OFF = "Active", "WaitingForFigures", "StepsAside", "Off"

#: namespace -> {PDRoleScale name: "HorizontalPodAutoscaler/<name>"}
Autoscalers = Callable[[str], Mapping[str, str]]


# --------------------------------------------------------------------------- external autoscalers
def list_autoscalers(kube: Kube, namespace: str) -> dict[str, str]:
    """PDRoleScale name -> ``HorizontalPodAutoscaler/<name>`` for every HPA of ``namespace`` that targets one.

    An HPA targets a PDRoleScale when its ``spec.scaleTargetRef`` has kind PDRoleScale and
    an apiVersion of our group (any version). Reads the API server (HPAs are not cached).
    When two HPAs target one object (an error the HPA controller reports as
    AmbiguousSelector), the first by name is named.
    """
    out: dict[str, str] = {}
    for hpa in sorted(kube.list(HPA_API_VERSION, HPA_KIND, namespace, ""), key=lambda h: h["metadata"]["name"]):
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("kind") == rolescale.KIND and group == L.DOMAIN and ref.get("name"):
            out.setdefault(ref["name"], f"{HPA_KIND}/{hpa['metadata']['name']}")
    return out


# --------------------------------------------------------------------------- signals
def signals_from_health(health: Health | None) -> P.Signals | None:
    """The planner's :class:`~..planning.planner.Signals` from either SLO source's Health (None: none yet).

    A Health without SLO figures (``problem``: PrometheusUnavailable, NoSeries, ...) gives
    Signals with that problem (the planner holds). Queues per role come from
    ``SLOResult.roles`` (the scraper's gauges, or the Prometheus source's load queries),
    pods from the pods that answered.
    """
    if health is None:
        return None
    if health.problem is not None or health.slo is None:
        why = health.problem[1] if health.problem else "no SLO figures"
        return P.Signals(at=health.evaluated_at, window_s=0.0, problem=why)
    slo = health.slo
    targets = tuple(P.TargetSignal(metric=t.metric, percentile=t.percentile, measured=t.measured, target=t.target,
                                   met=t.met) for t in slo.targets)
    roles: dict[str, P.RoleLoad] = {}
    for role in ROLES:
        summary = slo.roles.get(role)
        pods = int(health.reachable.get(role, 0))
        if summary is None:
            roles[role] = P.RoleLoad(pods=pods)
            continue
        q = summary.queues
        roles[role] = P.RoleLoad(
            pods=pods or summary.pods, running=q.get("num_running_reqs", 0.0), waiting=q.get("num_queue_reqs", 0.0),
            bootstrap=q.get("num_prefill_bootstrap_queue_reqs", 0.0),
            inflight=q.get("num_prefill_inflight_queue_reqs", 0.0),
            prealloc=q.get("num_decode_prealloc_queue_reqs", 0.0),
            transfer=q.get("num_decode_transfer_queue_reqs", 0.0),
            token_usage=summary.token_usage, known=bool(q) or summary.token_usage is not None)
    return P.Signals(at=health.evaluated_at, window_s=slo.window_seconds, targets=targets,
                     burn_short=slo.burn_rate_short, burn_long=slo.burn_rate_long, no_traffic=slo.no_traffic,
                     roles=roles)


def per_replica(signals: P.Signals | None, ready: Mapping[str, int]) -> P.Signals | None:
    """``signals`` with each role's loads divided by its serving group's ready replicas instead of the pods
    that answered: a multi-node replica (a LeaderWorkerSet group) has ``nodes`` pods but one queue."""
    if signals is None or signals.problem is not None:
        return signals
    roles = {r: replace(load, pods=ready[r]) if ready.get(r) else load for r, load in signals.roles.items()}
    return replace(signals, roles=roles)


def pressure_view(health: Health) -> tuple:
    """What of ``health`` can move the planner (``planning.planner.pressure_view``); () without figures."""
    signals = signals_from_health(health)
    return () if signals is None or signals.problem else P.pressure_view(signals)


# --------------------------------------------------------------------------- memory <-> status
def memory_of(previous: Mapping[str, Any]) -> dict[str, P.RoleMemory]:
    """The planner's memory per role from a previous ``status.autoscaling`` (empty memory when absent)."""
    block = previous.get("autoscaling") or {}
    out = {}
    for role in ROLES:
        r = block.get(role) or {}
        out[role] = P.RoleMemory(
            pressure=r.get("pressure") if r.get("pressure") in ("up", "down", "hold") else "hold",
            since=parse_rfc3339(r.get("since")),
            last_scale=parse_rfc3339(r.get("lastScaleTime")),
            up_load=float(r["upLoad"]) if isinstance(r.get("upLoad"), (int, float)) else None,
            blocked=bool(r.get("blocked")),
            last_miss=parse_rfc3339(r.get("lastMiss")),
        )
    return out


def _role_block(replicas: int, controller: str, d: P.RoleDecision | None) -> dict[str, Any]:
    block: dict[str, Any] = {"replicas": replicas, "controller": controller}
    if d is not None:
        m = d.memory
        block.update({
            "pressure": m.pressure,
            "since": rfc3339(m.since) if m.since is not None else None,
            "lastScaleTime": rfc3339(m.last_scale) if m.last_scale is not None else None,
            "upLoad": round(m.up_load, 3) if m.up_load is not None else None,
            "blocked": True if m.blocked else None,
            "lastMiss": rfc3339(m.last_miss) if m.last_miss is not None else None,
            "reason": d.reason[:512],
        })
    return {k: v for k, v in block.items() if v is not None}


# --------------------------------------------------------------------------- the step
@dataclass
class Scaling:
    """The outcome of :func:`reconcile_scaling`.

    ``counts``: each role's count (spec, PDRoleScale, or the planner's new one);
    ``scaled``: roles a PDRoleScale owns; ``controllers``: per scaled role, who sets its
    count (``planner``, ``HorizontalPodAutoscaler/<name>`` or ``none``); ``status``: the
    ``status.autoscaling`` block (None without scaled roles); ``events``: (type, reason,
    message); ``next_look_s``: when a stabilization window ends.
    """

    counts: dict[str, int]
    scaled: tuple[str, ...] = ()
    controllers: dict[str, str] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    next_look_s: float | None = None


def _serving(observed: Observed, role: str) -> int | None:
    """Desired replicas of ``role`` in the group that serves now (None: no serving group or role yet)."""
    group = observed.groups.get(observed.serving_key) if observed.serving_key else None
    workload = group.workloads.get(role) if group is not None else None
    return workload.desired if workload is not None else None


def reconcile_scaling(
    *,
    kube: Kube,
    plan: Plan,
    observed: Observed,
    owner: dict[str, Any],
    previous: Mapping[str, Any],
    health: Health | None,
    now: float,
    autoscalers: Autoscalers | None = None,
) -> Scaling:
    """Ensure the PDRoleScales, find who owns each count, run the planner (see the module docstring).

    ``previous``: the PDDeployment's previous status (the planner's memory);
    ``autoscalers``: a (cached) :func:`list_autoscalers` by namespace; None reads the API
    server. Writes: a PDRoleScale create or apply, a delete of one no longer needed, and
    the planner's ``/scale`` patches. Raises ``ApiException`` on a failed call.
    """
    spec, ns = plan.spec, plan.namespace
    scaled = scaled_roles(spec)
    live: dict[str, dict[str, Any] | None] = {}
    for role in scaled:
        name = role_scale_name(plan.name, role)
        obj = kube.get(API_VERSION, rolescale.KIND, name, ns)
        if obj is None:
            seeded = render_role_scale(plan, role, owner=owner, replicas=seed_replicas(spec, role, _serving(observed, role)))
            kube.create(seeded)
            obj = kube.get(API_VERSION, rolescale.KIND, name, ns) or seeded
        else:
            kube.apply(render_role_scale(plan, role, owner=owner), live=obj)
        live[role] = obj
    for obj in kube.list(API_VERSION, rolescale.KIND, ns, f"{L.LABEL_DEPLOYMENT}={plan.name}"):
        role = (obj["metadata"].get("labels") or {}).get(L.LABEL_ROLE)
        if role not in scaled:
            kube.delete(API_VERSION, rolescale.KIND, obj["metadata"]["name"], ns)
    counts = role_counts(spec, {r: ((o or {}).get("spec") or {}).get("replicas") for r, o in live.items()})
    if not scaled:
        return Scaling(counts=counts)
    hpas = (autoscalers or (lambda n: list_autoscalers(kube, n)))(ns)
    external = {r: hpas[role_scale_name(plan.name, r)] for r in scaled if role_scale_name(plan.name, r) in hpas}
    a = spec.autoscaling
    planned = tuple(r for r in scaled if a is not None and getattr(a, r) is not None)
    controllers = {r: external.get(r) or ("planner" if r in planned else "none") for r in scaled}
    result = Scaling(counts=counts, scaled=scaled, controllers=controllers)
    old_block = previous.get("autoscaling") or {}
    if not planned:
        result.status = {"planner": OFF, **{r: _role_block(counts[r], controllers[r], None) for r in scaled}}
        return result

    settings = planner_settings(plan, observed, previous, external, planned)
    signals = per_replica(signals_from_health(health), settings.ready)
    decision = P.decide(signals=signals, replicas=counts, memory=memory_of(previous), settings=settings, now=now)
    before = dict(counts)
    for role, d in decision.roles.items():
        if d.acted and d.replicas != counts[role]:
            kube.scale(API_VERSION, rolescale.KIND, role_scale_name(plan.name, role), ns, d.replicas,
                       field_manager=L.PLANNER_FIELD_MANAGER)
            counts[role] = d.replicas
    acted = [d for d in decision.roles.values() if d.acted]
    last = f"{rfc3339(now)} {'; '.join(d.reason for d in acted)}"[:1024] if acted else old_block.get("lastDecision")
    state = (ASIDE if all(r in external for r in planned) else
             WAITING if signals is None or signals.problem is not None else ACTIVE)
    gpus = settings.gpus_in_use + sum((counts[r] - before[r]) * settings.gpus_per_replica.get(r, 0)
                                      * settings.receivers for r in ROLES)
    result.status = {
        "planner": state,
        "gpus": f"{gpus}" + (f"/{a.maxGPUs}" if a.maxGPUs is not None else ""),
        "lastDecision": last,
        **{r: _role_block(counts[r], controllers[r], decision.roles.get(r)) for r in scaled},
    }
    result.events = list(decision.events)
    if state == ASIDE and old_block.get("planner") != ASIDE:
        result.events.append(("Normal", "PlannerStepsAside", "; ".join(
            f"{external[r]} scales {r} through PDRoleScale {role_scale_name(plan.name, r)}" for r in planned)))
    result.next_look_s = decision.next_look_s
    return result


def planner_settings(plan: Plan, observed: Observed, previous: Mapping[str, Any], external: Mapping[str, str],
                     planned: tuple[str, ...]) -> P.Settings:
    """The planner's :class:`~..planning.planner.Settings` from the spec and what exists (pure)."""
    a = plan.spec.autoscaling
    assert a is not None
    draining = (previous.get("rollout") or {}).get("drainingKey")
    receivers = max(1, len([k for k in observed.groups if k != draining]))
    serving = observed.groups.get(observed.serving_key or plan.compat_key)
    ready = {r: serving.workloads[r].ready for r in ROLES if serving is not None and r in serving.workloads}
    return P.Settings(
        bounds={r: P.RoleBounds(getattr(a, r).minReplicas, getattr(a, r).maxReplicas) for r in planned},
        gpus_per_replica={r: plan.role(r).inputs.gpus_per_replica for r in ROLES},
        max_gpus=a.maxGPUs,
        gpus_in_use=sum(g.gpus for g in observed.groups.values()),
        receivers=receivers,
        ready=ready,
        up_stabilization_s=parse_duration(a.scaleUpStabilization),
        down_stabilization_s=parse_duration(a.scaleDownStabilization),
        external=external,
    )


# --------------------------------------------------------------------------- counts -> groups, status
def scale_serving_group(kube: Kube, plan: Plan, observed: Observed, *, serving_key: str,
                        counts: Mapping[str, int], scaled: tuple[str, ...]) -> None:
    """While a new group surges beside the serving one (``serving_key`` != the plan's key), give the
    serving group's workloads of the scaled roles (a Deployment, or a multi-node role's
    LeaderWorkerSet) their count through ``/scale`` (the new group is rendered with it).
    Nothing when the plan's own group serves (it is rendered)."""
    if serving_key == plan.compat_key:
        return
    group = observed.groups.get(serving_key)
    if group is None:
        return
    for role in scaled:
        w = group.workloads.get(role)
        if w is None or w.desired == counts[role]:
            continue
        if w.pods_per_replica > 1:  # a multi-node role's LeaderWorkerSet: its /scale counts groups
            kube.scale(lws.API_VERSION, lws.KIND, w.name, plan.namespace, counts[role])
        else:
            kube.scale("apps/v1", "Deployment", w.name, plan.namespace, counts[role])


#: The PDRoleScale condition that says whether its count reaches the role's workload.
APPLIED = "Applied"


def applied_condition(generation: int) -> Cond:
    """``Applied=True``: the PDDeployment's ``generation`` was reconciled with this count."""
    return Cond(APPLIED, "True", "Applied", f"the count reaches the role's workload (PDDeployment generation {generation})")


def mark_role_scales_held(kube: Kube, *, name: str, namespace: str, generation: int, reason: str, message: str,
                          now: float) -> None:
    """``Applied=False`` on the PDDeployment ``name``'s PDRoleScales while a generation of it is not
    applied (refused by a rule or by SGLang, or a dependency missing): a ``kubectl scale`` or an
    HPA's count waits, and says why, instead of freezing silently (a fresh user's finding).
    ``reason``: the PDDeployment's (``InvalidSpec``, ``SGLangRefused``, ...); ``message``: one line. Written
    only when it changes; a PDRoleScale that does not exist is skipped."""
    held = Cond(APPLIED, "False", reason,
                (f"PDDeployment {name} generation {generation} is not applied ({message}); this count reaches the "
                 "role's workload once it is, and the running pods are left as they are")[:1024])
    for role in ROLES:
        rs = role_scale_name(name, role)
        live = kube.get(API_VERSION, rolescale.KIND, rs, namespace)
        if live is None:
            continue
        old = (live.get("status") or {}).get("conditions") or []
        own = int(live["metadata"].get("generation") or 0)  # a condition speaks for its own object's generation
        conditions = merge_conditions(old, [held], generation=own, now=now)
        if conditions != old:
            kube.patch_status(API_VERSION, rolescale.KIND, rs, namespace, {"conditions": conditions})


def write_role_scale_status(kube: Kube, plan: Plan, observed: Observed, scaling: Scaling, *, serving_key: str,
                            now: float = 0.0) -> None:
    """Each PDRoleScale's status: the serving group's pods of the role (``replicas``, ``readyReplicas``),
    the selector, the deployment, the role, who sets the count and ``Applied=True``; written only when it changed."""
    group = observed.groups.get(serving_key)
    for role in scaling.scaled:
        name = role_scale_name(plan.name, role)
        live = kube.get(API_VERSION, rolescale.KIND, name, plan.namespace)
        if live is None:
            continue
        w = group.workloads.get(role) if group is not None else None
        new = {
            "replicas": (w.total if w.total is not None else w.desired) if w is not None else 0,
            "readyReplicas": w.ready if w is not None else 0,
            "selector": role_selector(plan.name, role),
            "deployment": plan.name,
            "role": role,
            "controller": scaling.controllers.get(role, "none"),
        }
        old = live.get("status") or {}
        new["conditions"] = merge_conditions(old.get("conditions") or [], [applied_condition(plan.generation)],
                                             generation=int(live["metadata"].get("generation") or 0), now=now)
        patch = merge_patch({k: old.get(k) for k in new}, new)
        if patch:
            kube.patch_status(API_VERSION, rolescale.KIND, name, plan.namespace, patch)
