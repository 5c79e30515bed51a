"""Pure rendering: a valid :class:`~sglang_pd_operator.planning.plan.Plan` -> desired Kubernetes objects (dicts).

``render_group`` gives the objects of the plan's compat group (per role: ConfigMap,
Deployment, headless Service; the gateway Deployment); ``render_shared`` the objects
shared by all groups (gateway RBAC, the user-facing Service pointing at the serving
group, and with Mooncake HiCache storage the Mooncake Store master's Service and
Deployment); ``render_all`` both, for a first deployment or the ``render`` command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..planning.structs import Plan
from .engine import render_role
from .gateway import render_gateway_group, render_gateway_shared
from .labels import LABEL_ROLE as ROLE_LABEL
from .mooncake import render_mooncake_master
from .rolescale import render_role_scales


def render_group(plan: Plan, *, owner: dict | None = None,
                 replicas: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Objects of the plan's compat group, ConfigMaps before the Deployments that mount them.

    ``replicas``: per role, the count of a role whose ``spec.<role>.replicas`` is omitted
    (its PDRoleScale's; ``planning.scaling``); without it such a Deployment has no replicas field.
    """
    counts = replicas or {}
    objs = (render_role(plan, plan.prefill, owner=owner, replicas=counts.get("prefill"))
            + render_role(plan, plan.decode, owner=owner, replicas=counts.get("decode")))
    return objs + render_gateway_group(plan, owner=owner)


def render_shared(plan: Plan, *, serving_key: str, owner: dict | None = None) -> list[dict[str, Any]]:
    """Objects shared by every group; the user-facing Service selects ``serving_key``'s gateway.

    The Mooncake master (none without Mooncake storage) carries no compat key: every group
    of the PDDeployment shares it and group pruning never deletes it.
    """
    return render_gateway_shared(plan, serving_key=serving_key, owner=owner) + render_mooncake_master(plan, owner=owner)


def render_all(plan: Plan, *, owner: dict | None = None) -> list[dict[str, Any]]:
    """Shared objects first (RBAC before the gateway that uses it), then the group, serving the plan's key.

    A role whose replicas is omitted gets its PDRoleScale at the seed count, and its
    Deployment that count: what a first reconcile creates.
    """
    scales = render_role_scales(plan, owner=owner, seeded=True)
    seeds = {o["metadata"]["labels"][ROLE_LABEL]: o["spec"]["replicas"] for o in scales}
    return (render_shared(plan, serving_key=plan.compat_key, owner=owner) + scales
            + render_group(plan, owner=owner, replicas=seeds))
