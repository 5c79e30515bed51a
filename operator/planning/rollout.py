"""Paired rollouts: decide, from what exists, which compat group serves and which groups go (pure).

Every prefill, decode and gateway object of one compat key forms a *group*. A change
that keeps the key updates the group in place (phase Updating while older pods run;
each role surges one pod within the GPU budget, :func:`in_place_strategies`, and the
Deployments' own progress deadline fails an update that stalls); a change of the key
starts a new group beside the serving one. Only when the new group's prefill, decode and gateway are all
Ready does the user-facing Service move to the new gateway (cutover); the old group then
drains for ``drainGracePeriod`` and is deleted. Each gateway selects exactly one key,
so no moment exists where a gateway pairs pods of two keys (the failure mode of
llm-d #499, Dynamo #12796, KServe #6218).

``decide`` is a pure function of the observed groups, the serving key (read from the
user-facing Service, an object the operator owns), the previous rollout status and the
clock, so a restarted operator reaches the same decision (no duplicate groups: group
names derive from the key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..api.v1alpha1 import parse_duration

if TYPE_CHECKING:  # types only: this module imports nothing of the planner at run time
    from ..api.v1alpha1 import PDDeploymentSpec
    from .structs import RolePlan

Phase = Literal["Surging", "Updating", "Cutover", "Draining", "Complete", "Recovering", "Failed", "WaitingForCapacity"]


@dataclass(frozen=True)
class GroupState:
    """One observed compat group.

    ``ready``: prefill, decode and gateway Deployments exist and all replicas are
    available at their current pod template; ``gpus``: GPUs its pods request in total;
    ``unschedulable``: pods of the group wait for capacity (PodScheduled=False);
    ``updating``: one line per Deployment whose older pods still run beside the current
    template's (an in-place update), e.g. ``prefill 1/1 updated, 2 pods``; ``stalled``:
    one line per Deployment whose controller reports ProgressDeadlineExceeded; ``short``:
    one line per workload with fewer ready replicas than asked, e.g. ``decode: 0/1 ready``.
    """

    key: str
    ready: bool
    gpus: int = 0
    unschedulable: int = 0
    unschedulable_reason: str = ""
    updating: tuple[str, ...] = ()
    stalled: tuple[str, ...] = ()
    short: tuple[str, ...] = ()

    def waiting(self) -> str:
        """`` (N pod(s) cannot be scheduled: <scheduler's reason>)`` or ``""``."""
        if not self.unschedulable:
            return ""
        why = f": {self.unschedulable_reason}" if self.unschedulable_reason else ""
        pods = "1 pod" if self.unschedulable == 1 else f"{self.unschedulable} pods"
        return f" ({pods} cannot be scheduled{why})"


@dataclass(frozen=True)
class RolloutStatus:
    """What the previous reconcile recorded in ``status.rollout`` (all optional).

    ``completed``: the group of ``target_key`` has been Complete before (its
    ``phaseTransitions`` hold ``Complete``): it is no first group any more, and its turning
    Complete again is a recovery, not a finished rollout (unless it was ``Updating``).
    """

    target_key: str | None = None
    phase: str | None = None
    phase_started: float | None = None
    draining_key: str | None = None
    drain_started: float | None = None
    completed: bool = False


@dataclass(frozen=True)
class RolloutSettings:
    """spec.rollout in seconds."""

    progress_deadline_s: float = 1800.0
    drain_grace_s: float = 60.0
    max_surge_gpus: int | None = None
    scale_failed_to_zero: bool = False
    #: (role, why) of each role whose in-place update replaces pods without a surge pod
    #: (:func:`role_strategies`: ``rollout.maxSurgeGPUs`` leaves no room for one)
    no_surge: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RolloutDecision:
    """What this reconcile does.

    ``serving_key``: the key the user-facing Service selects afterwards;
    ``apply_target``: create or update the target group; ``target_to_zero``: apply it
    with zero replicas (a failed group with onFailure ScaleToZero); ``delete_keys``:
    groups to delete now; ``phase`` and ``phase_started`` (epoch seconds);
    ``draining_key`` / ``drain_started``: the old group waiting out its grace period;
    ``message``: one line for the Progressing condition; ``events``: (reason, message)
    pairs for phase transitions.
    """

    serving_key: str
    apply_target: bool
    target_to_zero: bool
    delete_keys: tuple[str, ...]
    phase: Phase
    phase_started: float
    draining_key: str | None
    drain_started: float | None
    message: str
    events: tuple[tuple[str, str], ...] = field(default=())


def next_step_in(decision: RolloutDecision, settings: RolloutSettings, now: float) -> float | None:
    """Seconds until ``decision`` takes a time-based step no watch event announces, None when it has none.

    A draining group is deleted when its grace period ends (``drainGracePeriod`` after
    ``drain_started``); a new group surging beside the serving one fails when its
    ``progressDeadline`` passes. Everything else moves on a child's event (a Deployment
    turning Ready, or its own controller's ProgressDeadlineExceeded). Never negative.
    """
    if decision.phase == "Draining" and decision.drain_started is not None:
        return max(0.0, decision.drain_started + settings.drain_grace_s - now)
    if decision.phase == "Surging":
        return max(0.0, decision.phase_started + settings.progress_deadline_s - now)
    return None


def _in_place_failed(
    *, target: str, state: GroupState, previous: RolloutStatus, others: list[str], now: float
) -> RolloutDecision:
    """The serving group's own Deployments stopped progressing (an in-place update or a first
    group past ``progressDeadlineSeconds``): Failed, and never scaled to zero, since its
    remaining pods are all that serves. Clears once the Deployments progress again (a new
    pod template restarts their deadline)."""
    events: tuple[tuple[str, str], ...] = ()
    if previous.phase != "Failed" or previous.target_key != target:
        events = (("ProgressDeadlineExceeded", f"group {target[:6]} made no progress within the progress deadline: "
                   + "; ".join(state.stalled)),)
    started = previous.phase_started if previous.phase == "Failed" and previous.target_key == target and previous.phase_started else now
    kept = "; its older pods keep serving" if state.updating else ""
    return RolloutDecision(
        serving_key=target,
        apply_target=True,
        target_to_zero=False,
        delete_keys=tuple(sorted(others)),
        phase="Failed",
        phase_started=started,
        draining_key=None,
        drain_started=None,
        message=f"group {target[:6]} did not become Ready within the progress deadline ({'; '.join(state.stalled)})"
        f"{state.waiting()}{kept}",
        events=events,
    )


def _pick_serving(target: str, serving: str | None, groups: dict[str, GroupState]) -> str:
    """The serving key, repaired when the Service is missing or points at a group that is gone."""
    if serving is not None and (serving in groups or serving == target):
        return serving
    if target in groups and groups[target].ready:
        return target
    ready_old = sorted(k for k, g in groups.items() if k != target and g.ready)
    return ready_old[0] if ready_old else target


def decide(
    *,
    target: str,
    serving: str | None,
    groups: dict[str, GroupState],
    previous: RolloutStatus,
    settings: RolloutSettings,
    target_gpus: int,
    now: float,
    scaled_to_zero: tuple[str, ...] = (),
) -> RolloutDecision:
    """Decide the serving group, what to apply and what to delete.

    ``target``: the compat key of the current spec; ``serving``: the key the user-facing
    Service selects now (None when there is no Service yet); ``groups``: every group that
    exists, by key; ``target_gpus``: GPUs the target group requests; ``scaled_to_zero``:
    roles whose count is 0 (``spec.<role>.replicas`` or its PDRoleScale): a group that
    serves with such a role is as asked, phase ``Complete`` with a message saying it serves
    nothing (never a surge waiting forever for pods nobody asked for). Never returns a
    decision whose ``delete_keys`` contains the serving key.
    """
    first_deploy = serving is None and not groups
    serving = _pick_serving(target, serving, groups)
    events: list[tuple[str, str]] = []
    same_rollout = previous.target_key == target

    if serving == target:
        others = [k for k in groups if k != target]
        draining = previous.draining_key if previous.draining_key in others else None
        if draining is not None and previous.drain_started is not None and now - previous.drain_started < settings.drain_grace_s:
            left = settings.drain_grace_s - (now - previous.drain_started)
            return RolloutDecision(
                serving_key=target,
                apply_target=True,
                target_to_zero=False,
                delete_keys=tuple(sorted(k for k in others if k != draining)),
                phase="Draining",
                phase_started=previous.drain_started,
                draining_key=draining,
                drain_started=previous.drain_started,
                message=f"group {draining[:6]} drains for {left:.0f}s more before it is deleted",
            )
        state = groups.get(target)
        ready = state is not None and state.ready
        if state is not None and not ready and state.stalled:
            return _in_place_failed(target=target, state=state, previous=previous, others=others, now=now)
        parked = bool(scaled_to_zero) and state is not None and not ready and not state.updating
        waiting = state is not None and not ready and not parked and not state.updating
        # an in-place update whose older pods are all gone (a role replaced without a surge pod) is still one
        # until the group is Ready; a group that served and lost ready pods with no change under way recovers
        # (a fresh user read "Surging ... is not Ready yet" for both)
        still_updating = waiting and same_rollout and previous.phase == "Updating"
        recovering = (waiting and not still_updating and same_rollout and previous.completed
                      and previous.phase in ("Complete", "Recovering"))
        phase: Phase = ("Complete" if ready or parked else "Updating" if (state is not None and state.updating)
                        or still_updating else "Recovering" if recovering else "Surging")
        # an event only for a rollout that finished: not when a pod of a group that was Complete recovers
        if phase == "Complete" and not parked and previous.phase not in (None, "Complete"):
            if previous.phase == "Updating":
                events.append(("RolloutComplete", f"group {target[:6]} serves; updated in place"))
            elif not (same_rollout and previous.completed):
                events.append(("RolloutComplete", f"group {target[:6]} serves" + ("; old groups deleted" if others else "")))
        if phase == "Updating" and previous.phase != "Updating":
            events.append(("Updating", f"group {target[:6]} updates in place: {'; '.join(state.updating)}"))
        if others and draining is not None:
            events.append(("Drained", f"group {draining[:6]} deleted after its grace period"))
        started = previous.phase_started if (same_rollout and previous.phase == phase and previous.phase_started is not None) else now
        pending = state.waiting() if state is not None else ""
        first = first_deploy or not (others or (same_rollout and previous.completed))
        if ready:
            message = f"group {target[:6]} serves"
        elif parked:
            roles = ", ".join(scaled_to_zero)
            fields = " / ".join(f"spec.{r}.replicas" for r in scaled_to_zero)
            message = (f"group {target[:6]} serves nothing: {roles} scaled to 0 replicas ({fields}, or the role's "
                       f"PDRoleScale where that is omitted); scale {roles} to at least 1 to serve") + pending
        elif phase == "Updating":
            shown = state.updating or state.short
            lines = "; ".join(shown)
            unsurged = [why for role, why in settings.no_surge if any(u.startswith(f"{role}:") for u in shown)]
            if unsurged:  # a fresh user read "its older pods serve" while the only pod was being replaced
                message = f"group {target[:6]} updates in place ({lines}); {'; '.join(unsurged)}" + pending
            elif state.updating:
                message = f"group {target[:6]} updates in place, its older pods serve until the new ones are Ready ({lines})" + pending
            else:
                message = f"group {target[:6]} updates in place; the new template's pods are not all Ready yet ({lines})" + pending
        elif phase == "Recovering":
            message = (f"group {target[:6]} is short of ready replicas ({'; '.join(state.short) or 'waiting for its workloads'}): "
                       "pods are being replaced or added; no rollout is under way") + pending
        else:
            message = ("creating the first group" if first else f"group {target[:6]} is not Ready yet") + pending
        return RolloutDecision(
            serving_key=target,
            apply_target=True,
            target_to_zero=False,
            delete_keys=tuple(sorted(others)),
            phase=phase,
            phase_started=started,
            draining_key=None,
            drain_started=None,
            message=message,
            events=tuple(events),
        )

    # A new key while another group serves: never delete the serving group here.
    stale = tuple(sorted(k for k in groups if k not in (serving, target)))
    target_state = groups.get(target)
    if target_state is not None and target_state.ready:
        events.append(("Cutover", f"the gateway Service moves from group {serving[:6]} to {target[:6]}"))
        events.append(("Draining", f"group {serving[:6]} drains for {settings.drain_grace_s:.0f}s"))
        return RolloutDecision(
            serving_key=target,
            apply_target=True,
            target_to_zero=False,
            delete_keys=stale,
            phase="Draining",
            phase_started=now,
            draining_key=serving,
            drain_started=now,
            message=f"cut over to group {target[:6]}; group {serving[:6]} drains",
            events=tuple(events),
        )
    if target_state is None and settings.max_surge_gpus is not None and target_gpus > settings.max_surge_gpus:
        waiting = same_rollout and previous.phase == "WaitingForCapacity" and previous.phase_started is not None
        started = previous.phase_started if waiting else now
        if not (same_rollout and previous.phase == "WaitingForCapacity"):
            events.append(("WaitingForCapacity", f"group {target[:6]} needs {target_gpus} GPUs beyond the serving group"))
        return RolloutDecision(
            serving_key=serving,
            apply_target=False,
            target_to_zero=False,
            delete_keys=stale,
            phase="WaitingForCapacity",
            phase_started=started,
            draining_key=None,
            drain_started=None,
            message=f"group {target[:6]} needs {target_gpus} extra GPUs, more than rollout.maxSurgeGPUs "
            f"({settings.max_surge_gpus}); group {serving[:6]} keeps serving",
            events=tuple(events),
        )
    surging_since = (
        previous.phase_started
        if same_rollout and previous.phase in ("Surging", "Failed") and previous.phase_started is not None
        else now
    )
    if not (same_rollout and previous.phase in ("Surging", "Failed")):
        events.append(("Surging", f"group {target[:6]} starts beside serving group {serving[:6]}"))
    if now - surging_since > settings.progress_deadline_s:
        if previous.phase != "Failed":
            events.append(
                ("ProgressDeadlineExceeded", f"group {target[:6]} was not Ready within the progress deadline")
            )
        return RolloutDecision(
            serving_key=serving,
            apply_target=True,
            target_to_zero=settings.scale_failed_to_zero,
            delete_keys=stale,
            phase="Failed",
            phase_started=surging_since,
            draining_key=None,
            drain_started=None,
            message=f"group {target[:6]} did not become Ready within the progress deadline"
            f"{target_state.waiting() if target_state else ''}; group {serving[:6]} keeps serving",
            events=tuple(events),
        )
    waiting = target_state.waiting() if target_state else ""
    return RolloutDecision(
        serving_key=serving,
        apply_target=True,
        target_to_zero=False,
        delete_keys=stale,
        phase="Surging",
        phase_started=surging_since,
        draining_key=None,
        drain_started=None,
        message=f"group {target[:6]} is starting beside serving group {serving[:6]}{waiting}",
        events=tuple(events),
    )


# --------------------------------------------------------------------------- in place
@dataclass(frozen=True)
class InPlaceStrategy:
    """How one role's Deployment replaces its pods when its key is unchanged (an in-place update).

    ``surge``: one extra pod starts first and an old pod stops only once it is Ready
    (maxSurge 1, maxUnavailable 0), so the role never loses its last ready pod to a
    replacement that cannot schedule or start. Without it (maxSurge 0, maxUnavailable 1)
    ``reason`` says why, for status and ``check``.
    """

    surge: bool
    reason: str = ""

    def rolling_update(self) -> dict[str, int]:
        """The Deployment's ``strategy.rollingUpdate``."""
        return {"maxSurge": 1, "maxUnavailable": 0} if self.surge else {"maxSurge": 0, "maxUnavailable": 1}


def in_place_strategies(
    *, gpus_per_pod: dict[str, int], replicas: dict[str, int | None], max_surge_gpus: int | None
) -> dict[str, InPlaceStrategy]:
    """Per role (``prefill`` then ``decode``), whether its in-place updates surge within the GPU budget.

    ``gpus_per_pod``: GPUs one surge unit of the role requests: a pod, or for a replica
    spanning nodes its whole LeaderWorkerSet group (LWS surges and replaces groups); ``replicas``: the role's spec
    replicas (None: an autoscaler owns them); ``max_surge_gpus``: spec.rollout.maxSurgeGPUs
    (None: no limit). A surge pod holds its GPUs beside the old pod, so the roles are
    charged in order and both at once (one change can update both). A role that does not
    fit is replaced one pod at a time; with one replica that leaves it without a ready pod
    until the replacement is Ready, which ``reason`` says with the budget that would avoid it.
    """
    left = max_surge_gpus
    out: dict[str, InPlaceStrategy] = {}
    for role in ("prefill", "decode"):
        need = gpus_per_pod.get(role, 0)
        if left is None or need <= left:
            out[role] = InPlaceStrategy(surge=True)
            left = None if left is None else left - need
            continue
        single = replicas.get(role) == 1
        gap = (
            "its only pod stops before the replacement is Ready (the role serves nothing meanwhile)"
            if single
            else "pods are replaced one at a time, one fewer ready pod meanwhile"
        )
        out[role] = InPlaceStrategy(
            surge=False,
            # said of every in-place update of the role, not only one under way (a Warning names it while
            # another role is edited), and why the budget is short (a fresh user's finding)
            reason=f"{role}'s in-place updates run without a surge pod: one needs {need} GPUs and "
            f"rollout.maxSurgeGPUs ({max_surge_gpus}) leaves {left}"
            + (" after prefill's surge pod (one change can update both)" if left != max_surge_gpus else "")
            + f"; {gap}",
        )
    return out


def role_strategies(*, spec: "PDDeploymentSpec", prefill: "RolePlan", decode: "RolePlan") -> dict[str, InPlaceStrategy]:
    """``in_place_strategies`` for the plan's two roles (GPUs per replica, the unit a Deployment or a
    LeaderWorkerSet surges, and replicas from their inputs)."""
    roles = {"prefill": prefill, "decode": decode}
    return in_place_strategies(
        gpus_per_pod={r: p.inputs.gpus_per_replica for r, p in roles.items()},
        replicas={r: p.inputs.spec.replicas for r, p in roles.items()},
        max_surge_gpus=spec.rollout.maxSurgeGPUs,
    )


def progress_deadline_seconds(spec: "PDDeploymentSpec") -> int:
    """spec.rollout.progressDeadline in whole seconds (at least 1): every group Deployment's
    ``progressDeadlineSeconds``, so the Deployment controller reports an in-place update that
    stops progressing (condition Progressing=False, ProgressDeadlineExceeded)."""
    return max(1, int(parse_duration(spec.rollout.progressDeadline)))
