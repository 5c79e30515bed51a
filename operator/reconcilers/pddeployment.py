"""Reconcile one PDDeployment: validate -> plan -> observe -> scale -> decide -> apply -> prune -> status.

Level-triggered and idempotent: it reads the object and what exists, converges, and
writes status only when it changed, so running it twice on an unchanged spec makes no
write the second time. An invalid generation touches no child object: status keeps
describing the serving generation and ``Valid=False`` lists every problem.

The numbered steps of :func:`reconcile` read top to bottom like the deployment they
build; each is a small function below it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from ..api import computedomain as cd
from ..api import lws
from ..api.v1alpha1 import API_VERSION, parse_duration
from ..catalog import Catalog
from ..kernelbuild.gate import (
    KernelGateState,
    cache_mode,
    gate_objects,
    kernel_gate,
    kernels_condition,
    missing_builds,
    with_kernel_compat,
)
from ..metrics.monitoring import MONITORING_API_VERSION, render_monitoring
from ..metrics.health import Health
from ..oracle.service import judged_key
from ..planning.plan import RuleMemo, plan_object, with_bucket_targets
from ..planning.structs import Plan
from ..planning.nvlink import uses_compute_domain
from ..planning.problems import Problem, errors
from ..planning.scaling import gpus_of, surge_replicas
from ..planning.rollout import (GroupState, RolloutDecision, RolloutSettings, RolloutStatus, decide, next_step_in,
                                role_strategies)
from ..render import render_group, render_shared
from ..render import labels as L
from ..render.gateway import endpoint
from ..render.record import WORKLOAD_KINDS, RenderRecord, current_record, stamp
from . import status as S
from .apierrors import CallTracker, describe_api_error
from .configs import prune_config_maps
from .drift import merge_patch
from .kernelbuild import ensure_kernelbuild
from .kube import Kube
from .kvstore import kvstore_conditions, kvstore_events, prune_master
from .observe import Observed, observe
from .scaling import (Autoscalers, mark_role_scales_held, reconcile_scaling, scale_serving_group,
                      write_role_scale_status)
from .sglang_gate import GateDecision, OracleSettings, gate
from .slo_buckets import keep_running_buckets
from .upgrade import CONDITION as UPGRADE_PENDING, REASON_HELD, Hold, adopt, live_group_objects, operator_changes

log = logging.getLogger(__name__)

GROUP_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"))
#: The workload of a role whose replicas span nodes, where the cluster serves it.
MULTI_NODE_KINDS = ((lws.API_VERSION, lws.KIND),)
#: IMEX channels of a multi-node role on GB200 / GB300 (NVIDIA's DRA driver), where the cluster serves them.
COMPUTE_DOMAIN_KINDS = ((cd.API_VERSION, cd.KIND),)


@dataclass
class Outcome:
    """What one reconcile did: writes issued, events emitted, whether the spec was valid.

    ``requeue_after``: seconds until a time-based rollout step is due (a drain grace
    period or a progress deadline ending), None when only an event can move it on;
    ``kernelbuilds``: names of the KernelBuilds the spec uses (their changes concern it);
    ``autoscaled``: the built-in planner scales a role (its figures concern it at once).
    """

    valid: bool
    writes: int = 0
    events: list[tuple[str, str, str]] = field(default_factory=list)
    decision: RolloutDecision | None = None
    requeue_after: float | None = None
    kernelbuilds: tuple[str, ...] = ()
    autoscaled: bool = False


def owner_of(body: dict[str, Any]) -> dict[str, Any]:
    """The owner reference target of a PDDeployment body."""
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": "PDDeployment", "name": meta["name"], "uid": meta.get("uid")}


def reconcile(
    *,
    kube: Kube,
    body: dict[str, Any],
    catalog: Catalog,
    now: float | None = None,
    health: Health | None = None,
    monitoring: bool = False,
    health_stale: str | None = None,
    rule_memo: RuleMemo | None = None,
    lws_served: bool = False,
    autoscalers: Autoscalers | None = None,
    cd_served: bool = False,
    oracle: OracleSettings | None = None,
    catalog_overrides: dict[str, str] | None = None,
    default_queue: str | None = None,
) -> Outcome:
    """Converge the children of the PDDeployment ``body`` (a dict as read from the API).

    ``default_queue``: the operator's default Kueue LocalQueue (``run --default-queue-name``)
    for a spec without ``scheduling.queueName`` (``planning.plan.build_plan``). It enters
    the compat key of a queued plan, so a serving group rendered under another default is
    held as an operator change (``upgrade.operator_changes``, UpgradePending) until the
    user changes its spec or opts in: the default reaches new groups only.

    ``oracle``: the SGLang oracle service (``run --oracle-url``): a generation whose rules
    pass creates or changes nothing until SGLang's verdict allows it
    (``sglang_gate.gate``); ``catalog_overrides``: the catalog ConfigMap's files, sent
    with the question so the service plans with the catalog the operator uses.

    ``lws_served``: the cluster serves LeaderWorkerSets (sigs.k8s.io/lws). Without them a
    spec with a role spanning nodes creates nothing: status says what to install
    (:func:`_missing_lws`), and whatever serves keeps serving untouched. ``cd_served``: the
    cluster serves ComputeDomains (NVIDIA's DRA driver); without them a spec with a role that
    needs IMEX channels (planning/nvlink.py) creates nothing either (ComputeDomainMissing).

    ``rule_memo``: remembers the CEL verdict per generation (``planning.plan.RuleMemo``).
    ``autoscalers``: the HPAs targeting PDRoleScales, by namespace (``scaling.list_autoscalers``,
    cached by the runtime); None reads them from the API server when a role is scaled.
    A PDDeployment being deleted (``metadata.deletionTimestamp``) is left alone: its
    children go with it, and re-applying them would only hold its deletion up.

    ``health``: the operator's latest scrape of this deployment (SLO result, reachable
    pods), written into status; None keeps what status says, unless ``health_stale``
    says why there are no fresh figures (then SLOMet turns Unknown, see
    ``status.valid_status``). ``monitoring``: the cluster serves the Prometheus
    Operator's PodMonitor and PrometheusRule kinds, so they are applied too (otherwise
    they are neither rendered nor touched).

    An API call that fails (an admission denial, a field the API server rejects) is
    recorded before the exception propagates: ``Reconciled`` False naming the call and
    the server's answer, and a Warning event ``ReconcileError`` when that condition
    changed (so a retry that fails the same way adds none).
    """
    now = time.time() if now is None else now
    if body["metadata"].get("deletionTimestamp"):
        return Outcome(valid=True)
    tracked = CallTracker(kube)
    try:
        return _reconcile(kube=tracked, body=body, catalog=catalog, now=now, health=health,  # type: ignore[arg-type]
                          monitoring=monitoring, health_stale=health_stale, rule_memo=rule_memo,
                          lws_served=lws_served, autoscalers=autoscalers, cd_served=cd_served, oracle=oracle,
                          catalog_overrides=catalog_overrides, default_queue=default_queue)
    except ApiException as e:
        if e.status == 409:  # the object changed since it was read (a status write's precondition): no
            raise            # failure to record; the retry reads the newer object
        reason, message = describe_api_error(e, call=tracked.last)
        _record_failure(kube, body, reason=reason, message=message, now=now, decided=tracked.decided)
        raise


def _reconcile(
    *,
    kube: Kube,
    body: dict[str, Any],
    catalog: Catalog,
    now: float,
    health: Health | None,
    monitoring: bool,
    health_stale: str | None,
    rule_memo: RuleMemo | None,
    lws_served: bool,
    autoscalers: Autoscalers | None = None,
    cd_served: bool = False,
    oracle: OracleSettings | None = None,
    catalog_overrides: dict[str, str] | None = None,
    default_queue: str | None = None,
) -> Outcome:
    writes_before = kube.total_writes
    meta = body["metadata"]
    name, namespace, generation = meta["name"], meta["namespace"], int(meta.get("generation") or 0)
    previous = body.get("status") or {}

    # 1. validate the object against the v1alpha1 schema and every SGLang rule
    plan, problems = plan_object(body, catalog, rule_memo=rule_memo, default_queue=default_queue)
    if plan is None or not plan.valid:
        outcome = _refuse(kube, body, problems, previous, generation, now)
        outcome.writes = kube.total_writes - writes_before
        return outcome
    spanning = [f"{r.role} nodes {r.inputs.nodes}" for r in (plan.prefill, plan.decode) if r.inputs.multi_node]
    if spanning and not lws_served:
        outcome = _missing_lws(kube, body, plan, spanning, previous, generation, now)
        outcome.writes = kube.total_writes - writes_before
        return outcome
    imex = [f"{r.role} nodes {r.inputs.nodes} on {r.inputs.accelerator_name}" for r in (plan.prefill, plan.decode)
            if uses_compute_domain(plan.spec, r)]
    if imex and not cd_served:
        outcome = _missing_dependency(kube, body, plan, previous, generation, now, reason=S.REASON_CD_MISSING,
                                      message=cd.missing_message(roles=imex))
        outcome.writes = kube.total_writes - writes_before
        return outcome

    # 1b. SGLang's own verdict (the oracle service) before any child is created or changed
    verdict = _sglang_verdict(oracle, plan, catalog, body, previous, generation, now, catalog_overrides)
    if verdict is not None and not verdict.proceed:
        outcome = _hold_for_sglang(kube, body, plan, verdict, previous, generation, now)
        outcome.writes = kube.total_writes - writes_before
        return outcome

    # what this generation's verdict is, kept for the failure record should an API call below fail
    # (a fresh user saw Valid=Unknown/AwaitingSGLangVerdict long after SGLang had accepted, and a VALID
    # column of the previous generation, while every apply failed)
    if isinstance(kube, CallTracker):
        kube.decided = (S.Cond("Valid", *verdict.valid) if verdict is not None else S.Cond("Valid", "True", "Valid", ""),
                        verdict.record if verdict is not None else previous.get("sglang"))

    # 2. kernels: each role's KernelBuild (created when missing); a built cache's digest enters the compat key
    gates = _kernel_gates(kube, plan)
    spec_plan = plan  # the spec alone: what this operator renders for it, before any cluster state
    if gates is not None:
        plan = with_kernel_compat(plan, gates)

    # 3. observe the compat groups that exist and the group the Service serves
    observed = observe(kube, name=name, namespace=namespace, lws_served=lws_served, cd_served=cd_served)

    # 3b. each role's count: its PDRoleScale's when replicas is omitted (kubectl scale, HPA, KEDA), the planner's step
    owner = owner_of(body)
    scaling = reconcile_scaling(kube=kube, plan=plan, observed=observed, owner=owner, previous=previous,
                                health=health, now=now, autoscalers=autoscalers)
    counts = scaling.counts

    # 3b'. an edit of spec.slo alone restarts no decode engine: they keep the buckets they run with
    plan, held_buckets = keep_running_buckets(plan, spec=body.get("spec") or {}, observed=observed)
    if held_buckets is not None:
        spec_plan = with_bucket_targets(spec_plan, held_buckets.slo)

    # 3c. an operator upgrade alone restarts nothing: a serving group this operator would render
    #     differently, while the user changed nothing it is made of, is held (UpgradePending)
    spec_objects = render_group(spec_plan)
    hold = operator_changes(
        body=body, observed=observed, previous=previous, spec_objects=spec_objects, new_key=spec_plan.compat_key,
        catalog=catalog, default_queue=default_queue,
        live_objects=lambda: live_group_objects(kube, name=name, namespace=namespace, key=observed.serving_key or "",
                                                lws_served=lws_served))
    target = hold.key if hold is not None else plan.compat_key

    # 4. decide the rollout: which group serves, what to create, what to delete
    rollout_before = previous_rollout(previous)
    decision = _decide(plan, observed.serving_key, observed.group_states(), rollout_before, now, counts, target=target)

    # 5. apply the target group (in place when its key is unchanged; held at zero without its kernels);
    #    the counts reach the serving group too while a new one surges beside it. A held group gets its
    #    counts only (and, made before 0.2.0, its record once).
    applied: list[str] = []  # the ConfigMaps this reconcile applied (never pruned below)
    if hold is not None:
        if hold.adopt is not None:
            adopt(kube, namespace=namespace, refs=observed.groups[hold.key].workload_refs, record=hold.adopt)
        _scale_held_group(kube, plan, observed, key=hold.key, counts=counts)
    else:
        if decision.apply_target:
            live = observed.groups.get(plan.compat_key)
            spec = body.get("spec") or {}  # the record names the targets the buckets follow
            record = current_record(generation=generation, objects=spec_objects,
                                    spec=held_buckets.recorded_spec(spec) if held_buckets is not None else spec,
                                    kept=live.record if live is not None else None)
            applied = _apply_group(kube, plan, owner, to_zero=decision.target_to_zero, gates=gates,
                         replicas=_target_replicas(plan, observed, decision, counts), record=record,
                         new_group=plan.compat_key not in observed.groups, lws_served=lws_served,
                         cd_served=cd_served)
        scale_serving_group(kube, plan, observed, serving_key=decision.serving_key, counts=counts,
                            scaled=scaling.scaled)

    # 6. apply the shared objects; the user-facing Service selects the serving group's gateway
    for obj in render_shared(plan, serving_key=decision.serving_key, owner=owner):
        kube.apply(obj)
    prune_master(kube, plan, observed.shared_deployments)  # a Mooncake master the spec no longer asks for

    # 6b. with the Prometheus Operator: its PodMonitor and PrometheusRule
    if monitoring:
        _apply_monitoring(kube, plan, owner)

    # 7. delete groups that no longer serve (drained) or never did (cancelled, superseded)
    for key in decision.delete_keys:
        _delete_group(kube, name=name, namespace=namespace, key=key, lws_served=lws_served, cd_served=cd_served)
    # 7b. a group that stays drops the ConfigMaps of configs none of its pods can read any more
    prune_config_maps(kube, name=name, namespace=namespace, observed=observed, applied=applied)

    # 8. write status (only when changed) and an event per rollout transition
    shown = decision
    if decision.apply_target or decision.delete_keys:
        observed, shown = _after_writes(kube, plan, observed, decision, rollout_before, now, counts,
                                        lws_served=lws_served, target=target, cd_served=cd_served)
    new_status = S.valid_status(
        previous=previous,
        generation=generation,
        problems=list(plan.problems),
        observed=observed,
        decision=shown,
        target_key=target,
        kv_layouts=_kv_layouts(plan, previous, hold),
        attention_backends=_attention_backends(plan, previous, hold),
        endpoint=endpoint(plan),
        now=now,
        health=health,
        slo_enabled=plan.spec.slo is not None,
        health_stale=health_stale,
        extra_conditions=_kernel_conditions(gates) + _upgrade_conditions(hold)
        + kvstore_conditions(plan=plan, health=health.kvstore if health else None, previous=previous),
        valid=S.Cond("Valid", *verdict.valid) if verdict is not None else None,
    )
    new_status["autoscaling"] = scaling.status
    new_status["scheduling"] = _scheduling_status(plan, previous, hold)
    new_status["sglang"] = verdict.record if verdict is not None else None
    steps = [t for t in (next_step_in(decision, _rollout_settings(plan), now), scaling.next_look_s,
                         verdict.requeue_after if verdict is not None else None) if t is not None]
    outcome = Outcome(valid=True, decision=decision, requeue_after=min(steps) if steps else None,
                      kernelbuilds=tuple(sorted({g.build_name for g in (gates or {}).values() if g.build_name})),
                      autoscaled=plan.spec.autoscaling is not None)
    _write_status(kube, body, previous, new_status)
    write_role_scale_status(kube, plan, observed, scaling, serving_key=shown.serving_key, now=now)
    for type_, reason, message in scaling.events:
        _event(kube, body, outcome, type_, reason, message)
    for reason, message in decision.events:
        _event(kube, body, outcome, "Normal" if reason not in ("ProgressDeadlineExceeded",) else "Warning", reason, message)
    _warn_new_warnings(kube, body, previous, plan.problems, outcome)
    _event_waiting_for_capacity(kube, body, previous, new_status, outcome)
    _event_upgrade_pending(kube, body, previous, hold, outcome)
    _warn_health_transitions(kube, body, previous, new_status, health, outcome)
    for type_, reason, message in kvstore_events(previous, new_status):
        _event(kube, body, outcome, type_, reason, message)
    if verdict is not None and verdict.event is not None and _verdict_moved(previous, verdict):
        _event(kube, body, outcome, *verdict.event)
    outcome.writes = kube.total_writes - writes_before
    return outcome


def _sglang_verdict(oracle: OracleSettings | None, plan: Plan, catalog: Catalog, body: dict[str, Any],
                    previous: dict, generation: int, now: float,
                    catalog_overrides: dict[str, str] | None) -> GateDecision | None:
    """SGLang's verdict on this generation through the oracle service (None without one).

    Asks the book off this thread when the gate says so (the answer queues this
    deployment again); see ``sglang_gate.gate`` for what each answer means.
    """
    if oracle is None:
        return None
    if S.applied_generation(previous) == generation:
        # this generation was applied already (before an operator restart or upgrade, or before the
        # oracle was configured): the gate is for new generations; what serves keeps its Valid
        was = next((c for c in previous.get("conditions") or [] if c.get("type") == "Valid"), {})
        valid = ("True", was.get("reason") or "Valid", was.get("message") or "") if was.get("status") == "True" else \
            ("True", "Valid", "")
        return GateDecision(True, valid, previous.get("sglang"))
    key = judged_key(plan, catalog)
    book = oracle.book
    decision = gate(plan=plan, key=key, previous=previous, generation=generation, answer=book.answer(key),
                    pending=book.pending(key), now=now, default_policy=oracle.default_policy,
                    default_max_wait_s=oracle.default_max_wait_s, rfc3339=S.rfc3339, parse_rfc3339=S.parse_rfc3339)
    if decision.ask:
        meta = body["metadata"]
        book.ask(key, namespace=meta["namespace"], name=meta["name"], obj=body, catalog_overrides=catalog_overrides)
    return decision


def _verdict_moved(previous: dict[str, Any], verdict: GateDecision) -> bool:
    """``status.sglang`` says something new (another verdict or other inputs): its event is due."""
    before = previous.get("sglang") or {}
    return (before.get("verdict"), before.get("key")) != (verdict.record.get("verdict"), verdict.record.get("key"))


def _hold_for_sglang(kube: Kube, body: dict[str, Any], plan: Plan, verdict: GateDecision, previous: dict,
                     generation: int, now: float) -> Outcome:
    """A generation SGLang refuses or has not judged yet: status says so; no child is created or changed.

    Like an invalid spec (:func:`_refuse`): ``observedGeneration`` advances, Valid carries
    the gate's status/reason/message, Ready and Progressing are False with the same reason
    naming what still serves, ``status.problems`` lists SGLang's refusals (and the rules'
    warnings), ``status.sglang`` the verdict; one event when the verdict changed.
    """
    status, reason, message = verdict.valid
    serves = S.still_serves(previous)
    new_status = dict(previous)
    new_status["observedGeneration"] = generation
    new_status["conditions"] = S.merge_conditions(
        previous.get("conditions") or [],
        [S.Cond("Valid", status, reason, message[: S.MAX_CONDITION_MESSAGE]),
         S.Cond("Ready", "False", reason, f"generation {generation} waits for SGLang's verdict (see the Valid "
                "condition); " + serves if status == "Unknown" else
                f"generation {generation} is not rolled out (see the Valid condition); {serves}"),
         S.Cond("Progressing", "False", reason, f"generation {generation} creates and changes nothing until SGLang "
                "accepts it")],
        generation=generation,
        now=now,
    )
    new_status["problems"] = [p.to_dict() for p in (*verdict.problems, *plan.problems)]
    new_status["sglang"] = verdict.record
    outcome = Outcome(valid=status != "False", requeue_after=verdict.requeue_after)
    _write_status(kube, body, previous, new_status)
    _hold_role_scales(kube, body, generation, reason, message, now)
    if verdict.event is not None and _verdict_moved(previous, verdict):
        _event(kube, body, outcome, *verdict.event)
    return outcome


def _refuse(
    kube: Kube, body: dict[str, Any], problems: list[Problem], previous: dict, generation: int, now: float
) -> Outcome:
    """An invalid generation: Valid=False and problems in status, one Warning event; children untouched.

    ``observedGeneration`` advances (status speaks for the refused generation) and Ready
    is False for it; the rest of status keeps describing the group that still serves.
    """
    new_status = dict(previous)
    new_status["observedGeneration"] = generation
    new_status["conditions"] = S.merge_conditions(
        previous.get("conditions") or [],
        S.invalid_conditions(problems, generation=generation, previous=previous),
        generation=generation,
        now=now,
    )
    new_status["problems"] = [p.to_dict() for p in problems]
    outcome = Outcome(valid=False)
    changed = _write_status(kube, body, previous, new_status)
    if changed:
        first = errors(problems)[:3]
        summary = "; ".join(p.line() for p in first) + (" ..." if len(errors(problems)) > 3 else "")
        _event(kube, body, outcome, "Warning", "InvalidSpec", f"generation {generation} refused: {summary}")
    first_error = next((p.line() for p in errors(problems)), "see the PDDeployment's Valid condition")
    _hold_role_scales(kube, body, generation, "InvalidSpec", first_error, now)
    return outcome


def _hold_role_scales(kube: Kube, body: dict[str, Any], generation: int, reason: str, message: str, now: float) -> None:
    """The PDRoleScales of a generation that is not applied say so (``Applied=False``, ``reason``)."""
    meta = body["metadata"]
    mark_role_scales_held(kube, name=meta["name"], namespace=meta["namespace"], generation=generation,
                          reason=reason, message=message.splitlines()[0] if message else reason, now=now)


def _missing_lws(
    kube: Kube, body: dict[str, Any], plan: Plan, spanning: list[str], previous: dict, generation: int, now: float
) -> Outcome:
    """A valid spec with a role spanning nodes on a cluster without LeaderWorkerSets: nothing is created.

    Not one object (not the single-node role, not the gateway, not a KernelBuild): a half
    deployment would serve nothing and hold GPUs. ``Valid`` stays True (the spec is
    right), ``Reconciled``, ``Ready`` and ``Progressing`` are False with reason
    LeaderWorkerSetMissing naming the API, the versions tested and how to install it
    (``lws.missing_message``); a group of an earlier generation keeps serving untouched.
    One Warning event when the condition appears.
    """
    return _missing_dependency(kube, body, plan, previous, generation, now, reason=S.REASON_LWS_MISSING,
                               message=lws.missing_message(roles=spanning))


def _missing_dependency(kube: Kube, body: dict[str, Any], plan: Plan, previous: dict, generation: int, now: float, *,
                        reason: str, message: str) -> Outcome:
    """A valid spec the cluster cannot run (an API it needs is not served): nothing is created.

    Shared by LeaderWorkerSetMissing and ComputeDomainMissing (NVIDIA's DRA driver): conditions
    False with ``reason`` and ``message`` (what to install), one Warning event when the reason appears.
    """
    new_status = dict(previous)
    new_status["observedGeneration"] = generation
    new_status["conditions"] = S.merge_conditions(
        previous.get("conditions") or [],
        S.missing_dependency_conditions(reason=reason, message=message, problems=list(plan.problems),
                                        generation=generation, previous=previous),
        generation=generation,
        now=now,
    )
    new_status["problems"] = [p.to_dict() for p in plan.problems]
    outcome = Outcome(valid=True)
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == "Reconciled"), {})
    if _write_status(kube, body, previous, new_status) and old.get("reason") != reason:
        _event(kube, body, outcome, "Warning", reason, message)
    _hold_role_scales(kube, body, generation, reason, message, now)
    return outcome


def _record_failure(kube: Kube, body: dict[str, Any], *, reason: str, message: str, now: float,
                    decided: tuple[S.Cond, dict[str, Any] | None] | None = None) -> None:
    """Write Reconciled=False (and, for a generation not yet applied, Ready/Progressing False) and
    one Warning event when that condition changed. Best effort: the caller re-raises the error.

    ``decided``: this generation's Valid condition and SGLang record when the reconcile got past
    its verdict before the call failed; they are written too, so Valid speaks for the current
    generation (without them Valid keeps what the last successful write said)."""
    meta = body["metadata"]
    previous = body.get("status") or {}
    generation = int(meta.get("generation") or 0)
    log.warning("%s/%s: reconcile failed (%s): %s", meta["namespace"], meta["name"], reason, message)
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == "Reconciled"), {})
    new_status = dict(previous)
    new_status["observedGeneration"] = generation
    conds = S.reconcile_error_conditions(reason=reason, message=message[: S.MAX_CONDITION_MESSAGE],
                                         generation=generation, previous=previous)
    if decided is not None:
        conds = [decided[0], *conds]
        new_status["sglang"] = decided[1]
    new_status["conditions"] = S.merge_conditions(
        previous.get("conditions") or [], conds, generation=generation, now=now,
    )
    try:
        _write_status(kube, body, previous, new_status)
    except ApiException as e:  # the object is gone, or the API server is what failed
        log.debug("%s/%s: could not record the failure in status: %s", meta["namespace"], meta["name"], e.reason)
        return
    new = next(c for c in new_status["conditions"] if c["type"] == "Reconciled")
    if (old.get("status"), old.get("reason"), old.get("message")) != (new["status"], new["reason"], new["message"]):
        _event(kube, body, Outcome(valid=True), "Warning", "ReconcileError", new["message"])


def previous_rollout(previous: dict[str, Any]) -> RolloutStatus:
    """The rollout memory in a previous ``status`` (its ``rollout`` block; empty values without one)."""
    prev = previous.get("rollout") or {}
    return RolloutStatus(
        target_key=prev.get("targetKey"),
        phase=prev.get("phase"),
        phase_started=S.parse_rfc3339(prev.get("phaseStarted")),
        draining_key=prev.get("drainingKey"),
        drain_started=S.parse_rfc3339(prev.get("drainStarted")),
        completed="Complete" in (prev.get("phaseTransitions") or {}),
    )


def _decide(
    plan: Plan, serving: str | None, groups: dict[str, GroupState], prev: RolloutStatus, now: float,
    counts: dict[str, int], *, target: str,
) -> RolloutDecision:
    """The rollout decision toward ``target`` (the plan's key, or a held group's: ``upgrade.Hold``)."""
    target_gpus = gpus_of(counts, {r: plan.role(r).inputs.gpus_per_replica for r in ("prefill", "decode")})
    return decide(
        target=target,
        serving=serving,
        groups=groups,
        previous=prev,
        settings=_rollout_settings(plan),
        target_gpus=target_gpus,
        now=now,
        scaled_to_zero=tuple(r for r in ("prefill", "decode") if counts.get(r) == 0)
        + (("gateway",) if plan.spec.gateway.replicas == 0 else ()),
    )


def _rollout_settings(plan: Plan) -> RolloutSettings:
    """``spec.rollout`` in seconds."""
    ro = plan.spec.rollout
    return RolloutSettings(
        progress_deadline_s=parse_duration(ro.progressDeadline),
        drain_grace_s=parse_duration(ro.drainGracePeriod),
        max_surge_gpus=ro.maxSurgeGPUs,
        scale_failed_to_zero=ro.onFailure == "ScaleToZero",
        no_surge=tuple((role, st.reason) for role, st in
                       role_strategies(spec=plan.spec, prefill=plan.prefill, decode=plan.decode).items() if not st.surge),
    )


def _after_writes(
    kube: Kube, plan: Plan, before: Observed, decision: RolloutDecision, rollout_before: RolloutStatus, now: float,
    counts: dict[str, int], *, lws_served: bool = False, target: str, cd_served: bool = False,
) -> tuple[Observed, RolloutDecision]:
    """The observation status shows after this reconcile's writes, and the decision made from it.

    Status reads the children again after the writes (an in-place update makes a Ready
    group not Ready) and decides the rollout phase again from that observation, with
    ``decision`` as the previous rollout and the same clock, so every condition of the
    write speaks for one observation (never Ready=False with Progressing=False/Complete).
    When that second decision would act where this reconcile did not (another serving
    key, more deletions), or a group turned Ready in between (its transition and event
    belong to the next reconcile, which its Deployment's change triggers), status shows
    ``before`` and ``decision``, the observation acted on. Events always come from
    ``decision``: they describe what was done.
    """
    after = observe(kube, name=plan.name, namespace=plan.namespace, lws_served=lws_served,
                    cd_served=cd_served)
    prev = RolloutStatus(
        target_key=target,
        phase=decision.phase,
        phase_started=decision.phase_started,
        draining_key=decision.draining_key,
        drain_started=decision.drain_started,
        completed=decision.phase == "Complete"
        or (rollout_before.completed and rollout_before.target_key == target),
    )
    again = _decide(plan, after.serving_key, after.group_states(), prev, now, counts, target=target)
    turned_ready = any(g.ready and not (k in before.groups and before.groups[k].ready) for k, g in after.groups.items())
    if turned_ready or again.serving_key != decision.serving_key or not set(again.delete_keys) <= set(decision.delete_keys):
        return before, decision
    return after, replace(again, events=())


def _kernel_gates(kube: Kube, plan: Plan) -> dict[str, KernelGateState] | None:
    """Per role, the KernelBuild it needs and its state; creates missing ``auto`` builds. None with ``cache: none``."""
    if cache_mode(plan.spec.kernels.cache) == "none":
        return None
    builds = {b["metadata"]["name"]: b for b in kube.list(API_VERSION, "KernelBuild", plan.namespace, "")}
    gates = kernel_gate(plan, builds)
    for manifest in missing_builds(plan, gates):
        ensure_kernelbuild(kube, manifest)
    return gates


def _kernel_conditions(gates: dict[str, KernelGateState] | None) -> list[S.Cond]:
    c = kernels_condition(gates) if gates is not None else None
    return [S.Cond(c["type"], c["status"], c["reason"], c["message"])] if c else []


def _target_replicas(plan: Plan, observed: Observed, decision: RolloutDecision,
                     counts: dict[str, int]) -> dict[str, int]:
    """The plan's group's replicas: the counts, or within ``rollout.maxSurgeGPUs`` while it surges
    beside another serving group (``planning.scaling.surge_replicas``)."""
    if decision.serving_key == plan.compat_key:
        return counts
    group = observed.groups.get(plan.compat_key)
    current = {r: w.desired for r, w in group.workloads.items()} if group is not None else None
    return surge_replicas(counts=counts, current=current, max_surge_gpus=plan.spec.rollout.maxSurgeGPUs,
                          gpus_per_replica={r: plan.role(r).inputs.gpus_per_replica for r in ("prefill", "decode")})


def _apply_group(
    kube: Kube, plan: Plan, owner: dict[str, Any], *, to_zero: bool, gates: dict[str, KernelGateState] | None,
    replicas: dict[str, int] | None = None, record: RenderRecord | None = None, new_group: bool = False,
    lws_served: bool = False, cd_served: bool = False,
) -> list[str]:
    """Apply the plan's group all or nothing: the API server's verdict first, no GPU touched before it.

    Its workloads carry ``record`` (who rendered them, from what spec). Children that differ
    from the live object are applied with a server dry run (``dryRun=All``: schema,
    defaulting, admission policies and webhooks run, nothing is stored) before any is
    written; a refusal raises with the child named (``dry-run apply Deployment ns/name``)
    and nothing written. An existing group dry-runs every changed child (a refused update
    must leave the serving group as it was). A ``new_group`` writes its other children
    first (the gateway's Deployment included: it takes no GPU) and its engine workloads
    (prefill and decode Deployments or LeaderWorkerSets: what takes GPUs) last, and
    dry-runs every engine but the first it writes, before any write: that first engine's
    own write is the API server's verdict on it, given when every other engine was already
    heard. A child refused at its write, dry-run or not (a policy or quota that changed in
    between), makes the group's children be deleted again before the error propagates, so
    a new group is never left half created and no engine pod of it exists unless every
    engine was accepted. That saves 10 of the 11 requests a dry run of every child cost
    per new group (the convergence of 1,000 PDDeployments against a plain client,
    docs/scale.md).
    ``reconcile`` records the error as ``Reconciled=False`` naming the child and the API
    server's message. Returns the names of the ConfigMaps it applied.
    """
    objects = render_group(plan, owner=owner, replicas=replicas)
    if record is not None:
        objects = stamp(objects, record)
    if gates is not None:
        objects = gate_objects(objects, gates)
    objects = [{**obj, "spec": {**obj["spec"], "replicas": 0}}
               if to_zero and obj["kind"] in ("Deployment", lws.KIND) else obj for obj in objects]
    # a ComputeDomain's spec is immutable (the driver's CEL): created once when missing, never applied
    domains = [obj for obj in objects if obj["kind"] == cd.KIND]
    objects = [obj for obj in objects if obj["kind"] != cd.KIND]
    if new_group:  # its engines last: everything before them can be taken back before a GPU pod exists
        engines = [obj for obj in objects if _is_engine(obj)]
        objects = [obj for obj in objects if not _is_engine(obj)] + engines
        checked = engines[1:]  # the first engine's write is its own verdict: the others were heard before it
    else:
        checked = objects
    for obj in checked:  # 1. the API server's verdict on each changed child (a new group's: engines); nothing is written
        kube.apply(obj, dry_run=True)
    try:
        for obj in domains:
            meta = obj["metadata"]
            if kube.get(cd.API_VERSION, cd.KIND, meta["name"], meta["namespace"]) is None:
                kube.create(obj)
        for obj in objects:  # 2. write them
            kube.apply(obj)
        if cd_served:
            _prune_replica_domains(kube, plan, domains)
    except ApiException:
        if not new_group:
            raise
        failed = getattr(kube, "last", None)
        try:  # 3. refused after its dry run: the new group's children go again
            _delete_group(kube, name=plan.name, namespace=plan.namespace, key=plan.compat_key, lws_served=lws_served,
                          cd_served=cd_served)
        except ApiException as e:
            log.warning("%s/%s: could not delete the half-created group %s: %s", plan.namespace, plan.name,
                        plan.compat_key, e.reason)
        if failed is not None:
            _track(kube, f"{failed} (the new group's other children were deleted again)")
        raise
    return [obj["metadata"]["name"] for obj in objects if obj["kind"] == "ConfigMap"]


def _prune_replica_domains(kube: Kube, plan: Plan, domains: list[dict[str, Any]]) -> None:
    """Delete the per-replica ComputeDomains of the plan's group that no replica uses any more (a
    scale-down): one not among ``domains`` (the rendered ones), once no pod of its replica remains
    (the driver's IMEX daemons serve those pods until they are gone). render/multinode.py."""
    roles = {r.role for r in (plan.prefill, plan.decode) if r.inputs.multi_node and uses_compute_domain(plan.spec, r)}
    if not roles:
        return
    keep = {d["metadata"]["name"] for d in domains}
    selector = f"{L.LABEL_DEPLOYMENT}={plan.name},{L.LABEL_COMPAT_KEY}={plan.compat_key},{cd.GROUP_INDEX_LABEL}"
    for obj in kube.list(cd.API_VERSION, cd.KIND, plan.namespace, selector):
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if meta["name"] in keep or labels.get(L.LABEL_ROLE) not in roles or meta.get("deletionTimestamp"):
            continue
        replica = (f"{L.LABEL_DEPLOYMENT}={plan.name},{L.LABEL_COMPAT_KEY}={plan.compat_key},"
                   f"{L.LABEL_ROLE}={labels[L.LABEL_ROLE]},{lws.LABEL_GROUP_INDEX}={labels[cd.GROUP_INDEX_LABEL]}")
        if not kube.list("v1", "Pod", plan.namespace, replica):
            kube.delete(cd.API_VERSION, cd.KIND, meta["name"], plan.namespace)


def _is_engine(obj: dict[str, Any]) -> bool:
    """An engine workload (a prefill or decode Deployment or LeaderWorkerSet): what takes GPUs."""
    return obj["kind"] in WORKLOAD_KINDS and (obj["metadata"].get("labels") or {}).get(L.LABEL_ROLE) in ("prefill", "decode")


def _track(kube: Kube, call: str) -> None:
    """Name the call in flight for an error message, when ``kube`` is the reconcile's CallTracker."""
    if hasattr(kube, "last"):
        kube.last = call  # type: ignore[attr-defined]


def _scale_held_group(kube: Kube, plan: Plan, observed: Observed, *, key: str, counts: dict[str, int]) -> None:
    """A held group (``upgrade.Hold``) follows the counts through ``/scale``: each role's (the spec's or
    its PDRoleScale's) and the gateway's ``spec.gateway.replicas``; its templates stay as rendered."""
    group = observed.groups.get(key)
    if group is None:
        return
    wanted = dict(counts)
    wanted["gateway"] = 1 if plan.spec.gateway.replicas is None else plan.spec.gateway.replicas
    for component, w in group.workloads.items():
        n = wanted.get(component)
        if n is None or w.desired == n:
            continue
        if w.pods_per_replica > 1:  # a multi-node role's LeaderWorkerSet: its /scale counts groups
            kube.scale(lws.API_VERSION, lws.KIND, w.name, plan.namespace, n)
        else:
            kube.scale("apps/v1", "Deployment", w.name, plan.namespace, n)


def _kv_layouts(plan: Plan, previous: dict[str, Any], hold: Hold | None) -> dict[str, str | None]:
    """Each role's KV layout string: the plan's, or for a held group what status said of it."""
    if hold is not None:
        return {r: (previous.get(r) or {}).get("kvLayout") for r in ("prefill", "decode")}
    return {r: plan.role(r).kv_layout_string for r in ("prefill", "decode")}


def _attention_backends(plan: Plan, previous: dict[str, Any], hold: Hold | None) -> dict[str, str | None]:
    if hold is not None:
        return {r: (previous.get(r) or {}).get("attentionBackend") for r in ("prefill", "decode")}
    return {r: (plan.role(r).layout.attention_backend if plan.role(r).layout else None) for r in ("prefill", "decode")}


def _scheduling_status(plan: Plan, previous: dict[str, Any], hold: Hold | None) -> dict[str, str] | None:
    """``status.scheduling``: the Kueue queue of the target group's LeaderWorkerSets and where it comes
    from (``spec`` or ``operatorDefault``); None when nothing is queued. A held group keeps what status
    said of it (its queue is the one it was created with, not the operator's current default)."""
    if hold is not None:
        return previous.get("scheduling")
    return {"queueName": plan.queue_name, "queueSource": plan.queue_source} if plan.queued else None


def _upgrade_conditions(hold: Hold | None) -> list[S.Cond]:
    """UpgradePending while a group is held; absent otherwise."""
    if hold is None:
        return []
    return [S.Cond(UPGRADE_PENDING, "True", REASON_HELD, hold.message()[: S.MAX_CONDITION_MESSAGE * 4])]


def _event_upgrade_pending(kube: Kube, body: dict[str, Any], previous: dict[str, Any], hold: Hold | None,
                           outcome: Outcome) -> None:
    """One Normal event when a group starts being held (status is the memory: a restart adds none)."""
    if hold is None:
        return
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == UPGRADE_PENDING), {})
    if old.get("status") != "True":
        _event(kube, body, outcome, "Normal", UPGRADE_PENDING, hold.message()[: S.MAX_CONDITION_MESSAGE])


def _apply_monitoring(kube: Kube, plan: Plan, owner: dict[str, Any]) -> None:
    """PodMonitor (engine and gateway pods) and, with ``spec.slo``, PrometheusRule; a rule
    left from a removed ``spec.slo`` is deleted."""
    objects = render_monitoring(
        load=plan.spec.autoscaling is not None,
        name=plan.name,
        namespace=plan.namespace,
        slo_spec=plan.spec.slo,
        pod_selector={L.LABEL_DEPLOYMENT: plan.name, "app.kubernetes.io/managed-by": L.MANAGED_BY},
        role_label=L.LABEL_ROLE,
        compat_key_label=L.LABEL_COMPAT_KEY,
        labels=L.common_labels(plan.name),
        owner_references=L.owner_reference(owner),
    )
    try:
        for obj in objects:
            kube.apply(obj)
        if plan.spec.slo is None and kube.get(MONITORING_API_VERSION, "PrometheusRule", plan.name, plan.namespace):
            kube.delete(MONITORING_API_VERSION, "PrometheusRule", plan.name, plan.namespace)
    except (NotFoundError, ResourceNotFoundError) as e:  # the CRDs went away since the check
        log.warning("%s/%s: Prometheus Operator kinds not served any more, monitoring objects skipped: %s",
                    plan.namespace, plan.name, str(e).splitlines()[0])


def _delete_group(kube: Kube, *, name: str, namespace: str, key: str, lws_served: bool = False,
                  cd_served: bool = False) -> None:
    selector = f"{L.LABEL_DEPLOYMENT}={name},{L.LABEL_COMPAT_KEY}={key},app.kubernetes.io/managed-by={L.MANAGED_BY}"
    for api_version, kind in GROUP_KINDS:
        for obj in kube.list(api_version, kind, namespace, selector):
            kube.delete(api_version, kind, obj["metadata"]["name"], namespace)
    if lws_served:  # the kind exists only where LeaderWorkerSet is installed
        for api_version, kind in MULTI_NODE_KINDS:
            for obj in kube.list(api_version, kind, namespace, selector):
                kube.delete(api_version, kind, obj["metadata"]["name"], namespace)
    if cd_served:  # the kind exists only where NVIDIA's DRA driver is installed
        for api_version, kind in COMPUTE_DOMAIN_KINDS:
            for obj in kube.list(api_version, kind, namespace, selector):
                kube.delete(api_version, kind, obj["metadata"]["name"], namespace)


def _write_status(kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any]) -> bool:
    """Merge-patch status with exactly the difference; no write when nothing changed.

    The patch carries ``body``'s resourceVersion as a precondition: status holds memory
    (rollout timers, the planner's hysteresis), and a difference computed against a status
    someone else rewrote since (another replica after a failover, a user) must not land on
    it; the API server answers 409 and the retry reads the newer object.
    """
    patch = merge_patch(S.comparable(previous), S.comparable(new))
    if not patch:
        return False
    meta = body["metadata"]
    kube.patch_status(API_VERSION, "PDDeployment", meta["name"], meta["namespace"], patch,
                      resource_version=meta.get("resourceVersion"))
    return True


def _event(kube: Kube, body: dict[str, Any], outcome: Outcome, type_: str, reason: str, message: str) -> None:
    outcome.events.append((type_, reason, message))
    try:
        kube.event(body, type_=type_, reason=reason, message=message)
    except Exception as e:  # an event is best effort; never fail a reconcile on it
        log.warning("could not record event %s: %s", reason, e)


def _warn_new_warnings(
    kube: Kube, body: dict[str, Any], previous: dict[str, Any], problems: tuple[Problem, ...], outcome: Outcome
) -> None:
    old = {(p.get("field"), p.get("message")) for p in previous.get("problems") or [] if p.get("severity") == "warning"}
    for p in problems:
        if p.severity == "warning" and (p.field, p.to_dict()["message"]) not in old:
            _event(kube, body, outcome, "Warning", "CatalogWarning", p.line())


def _event_waiting_for_capacity(kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any],
                                outcome: Outcome) -> None:
    """A Normal event when Ready turns to WaitingForCapacity (Kueue holds replicas of the target group); once per
    transition (status is the memory)."""
    def reason(status: dict[str, Any]) -> str | None:
        return next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)

    if reason(new) == S.REASON_WAITING_FOR_CAPACITY != reason(previous):
        ready = next(c for c in new["conditions"] if c.get("type") == "Ready")
        _event(kube, body, outcome, "Normal", S.REASON_WAITING_FOR_CAPACITY, ready.get("message", ""))


def _warn_health_transitions(
    kube: Kube, body: dict[str, Any], previous: dict[str, Any], new: dict[str, Any], health: Health | None,
    outcome: Outcome,
) -> None:
    """Warning events on transitions only: a target that turned red (its ``met`` in
    ``status.slo.targets`` became false), and Degraded turning to NoPrefill, NoDecode or
    KVTransferFailing. Status is the memory, so an operator restart fires nothing again."""
    was_red = {(t.get("metric"), t.get("percentile")) for t in (previous.get("slo") or {}).get("targets") or []
               if t.get("met") is False}
    if health is not None and health.slo is not None and new.get("slo"):
        turned = [t for t in health.slo.violations if (t.metric, t.percentile) not in was_red]
        if turned:
            window = new["slo"].get("window", "")
            _event(kube, body, outcome, "Warning", "SLOTargetMissed",
                   "; ".join(t.describe() for t in turned) + f" (window {window})")
    old_c = next((c for c in previous.get("conditions") or [] if c.get("type") == "Degraded"), {})
    new_c = next((c for c in new.get("conditions") or [] if c.get("type") == "Degraded"), {})
    if (new_c.get("status") == "True" and new_c.get("reason") in S.DEGRADED_WARNINGS
            and (old_c.get("status"), old_c.get("reason")) != ("True", new_c.get("reason"))):
        _event(kube, body, outcome, "Warning", new_c["reason"], new_c.get("message", ""))
