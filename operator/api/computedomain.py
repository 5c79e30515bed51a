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
