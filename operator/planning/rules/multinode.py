"""What a replica spanning several nodes (``parallelism.nodes`` > 1) must satisfy, checked before any pod exists.

A multi-node replica is one LeaderWorkerSet group: ``nodes`` pods, every one started with
the role's arguments plus ``--nnodes N --node-rank k --dist-init-addr <node 0>:<port>``
(render/multinode.py). SGLang splits the replica's ranks evenly over the nodes and runs
node 0's tokenizer, HTTP server and (prefill) bootstrap server; the other nodes run
schedulers only.

Sources (sglang 0.5.23): arg_groups/validation_hook.py ``check_server_args`` ("tp_size
must be divisible by number of nodes", "multi-node data-parallel replicas are not
supported; use attention DP (--attn-dp-size) across nodes"), entrypoints/engine.py
``_calculate_rank_ranges`` (node k holds tp x pp / nnodes ranks, one GPU each),
arg_groups/deepseek_v4_hook.py ``validate_deepseek_v4_cp`` ("Context parallel only
supports single machine ... Cross-machine CP has precision issues"), arg_groups/moe_hook.py
(``--deepep-v2-mode direct`` "is NVLink-only and cannot run across nodes").

The rules that hold per rank (DSpark's attention-DP requirements, the MoE all-to-all
backends, the handshake fields) need nothing here: every node runs the same command, and
the SGLang oracle judges each node rank's command (oracle/judge.py).
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..problems import Problem
from ..structs import RolePlan
from .fields import flag_field
from .moe import a2a_backend


def _field(role: RolePlan, leaf: str = "nodes") -> str:
    return f"spec.{role.role}.parallelism.{leaf}"


def _ranks(role: RolePlan) -> int:
    """tp x pp of one replica: the ranks SGLang spreads over the nodes."""
    return role.inputs.parallelism.tp * role.inputs.pipeline_parallel


def nodes_divide_ranks(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """tp x pp must be a multiple of ``parallelism.nodes``.

    Source: sglang 0.5.23 arg_groups/validation_hook.py check_server_args asserts
    ``(tp_size * pp_size) % nnodes == 0`` ("tp_size must be divisible by number of nodes")
    on every node; entrypoints/engine.py gives each node tp x pp / nnodes ranks.
    """
    nodes = role.inputs.nodes
    ranks = _ranks(role)
    if nodes <= 1 or ranks % nodes == 0:
        return []
    pp = role.inputs.pipeline_parallel
    shape = f"tp {role.inputs.parallelism.tp}" + (f" x pp {pp}" if pp > 1 else "")
    return [
        Problem(
            field=_field(role),
            message=f"the {role.role} role's {shape} = {ranks} ranks do not split evenly over {nodes} nodes; SGLang "
            "0.5.23 refuses it (\"tp_size must be divisible by number of nodes\")",
            fix=f"use a number of nodes that divides {ranks}, or a tp (x pp) that is a multiple of {nodes}",
            rule="nodes_divide_ranks",
        )
    ]


def replica_fills_nodes(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A multi-node replica takes exactly the accelerator's GPUs on each of its nodes.

    Each pod of the group runs tp x pp / nodes ranks, one GPU each
    (entrypoints/engine.py ``_calculate_rank_ranges``), and requests that many GPUs.

    - More than the node has: the pods can never be scheduled.
    - Fewer (stricter by design): the replica would fit on fewer nodes, and every node
      boundary moves TP / EP traffic from NVLink to the network. Two groups' pods would
      also share a node's NICs, which the per-GPU NIC mapping of the KV transfer
      (planning/transfer.py) assigns to one pod. The operator refuses it and names the
      node count that fills each node.

    Single-node replicas are judged by placement.replica_fits_node (fewer GPUs than the
    node has is normal there). Stands aside when tp x pp does not split over the nodes
    (:func:`nodes_divide_ranks`).
    """
    acc = role.inputs.accelerator
    nodes = role.inputs.nodes
    ranks = _ranks(role)
    if acc is None or nodes <= 1 or ranks % nodes:
        return []
    per_node = ranks // nodes
    if per_node == acc.gpusPerNode:
        return []
    fits = -(-ranks // acc.gpusPerNode)
    fix = (
        f"use nodes {fits} ({acc.gpusPerNode} GPUs on each {role.inputs.accelerator_name} node)"
        if ranks % acc.gpusPerNode == 0
        else f"use a tp (x pp) that is a multiple of {acc.gpusPerNode} with nodes = tp x pp / {acc.gpusPerNode}"
    )
    if per_node > acc.gpusPerNode:
        what = f"needs {per_node} GPUs on each node but a {role.inputs.accelerator_name} node has {acc.gpusPerNode}"
    else:
        what = (f"would take only {per_node} of a {role.inputs.accelerator_name} node's {acc.gpusPerNode} GPUs on "
                f"each of {nodes} nodes (it fits on {fits}; every extra node moves TP/EP traffic from NVLink to the "
                "network)")
    return [
        Problem(
            field=_field(role),
            message=f"a {role.role} replica of {ranks} GPUs over {nodes} nodes {what}",
            fix=fix,
            rule="replica_fills_nodes",
        )
    ]


def no_data_parallel_across_nodes(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """System data parallelism (dp > 1 without dpAttention) runs on one node only: across nodes use attention DP.

    Source: sglang 0.5.23 arg_groups/validation_hook.py check_server_args asserts "multi-node
    data-parallel replicas are not supported; use attention DP (--attn-dp-size) across
    nodes". The CRD refuses the same at apply time (CEL on parallelism.dp).
    """
    p = role.inputs.parallelism
    if p.nodes <= 1 or p.dp <= 1 or p.dpAttention:
        return []
    return [
        Problem(
            field=_field(role, "dp"),
            message=f"the {role.role} role runs {p.dp} data-parallel replicas (dp without dpAttention) across {p.nodes} "
            "nodes; SGLang 0.5.23 refuses it (\"multi-node data-parallel replicas are not supported\")",
            fix="turn parallelism.dpAttention on (attention DP across nodes, DEP), or use nodes 1 and scale with replicas",
            rule="no_data_parallel_across_nodes",
        )
    ]


def dsv4_context_parallel_one_node(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4 prefill context parallelism runs inside one node.

    Source: sglang 0.5.23 arg_groups/deepseek_v4_hook.py validate_deepseek_v4_cp: "Context
    parallel only supports single machine (tp_size <= 8). Cross-machine CP has precision
    issues." SGLang checks tp <= 8, which is one node on 8-GPU machines; on a 4-GPU GB300
    node tp 8 crosses a node boundary and SGLang starts it (on AMD it refuses "multiple
    nodes" outright). The operator refuses CP across nodes on every accelerator, as
    SGLang's message states the limit (stricter by design on NVIDIA). The other CP
    refusals are parallel.dsv4_prefill_cp's.
    """
    if role.inputs.nodes <= 1 or not role.inputs.prefill_cp or not role.inputs.is_deepseek_v4:
        return []
    acc = role.inputs.accelerator
    if acc is not None and acc.vendor == "amd":
        return []  # parallel.dsv4_prefill_cp reports SGLang's own "multiple nodes" refusal on HIP
    return [
        Problem(
            field=flag_field(role, "enable_prefill_cp"),
            message=f"DeepSeek-V4 prefill context parallelism across {role.inputs.nodes} nodes; SGLang 0.5.23 supports "
            "it on a single machine only (\"Cross-machine CP has precision issues\")",
            fix=f"remove --enable-prefill-cp from the {role.role} role, or use nodes 1",
            rule="dsv4_context_parallel_one_node",
        )
    ]


def deepep_v2_direct_one_node(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend deepep_v2`` in ``direct`` mode (NVLink only) runs inside one node.

    Source: sglang 0.5.23 arg_groups/moe_hook.py handle_a2a_moe raises "--deepep-v2-mode
    direct is NVLink-only and cannot run across nodes (nnodes=N); pass --deepep-v2-mode hybrid."
    ``direct`` is the field's default (arg_groups/fields/exec_.py), so an unset mode counts.
    """
    flags = parse_flags(role.inputs.spec.extraArgs)
    if role.inputs.nodes <= 1 or a2a_backend(flags) != "deepep_v2" or flags.get("deepep_v2_mode", "direct") != "direct":
        return []
    given = flags.get("deepep_v2_mode") is not None
    return [
        Problem(
            field=flag_field(role, "deepep_v2_mode" if given else "moe_a2a_backend"),
            message=f"--deepep-v2-mode direct (NVLink only{'' if given else ', the default'}) on a {role.role} replica "
            f"across {role.inputs.nodes} nodes; SGLang 0.5.23 refuses it",
            fix="use --deepep-v2-mode hybrid",
            rule="deepep_v2_direct_one_node",
        )
    ]


def kernel_cache_multi_node(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Warn: a kernel cache (``kernels.cache`` auto or a KernelBuild name) for a role spanning nodes.

    A KernelBuild runs its recipe in one Job on one node: the built-in recipes
    (kernels/builds.yaml) start ``sglang.launch_server`` (and ``compile_deep_gemm``) with the
    role's flags, and a server of ``--nnodes N`` waits for the other N-1 nodes, which never
    come, until the build's timeout. The cache itself would serve every rank (one cache per
    role: every node runs the same flags on the same node type), so the operator mounts a
    Ready one in every pod of the group; this warns that the built-in recipes cannot make it.
    """
    if not role.inputs.multi_node or spec.kernels.cache == "none":
        return []
    return [
        Problem(
            field="spec.kernels.cache",
            message=f"the {role.role} role spans {role.inputs.nodes} nodes; a KernelBuild warms up the role's server "
            "in one Job on one node, where a server of --nnodes "
            f"{role.inputs.nodes} waits for nodes that never join, so the build times out and the role waits at zero",
            fix="use kernels.cache: none for a deployment with multi-node roles, or name a KernelBuild whose recipe "
            "builds without starting the server",
            rule="kernel_cache_multi_node",
            severity="warning",
        )
    ]


ROLE_RULES = (
    nodes_divide_ranks,
    replica_fills_nodes,
    no_data_parallel_across_nodes,
    dsv4_context_parallel_one_node,
    deepep_v2_direct_one_node,
    kernel_cache_multi_node,
)
