"""Each role's replica count and how it reaches the compat groups (pure).

A role whose ``spec.<role>.replicas`` is set has that count. A role whose replicas is
omitted is *scaled*: its count lives in its PDRoleScale (``spec.replicas``, written through
``/scale`` by kubectl scale, an HPA, KEDA or the built-in planner) and starts at
:func:`seed_replicas`. The count applies to every group that serves or is about to: the
serving group and, during a paired rollout, the new group surging beside it
(:func:`surge_replicas` keeps that one within ``rollout.maxSurgeGPUs``). A draining group
keeps what it had until it is deleted.

Nothing here reads the cluster: the reconciler (``reconcilers/scaling.py``) passes the
PDRoleScales' counts in, and ``render`` takes the result as an input (no object is
patched after rendering).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..api.v1alpha1 import PDDeploymentSpec

ROLES = ("prefill", "decode")


def scaled_roles(spec: PDDeploymentSpec) -> tuple[str, ...]:
    """Roles whose count a PDRoleScale owns (``spec.<role>.replicas`` omitted), in ROLES order."""
    return tuple(r for r in ROLES if getattr(spec, r).replicas is None)


def seed_replicas(spec: PDDeploymentSpec, role: str, serving: int | None = None) -> int:
    """The count a new PDRoleScale starts at.

    ``serving``: replicas of the role in the group that serves now (None: no group yet).
    A role that already serves keeps its count (``spec.<role>.replicas`` removed to hand the
    role to an HPA or the planner must not scale it down on the spot), within
    ``spec.autoscaling.<role>``'s bounds when the planner scales it; a new role starts at
    ``minReplicas`` when planned, else 1. Never 0: an HPA does not scale a target whose
    count is 0 (kube-controller-manager's podautoscaler disables scaling at 0 replicas).
    """
    bounds = getattr(spec.autoscaling, role, None) if spec.autoscaling is not None else None
    low, high = (bounds.minReplicas, bounds.maxReplicas) if bounds is not None else (1, None)
    if not serving:
        return low
    return max(low, serving if high is None else min(serving, high))


def role_counts(spec: PDDeploymentSpec, scale_replicas: Mapping[str, int | None]) -> dict[str, int]:
    """Each role's count: ``spec.<role>.replicas`` when set, else its PDRoleScale's ``spec.replicas``
    (``scale_replicas[role]``; missing or None: :func:`seed_replicas`)."""
    out = {}
    for role in ROLES:
        fixed = getattr(spec, role).replicas
        if fixed is not None:
            out[role] = fixed
        else:
            got = scale_replicas.get(role)
            out[role] = seed_replicas(spec, role) if got is None else got
    return out


def gpus_of(replicas: Mapping[str, int], gpus_per_replica: Mapping[str, int]) -> int:
    """GPUs the engine pods of one group request: sum of replicas x GPUs per replica over the roles."""
    return sum(replicas.get(r, 0) * gpus_per_replica.get(r, 0) for r in ROLES)


def surge_replicas(
    *,
    counts: Mapping[str, int],
    current: Mapping[str, int] | None,
    gpus_per_replica: Mapping[str, int],
    max_surge_gpus: int | None,
) -> dict[str, int]:
    """Replicas of a new compat group while it surges beside the serving one.

    ``counts``: each role's count; ``current``: the new group's replicas now (None: not
    created yet); ``max_surge_gpus``: ``spec.rollout.maxSurgeGPUs`` (None: no limit).
    A group not created yet gets ``counts`` (the rollout decision waits, phase
    WaitingForCapacity, while that does not fit the budget). Once it exists, a lower count
    applies at once and a higher one only as far as the group's GPUs stay within the budget
    (prefill first, one replica at a time); the rest follows once the group serves and the
    surge is over. Never below the group's current replicas for a role that grows.
    """
    if current is None or max_surge_gpus is None:
        return dict(counts)
    out = {r: min(counts.get(r, 0), current.get(r, 0)) for r in ROLES}
    for role in ROLES:
        while out[role] < counts.get(role, 0):
            trial = {**out, role: out[role] + 1}
            if gpus_of(trial, gpus_per_replica) > max_surge_gpus:
                break
            out = trial
    return out


def ceil_step(replicas: int, factor: float) -> int:
    """``ceil(replicas x factor)``, at least one more than ``replicas`` (the planner's step up)."""
    return max(replicas + 1, math.ceil(replicas * factor - 1e-9))
