"""Placement rules: the accelerator exists, a replica fits one node, memory fits the node.

Source: the accelerator catalog (kernels/accelerators.yaml); SGLang's process layout
(one GPU per TP rank; with DP attention off, dp copies of the TP group).
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..memory import gib, quantity_bytes
from ..nvlink import nvlink_mode
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
    """A single-node replica's GPUs (tp x pp, x dp without DP attention) must fit one node.

    A replica spanning nodes is judged per node by multinode.replica_fills_nodes.
    """
    acc = role.inputs.accelerator
    gpus = role.inputs.gpus_per_replica
    if acc is None or role.inputs.multi_node or gpus <= acc.gpusPerNode:
        return []
    return [
        Problem(
            field=f"spec.{role.role}.parallelism",
            message=f"a {role.role} replica needs {gpus} GPUs but a {role.inputs.accelerator_name} node has "
            f"{acc.gpusPerNode}",
            fix=f"use tp x pp x dp (dp counts only without dpAttention) <= {acc.gpusPerNode}",
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
    """The pod's memory request (operator-sized or given) must fit the node's host memory.

    Per pod, so per node for a replica spanning nodes: each node's pod is sized for its
    own GPUs (planning/memory.py), and an Engram host table is one copy per node.
    """
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


def parallelism_divides_model(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The parallel widths must divide what the model's config fixes, or every engine fails building the model.

    SGLang divides while it constructs the layers, after argument checks passed:
    attention heads (and KV heads, or TP by the KV heads when larger) by attention TP
    (layers/linear.py QKVParallelLinear ``divide()``; models/deepseek_v4.py for
    DeepSeek-V4, also its output groups), routed experts by the MoE EP size and the MoE
    intermediate size by the MoE TP size (layers/moe/fused_moe_triton/layer.py FusedMoE),
    a dense MLP's intermediate size by TP (MergedColumnParallelLinear). Sizes come from
    the catalog's copy of the model's config.json (planning/model_shape.py); the SGLang
    oracle checks the same divisions with SGLang's own ``ensure_divisibility``.
    """
    model = role.inputs.model
    config = catalog.hf_config(spec.model.name)
    if model is None or config is None or (role.role == "decode" and _same_parallelism(spec)):
        return []
    from ..features import parse_flags
    from ..model_shape import model_shape

    shape = model_shape(config, mla=model.mla)
    p = role.inputs.parallelism
    if (p.ep > 1 and p.tp % p.ep) or (p.dpAttention and p.tp % p.dp):
        return []  # parallelism_consistent refuses the widths themselves
    flags = parse_flags(role.inputs.spec.extraArgs)
    attn_tp = role.inputs.attention_tp
    ep = max(1, p.ep)
    moe_dp = max(1, int(flags.get("moe_dp_size") or 1)) if str(flags.get("moe_dp_size") or "1").isdigit() else 1
    moe_tp = max(1, p.tp // ep // moe_dp)
    redundant = str(flags.get("ep_num_redundant_experts") or "0")
    experts = shape.experts + (int(redundant) if redundant.isdigit() else 0)
    checks: list[tuple[int | None, int, str]] = [(shape.heads, attn_tp, f"{shape.heads} attention heads over attention TP {attn_tp}")]
    if shape.kv_heads:
        if attn_tp >= shape.kv_heads:
            checks.append((attn_tp, shape.kv_heads, f"attention TP {attn_tp} over {shape.kv_heads} KV heads (replicated)"))
        else:
            checks.append((shape.kv_heads, attn_tp, f"{shape.kv_heads} KV heads over attention TP {attn_tp}"))
    if shape.o_groups:
        checks.append((shape.o_groups, attn_tp, f"{shape.o_groups} output groups over attention TP {attn_tp}"))
    if experts:
        checks.append((experts, ep, f"{experts} routed experts over expert parallelism {ep}"))
        checks.append((shape.moe_intermediate, moe_tp, f"MoE intermediate size {shape.moe_intermediate} over MoE TP {moe_tp}"))
    if shape.intermediate:
        checks.append((shape.intermediate, p.tp, f"dense MLP intermediate size {shape.intermediate} over TP {p.tp}"))
    bad = [what for n, d, what in checks if n is not None and d >= 1 and n % d != 0]
    if not bad:
        return []
    roles = "both roles'" if _same_parallelism(spec) else f"the {role.role} role's"
    return [
        Problem(
            field=f"spec.{role.role}.parallelism.tp",
            message=f"{spec.model.name} does not split over {roles} parallelism (tp {p.tp}, dp {p.dp}, ep {p.ep}"
            f"{', dpAttention' if p.dpAttention else ''}): {'; '.join(bad)} do not divide; SGLang fails building the "
            "model on every engine",
            fix="use a tp (and ep) that divides the model's head, expert and intermediate counts, e.g. a power of two",
            rule="parallelism_divides_model",
        )
    ]


def _same_parallelism(spec: PDDeploymentSpec) -> bool:
    return spec.prefill.parallelism == spec.decode.parallelism and spec.prefill.extraArgs == spec.decode.extraArgs


def replica_fits_nvlink_clique(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A multi-node replica held to one NVLink clique must fit in one (e.g. at most 72 GPUs on NVL72).

    With ``spec.placement.nvlinkDomain`` required or preferred (required is the default on
    GB200 / GB300, planning/nvlink.py), every pod of a replica is placed in one NVLink
    partition; a replica of more GPUs than the partition holds (``nvlinkDomain`` in the
    catalog) could never be placed, so it is refused before anything is created.
    ``nvlinkDomain: none`` says it runs across cliques over RDMA: then it is served.
    A ``required``/``preferred`` set on an accelerator without multi-node NVLink has no
    effect: a warning says so.
    """
    acc = role.inputs.accelerator
    asked = spec.placement.nvlinkDomain
    if acc is None or not role.inputs.multi_node:
        return []
    if not acc.multi_node_nvlink:
        if asked in ("required", "preferred"):
            return [Problem(
                field="spec.placement.nvlinkDomain",
                message=f"{role.inputs.accelerator_name} has no NVLink across nodes in the accelerator catalog "
                f"(nvlinkDomain {acc.nvlinkDomain} GPUs, {acc.gpusPerNode} per node, no nvlinkCliqueLabel), so "
                f"nvlinkDomain: {asked} places nothing",
                fix="remove spec.placement.nvlinkDomain, or add nvlinkCliqueLabel to the catalog entry if the nodes "
                "share an NVLink fabric",
                rule="replica_fits_nvlink_clique",
                severity="warning",
            )]
        return []
    gpus = role.inputs.gpus_per_replica
    if nvlink_mode(spec, role) == "none" or gpus <= acc.nvlinkDomain:
        return []
    return [Problem(
        field=f"spec.{role.role}.parallelism.nodes",
        message=f"a {role.role} replica takes {gpus} GPUs on {role.inputs.nodes} nodes, more than one NVLink clique "
        f"of {role.inputs.accelerator_name} holds ({acc.nvlinkDomain} GPUs, {acc.nodes_per_clique} nodes), and "
        f"spec.placement.nvlinkDomain is {nvlink_mode(spec, role)}: it could never be placed",
        fix=f"use at most {acc.nodes_per_clique} nodes ({acc.nvlinkDomain} GPUs) per replica and scale with "
        "replicas, or set spec.placement.nvlinkDomain: none to run the replica across cliques (traffic between "
        "cliques over RDMA, no ComputeDomain)",
        rule="replica_fits_nvlink_clique",
    )]
