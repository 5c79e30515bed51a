"""Placement rules: the accelerator exists, a replica fits one node, memory fits the node.

Source: the accelerator catalog (kernels/accelerators.yaml); SGLang's process layout
(one GPU per TP rank; with DP attention off, dp copies of the TP group).
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..memory import gib, quantity_bytes
from ..structs import RolePlan
from ..problems import Problem


def accelerator_known(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The role's accelerator must be a catalog name."""
    if role.inputs.accelerator is not None:
        return []
    if role.role == "decode" and role.inputs.accelerator_field == "spec.accelerator":
        return []  # reported once, for prefill
    return [
        Problem(
            field=role.inputs.accelerator_field,
            message=f"accelerator {role.inputs.accelerator_name!r} is not in the accelerator catalog",
            fix=f"use one of: {', '.join(sorted(catalog.accelerators))}, or add it to the catalog ConfigMap",
            rule="accelerator_known",
        )
    ]


def replica_fits_node(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A single-node replica's GPUs (tp x dp without DP attention) must fit one node."""
    acc = role.inputs.accelerator
    gpus = role.inputs.gpus_per_replica
    if acc is None or gpus <= acc.gpusPerNode:
        return []
    return [
        Problem(
            field=f"spec.{role.role}.parallelism",
            message=f"a {role.role} replica needs {gpus} GPUs but a {role.inputs.accelerator_name} node has "
            f"{acc.gpusPerNode}",
            fix=f"use tp x dp (dp counts only without dpAttention) <= {acc.gpusPerNode}",
            rule="replica_fits_node",
        )
    ]


def parallelism_consistent(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """ep must divide the GPUs of a replica; dp must divide tp with DP attention (SGLang asserts both)."""
    p = role.inputs.parallelism
    problems = []
    if p.ep > 1 and p.tp % p.ep != 0:
        problems.append(
            Problem(
                field=f"spec.{role.role}.parallelism.ep",
                message=f"ep {p.ep} must divide tp {p.tp}",
                fix="set ep to a divisor of tp (ep = tp for full expert parallelism)",
                rule="parallelism_consistent",
            )
        )
    if p.dpAttention and p.tp % p.dp != 0:
        problems.append(
            Problem(
                field=f"spec.{role.role}.parallelism.dp",
                message=f"with dpAttention, dp {p.dp} must divide tp {p.tp}",
                fix="set dp to a divisor of tp",
                rule="parallelism_consistent",
            )
        )
    return problems


def memory_fits_node(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The pod's memory request (operator-sized or given) must fit the node's host memory."""
    acc = role.inputs.accelerator
    if acc is None:
        return []
    request = role.inputs.spec.resources.memory
    need = quantity_bytes(request) if request else role.memory.host_bytes
    have = quantity_bytes(acc.hostMemory)
    if need <= have:
        return []
    items = ", ".join(f"{what} {gib(b)}" for what, b in role.memory.host_items)
    return [
        Problem(
            field=f"spec.{role.role}.resources.memory",
            message=f"a {role.role} pod needs {gib(need)} of host memory ({items}) but a "
            f"{role.inputs.accelerator_name} node has {acc.hostMemory}",
            fix="lower residentExperts / use a node type with more memory / move the Engram table off the host",
            rule="memory_fits_node",
        )
    ]
