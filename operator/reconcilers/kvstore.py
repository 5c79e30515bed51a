"""The ``KVStoreReady`` condition of a PDDeployment from the Mooncake Store master's health.

With ``kvCache.hicache.storage.backend: mooncake`` every prefill pod (and decode with
``decodeOffload``) keeps HiCache pages in one Mooncake Store whose master the operator runs
(render/mooncake.py, applied with the shared objects). Engines keep serving without it
(HiCache falls back to GPU + host memory), but every cross-replica prefix hit is lost, so
its liveness is a condition of the PDDeployment.

How the running operator wires it: the scraper (``metrics/scraper.py``) probes the master
pod every interval (``metrics/kvstore.py``: ``/health`` and ``/metrics`` on its pod IP and
metrics port, never from inside a reconcile) and carries the result as
``Health.kvstore``; the reconcile turns it into the condition::

    conds = kvstore_conditions(plan=plan, health=health.kvstore, previous=status)
    # [] without Mooncake storage, else [Cond("KVStoreReady", ...)]; passed to
    # status.valid_status(extra_conditions=...)

Without a fresh probe (operator just started, or a reconcile run outside the operator)
the previous ``KVStoreReady`` is kept, or False/``MasterNotProbed`` when there is none.
:func:`kvstore_events` names the transitions to record as events (Warning
``KVStoreNotReady`` when True turns False, Normal ``KVStoreReady`` back), and
:func:`prune_master` deletes a master the spec no longer asks for.
:func:`observe_kvstore` is the blocking variant (API read of the Deployment + probe of the
Service URL) for tools and tests.

The probe, :class:`MasterHealth`, the transfer figures and :class:`KVStoreCollector` live
in ``metrics/kvstore.py`` (the scraper uses them; it cannot import the reconcilers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..metrics.health import MasterHealth
from ..metrics.kvstore import DEFAULT_TIMEOUT_S, HttpGet, http_get, probe_master
from ..planning import hicache as H
from ..planning.structs import Plan
from ..render.mooncake import master_metrics_url, mooncake_spec
from .status import Cond

CONDITION_TYPE = "KVStoreReady"
#: Reasons of a False ``KVStoreReady``.
NOT_FOUND, UNAVAILABLE, UNREACHABLE, NOT_READY, NOT_PROBED = (
    "MasterNotFound", "MasterUnavailable", "MasterUnreachable", "MasterNotReady", "MasterNotProbed")


def master_deployment_ready(kube: Any, plan: Plan) -> bool | None:
    """The master's Deployment has an available replica; None when it does not exist."""
    dep = kube.get("apps/v1", "Deployment", H.master_service_name(plan.name), plan.namespace)
    if dep is None:
        return None
    status = dep.get("status") or {}
    return int(status.get("availableReplicas") or 0) >= 1


def observe_kvstore(
    *, kube: Any, plan: Plan, url: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, get: HttpGet = http_get
) -> MasterHealth | None:
    """The master's state for ``plan``: its Deployment (through ``kube``) and ``/health`` + ``/metrics``.

    None when the spec has no Mooncake storage (no condition then). ``url`` overrides the
    in-cluster Service URL (an operator outside the cluster, tests). ``kube`` may be None
    to skip the API read. Never raises for an unreachable master.
    """
    if mooncake_spec(plan) is None:
        return None
    target = url or master_metrics_url(plan)
    assert target is not None
    deployment_ready = master_deployment_ready(kube, plan) if kube is not None else None
    if deployment_ready is None and kube is not None:
        return MasterHealth(
            url=target, reachable=False, ready=False, deployment_ready=None, exists=False,
            error=f"Deployment {H.master_service_name(plan.name)} does not exist yet",
        )  # fmt: skip
    health = probe_master(target, timeout=timeout, get=get)
    return MasterHealth(
        url=health.url,
        reachable=health.reachable,
        ready=health.ready and deployment_ready is not False,
        deployment_ready=deployment_ready,
        role=health.role,
        state=health.state,
        error=health.error if deployment_ready is not False else "the master Deployment has no available replica",
        metrics=health.metrics,
        exists=True if kube is not None else None,
    )


def kvstore_condition(health: MasterHealth) -> Cond:
    """``KVStoreReady`` from one look at the master: True when it serves, else False with the reason.

    False reasons: ``MasterNotFound`` (no master Deployment / pod yet), ``MasterUnavailable``
    (the Deployment has no available replica / the pod is not Ready), ``MasterUnreachable``
    (``/health`` does not answer), ``MasterNotReady`` (it answers but does not serve).
    """
    if health.ready:
        return Cond(CONDITION_TYPE, "True", "MasterReady", health.describe())
    if health.exists is False:
        return Cond(CONDITION_TYPE, "False", NOT_FOUND, health.describe())
    if health.deployment_ready is False:
        return Cond(CONDITION_TYPE, "False", UNAVAILABLE, health.describe())
    if not health.reachable:
        return Cond(CONDITION_TYPE, "False", UNREACHABLE, health.describe())
    return Cond(CONDITION_TYPE, "False", NOT_READY, health.describe())


def not_probed_condition(plan: Plan) -> Cond:
    """``KVStoreReady`` before the scraper's first look at the master."""
    return Cond(
        CONDITION_TYPE, "False", NOT_PROBED,
        f"the operator has not probed the Mooncake master {H.master_service_name(plan.name)} yet "
        "(it does every --slo-interval seconds; 0 turns the probe off)",
    )  # fmt: skip


def kvstore_conditions(
    *, plan: Plan, health: MasterHealth | None, previous: Mapping[str, Any] | None = None
) -> list[Cond]:
    """The conditions to merge into status: ``[KVStoreReady]``, or [] without Mooncake storage.

    ``health``: the latest look at the master. Without one: [] when ``previous`` (the
    PDDeployment's current status) is None; else the previous ``KVStoreReady`` kept as it
    is, or False/``MasterNotProbed`` when status has none yet.
    """
    if mooncake_spec(plan) is None:
        return []
    if health is not None:
        return [kvstore_condition(health)]
    if previous is None:
        return []
    for c in previous.get("conditions") or []:
        if c.get("type") == CONDITION_TYPE:
            return [Cond(CONDITION_TYPE, c.get("status", "Unknown"), c.get("reason", ""), c.get("message", ""))]
    return [not_probed_condition(plan)]


def kvstore_condition_dict(health: MasterHealth) -> dict[str, str]:
    """:func:`kvstore_condition` as a plain dict (type, status, reason, message)."""
    c = kvstore_condition(health)
    return {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}


def _condition(status: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == type_), None)


def kvstore_events(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Events (type, reason, message) for a ``KVStoreReady`` transition between two statuses.

    True -> False: Warning ``KVStoreNotReady``; False -> True: Normal ``KVStoreReady``.
    Nothing for the first report (a master starting is expected) or an unchanged status,
    so an operator restart fires nothing again.
    """
    old, cur = _condition(previous, CONDITION_TYPE), _condition(new, CONDITION_TYPE)
    if old is None or cur is None or old.get("status") == cur.get("status"):
        return []
    detail = f"{cur.get('reason', '')}: {cur.get('message', '')}"
    if old.get("status") == "True" and cur.get("status") == "False":
        return [("Warning", "KVStoreNotReady", detail)]
    if cur.get("status") == "True":
        return [("Normal", "KVStoreReady", detail)]
    return []


def prune_master(kube: Any, plan: Plan, shared_deployments: Iterable[str]) -> bool:
    """Delete the master's Deployment and Service when the spec no longer uses Mooncake storage.

    ``shared_deployments``: the PDDeployment's Deployments outside any compat group, as
    observed (``Observed.shared_deployments``), so a spec without Mooncake costs no extra
    API call. True when something was deleted.
    """
    name = H.master_service_name(plan.name)
    if mooncake_spec(plan) is not None or name not in set(shared_deployments):
        return False
    deleted = kube.delete("apps/v1", "Deployment", name, plan.namespace)
    return kube.delete("v1", "Service", name, plan.namespace) or deleted
