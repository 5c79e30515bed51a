"""Render each scaled role's PDRoleScale: the scale target that survives paired rollouts (pure).

One per role whose ``spec.<role>.replicas`` is omitted (``planning.scaling.scaled_roles``),
named ``<PDDeployment>-<role>``, labelled like every object of the PDDeployment plus the
role (no compat key: it belongs to no group, and group pruning never deletes it). The
rendered object carries no ``spec.replicas``: the count is written once at creation
(``planning.scaling.seed_replicas``) and from then on only through ``/scale``, so the
operator's server-side apply never owns it and never takes it back from kubectl scale, an
HPA or KEDA (``reconcilers/scaling.py``).
"""

from __future__ import annotations

from typing import Any

from ..api import rolescale
from ..planning.scaling import scaled_roles, seed_replicas
from ..planning.structs import Plan
from . import labels as L


def role_scale_name(deployment: str, role: str) -> str:
    """``<PDDeployment>-<role>``, e.g. ``dsv41-flash-decode``."""
    return f"{deployment}-{role}"


def role_selector(deployment: str, role: str) -> str:
    """The string selector of the role's pods in every compat group (``status.selector``, read by HPA)."""
    return f"{L.LABEL_DEPLOYMENT}={deployment},{L.LABEL_ROLE}={role}"


def render_role_scale(plan: Plan, role: str, *, owner: dict | None = None,
                      replicas: int | None = None) -> dict[str, Any]:
    """The PDRoleScale of ``role``; with ``replicas`` (creation, the ``render`` command) ``spec.replicas`` is set."""
    labels = {**L.common_labels(plan.name), "app.kubernetes.io/component": role, L.LABEL_ROLE: role}
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    return {
        "apiVersion": rolescale.API_VERSION,
        "kind": rolescale.KIND,
        "metadata": L.metadata(name=role_scale_name(plan.name, role), namespace=plan.namespace, labels=labels,
                               owner=owner),
        "spec": spec,
    }


def render_role_scales(plan: Plan, *, owner: dict | None = None, seeded: bool = False) -> list[dict[str, Any]]:
    """The PDRoleScale of every scaled role; ``seeded``: with ``spec.replicas`` at the seed count."""
    return [render_role_scale(plan, r, owner=owner, replicas=seed_replicas(plan.spec, r) if seeded else None)
            for r in scaled_roles(plan.spec)]
