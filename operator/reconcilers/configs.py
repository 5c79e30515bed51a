"""Prune engine ConfigMaps no pod can read any more.

An engine's ConfigMap is named after its content (``render.engine.config_map_name``) and
immutable, so an in-place update that changes a role's SGLang config makes a second
ConfigMap beside the first instead of rewriting the one the running pods mount (a
rewritten, shared ConfigMap reached the old pods through the kubelet's volume refresh: an
old pod whose container restarted mid-update started with the new config under the old
template). The old one is deleted here, and only when nothing can read it again:

- no workload of the group mounts it in its pod template (a held group, ``upgrade.Hold``,
  keeps the ConfigMap it was rendered with, whatever its name);
- no pod of the group mounts it, terminating ones included (the operator's cache keeps each
  pod's ConfigMap volumes, ``runtime.cache.trim``);
- the role's workload has settled on its current generation with no replica of an older
  template left (``WorkloadState.updating``): a ReplicaSet of an older template that still
  has replicas could make a pod that mounts it;
- it is not among the ConfigMaps this reconcile applied (the cache may not show the new
  template yet).

A group that goes away takes its ConfigMaps with it (``pddeployment._delete_group``); this is
for the ConfigMaps left inside a group that stays. :func:`stale_config_maps` is pure.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from ..render import labels as L
from .kube import Kube
from .observe import Observed

log = logging.getLogger(__name__)


def stale_config_maps(config_maps: Iterable[tuple[str, dict[str, str]]], observed: Observed,
                      applied: frozenset[str]) -> list[str]:
    """Names of the engine ConfigMaps to delete, sorted.

    ``config_maps``: (name, labels) of the PDDeployment's ConfigMaps; ``observed``: its groups
    as read before this reconcile's writes; ``applied``: the ConfigMap names this reconcile
    applied. A ConfigMap is stale when its group exists, its role's workload has settled with
    no replica of an older template, and neither that group's pod templates nor its pods mount
    it. Anything uncertain (no compat key or role label, a group or workload not observed) is kept.
    """
    out = []
    for name, labels in config_maps:
        key, component = labels.get(L.LABEL_COMPAT_KEY), labels.get(L.LABEL_ROLE)
        group = observed.groups.get(key or "")
        if group is None or name in applied or name in group.config_maps_in_use:
            continue
        workload = group.workloads.get(component or "")
        if workload is None or not workload.settled or workload.updating:
            continue
        out.append(name)
    return sorted(out)


def prune_config_maps(kube: Kube, *, name: str, namespace: str, observed: Observed,
                      applied: Iterable[str]) -> list[str]:
    """Delete the PDDeployment ``name``'s stale engine ConfigMaps (:func:`stale_config_maps`); returns their names.

    Reads the ConfigMaps from the operator's cache (a few small objects per PDDeployment).
    """
    selector = f"{L.LABEL_DEPLOYMENT}={name},app.kubernetes.io/managed-by={L.MANAGED_BY}"
    found = [(o["metadata"]["name"], o["metadata"].get("labels") or {})
             for o in kube.list("v1", "ConfigMap", namespace, selector)]
    stale = stale_config_maps(found, observed, frozenset(applied))
    for cm in stale:
        log.info("%s/%s: ConfigMap %s pruned (no pod or pod template of its group mounts it)", namespace, name, cm)
        kube.delete("v1", "ConfigMap", cm, namespace)
    return stale
