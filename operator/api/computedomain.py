"""Facts of NVIDIA's ComputeDomain (resource.nvidia.com/v1beta1), the optional dependency that gives a multi-node
replica on GB200 / GB300 its IMEX channels (multi-node NVLink memory sharing).

NVIDIA's DRA driver for GPUs (github.com/NVIDIA/k8s-dra-driver-gpu) serves the kind. A
ComputeDomain names ``spec.numNodes`` and ``spec.channel.resourceClaimTemplate.name``; the
driver's controller creates that ResourceClaimTemplate (one IMEX channel per claim, DRA,
resource.k8s.io), and pods that reference it get a channel on their node, where the
driver starts an IMEX daemon that joins the domain. ``status.status`` is Ready / NotReady
(/ Failed); ``status.nodes`` lists each node that joined (name, ipAddress, cliqueID,
index, status Ready / NotReady / Failed). The spec is immutable (the CRD's CEL
``self == oldSelf``). The names below were read from the driver's
api/nvidia.com/resource/v1beta1/computedomain.go; the driver's module is not served by
the Go module proxy this project builds from, so the dev cluster runs a stand-in
controller (devtools, docs/multi-node.md says what it does and does not do).

Each replica of a LeaderWorkerSet gets its own ComputeDomain (:func:`group_domain_name`);
the MutatingAdmissionPolicy of :func:`admission_policy` points each new pod at its own
replica's channel template, since LWS renders every replica from one pod template.

No I/O here: planning, rendering and the reconcilers all import it.
"""

from __future__ import annotations

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ComputeDomain"
PLURAL = "computedomains"
#: The CRD the operator needs served before it creates a multi-node role on GB200 / GB300.
CRD_NAME = f"{PLURAL}.{GROUP}"

STATUS_READY = "Ready"
#: ``spec.channel.allocationMode``: one IMEX channel per claim (the driver's default).
ALLOCATION_SINGLE = "Single"

#: The pod-level claim name every engine pod of such a role references (``spec.resourceClaims[].name``).
POD_CLAIM = "imex-channel"

INSTALL_HINT = (
    "install NVIDIA's DRA driver for GPUs with ComputeDomain support (Helm chart nvidia-dra-driver-gpu, "
    "resources.computeDomains.enabled=true), which serves it and runs its controller and IMEX daemons"
)


#: Label of an engine pod template whose pods take the IMEX channel of their own group's ComputeDomain; its
#: value is the LeaderWorkerSet's name, the prefix of the group's domain (:func:`group_domain_name`).
GROUP_DOMAIN_LABEL = "pd.sglang-operator.io/imex-domain"
#: Label of a per-group ComputeDomain: the LeaderWorkerSet group index (engine replica) it serves.
GROUP_INDEX_LABEL = "pd.sglang-operator.io/group-index"

#: The MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in Kubernetes 1.36) that points each pod
#: of a group at its own group's channel template, and its binding (same name); the chart installs both.
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
POLICY_KIND = "MutatingAdmissionPolicy"
BINDING_KIND = "MutatingAdmissionPolicyBinding"
POLICY_NAME = "sglang-pd-operator-imex-channel-per-replica"
#: Labels the policy reads the group index from: LWS's (the worker StatefulSet's template carries it, LWS's pod
#: webhook adds it to a leader) and the StatefulSet controller's pod ordinal (a leader's ordinal is its group).
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
POD_INDEX = "apps.kubernetes.io/pod-index"


def claim_template_name(compute_domain: str) -> str:
    """The ResourceClaimTemplate the driver creates for ``compute_domain``'s channel (``<name>-channel``)."""
    return f"{compute_domain}-channel"


def missing_message(*, roles: list[str]) -> str:
    """The condition message for a cluster that does not serve ComputeDomains; ``roles``: e.g. ['decode nodes 16 on gb300']."""
    return (
        f"{' and '.join(roles)} span nodes of a multi-node NVLink system, which needs the ComputeDomain API "
        f"({API_VERSION}, CRD {CRD_NAME}) for its IMEX channels; the cluster does not serve it, so nothing was "
        f"created. To fix: {INSTALL_HINT}; the operator notices it within half a minute. Or set "
        "spec.placement.nvlinkDomain: none to run the replicas without NVLink across nodes (over RDMA)"
    )


def node_ready(status: dict, node: str) -> bool:
    """``node`` is listed in a ComputeDomain's ``status`` with its IMEX daemon Ready."""
    return any(n.get("name") == node and n.get("status", STATUS_READY) == STATUS_READY
               for n in status.get("nodes") or [])


def placeholder_template(workload: str) -> str:
    """The claim template the pod template of LeaderWorkerSet ``workload`` names, which never exists
    (``<workload>-replica-channel``: no replica's domain is named ``<workload>-replica``, and a domain of
    an operator before 0.3.0 has ``<workload>-channel``): the admission policy replaces it."""
    return f"{workload}-replica-channel"


def group_domain_name(workload: str, group: int | str) -> str:
    """The ComputeDomain of group ``group`` of LeaderWorkerSet ``workload``: ``<workload>-<group>``."""
    return f"{workload}-{group}"


def group_index_expression() -> str:
    """CEL: the pod's LWS group index (string) from its labels (:data:`LWS_GROUP_INDEX`, else :data:`POD_INDEX`)."""
    return (f"('{LWS_GROUP_INDEX}' in object.metadata.labels ? object.metadata.labels['{LWS_GROUP_INDEX}'] "
            f": object.metadata.labels['{POD_INDEX}'])")


def admission_policy() -> list[dict]:
    """The MutatingAdmissionPolicy and its binding that give each group of a LeaderWorkerSet its own IMEX channel.

    LWS renders every group from one pod template, so the template cannot name group ``i``'s
    claim template. Its pods carry :data:`GROUP_DOMAIN_LABEL` (the LeaderWorkerSet's name)
    and the claim :data:`POD_CLAIM` naming :func:`placeholder_template`, which never exists;
    at the pod's CREATE the policy sets that claim's template to
    ``claim_template_name(group_domain_name(<lws>, <group index>))``. A pod the policy did
    not reach (the policy missing) stays Pending on the missing template instead of joining
    another group's IMEX domain, and the operator creates no group without the policy
    (``ImexChannelPolicyMissing``). ``failurePolicy: Fail``: a pod whose index cannot be read
    is refused, not admitted with the placeholder. Sources: Kubernetes' MutatingAdmissionPolicy
    (KEP-3962, ApplyConfiguration mutations, ``spec.resourceClaims`` a list map keyed by name),
    the StatefulSet controller's ``apps.kubernetes.io/pod-index`` label, LWS's group-index label.
    """
    claim = (f"Object.spec.resourceClaims{{name: '{POD_CLAIM}', resourceClaimTemplateName: "
             f"object.metadata.labels['{GROUP_DOMAIN_LABEL}'] + '-' + {group_index_expression()} + '-channel'}}")
    labels = {"app.kubernetes.io/name": "sglang-pd-operator", "app.kubernetes.io/component": "imex-channel-per-replica"}
    policy = {
        "apiVersion": ADMISSION_API_VERSION, "kind": POLICY_KIND,
        "metadata": {"name": POLICY_NAME, "labels": labels},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                   "resources": ["pods"]}],
                "objectSelector": {"matchExpressions": [{"key": GROUP_DOMAIN_LABEL, "operator": "Exists"}]},
            },
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": f"Object{{spec: Object.spec{{resourceClaims: [{claim}]}}}}"}}],
        },
    }
    binding = {
        "apiVersion": ADMISSION_API_VERSION, "kind": BINDING_KIND,
        "metadata": {"name": POLICY_NAME, "labels": labels},
        "spec": {"policyName": POLICY_NAME},
    }
    return [policy, binding]


def policy_missing_message(*, pod: str) -> str:
    """Why ``pod`` waits (at most about 300 characters, what status quotes): its IMEX claim still names the
    placeholder: no admission policy (:func:`admission_policy`; the chart names it after its release)
    pointed it at its replica's channel."""
    return (
        f"no MutatingAdmissionPolicy pointed pod {pod} at its replica's IMEX channel ({POLICY_NAME} and its binding "
        "from crds/policies/, or the chart's imex.channelPerReplicaPolicy=true): install both, then delete the waiting pods"
    )


def policy_missed(pod: dict) -> str | None:
    """The placeholder template ``pod``'s IMEX claim still names (the admission policy did not act on it), else None."""
    prefix = ((pod.get("metadata") or {}).get("labels") or {}).get(GROUP_DOMAIN_LABEL)
    if prefix is None:
        return None
    placeholder = placeholder_template(prefix)
    for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
        if claim.get("name") == POD_CLAIM and claim.get("resourceClaimTemplateName") == placeholder:
            return placeholder
    return None
