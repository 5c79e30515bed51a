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
