"""Names, labels and annotations of the objects the operator owns.

A *compat group* is every prefill, decode and gateway object of one compat key; its id
is the first :data:`GROUP_ID_LENGTH` hex digits of the key. Objects of a group carry
the key as a label, so a selector that includes it can never match pods of two keys.
"""

from __future__ import annotations

from typing import Any

DOMAIN = "pd.sglang-operator.io"
LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_COMPAT_KEY = f"{DOMAIN}/compat-key"
ANNOTATION_CONFIG_HASH = f"{DOMAIN}/config-hash"
ANNOTATION_BOOTSTRAP_PORT = "sglang.ai/bootstrap-port"  # read by smg 1.13 Kubernetes discovery
MANAGED_BY = "sglang-pd-operator"
FIELD_MANAGER = "sglang-pd-operator"
#: The field manager of the built-in planner's writes to a PDRoleScale's /scale (its
#: managedFields tell them apart from kubectl's, an HPA's or KEDA's).
PLANNER_FIELD_MANAGER = "sglang-pd-operator-planner"
GROUP_ID_LENGTH = 6

ROLE_GATEWAY = "gateway"


def group_id(compat_key: str) -> str:
    """The short id of a compat group, used in object names."""
    return compat_key[:GROUP_ID_LENGTH]


def group_object_name(name: str, compat_key: str, component: str) -> str:
    """``<deployment>-<group id>-<component>``, e.g. ``dsv41-flash-50537a-prefill``."""
    return f"{name}-{group_id(compat_key)}-{component}"


def common_labels(name: str) -> dict[str, str]:
    """Labels on every object of one PDDeployment."""
    return {
        "app.kubernetes.io/name": "sglang",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_DEPLOYMENT: name,
    }


def selector_labels(name: str, component: str, compat_key: str) -> dict[str, str]:
    """Labels that select the pods of one component of one compat group (immutable selectors)."""
    return {LABEL_DEPLOYMENT: name, LABEL_ROLE: component, LABEL_COMPAT_KEY: compat_key}


def component_labels(name: str, component: str, compat_key: str) -> dict[str, str]:
    """Every label of an object of one component of one compat group."""
    return {**common_labels(name), "app.kubernetes.io/component": component, **selector_labels(name, component, compat_key)}


def owner_reference(owner: dict[str, Any] | None, *, controller: bool = True) -> list[dict[str, Any]]:
    """``ownerReferences`` pointing at the PDDeployment (``owner`` = its apiVersion/kind/name/uid), or [].

    ``controller``: the PDDeployment is the object's managing controller (the usual case);
    False for an object another controller may also create and own (a multi-node role's
    Service, which LeaderWorkerSet creates when it does not find one: render/multinode.py).
    """
    if not owner or not owner.get("uid"):
        return []
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["name"],
            "uid": owner["uid"],
            "controller": controller,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(
    *, name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any] | None, annotations: dict | None = None,
    controller: bool = True,
) -> dict[str, Any]:
    """Object metadata with labels, optional annotations and the owner reference (see :func:`owner_reference`)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    refs = owner_reference(owner, controller=controller)
    if refs:
        meta["ownerReferences"] = refs
    return meta
