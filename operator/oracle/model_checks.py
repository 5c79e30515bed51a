"""The checks SGLang makes while it builds the model that the model's config already decides (worker side).

SGLang divides head counts, group counts, expert counts and intermediate sizes by the
parallel widths while it constructs the layers, long after argument resolution passed:
``tp: 3`` on a 64-head model resolves and validates, then every engine fails in
``divide()`` (sglang/srt/distributed/utils.py) building the first linear layer. The
oracle cannot build the layers (that needs the GPU kernels), so this module lists the
divisions the model code makes, reads both sides from SGLang itself (the HF config SGLang
loaded through ``model_config_of``; the widths of ``runtime_context.parallel_widths_of``
on the resolved view) and runs SGLang's own ``ensure_divisibility`` on them, so the
message is SGLang's ("64 is not divisible by 3").

The list is the one part of the oracle that restates SGLang, and says where each
division is made:

- attention heads / attention TP: layers/linear.py ``QKVParallelLinear`` (``divide(
  total_num_heads, tp_size)``), models/qwen3_moe.py attention, models/deepseek_v4.py
  attention (``n_heads // attn_tp_size`` feeding ``wq_b``, a ColumnParallelLinear that
  divides its output size, linear.py);
- KV heads (models that are not MLA): layers/linear.py ``QKVParallelLinear`` divides the
  KV heads by TP, or TP by the KV heads when TP is larger (replicated KV heads);
- output groups (DeepSeek-V4): models/deepseek_v4.py ``n_groups // attn_tp_size``;
- routed experts / MoE EP: layers/moe/fused_moe_triton/layer.py ``FusedMoE`` asserts the
  routed experts divide by the EP size;
- MoE intermediate size / MoE TP: the same ``FusedMoE`` asserts
  ``intermediate_size % moe_tp_size == 0``;
- dense MLP intermediate size / TP, for models with dense layers: linear.py
  ``MergedColumnParallelLinear``.

It also places the node's schedulers (of ``--node-rank``) on GPUs as the launcher does (entrypoints/engine.py
``_calculate_rank_ranges`` and weight_cache/protocol.py ``compute_local_gpu_id``, which
the engine's own formula mirrors; with system DP, managers/data_parallel_controller.py
starts replica r at ``r * tp * pp * gpu_id_step``): a GPU id beyond the node's device
count fails ``torch.cuda.set_device`` in the scheduler process ("invalid device
ordinal") right after the checks above passed.

With ``--enable-paged-experts`` it also runs SGLang's own ``check_paged_experts_compat``
(layers/moe/paged_experts/method.py, called per MoE layer while the model is built) in
rank 0's runtime context: the layer it inspects is reduced to what that function reads
(the router's top-k from the config, the fused shared-expert slots SGLang resolved), and
the expert format is taken as supported (the formats cover unquantized, FP8 block, W8A8,
INT8, GPTQ, AWQ, MXFP4 and NVFP4 experts; reported as an assumption).

The differential test (tests/contract/test_oracle_differential.py) runs this oracle
against the operator's own rules; ``tests/contract/test_oracle.py`` checks each entry
against a shape SGLang's divide refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BuildProblem:
    """One division the model build would fail on: SGLang's message and the place it is made."""

    message: str
    where: str
    type: str = "AssertionError"


def _first(obj: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_build_problems(server_args: Any) -> list[BuildProblem]:
    """Every division the model build of ``server_args`` (resolved) would fail on; [] when none.

    Raises whatever SGLang raises while loading the HF config (``model_config_of``).
    """
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.distributed.utils import ensure_divisibility
    from sglang.srt.runtime_context import parallel_widths_of

    cfg = resolving_view(server_args)
    model_config = model_config_of(server_args)
    hf = model_config.hf_text_config
    widths = parallel_widths_of(cfg)
    attn_tp, moe_tp, moe_ep = widths["attn_tp_size"], widths["moe_tp_size"], widths["moe_ep_size"]
    tp = cfg.tp_size
    archs = list(getattr(model_config.hf_config, "architectures", None) or [])
    dsv4 = "DeepseekV4ForCausalLM" in archs
    mla = dsv4 or getattr(model_config, "attention_arch", None) == AttentionArch.MLA

    checks: list[tuple[int | None, int, str, str]] = []
    heads = _first(hf, "num_attention_heads")
    checks.append((heads, attn_tp, f"attention heads ({heads}) over attention TP {attn_tp}",
                   "sglang/srt/layers/linear.py:QKVParallelLinear (models/deepseek_v4.py attention for DeepSeek-V4)"))
    kv_heads = _first(hf, "num_key_value_heads")
    if not mla and kv_heads:
        if attn_tp >= kv_heads:
            checks.append((attn_tp, kv_heads, f"attention TP {attn_tp} over KV heads ({kv_heads}), replicated",
                           "sglang/srt/layers/linear.py:QKVParallelLinear"))
        else:
            checks.append((kv_heads, attn_tp, f"KV heads ({kv_heads}) over attention TP {attn_tp}",
                           "sglang/srt/layers/linear.py:QKVParallelLinear"))
    if dsv4:
        groups = _first(hf, "o_groups")
        checks.append((groups, attn_tp, f"output groups o_groups ({groups}) over attention TP {attn_tp}",
                       "sglang/srt/models/deepseek_v4.py:DeepseekV4Attention (n_groups // attn_tp_size)"))
    experts = _first(hf, "n_routed_experts", "num_experts", "num_local_experts")
    if experts:
        redundant = int(getattr(cfg, "ep_num_redundant_experts", 0) or 0)
        checks.append((experts + redundant, moe_ep, f"routed experts ({experts + redundant}) over MoE EP {moe_ep}",
                       "sglang/srt/layers/moe/fused_moe_triton/layer.py:FusedMoE"))
        moe_inter = _first(hf, "moe_intermediate_size")
        checks.append((moe_inter, moe_tp, f"MoE intermediate size ({moe_inter}) over MoE TP {moe_tp}",
                       "sglang/srt/layers/moe/fused_moe_triton/layer.py:FusedMoE"))
    dense_layers = (not experts) or bool(_first(hf, "first_k_dense_replace")) or bool(getattr(hf, "mlp_only_layers", None))
    inter = _first(hf, "intermediate_size")
    if dense_layers and inter:
        checks.append((inter, tp, f"dense MLP intermediate size ({inter}) over TP {tp}",
                       "sglang/srt/layers/linear.py:MergedColumnParallelLinear"))

    problems = _placement_problems(server_args)
    if getattr(cfg, "enable_paged_experts", False):
        problems += _paged_experts_problems(server_args, hf)
    for numerator, denominator, what, where in checks:
        if numerator is None or denominator is None or denominator < 1:
            continue
        try:
            ensure_divisibility(numerator, denominator)
        except AssertionError as e:
            problems.append(BuildProblem(f"{e}: {what}; the model build fails", where))
    return problems


def _paged_experts_problems(server_args: Any, hf: Any) -> list[BuildProblem]:
    """SGLang's check_paged_experts_compat on the first MoE layer, in rank 0's context."""
    import types

    from sglang.srt.layers.moe.paged_experts.method import check_paged_experts_compat
    from sglang.srt.layers.moe.utils import get_num_fused_shared_experts
    from sglang.srt.runtime_context import SpawnRanks, create_context, use_context

    context = create_context(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    with use_context(context):
        layer = types.SimpleNamespace(
            top_k=_first(hf, "num_experts_per_tok"),
            quant_method=types.SimpleNamespace(),
            num_fused_shared_experts=get_num_fused_shared_experts(),
        )
        try:
            check_paged_experts_compat(layer=layer, expert_format=object())
        except RuntimeError as e:
            return [BuildProblem(str(e), "sglang/srt/layers/moe/paged_experts/method.py:check_paged_experts_compat",
                                 type(e).__name__)]
    return []


def _placement_problems(server_args: Any) -> list[BuildProblem]:
    """The GPU ids this node's schedulers would take (``--node-rank``, 0 by default), against the
    GPUs the pod sees (the ones it requests: emulation.pod_gpus)."""
    import torch

    from sglang.srt.entrypoints.engine import _calculate_rank_ranges
    from sglang.srt.runtime_context import SpawnRanks, create_context, get_device, get_parallel, use_context
    from sglang.srt.weight_cache.protocol import compute_local_gpu_id

    context = create_context(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    with use_context(context):
        parallel, device = get_parallel(), get_device()
        pp_range, tp_range, pp_per_node, tp_per_node = _calculate_rank_ranges(parallel.node_rank)
        replicas = parallel.dp_size if parallel.dp_size > 1 else 1
        step = device.gpu_id_step
        highest = max(
            device.base_gpu_id + replica * parallel.tp_size * parallel.pp_size * step
            + compute_local_gpu_id(pp, tp, pp_per_node, tp_per_node, base_gpu_id=0, gpu_id_step=step)
            for replica in range(replicas) for pp in pp_range for tp in tp_range
        )
    count = torch.cuda.device_count()
    if highest < count:
        return []
    return [BuildProblem(
        f"CUDA error: invalid device ordinal: a scheduler of node {parallel.node_rank} takes GPU {highest}, the pod "
        f"sees {count} GPUs "
        f"(tp {parallel.tp_size}, pp {parallel.pp_size}, dp {parallel.dp_size}, nnodes {parallel.nnodes})",
        "sglang/srt/entrypoints/engine.py:_launch_scheduler_processes", "RuntimeError")]
