"""Rules about the built-in SLO planner's bounds (``spec.autoscaling``) that need the roles' GPU counts.

Object-local rules (maxReplicas >= minReplicas, a role the planner scales has no fixed
replicas, spec.slo has a target) are CEL on the CRD (``api/v1alpha1.py``); what needs
GPUs per replica, which come from parallelism and ``--pp-size`` in extraArgs, lives here.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ..problems import Problem
from ..scaling import ROLES, gpus_of, seed_replicas
from ..structs import RolePlan


def autoscaling_budget_fits(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """``autoscaling.maxGPUs`` must hold both roles at their least counts; warn when it cannot hold their most.

    Least: a planned role's minReplicas, a fixed role's replicas, a role an external
    autoscaler owns its seed (1). A budget below that could never be met (the planner
    never goes below minReplicas): an error naming the GPUs needed. A budget below the
    most (every planned role at maxReplicas) is allowed, it is what a budget is for, and
    said as a warning so the bound that really applies is visible.
    """
    a = spec.autoscaling
    if a is None or a.maxGPUs is None:
        return []
    per = {"prefill": prefill.inputs.gpus_per_replica, "decode": decode.inputs.gpus_per_replica}
    least, most = {}, {}
    for role in ROLES:
        fixed = getattr(spec, role).replicas
        bounds = getattr(a, role)
        least[role] = fixed if fixed is not None else seed_replicas(spec, role)
        most[role] = fixed if fixed is not None else (bounds.maxReplicas if bounds is not None else least[role])
    need, top = gpus_of(least, per), gpus_of(most, per)
    if need > a.maxGPUs:
        return [Problem(
            field="spec.autoscaling.maxGPUs",
            message=f"the roles need {need} GPUs at their least counts (prefill {least['prefill']} x {per['prefill']}, "
                    f"decode {least['decode']} x {per['decode']} GPUs), more than maxGPUs {a.maxGPUs}",
            fix=f"set maxGPUs to at least {need}, or lower minReplicas",
            rule="autoscaling_budget_fits",
        )]
    if top > a.maxGPUs:
        return [Problem(
            field="spec.autoscaling.maxGPUs",
            message=f"maxGPUs {a.maxGPUs} is below the {top} GPUs of every planned role at maxReplicas: the budget, "
                    "not maxReplicas, is the bound that applies first",
            fix=f"set maxGPUs to {top} to let maxReplicas bind, or keep it as the budget you mean",
            rule="autoscaling_budget_fits",
            severity="warning",
        )]
    return []
