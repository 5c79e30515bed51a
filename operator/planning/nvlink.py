"""NVLink placement of multi-node replicas: which roles are held to one NVLink clique and get a ComputeDomain (pure).

On a rack-scale NVLink system (GB200 / GB300 NVL72) the GPUs of different compute trays
reach each other over NVLink only when (a) their nodes are in the same NVLink partition,
which NVIDIA's GPU operator labels on each node (``nvidia.com/gpu.clique`` =
``<clusterUUID>.<cliqueID>``; the catalog's ``nvlinkCliqueLabel``), and (b) their pods hold
IMEX channels, which Kubernetes hands out through NVIDIA's DRA driver as a
``ComputeDomain`` (resource.nvidia.com/v1beta1) and the ResourceClaimTemplate it creates.
DeepEP / MegaMoE across the trays of a wide-EP replica need both; without them they fall
back to the network or fail.

``spec.placement.nvlinkDomain`` (api/v1alpha1.py ``PlacementSpec``) picks the policy;
:func:`nvlink_mode` resolves its default. docs/multi-node.md.
"""

from __future__ import annotations

from typing import Literal

from ..api.v1alpha1 import PDDeploymentSpec
from .structs import RolePlan

NVLinkMode = Literal["required", "preferred", "none"]


def nvlink_mode(spec: PDDeploymentSpec, role: RolePlan) -> NVLinkMode:
    """The effective NVLink placement of ``role``'s replicas: required, preferred or none.

    ``none`` for a single-node role (its pod is one node: NVLink inside the tray) and for an
    accelerator without multi-node NVLink in the catalog (``Accelerator.multi_node_nvlink``:
    no clique label to place by). Otherwise ``spec.placement.nvlinkDomain``, defaulting to
    ``required``.
    """
    acc = role.inputs.accelerator
    if not role.inputs.multi_node or acc is None or not acc.multi_node_nvlink:
        return "none"
    return spec.placement.nvlinkDomain or "required"


def clique_label(role: RolePlan) -> str | None:
    """The node label naming an NVLink partition on ``role``'s accelerator, or None (no multi-node NVLink)."""
    acc = role.inputs.accelerator
    return acc.nvlinkCliqueLabel if acc is not None and acc.multi_node_nvlink else None


def uses_compute_domain(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    """``role`` gets a ComputeDomain (IMEX channels): a multi-node NVIDIA role placed by NVLink clique.

    True when :func:`nvlink_mode` is required or preferred on an NVIDIA accelerator with
    multi-node NVLink (GB200, GB300); ``none`` opts out (the replica runs across cliques over
    RDMA and uses no IMEX channel).
    """
    acc = role.inputs.accelerator
    return acc is not None and acc.vendor == "nvidia" and nvlink_mode(spec, role) != "none"
