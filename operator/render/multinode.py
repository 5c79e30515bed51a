"""Render a role whose replicas span nodes as one LeaderWorkerSet per compat group (pure).

One *group* of the LeaderWorkerSet (sigs.k8s.io/lws, ``operator/api/lws.py``) is one engine
replica: ``size`` = ``parallelism.nodes`` pods, ``replicas`` = the role's replicas. The pod
templates come from :func:`~.engine.pod_template` (leader and worker differ in their
readiness probe only); every pod runs the role's SGLang arguments with ``--nnodes N
--node-rank $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):20000``
(planning/engine_args.py ``node_args``), SGLANG_HOST_IP from its pod IP, the same bootstrap
port and the same NIC mapping.

Choices, and why:

- ``restartPolicy: RecreateGroupOnPodRestart``: an SGLang replica is one torch.distributed
  world; a rank that restarts cannot rejoin it, so any pod's restart recreates the group.
- ``startupPolicy: LeaderCreated``: workers start as soon as the leader pod exists. The
  other policy, LeaderReady, would deadlock: the leader turns Ready only after its
  ``/health`` answers, i.e. after every rank of the world joined (node 0's schedulers
  cannot finish torch.distributed's init without the workers). The price is lws #746:
  a worker can start before the leader's DNS name resolves (the leader pod still pulling
  its image), and SGLang would fail on an address it cannot resolve. So every pod first
  runs :func:`wait_for_leader_container`, which waits (bounded) until
  ``LWS_LEADER_ADDRESS`` resolves; the leader runs it too (its own name appears once its
  endpoint is published).
- The group's headless Service is the operator's own (named like the LeaderWorkerSet and
  applied before it, so LWS finds it and uses it as the pods' subdomain instead of
  creating one) with ``publishNotReadyAddresses: true``: the leader's DNS record must
  exist before the leader is Ready, or nobody could ever join it. Its owner reference to
  the PDDeployment does not claim control: should LWS have created the Service first (it
  was deleted while the group ran), LWS is its controller, and the operator's apply adds
  its labels, selector and a second, non-controller owner instead of being refused
  ("Only one reference can have Controller set to true", seen on the dev cluster).
- NVLink placement (``spec.placement.nvlinkDomain``, planning/nvlink.py): on GB200 / GB300
  every pod of one group carries a pod affinity on the accelerator's clique label
  (``nvidia.com/gpu.clique``) to the pods of its own group: ``labelSelector`` the
  LeaderWorkerSet's name, ``matchLabelKeys: [leaderworkerset.sigs.k8s.io/group-key]`` (the
  API server adds the pod's own group hash, which LWS's webhook puts on the leader and its
  worker StatefulSet on the workers), required or preferred. The leader, first of its
  group, matches its own term and may go anywhere; its workers follow it into its clique.
  LWS v0.9.0's own ``leaderworkerset.sigs.k8s.io/exclusive-topology`` annotation was not
  used: it is 1:1 exclusive (pod_webhook.go ``SetExclusiveAffinities`` adds an anti-affinity
  against every other group's pods, of any LeaderWorkerSet, in the domain), so a two-tray
  prefill group would take a whole 18-tray rack, and prefill and decode of one deployment
  could never share a rack (``pairDomain``); it also holds the workers back until the
  leader is bound and then pins them with a nodeSelector (pod_controller.go), the same
  leader-first choice as the affinity.
- IMEX channels (planning/nvlink.py ``uses_compute_domain``: a multi-node role on GB200 /
  GB300 unless ``nvlinkDomain: none``): one ComputeDomain (NVIDIA's DRA driver,
  api/computedomain.py) per replica, i.e. per LWS group: ``<lws>-<i>``, ``numNodes`` = the
  replica's nodes, its channel's ResourceClaimTemplate ``<lws>-<i>-channel``; every pod of
  group ``i`` (leader and workers) references that template (``spec.resourceClaims``, the
  engine container's ``resources.claims``), so each rank's node gets an IMEX channel of its
  own replica's domain, the unit Dynamo's Grove also gives one domain to. LWS v0.9.0 renders
  every group from the same pod template, so the template names ``<lws>-replica-channel``
  (never created) and carries ``pd.sglang-operator.io/imex-domain: <lws>``; a
  MutatingAdmissionPolicy the chart installs (``admission_policy``) rewrites the claim of
  each new pod to its group's template from the pod's group index. Without the policy a
  pod stays Pending on the missing template and status says what to install
  (reconcilers/observe.py), never joining another replica's domain. The spec is immutable
  (the CRD's CEL): the operator creates a replica's domain once when missing and never
  patches it; a replica removed by a scale-down loses its domain once its pods are gone
  (reconcilers/pddeployment.py). A group counts Ready only when its own domain is Ready
  and lists every node of its pods Ready (reconcilers/observe.py).
- Gang admission (``spec.scheduling.queueName``, else the operator's ``--default-queue-name``:
  ``Plan.queue_name``; api/kueue.py): the LeaderWorkerSet carries Kueue's queue label, so
  Kueue's LWS integration makes one Workload per group and keeps every pod of the group
  behind its scheduling gate until the whole group is admitted (the queue is a compat
  input, ``planning.plan.with_queue_compat``: Kueue refuses a queue change in place);
  with NVLink placement the pod templates also ask Kueue's topology-aware scheduling for
  one clique for leader and workers together (:func:`kueue_annotations`). The pod
  affinity stays: it is what the kube-scheduler enforces should Kueue be absent.
- ``rolloutStrategy``: RollingUpdate with the role's in-place strategy (a whole group is
  the unit LWS surges: maxSurge 1 / maxUnavailable 0, or 0 / 1 when rollout.maxSurgeGPUs
  cannot hold one more group).
"""

from __future__ import annotations

from typing import Any

from ..api import computedomain as cd
from ..api import kueue, lws
from ..planning.nvlink import clique_label, nvlink_mode, uses_compute_domain
from ..planning.rollout import InPlaceStrategy
from ..planning.structs import Plan, RolePlan
from . import labels as L

#: Seconds a pod waits for the leader's DNS name before its init container fails (the
#: kubelet then restarts it; LWS recreates the group).
LEADER_DNS_WAIT_S = 600
WAIT_FOR_LEADER = "wait-for-leader"

#: argv[1]: seconds to wait. Exits 0 once LWS_LEADER_ADDRESS resolves, 1 with a message after the deadline.
WAIT_FOR_LEADER_SCRIPT = """\
import os, socket, sys, time
name, budget = os.environ["LWS_LEADER_ADDRESS"], float(sys.argv[1])
deadline = time.monotonic() + budget
while True:
    try:
        socket.getaddrinfo(name, None)
        sys.exit(0)
    except OSError as e:
        if time.monotonic() >= deadline:
            sys.exit(f"the leader address {name} did not resolve within {budget:.0f}s: {e}")
        time.sleep(1)
"""


def wait_for_leader_container(role: RolePlan) -> dict[str, Any]:
    """The init container of every pod of a multi-node replica: wait until the leader's DNS name resolves.

    ``python3 -I -S`` of the engine image (stdlib only); ``LWS_LEADER_ADDRESS`` is injected
    into init containers too (lws pkg/utils/pod/pod_utils.go AddLWSVariables). Fails loud
    after :data:`LEADER_DNS_WAIT_S` instead of handing SGLang an address it cannot reach.
    """
    return {
        "name": WAIT_FOR_LEADER,
        "image": role.inputs.runtime.image,
        "imagePullPolicy": role.inputs.runtime.imagePullPolicy,
        "command": ["python3", "-I", "-S", "-c", WAIT_FOR_LEADER_SCRIPT, str(LEADER_DNS_WAIT_S)],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    }


def group_service_settings() -> dict[str, Any]:
    """What the role's headless Service adds for a multi-node role: not-ready pods resolve (see the module doc)."""
    return {"publishNotReadyAddresses": True}


def leader_worker_set(
    plan: Plan,
    role: RolePlan,
    *,
    owner: dict | None,
    strategy: InPlaceStrategy,
    leader: dict[str, Any],
    worker: dict[str, Any],
    replicas: int | None = None,
) -> dict[str, Any]:
    """The LeaderWorkerSet of a multi-node ``role`` in the plan's compat group.

    ``leader`` / ``worker``: the pod templates (:func:`~.engine.pod_template`);
    ``strategy``: the role's in-place strategy; ``replicas``: the role's count (groups)
    when ``spec.<role>.replicas`` is omitted (its PDRoleScale's), as for a Deployment
    (:func:`~.engine.render_role`). Named like the role's Deployment would be
    (``<name>-<group id>-<role>``), which is also its Service's name.
    """
    name, ns, key, component = plan.name, plan.namespace, plan.compat_key, role.role
    spec: dict[str, Any] = {
        "startupPolicy": lws.STARTUP_LEADER_CREATED,
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": strategy.rolling_update()},
        "networkConfig": {"subdomainPolicy": "Shared"},
        "leaderWorkerTemplate": {
            "size": role.inputs.nodes,
            "restartPolicy": lws.RESTART_RECREATE_GROUP,
            "leaderTemplate": leader,
            "workerTemplate": worker,
        },
    }
    count = role.inputs.spec.replicas if role.inputs.spec.replicas is not None else replicas
    if count is not None:
        spec = {"replicas": count, **spec}
    labels = L.component_labels(name, component, key)
    queue = plan.queue_name  # spec.scheduling.queueName, else the operator's default
    if queue:  # Kueue admits each group whole (api/kueue.py)
        labels = {**labels, kueue.QUEUE_LABEL: queue}
    return {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": L.metadata(name=L.group_object_name(name, key, component), namespace=ns,
                               labels=labels, owner=owner),
        "spec": spec,
    }


def kueue_annotations(plan: Plan, role: RolePlan) -> dict[str, str]:
    """Pod template annotations of a multi-node ``role`` queued through Kueue (:attr:`Plan.queue_name`).

    With NVLink placement required (preferred) on the accelerator's clique label: Kueue's
    topology-aware scheduling must (should) find one domain of that level for the whole
    pod set (``kueue.x-k8s.io/podset-required-topology`` / ``-preferred-topology``), and the
    leader and worker pod sets form one podset group (``kueue.x-k8s.io/podset-group-name``)
    so they share it: the whole replica in one clique before any pod is ungated. Without a
    queue, or with ``nvlinkDomain: none``, none (Kueue then admits by quota alone). Source:
    Kueue apis/kueue/v1beta2/topology_types.go, pkg/controller/jobs/leaderworkerset
    (its webhook validates the group: exactly two pod sets, one of them of one pod).
    """
    if not plan.queue_name or not role.inputs.multi_node:
        return {}
    mode, label = nvlink_mode(plan.spec, role), clique_label(role)
    if mode == "none" or label is None:
        return {}
    key = kueue.REQUIRED_TOPOLOGY if mode == "required" else kueue.PREFERRED_TOPOLOGY
    return {key: label, kueue.PODSET_GROUP_NAME: kueue.REPLICA_PODSET_GROUP}


#: Weight of the preferred clique terms (the scheduler's 1..100 scale): a group's own clique
#: outweighs the other role's (``pairDomain``).
GROUP_CLIQUE_WEIGHT = 100
PAIR_CLIQUE_WEIGHT = 50


def pod_affinity(plan: Plan, role: RolePlan) -> dict[str, Any] | None:
    """The ``affinity`` of ``role``'s pods from ``spec.placement``, or None when it places nothing.

    - A multi-node role with NVLink mode required / preferred (planning/nvlink.py): a
      podAffinity term on the clique label to the pods of the same LWS group (module doc);
      required -> ``requiredDuringSchedulingIgnoredDuringExecution``, preferred -> a
      preferred term of weight :data:`GROUP_CLIQUE_WEIGHT`.
    - ``pairDomain: preferred`` on an accelerator with multi-node NVLink: a preferred term
      (weight :data:`PAIR_CLIQUE_WEIGHT`) to the other role's pods of the same compat group
      in the same clique, on single-node roles too.
    """
    label = clique_label(role)
    if label is None:
        return None
    required: list[dict[str, Any]] = []
    preferred: list[dict[str, Any]] = []
    mode = nvlink_mode(plan.spec, role)
    if mode != "none":
        term = {
            "labelSelector": {"matchLabels": {lws.LABEL_NAME: L.group_object_name(plan.name, plan.compat_key, role.role)}},
            "matchLabelKeys": [lws.LABEL_GROUP_KEY],
            "topologyKey": label,
        }
        if mode == "required":
            required.append(term)
        else:
            preferred.append({"weight": GROUP_CLIQUE_WEIGHT, "podAffinityTerm": term})
    if plan.spec.placement.pairDomain == "preferred":
        other = "decode" if role.role == "prefill" else "prefill"
        preferred.append({"weight": PAIR_CLIQUE_WEIGHT, "podAffinityTerm": {
            "labelSelector": {"matchLabels": L.selector_labels(plan.name, other, plan.compat_key)},
            "topologyKey": label,
        }})
    if not required and not preferred:
        return None
    affinity: dict[str, Any] = {}
    if required:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    return {"podAffinity": affinity}


def compute_domains(plan: Plan, role: RolePlan, *, owner: dict | None, replicas: int | None = None) -> list[dict[str, Any]]:
    """One ComputeDomain per replica (LWS group) of ``role``'s LeaderWorkerSet, or [] when it uses none.

    Group ``i``'s is ``<lws>-<i>`` (:func:`~..api.computedomain.group_domain_name`),
    labelled like the group's objects plus its group index (pruned with the group), owned by
    the PDDeployment; ``numNodes`` = the replica's nodes; its channel template
    ``<lws>-<i>-channel``, which the admission policy points group ``i``'s pods at
    (``api/computedomain.py admission_policy``). Replicas: ``spec.<role>.replicas``, else
    ``replicas``, else 1. See the module doc.
    """
    if not uses_compute_domain(plan.spec, role):
        return []
    workload = L.group_object_name(plan.name, plan.compat_key, role.role)
    count = role.inputs.spec.replicas if role.inputs.spec.replicas is not None else replicas
    out = []
    for group in range(1 if count is None else count):
        name = cd.group_domain_name(workload, group)
        labels = {**L.component_labels(plan.name, role.role, plan.compat_key), cd.GROUP_INDEX_LABEL: str(group)}
        out.append({
            "apiVersion": cd.API_VERSION,
            "kind": cd.KIND,
            "metadata": L.metadata(name=name, namespace=plan.namespace, labels=labels, owner=owner),
            "spec": {
                "numNodes": role.inputs.nodes,
                "channel": {"resourceClaimTemplate": {"name": cd.claim_template_name(name)},
                            "allocationMode": cd.ALLOCATION_SINGLE},
            },
        })
    return out


def imex_claims(plan: Plan, role: RolePlan) -> list[dict[str, Any]]:
    """The pod's ``resourceClaims``: the IMEX channel, or none.

    The template named is ``<lws>-replica-channel``, which never exists: the admission policy
    replaces it at each pod's creation with its own group's (``<lws>-<i>-channel``), and a
    pod it did not reach waits Pending instead of joining another group's domain.
    """
    if not uses_compute_domain(plan.spec, role):
        return []
    name = L.group_object_name(plan.name, plan.compat_key, role.role)
    return [{"name": cd.POD_CLAIM, "resourceClaimTemplateName": cd.placeholder_template(name)}]


def imex_pod_labels(plan: Plan, role: RolePlan) -> dict[str, str]:
    """The pod template's label that asks the admission policy for the group's own channel
    (:data:`~..api.computedomain.GROUP_DOMAIN_LABEL`: the LeaderWorkerSet's name), or none."""
    if not uses_compute_domain(plan.spec, role):
        return {}
    return {cd.GROUP_DOMAIN_LABEL: L.group_object_name(plan.name, plan.compat_key, role.role)}
