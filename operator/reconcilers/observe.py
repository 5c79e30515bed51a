"""Read what exists for one PDDeployment: its compat groups, their readiness, the serving key.

LIST calls of Deployments, LeaderWorkerSets (where the cluster serves them: a role whose
replicas span nodes) and Pods by the deployment label, and one GET (the user-facing
Service) per reconcile; the operator process answers them from its object cache. The
result is plain data for the pure rollout decision (planning/rollout.py) and the status
computation (reconcilers/status.py).

A role's workload is a Deployment (one pod per replica) or a LeaderWorkerSet (one group
of ``size`` pods per replica); both become a :class:`WorkloadState` counted in replicas
(groups), with the role's pods counted beside them. LeaderWorkerSet counts a group ready
only when its leader and every worker are (its ``status.readyReplicas``). A
LeaderWorkerSet whose pods hold IMEX channels (a ComputeDomain's claim template, GB200 /
GB300) counts a group ready only when, besides, every node of its pods is Ready in the
ComputeDomain's ``status.nodes`` (:func:`imex_ready_groups`). A group whose pods a
scheduling gate holds (Kueue's gang admission, ``spec.scheduling.queueName``) is looked up
in Kueue's Workloads, uncached, and reported with Kueue's reason while it is not admitted
(:func:`admission_waits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from ..api import computedomain as cd
from ..api import kueue, lws
from ..planning.rollout import GroupState
from ..render import labels as L
from ..render.record import RenderRecord, read_record
from .kube import Kube

COMPONENTS = ("prefill", "decode", L.ROLE_GATEWAY)


@dataclass(frozen=True)
class WorkloadState:
    """One workload of a group (a Deployment, or a LeaderWorkerSet whose replicas are groups of pods):
    desired, ready, updated and available replicas, and whether it has settled.

    ``gpus_per_pod``: GPUs one replica requests (for a LeaderWorkerSet: every pod of the
    group); ``total``: replicas of every template (status.replicas; a surge pod and the old pod it
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
    #: pods of one replica (a LeaderWorkerSet's group size; 1 for a Deployment)
    pods_per_replica: int = 1
    #: the workload's pods that exist and are Ready (filled in by :func:`observe`)
    pods_ready: int = 0
    pods_total: int = 0
    #: the pod template's config-hash annotation (``render.engine.config_hash``), "" without one
    config_hash: str = ""

    @property
    def ready_all(self) -> bool:
        """Every desired replica is updated, ready and available at the current spec, no pod of an
        older template is left (a surge's old pod counts as ready), and there is at least one."""
        no_old = self.total is None or self.total == self.desired
        return self.settled and no_old and self.desired > 0 and self.desired == self.ready == self.updated == self.available

    def updating_line(self, component: str) -> str:
        """One line of an in-place update, in replicas (a LeaderWorkerSet's are groups), e.g.
        ``decode: 1/1 on the new template, 1 of an older one still running, 1/2 available``.

        "On the new template" is the workload's ``updatedReplicas``: created from it, not
        Ready (a fresh user read "1/1 updated" while the new pod was Pending), so the line
        also gives the available count over every replica that exists, old and new.
        """
        total = self.total if self.total is not None else self.updated
        older = max(0, total - self.updated)
        return (f"{component}: {self.updated}/{self.desired} on the new template, {older} of an older one still running, "
                f"{self.available}/{total} available")

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
    #: groups (replicas) Kueue has not admitted yet, one line each: "decode group 0: <Kueue's reason>"
    awaiting_admission: tuple[str, ...] = ()
    deployment_names: tuple[str, ...] = ()
    #: what the group records about the operator that rendered it (None: made before 0.2.0)
    record: RenderRecord | None = None
    #: (apiVersion, kind, name) of each workload, where the record lives
    workload_refs: tuple[tuple[str, str, str], ...] = ()
    #: ConfigMaps a workload's pod template or a pod of the group mounts (none of them may be pruned)
    config_maps_in_use: frozenset[str] = frozenset()

    @property
    def ready(self) -> bool:
        """prefill, decode and gateway all exist and are fully ready."""
        return all(c in self.workloads and self.workloads[c].ready_all for c in COMPONENTS)

    @property
    def gpus(self) -> int:
        """GPUs requested by the group's desired replicas (every pod of a multi-node replica)."""
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
            updating=tuple(w.updating_line(c) for c, w in ordered if w.updating),
            stalled=tuple(f"{c}: {w.stalled}" for c, w in ordered if w.stalled),
            short=tuple(f"{c}: {w.ready}/{w.desired} ready" for c, w in ordered if w.desired > 0 and w.ready < w.desired),
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


def _settled_by_own_metadata(kube: Kube, obj: dict[str, Any], kind: str, state: WorkloadState,
                             namespace: str) -> WorkloadState:
    """``state``, settled when the only generation its controller has not observed is one our own
    metadata-only patch made (``kube.MetadataBumps``: the render record written into a group made
    before 0.2.0 changes no pod, and must not read as a rollout in progress, i.e. Ready False)."""
    bumps = getattr(kube, "metadata_bumps", None)  # test doubles of Kube may have none
    if state.settled or bumps is None:
        return state
    meta, status = obj["metadata"], obj.get("status") or {}
    if bumps.settles(kind, namespace, meta["name"], generation=int(meta.get("generation") or 0),
                     observed=int(status.get("observedGeneration") or 0)):
        return replace(state, settled=True)
    return state


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


def lws_state(lws_obj: dict[str, Any]) -> WorkloadState:
    """Readiness of one LeaderWorkerSet from its spec and status, counted in groups (replicas).

    ``ready``: groups whose leader is Running and Ready and whose worker StatefulSet is
    ready (LWS's ``readyReplicas``, pkg/controllers/leaderworkerset_controller.go
    updateConditions); ``updated``: groups at the current template revision; ``total``:
    groups that exist (a surge group included). LeaderWorkerSet has no progress deadline
    of its own, so ``stalled`` stays empty (the rollout's own deadline covers a new group).
    """
    spec, status, meta = lws_obj.get("spec", {}), lws_obj.get("status") or {}, lws_obj["metadata"]
    desired = int(spec.get("replicas", 1))
    template = spec.get("leaderWorkerTemplate") or {}
    size = int(template.get("size") or 1)
    worker = template.get("workerTemplate") or {}
    leader = template.get("leaderTemplate") or worker  # LWS runs the leader from the worker template without one
    per_group = _gpus({"spec": {"template": leader}}) + _gpus({"spec": {"template": worker}}) * (size - 1)
    ready = int(status.get("readyReplicas") or 0)
    return WorkloadState(
        name=meta["name"],
        desired=desired,
        ready=ready,
        updated=int(status.get("updatedReplicas") or 0),
        available=ready,
        settled=int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0),
        gpus_per_pod=per_group,
        total=int(status.get("replicas") or 0),
        pods_per_replica=size,
    )


def _template_config_hash(workload: dict[str, Any]) -> str:
    """The config-hash annotation of a workload's (first) pod template; "" without one."""
    templates = lws.pod_templates(workload)
    return ((templates[0].get("metadata") or {}).get("annotations") or {}).get(L.ANNOTATION_CONFIG_HASH, "") \
        if templates else ""


def mounted_config_maps(pod_spec: dict[str, Any]) -> set[str]:
    """Names of the ConfigMaps a pod spec (or a pod template's spec) mounts as volumes."""
    return {v["configMap"]["name"] for v in pod_spec.get("volumes") or [] if (v.get("configMap") or {}).get("name")}


def _pod_is_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with "..." when cut."""
    if len(text) <= limit:
        return text
    return text[: limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:") + "..."


def unschedulable_reason(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when the pod cannot be scheduled (PodScheduled=False, Unschedulable), else None.

    A pod whose IMEX claim still names the placeholder template waits for a template that never
    comes (the admission policy is missing, api/computedomain.py): that is said instead."""
    placeholder = cd.policy_missed(pod)
    if placeholder is not None:
        return cd.policy_missing_message(pod=(pod.get("metadata") or {}).get("name", "?"))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "unschedulable")
    return None


def _group_record(records: dict[str, RenderRecord | None]) -> RenderRecord | None:
    """The group's record: the one its workloads agree on; None when one has none (a workload
    made before 0.2.0, or one an interrupted write left behind) or two disagree."""
    found = list(records.values())
    if not found or any(r is None for r in found):
        return None
    first = found[0]
    return first if all(r.annotations() == first.annotations() for r in found) else None  # type: ignore[union-attr]


def uses_imex(lws_obj: dict[str, Any]) -> bool:
    """The LeaderWorkerSet's pods reference a claim template (the IMEX channel of its ComputeDomain)."""
    return any(rc.get("resourceClaimTemplateName") for t in lws.pod_templates(lws_obj)
               for rc in (t.get("spec") or {}).get("resourceClaims") or [])


def per_group_imex(lws_obj: dict[str, Any]) -> bool:
    """The LeaderWorkerSet's pods take their own group's ComputeDomain (the admission policy's label on the
    template); else one ComputeDomain named like the LeaderWorkerSet serves every group (before 0.3.0)."""
    return any(cd.GROUP_DOMAIN_LABEL in ((t.get("metadata") or {}).get("labels") or {}) for t in lws.pod_templates(lws_obj))


def imex_ready_groups(domain_of: Callable[[str], dict[str, Any] | None], group_nodes: dict[str, list[str]],
                      size: int) -> int:
    """Groups whose ComputeDomain lists all of their ``size`` pods' nodes Ready.

    ``domain_of(group index)``: the group's ComputeDomain (its own, or the one shared by every
    group of a LeaderWorkerSet made before 0.3.0), None when missing: the group counts none.
    A group's own domain must also say ``status.status`` Ready. ``group_nodes``: group index
    -> the node of each of its pods ("" while unscheduled). Source of the status shape:
    NVIDIA's DRA driver, api/nvidia.com/resource/v1beta1/computedomain.go (``api/computedomain.py``).
    """
    ready = 0
    for group, nodes in group_nodes.items():
        domain = domain_of(group)
        if domain is None or len(nodes) < size:
            continue
        status = domain.get("status") or {}
        own = cd.GROUP_INDEX_LABEL in ((domain.get("metadata") or {}).get("labels") or {})
        if own and status.get("status") != cd.STATUS_READY:
            continue
        ready += all(n and cd.node_ready(status, n) for n in nodes)
    return ready


def scheduling_gated(pod: dict[str, Any]) -> bool:
    """A scheduling gate holds the pod (PodScheduled=False, reason SchedulingGated): Kueue has not admitted its group."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == kueue.SCHEDULING_GATED
               for c in (pod.get("status") or {}).get("conditions") or [])


def admission_waits(component: str, workloads: list[dict[str, Any]], gated_groups: set[str]) -> list[str]:
    """One line per group of ``component`` whose pods are gated and whose Kueue Workload is not admitted.

    ``workloads``: the Kueue Workloads of the role's LeaderWorkerSet (label
    ``kueue.x-k8s.io/job-uid``); ``gated_groups``: group indexes with a gated pod. A gated
    group without a Workload yet says so (Kueue makes it right after the group's pods appear).
    Lines are sorted by group index: ``decode group 0: <the QuotaReserved message>``.
    """
    by_group = {kueue.group_index(w): w for w in workloads}
    lines = []
    for group in sorted(gated_groups, key=lambda g: (len(g), g)):
        wl = by_group.get(group)
        if wl is not None and kueue.admitted(wl):
            continue  # admitted; its pods are being ungated
        why = kueue.waiting_reason(wl) if wl is not None else "no Kueue Workload yet"
        lines.append(f"{component} group {group}: {why}")
    return lines


def _kueue_workloads(kube: Kube, namespace: str, lws_uid: str) -> list[dict[str, Any]]:
    """The Kueue Workloads of one LeaderWorkerSet (an uncached LIST: the operator does not watch Kueue's
    kind); [] where the cluster does not serve it or the operator may not read it."""
    try:
        return kube.uncached().list(kueue.API_VERSION, kueue.WORKLOAD_KIND, namespace, f"{kueue.JOB_UID_LABEL}={lws_uid}")
    except (ResourceNotFoundError, ApiException):
        return []


def service_serving_key(service: dict[str, Any] | None) -> str | None:
    """The compat key the user-facing Service selects (its ``spec.selector``), None without one:
    the group that serves, for the rollout decision, status and both SLO sources."""
    if service is None:
        return None
    return (service.get("spec", {}).get("selector") or {}).get(L.LABEL_COMPAT_KEY)


def observe(kube: Kube, *, name: str, namespace: str, lws_served: bool = False, cd_served: bool = False) -> Observed:
    """List the PDDeployment's workloads and Pods, group them by compat key, read the Service's key.

    ``lws_served``: the cluster serves LeaderWorkerSets (they are listed too; without it
    the kind does not exist and nothing of it can). ``cd_served``: it serves ComputeDomains
    (listed too, and a LeaderWorkerSet using one counts a group ready only with it).
    """
    selector = f"{L.LABEL_DEPLOYMENT}={name},app.kubernetes.io/managed-by={L.MANAGED_BY}"
    groups: dict[str, dict[str, Any]] = {}
    shared: list[str] = []
    workloads = [(dep, workload_state) for dep in kube.list("apps/v1", "Deployment", namespace, selector)]
    if lws_served:
        workloads += [(obj, lws_state) for obj in kube.list(lws.API_VERSION, lws.KIND, namespace, selector)]
    for obj, state_of in workloads:
        lbl = obj["metadata"].get("labels") or {}
        key, component = lbl.get(L.LABEL_COMPAT_KEY), lbl.get(L.LABEL_ROLE)
        if not key:
            shared.append(obj["metadata"]["name"])
            continue
        if component not in COMPONENTS:
            continue
        g = groups.setdefault(key, {"workloads": {}, "unschedulable": 0, "names": [], "refs": [], "records": {}})
        kind = obj.get("kind") or ("Deployment" if state_of is workload_state else lws.KIND)
        state = replace(state_of(obj), config_hash=_template_config_hash(obj))
        g["workloads"][component] = _settled_by_own_metadata(kube, obj, kind, state, namespace)
        g["names"].append(obj["metadata"]["name"])
        g["refs"].append((obj.get("apiVersion") or ("apps/v1" if state_of is workload_state else lws.API_VERSION),
                          obj.get("kind") or ("Deployment" if state_of is workload_state else lws.KIND),
                          obj["metadata"]["name"]))
        g["records"][component] = read_record(obj["metadata"].get("annotations"))
        g.setdefault("configs", set()).update(*(mounted_config_maps(t.get("spec") or {}) for t in lws.pod_templates(obj)))
    # (key, component) of LeaderWorkerSets whose pods hold IMEX channels -> one ComputeDomain per group
    imex: dict[tuple[str, str], bool] = {}
    if lws_served:
        for obj, state_of in workloads:
            lbl = obj["metadata"].get("labels") or {}
            if state_of is lws_state and uses_imex(obj):
                imex[(lbl.get(L.LABEL_COMPAT_KEY), lbl.get(L.LABEL_ROLE))] = per_group_imex(obj)
    # (key, component, group index) -> its ComputeDomain; group index None: one shared by every group
    domains: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    if cd_served and imex:
        for obj in kube.list(cd.API_VERSION, cd.KIND, namespace, selector):
            lbl = obj["metadata"].get("labels") or {}
            domains[(lbl.get(L.LABEL_COMPAT_KEY), lbl.get(L.LABEL_ROLE), lbl.get(cd.GROUP_INDEX_LABEL))] = obj
    group_nodes: dict[tuple[str, str], dict[str, list[str]]] = {}
    gated: dict[tuple[str, str], set[str]] = {}  # (key, component) -> LWS groups with a pod behind a scheduling gate
    pods: dict[tuple[str, str], list[int]] = {}  # (key, component) -> [ready, total]
    in_use: dict[str | None, set[str]] = {}  # key -> ConfigMaps its pods mount
    for pod in kube.list("v1", "Pod", namespace, f"{L.LABEL_DEPLOYMENT}={name}"):
        labels = pod["metadata"].get("labels") or {}
        key = labels.get(L.LABEL_COMPAT_KEY)
        if labels.get(lws.LABEL_GROUP_INDEX) is not None and scheduling_gated(pod):
            gated.setdefault((key, labels.get(L.LABEL_ROLE)), set()).add(labels[lws.LABEL_GROUP_INDEX])
        if (key, labels.get(L.LABEL_ROLE)) in imex and labels.get(lws.LABEL_GROUP_INDEX) is not None:
            group_nodes.setdefault((key, labels.get(L.LABEL_ROLE)), {}).setdefault(
                labels[lws.LABEL_GROUP_INDEX], []).append((pod.get("spec") or {}).get("nodeName") or "")
        in_use.setdefault(key, set()).update(mounted_config_maps(pod.get("spec") or {}))
        counts = pods.setdefault((key, labels.get(L.LABEL_ROLE)), [0, 0])
        counts[0] += _pod_is_ready(pod)
        counts[1] += 1
        why = unschedulable_reason(pod) if key in groups else None
        if why is not None:
            groups[key]["unschedulable"] += 1
            groups[key].setdefault("reason", clip(why, 300))
    uids = {(lbl.get(L.LABEL_COMPAT_KEY), lbl.get(L.LABEL_ROLE)): obj["metadata"].get("uid")
            for obj, state_of in workloads if state_of is lws_state
            for lbl in [obj["metadata"].get("labels") or {}] if lbl.get(kueue.QUEUE_LABEL)}  # queued through Kueue
    for (key, component), groups_gated in sorted(gated.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        uid = uids.get((key, component))
        if key in groups and uid:
            groups[key].setdefault("admission", []).extend(
                admission_waits(component, _kueue_workloads(kube, namespace, uid), groups_gated))
    for key, g in groups.items():
        for component, w in g["workloads"].items():
            ready, total = pods.get((key, component), (0, 0))
            w = replace(w, pods_ready=ready, pods_total=total)
            if (key, component) in imex:  # a group is Ready only with its nodes Ready in the ComputeDomain
                per_group = imex[(key, component)]
                ok = imex_ready_groups(lambda g, k=key, c=component, p=per_group: domains.get((k, c, g if p else None)),
                                       group_nodes.get((key, component), {}), w.pods_per_replica)
                w = replace(w, ready=min(w.ready, ok), available=min(w.available, ok))
            g["workloads"][component] = w
    service = kube.get("v1", "Service", name, namespace)
    serving = service_serving_key(service)
    return Observed(
        groups={
            k: ObservedGroup(
                key=k,
                workloads=v["workloads"],
                unschedulable=v["unschedulable"],
                unschedulable_reason=v.get("reason", ""),
                awaiting_admission=tuple(v.get("admission", ())),
                deployment_names=tuple(v["names"]),
                record=_group_record(v["records"]),
                workload_refs=tuple(sorted(v["refs"])),
                config_maps_in_use=frozenset(v.get("configs", set()) | in_use.get(k, set())),
            )
            for k, v in groups.items()
        },
        serving_key=serving,
        service_exists=service is not None,
        shared_deployments=tuple(sorted(shared)),
    )
