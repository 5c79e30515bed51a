"""Values SGLang 0.5.23 derives when a flag is not set, restated for the rules (pure).

The rules need some of SGLang's own defaults to know what a role will run: the chunked
prefill size and the largest decode CUDA graph batch SGLang picks by GPU memory
(arg_groups/memory_hook.py ``handle_gpu_memory_settings``), and the chunk each attention-DP
rank gets (parallel_hook.py ``handle_data_parallelism`` divides it by the attention-DP
size). The SGLang oracle reports the values SGLang resolves; the differential test keeps
these in step.
"""

from __future__ import annotations

from typing import Any, Mapping

from .features import as_int
from .memory import quantity_bytes
from .roles import RoleInputs

GIB_MIB = 1024


def gpu_memory_mib(role: RoleInputs) -> float | None:
    """The role's GPU memory in MiB (the catalog's gpuMemory), as get_device_memory_capacity reports it."""
    acc = role.accelerator
    return quantity_bytes(acc.gpuMemory) / 2**20 if acc is not None else None


def chunked_prefill_size(role: RoleInputs, flags: Mapping[str, Any]) -> int | None:
    """The chunked prefill size SGLang resolves for the engine (before the attention-DP split); None when unknown.

    ``--chunked-prefill-size`` (``flags`` are ``features.parse_flags`` of the role's
    extraArgs), else memory_hook's choice by GPU memory: 2048 below 20 GiB, 4096 below 60
    GiB, 8192 below 160 GiB, else 16384. A value that is not a number gives None
    (extra_args_parse refuses it).
    """
    size = as_int(flags.get("chunked_prefill_size"))
    if size is not None or flags.get("chunked_prefill_size") is not None:
        return size
    mib = gpu_memory_mib(role)
    if mib is None:
        return None
    return 2048 if mib < 20 * GIB_MIB else 4096 if mib < 60 * GIB_MIB else 8192 if mib < 160 * GIB_MIB else 16384


def chunked_prefill_per_rank(role: RoleInputs, flags: Mapping[str, Any]) -> int | None:
    """:func:`chunked_prefill_size` per attention-DP rank: SGLang divides it by the attention-DP size."""
    size = chunked_prefill_size(role, flags)
    dp = role.attention_dp
    return size // dp if size is not None and dp > 1 and size > 0 else size


#: ``--max-prefill-tokens`` unset (server_args.py / arg_groups fields: 16384).
MAX_PREFILL_TOKENS_DEFAULT = 16384

#: SGLang's reserve floor on a GPU above 60 GiB, in MiB (memory_hook.py
#: ``handle_gpu_memory_settings``: ``reserved_mem = max(reserved_mem, 10 * 1024)``).
LARGE_GPU_RESERVE_FLOOR_MIB = 10 * 1024


#: Flags under which the decode CUDA graphs' largest batch is not memory_hook's table (given
#: sizes, torch.compile's, a speculative or request cap the hooks resolve): the bound is 0.
_DECODE_GRAPH_FLAGS = ("cuda_graph_max_bs", "cuda_graph_max_bs_decode", "cuda_graph_bs", "cuda_graph_bs_decode",
                       "torch_compile_max_bs", "enable_torch_compile", "speculative_algorithm",
                       "json_model_override_args", "pp_size")


def decode_graph_max_bs_lower_bound(role: RoleInputs, flags: Mapping[str, Any]) -> int:
    """At most the largest decode CUDA graph batch SGLang 0.5.23 resolves for a decode role; 0 when unsure.

    memory_hook.py ``handle_gpu_memory_settings`` (:88-188): by GPU memory, 8 below 20 GiB;
    48 / 32 (tp < 4) or 160 below 35 / 60 GiB; 256 (tp < 4) or 512 below 160 GiB; else 512;
    then at most ``--max-running-requests``. 0 for a role with a flag of
    :data:`_DECODE_GRAPH_FLAGS`, speculative decoding (its hook caps the requests at 48), a
    DeepSeek-V4 model (its hooks cap requests and the MegaMoE hook the batch) or another role.
    """
    if role.role != "decode" or role.speculative_algorithm or role.is_deepseek_v4:
        return 0
    if any(flags.get(dest) not in (None, False) for dest in _DECODE_GRAPH_FLAGS):
        return 0
    mib = gpu_memory_mib(role)
    if mib is None:
        return 0
    tp = max(1, role.parallelism.tp)
    if mib < 20 * GIB_MIB:
        max_bs = 8
    elif mib < 35 * GIB_MIB:
        max_bs = 48 if tp < 4 else 160
    elif mib < 60 * GIB_MIB:
        max_bs = 32 if tp < 4 else 160
    elif mib < 160 * GIB_MIB:
        max_bs = 256 if tp < 4 else 512
    else:
        max_bs = 512
    text = flags.get("max_running_requests")
    if text is not None:
        requests = as_int(text)
        if requests is None or requests < 1:
            return 0
        max_bs = min(max_bs, requests)
    return max_bs


def _env_true(value: str | None) -> bool:
    """An ``EnvBool`` of sglang/srt/environ.py read as SGLang reads it (unset: False)."""
    return value is not None and value.lower() in ("true", "1", "yes", "y")


def mem_fraction_static_upper_bound(role: RoleInputs, flags: Mapping[str, Any],
                                    env: Mapping[str, str]) -> float | None:
    """At least the ``--mem-fraction-static`` SGLang 0.5.23 runs the role with; None when unknown.

    With the flag set, its value (capped at 1). Unset, SGLang derives it in
    arg_groups/memory_hook.py ``handle_gpu_memory_settings`` as
    ``round((gpu_mem - reserved_mem) / gpu_mem, 3)`` (MiB), and this returns that formula
    with a lower bound of ``reserved_mem`` plus the rounding's 0.0005:

    - with ``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING`` on (overrides.py
      ``post_capture_kv_sizing_planned`` may then skip the graph reserve):
      ``1536 + tp * 1024 / 8``;
    - otherwise ``512 + 1.5 * activation_tokens + tp * 1024 / 8``, plus on a decode role with
      attention DP the graph reserve's ``max_bs * attn_dp * 3`` (``* 4.5`` above 300;
      memory_hook.py ``reserve_for_graph_mb``) with :func:`decode_graph_max_bs_lower_bound`
      (the other graph terms, DeepEP and XPU reserves and the multimodal adjustment only lower
      the fraction further), at least :data:`LARGE_GPU_RESERVE_FLOOR_MIB` on a GPU above 60 GiB. ``activation_tokens``
      is at least 2048; a prefill role's is at least its chunked prefill size
      (:func:`chunked_prefill_size`: the hook runs before parallel_hook.py divides it over
      attention DP; a DEP4 prefill on GB200 resolves 0.864, the whole 16k chunk's reserve), or
      with chunked prefill off (``--chunked-prefill-size -1``) its ``--max-prefill-tokens``
      (:data:`MAX_PREFILL_TOKENS_DEFAULT` unset).

    ``flags`` are ``features.parse_flags`` of the role's extraArgs, ``env`` its environment.
    The pipeline size is taken as 1 (callers leave ``--pp-size`` roles alone). The SGLang
    oracle reports the fraction SGLang resolved (``facts["memory"]["memFractionStatic"]``);
    tests/contract/test_weight_bytes.py holds this bound to it.
    """
    text = flags.get("mem_fraction_static")
    if text is not None:
        try:
            return min(1.0, float(text))
        except (TypeError, ValueError):
            return None  # extra_args_parse names the value
    mib = gpu_memory_mib(role)
    if mib is None:
        return None
    tp = max(1, role.parallelism.tp)
    if _env_true(env.get("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING")):
        reserved = 1536 + tp * 1024 / 8
    else:
        activation = 2048
        if role.role == "prefill":
            chunk = chunked_prefill_size(role, flags)  # before parallel_hook divides it over attention DP
            if chunk is not None and chunk > 0:
                activation = max(chunk, 2048)
            elif chunk is not None:  # chunked prefill off: the whole prefill batch
                activation = max(as_int(flags.get("max_prefill_tokens"), MAX_PREFILL_TOKENS_DEFAULT), 2048)
        reserved = 512 + activation * 1.5 + tp * 1024 / 8
        dp = role.attention_dp
        max_bs = decode_graph_max_bs_lower_bound(role, flags)
        if dp > 1 and max_bs:  # reserve_for_graph_mb (memory_hook.py:370-378): DP attention's padding
            reserved += max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
        if mib > 60 * GIB_MIB:
            reserved = max(reserved, LARGE_GPU_RESERVE_FLOOR_MIB)
    return min(1.0, (mib - reserved) / mib + 0.0005)
