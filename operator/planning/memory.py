"""Size one engine pod's host memory and count GPU memory that SGLang's KV sizing does not see.

Host memory (the pod's memory request) = engine base + Paged Experts' pinned expert
store (every routed expert of every layer: sglang layers/moe/paged_experts keeps the full
expert set in pinned host memory) + the Engram host table when
``engram.placement: host`` (SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE, one copy per node) +
/dev/shm (an in-memory emptyDir counts against the pod's memory) + the host memory the pod
lends to the Mooncake Store when HiCache stores KV there (``globalSegmentSize``).

GPU memory outside KV sizing: decoder SWA bounded replay's tail CUDA graphs take about
2.2 GiB per GPU on GB300 TP4 (seed 003, sglang #45059) and are not counted by SGLang's
KV pool sizing; they are on by default for DeepSeek-V4.1 unless replay is off.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes.utils import parse_quantity

from ..api.v1alpha1 import PDDeploymentSpec
from .features import parse_flags
from .hicache import segment_bytes
from .roles import RoleInputs

GIB = 1 << 30
ENGINE_BASE_BYTES = 16 * GIB
ENGINE_PER_GPU_BYTES = 12 * GIB
TAIL_GRAPH_BYTES_PER_GPU = int(2.2 * GIB)
DEFAULT_SHM = "64Gi"


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity (``64Gi``, ``500M``) as whole bytes (kubernetes.utils.parse_quantity)."""
    return int(parse_quantity(text))


def gib(n_bytes: int) -> str:
    """Bytes as a whole-GiB quantity string, rounded up (``35Gi``)."""
    return f"{-(-n_bytes // GIB)}Gi"


@dataclass(frozen=True)
class MemoryPlan:
    """Memory of one pod of a role.

    ``host_items``: (what, bytes) pairs summing to ``host_bytes``, the memory request;
    ``pinned_bytes``: the part that must be page-locked (Paged Experts);
    ``gpu_outside_kv_bytes``: per-GPU memory SGLang's KV sizing does not count;
    ``engram_host_unknown``: host Engram table requested but its size is not in the catalog.
    """

    host_items: tuple[tuple[str, int], ...]
    pinned_bytes: int
    gpu_outside_kv_bytes: int
    shm: str
    engram_host_unknown: bool

    @property
    def host_bytes(self) -> int:
        """The pod's memory request in bytes."""
        return sum(b for _, b in self.host_items)


def bounded_replay_on(spec: PDDeploymentSpec, role: RoleInputs) -> bool:
    """Decoder SWA bounded replay resolves on for this PD role.

    As sglang 0.5.23 deepseek_v4_hook.validate_deepseek_v41_features resolves the unset
    flag: DeepSeek-V4.1, not an RL rollout (the operator renders it off), CUDA (PD on ROCm
    has not been run with it), no prefill / attention / decode context parallelism, no
    --enable-return-hidden-states, a breakable or disabled prefill CUDA graph, and DP
    attention only as attn_dp = tp with MoE all-to-all none or megamoe.
    """
    if spec.rlRollout or role.model is None or not role.model.is_deepseek_v41:
        return False
    if role.accelerator is None or role.accelerator.vendor != "nvidia":
        return False
    flags = parse_flags(role.spec.extraArgs)
    if flags.get("enable_decoder_swa_bounded_replay") is False:
        return False
    if role.prefill_cp or role.attention_cp != 1 or role.decode_cp != 1:
        return False
    if flags.get("enable_return_hidden_states") not in (None, False):
        return False
    if flags.get("cuda_graph_backend_prefill") == "full":
        return False
    p = role.parallelism
    if p.dpAttention and not (p.dp == p.tp and flags.get("moe_a2a_backend", "none") in ("none", "megamoe")):
        return False
    return True


def tail_graphs_on(spec: PDDeploymentSpec, role: RoleInputs) -> bool:
    """Tail CUDA graphs are captured: bounded replay on and SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS != 0."""
    rows = {e.name: e.value for e in role.spec.env}.get("SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS")
    return bounded_replay_on(spec, role) and rows != "0"


def plan_memory(*, spec: PDDeploymentSpec, role: RoleInputs) -> MemoryPlan:
    """Host memory items, pinned bytes and per-GPU memory outside KV sizing of one pod.

    A replica spanning nodes has one pod per node, sized for that node's GPUs
    (``RoleInputs.gpus_per_pod``); the Engram host table is one copy per node, so per pod.
    """
    gpus = role.gpus_per_pod
    shm = role.spec.resources.sharedMemory or (role.accelerator.sharedMemory if role.accelerator else DEFAULT_SHM)
    items: list[tuple[str, int]] = [("engine processes", ENGINE_BASE_BYTES + ENGINE_PER_GPU_BYTES * gpus)]
    items.append(("/dev/shm", quantity_bytes(shm)))
    pinned = 0
    if role.paged_experts_k is not None and role.model is not None:
        pinned = role.model.expert_bytes_total
        items.append(("Paged Experts pinned expert store", pinned))
    segment = segment_bytes(spec, role.role)
    if segment:
        items.append(("Mooncake Store segment (HiCache L3)", segment))
    engram_unknown = False
    if spec.engram is not None and spec.engram.placement == "host":
        table = role.model.engramTableBytes if role.model is not None else None
        if table:
            items.append(("Engram host table", table))
        else:
            engram_unknown = True
    return MemoryPlan(
        host_items=tuple(items),
        pinned_bytes=pinned,
        gpu_outside_kv_bytes=TAIL_GRAPH_BYTES_PER_GPU if tail_graphs_on(spec, role) else 0,
        shm=shm,
        engram_host_unknown=engram_unknown,
    )
