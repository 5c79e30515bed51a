"""Read what exists for one PDDeployment: its compat groups, their readiness, the serving key.

Two LIST calls (Deployments and Pods by the deployment label) and one GET (the
user-facing Service) per reconcile. The result is plain data for the pure rollout
decision (planning/rollout.py) and the status computation (reconcilers/status.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..planning.rollout import GroupState
from ..render import labels as L
from .kube import Kube

COMPONENTS = ("prefill", "decode", L.ROLE_GATEWAY)


@dataclass(frozen=True)
class WorkloadState:
    """One Deployment of a group: desired, ready, updated and available replicas, and whether it has settled.

    ``total``: pods of every template (status.replicas; a surge pod and the old pod it
    replaces both count); ``stalled``: the Deployment controller's message once the rollout
    made no progress within ``progressDeadlineSeconds`` (its condition Progressing=False,
    ProgressDeadlineExceeded), else "".
    """

    name: str
    desired: int
    ready: int
    updated: int
    available: int
    settled: bool
    gpus_per_pod: int = 0
    total: int | None = None
    stalled: str = ""

    @property
    def ready_all(self) -> bool:
        """Every desired replica is updated, ready and available at the current spec, no pod of an
        older template is left (a surge's old pod counts as ready), and there is at least one."""
        no_old = self.total is None or self.total == self.desired
        return self.settled and no_old and self.desired > 0 and self.desired == self.ready == self.updated == self.available

    @property
    def updating(self) -> bool:
        """Pods of an older pod template still run beside the current one's (an in-place update)."""
        return self.total is not None and self.total > self.updated


@dataclass(frozen=True)
class ObservedGroup:
    """The workloads of one compat group by component (prefill, decode, gateway)."""

    key: str
    workloads: dict[str, WorkloadState] = field(default_factory=dict)
    unschedulable: int = 0
    unschedulable_reason: str = ""
    deployment_names: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        """prefill, decode and gateway all exist and are fully ready."""
        return all(c in self.workloads and self.workloads[c].ready_all for c in COMPONENTS)

    @property
    def gpus(self) -> int:
        """GPUs requested by the group's desired replicas."""
        return sum(w.desired * w.gpus_per_pod for w in self.workloads.values())

    def state(self) -> GroupState:
        """The pure view used by the rollout decision."""
        ordered = [(c, self.workloads[c]) for c in COMPONENTS if c in self.workloads]
        return GroupState(
            key=self.key,
            ready=self.ready,
            gpus=self.gpus,
            unschedulable=self.unschedulable,
            unschedulable_reason=self.unschedulable_reason,
            updating=tuple(f"{c} {w.updated}/{w.desired} updated, {w.total} pods" for c, w in ordered if w.updating),
            stalled=tuple(f"{c}: {w.stalled}" for c, w in ordered if w.stalled),
        )


@dataclass(frozen=True)
class Observed:
    """Everything observed for one PDDeployment."""

    groups: dict[str, ObservedGroup]
    serving_key: str | None
    service_exists: bool
    #: the PDDeployment's Deployments outside any compat group (the Mooncake Store master)
    shared_deployments: tuple[str, ...] = ()

    def group_states(self) -> dict[str, GroupState]:
        """The pure view of every group, by key, for the rollout decision."""
        return {k: g.state() for k, g in self.groups.items()}


def _gpus(deployment: dict[str, Any]) -> int:
    total = 0
    for c in deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for res, qty in (c.get("resources", {}).get("requests") or {}).items():
            if res.endswith("/gpu"):
                total += int(qty)
    return total


def workload_state(deployment: dict[str, Any]) -> WorkloadState:
    """Readiness of one apps/v1 Deployment from its spec and status."""
    spec, status, meta = deployment.get("spec", {}), deployment.get("status") or {}, deployment["metadata"]
    desired = int(spec.get("replicas", 1))
    settled = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    stalled = next(
        (str(c.get("message") or "progress deadline exceeded") for c in status.get("conditions") or []
         if c.get("type") == "Progressing" and c.get("status") == "False" and c.get("reason") == "ProgressDeadlineExceeded"),
        "",
    )  # fmt: skip
    return WorkloadState(
        name=meta["name"],
        desired=desired,
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        available=int(status.get("availableReplicas") or 0),
        settled=settled,
        gpus_per_pod=_gpus(deployment),
        total=int(status.get("replicas") or 0),
        stalled=stalled if settled else "",
    )


def unschedulable_reason(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when the pod cannot be scheduled (PodScheduled=False, Unschedulable), else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "unschedulable")
    return None


def observe(kube: Kube, *, name: str, namespace: str) -> Observed:
    """List the PDDeployment's Deployments and Pods, group them by compat key, read the Service's key."""
    selector = f"{L.LABEL_DEPLOYMENT}={name},app.kubernetes.io/managed-by={L.MANAGED_BY}"
    groups: dict[str, dict[str, Any]] = {}
    shared: list[str] = []
    for dep in kube.list("apps/v1", "Deployment", namespace, selector):
        lbl = dep["metadata"].get("labels") or {}
        key, component = lbl.get(L.LABEL_COMPAT_KEY), lbl.get(L.LABEL_ROLE)
        if not key:
            shared.append(dep["metadata"]["name"])
            continue
        if component not in COMPONENTS:
            continue
        g = groups.setdefault(key, {"workloads": {}, "unschedulable": 0, "names": []})
        g["workloads"][component] = workload_state(dep)
        g["names"].append(dep["metadata"]["name"])
    for pod in kube.list("v1", "Pod", namespace, f"{L.LABEL_DEPLOYMENT}={name}"):
        key = (pod["metadata"].get("labels") or {}).get(L.LABEL_COMPAT_KEY)
        why = unschedulable_reason(pod) if key in groups else None
        if why is not None:
            groups[key]["unschedulable"] += 1
            groups[key].setdefault("reason", why[:300])
    service = kube.get("v1", "Service", name, namespace)
    serving = None
    if service is not None:
        serving = (service.get("spec", {}).get("selector") or {}).get(L.LABEL_COMPAT_KEY)
    return Observed(
        groups={
            k: ObservedGroup(
                key=k,
                workloads=v["workloads"],
                unschedulable=v["unschedulable"],
                unschedulable_reason=v.get("reason", ""),
                deployment_names=tuple(v["names"]),
            )
            for k, v in groups.items()
        },
        serving_key=serving,
        service_exists=service is not None,
        shared_deployments=tuple(sorted(shared)),
    )
