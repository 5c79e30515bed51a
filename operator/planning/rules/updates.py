"""Rules about how a change reaches running pods (in-place updates of a compat group).

A change that keeps the compat key updates the group's Deployments in place; each role
surges one pod within ``spec.rollout.maxSurgeGPUs`` (planning/rollout.py
``in_place_strategies``). A role that cannot surge is said here, before any pod exists.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ..problems import Problem
from ..rollout import role_strategies
from ..structs import RolePlan


def in_place_update_surges(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Warn when a role's in-place updates cannot surge a pod within ``rollout.maxSurgeGPUs``.

    Source: apps/v1 Deployment RollingUpdate semantics (maxSurge 0 stops an old pod before
    its replacement exists). The Deployment is then rendered with maxSurge 0 /
    maxUnavailable 1 (a surge beyond the budget would take GPUs the user did not grant);
    one warning per such role, with the budget that lets it surge.
    """
    if prefill.inputs.accelerator is None or decode.inputs.accelerator is None:
        return []
    out = []
    strategies = role_strategies(spec=spec, prefill=prefill, decode=decode)
    need = 0
    for role, plan in (("prefill", prefill), ("decode", decode)):
        need += plan.inputs.gpus_per_replica
        s = strategies[role]
        if not s.surge:
            out.append(Problem(
                field="spec.rollout.maxSurgeGPUs",
                message=s.reason,
                fix=f"set rollout.maxSurgeGPUs to at least {need}"
                + (f" (one budget for both roles' surge pods: prefill {prefill.inputs.gpus_per_replica} + decode "
                   f"{decode.inputs.gpus_per_replica} GPUs)" if role == "decode" else "")
                + f" (or remove it), or run more {role} replicas",
                rule="in_place_update_surges",
                severity="warning",
            ))
    return out
