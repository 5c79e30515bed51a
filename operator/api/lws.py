"""Facts of LeaderWorkerSet (sigs.k8s.io/lws), the optional dependency that runs a replica across nodes.

A role whose replicas span nodes (``parallelism.nodes`` > 1) is rendered as one
LeaderWorkerSet per compat group (render/multinode.py): one *group* of ``size`` pods per
replica, a leader (worker index 0) and ``size - 1`` workers, recreated together. The
names below are LWS's API, read from its Go module (api/leaderworkerset/v1/
leaderworkerset_types.go, pkg/utils/pod/pod_utils.go ``AddLWSVariables``,
pkg/webhooks/pod_webhook.go) at the versions in :data:`TESTED_VERSIONS`.

No I/O here: planning, rendering and the reconcilers all import it.
"""

from __future__ import annotations

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
#: The CRD the operator needs served before it creates a multi-node role.
CRD_NAME = f"{PLURAL}.{GROUP}"

#: LWS releases the operator is tested with (the dev cluster runs the first; Go module sigs.k8s.io/lws).
TESTED_VERSIONS = ("v0.9.0",)
#: What to run to install it (the LWS project's release manifest; its controller and webhooks included).
INSTALL_HINT = (
    f"kubectl apply --server-side -f https://github.com/kubernetes-sigs/lws/releases/download/"
    f"{TESTED_VERSIONS[0]}/manifests.yaml"
)

# Labels the LWS pod webhook and controller put on every pod of a group.
LABEL_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
#: A hash unique to one group, on its leader (pod webhook) and its workers (worker StatefulSet template).
LABEL_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
#: LWS's own 1:1 exclusive placement (one group per topology domain, others anti-affine); not used, see render/multinode.py.
ANNOTATION_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
#: ``worker-index`` of a group's leader (node 0 of the engine replica).
LEADER_INDEX = "0"

# Variables the LWS pod webhook injects into every container and init container.
ENV_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"  # <lws>-<group>.<subdomain>.<namespace>: the leader pod's DNS name
ENV_GROUP_SIZE = "LWS_GROUP_SIZE"
ENV_WORKER_INDEX = "LWS_WORKER_INDEX"

# Spec values the operator renders.
RESTART_RECREATE_GROUP = "RecreateGroupOnPodRestart"
STARTUP_LEADER_CREATED = "LeaderCreated"


def env_ref(name: str) -> str:
    """``$(NAME)``: a container argument the kubelet expands from the container's environment."""
    return f"$({name})"


def missing_message(*, roles: list[str]) -> str:
    """The condition message for a cluster that does not serve LeaderWorkerSets; ``roles``: e.g. ['decode nodes 16']."""
    return (
        f"{' and '.join(roles)} span nodes, which needs the LeaderWorkerSet API ({API_VERSION}, CRD {CRD_NAME}); "
        f"the cluster does not serve it, so nothing was created. Install LeaderWorkerSet "
        f"{' or '.join(TESTED_VERSIONS)} (the versions tested), e.g. {INSTALL_HINT}; the operator notices it "
        "within half a minute"
    )


def pod_templates(workload: dict) -> list[dict]:
    """The pod templates of a rendered Deployment (``spec.template``) or LeaderWorkerSet (its
    ``leaderTemplate`` and ``workerTemplate``), in place: callers may edit them."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == KIND:
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    return [spec["template"]] if spec.get("template") else []
