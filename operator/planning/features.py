"""Which SGLang features a role's rendered arguments turn on, the way SGLang's plugin probes see them.

SGLang 0.5.23 refuses to start a kernel plugin when a feature in use is not accepted by
the plugin's spec (sglang/srt/kernel_plugins/nvidia/binding.py FEATURE_PROBES and
features_in_use; the amd binding has the same table). The probes read resolved
server_args fields; here the same conditions are evaluated on the rendered argument
list. The contract test compares :func:`features_in_use` with SGLang's own on the parsed
arguments of every example.

Feature names are the lower-case names of SGLang's ``Feature`` enum members
(kernels/plugin_kernels/<vendor>/spec.py), as used in ``kernels/plugins.yaml``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from .sglang_flags import flag_table

FEATURE_DESCRIPTIONS: dict[str, str] = {
    "pipeline_parallel": "pipeline parallelism",
    "multi_node_tp": "multi-node tensor parallelism",
    "dp_attention": "DP attention",
    "expert_parallel": "expert parallelism",
    "eplb": "EPLB",
    "context_parallel": "context parallelism",
    "speculative_decoding": "speculative decoding",
    "ragged_verify": "uneven tokens per request in verify (SGLANG_RAGGED_VERIFY_MODE)",
    "two_batch_overlap": "two-batch / single-batch overlap",
    "lora": "LoRA",
    "pd_disaggregation": "PD disaggregation",
    "return_routed_experts": "--enable-return-routed-experts",
    "return_indexer_topk": "--enable-return-indexer-topk",
    "kv_offload": "KV offload",
    "hisparse": "hierarchical sparse attention",
    "memory_release": "memory release",
    "cpu_offload": "CPU offload",
    "torch_compile": "torch-compiled decode",
    "deterministic_inference": "deterministic inference",
    "eagle3_hidden_states": "EAGLE3 hidden states at covered layers",
}

# Features each vendor binding probes (nvidia binding.py FEATURE_PROBES, amd binding.py
# _PROBES): AMD has no hisparse / deterministic inference probe, NVIDIA no EAGLE3 one.
VENDOR_FEATURES: dict[str, frozenset[str]] = {
    "nvidia": frozenset(FEATURE_DESCRIPTIONS) - {"eagle3_hidden_states"},
    "amd": frozenset(FEATURE_DESCRIPTIONS) - {"hisparse", "deterministic_inference"},
}


def parse_flags(args: Sequence[str]) -> dict[str, Any]:
    """Map each ``--flag`` in ``args`` to its value: the next token, or True for a switch.

    ``--flag=value`` is split; ``--no-flag`` sets ``flag`` to False. Keys are SGLang's
    dest names: an option of the pinned parser maps to its dest (so aliases such as
    ``--enable-hicache`` or ``--attention-context-parallel-size`` land on the field
    SGLang sets), any other flag to its name without dashes, ``-`` turned into ``_``.
    Known switches never take the next token as a value. A later occurrence wins, as
    with argparse.
    """
    table = flag_table()
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name, eq, value = tok[2:].partition("=")
        info = table.get("--" + name)
        key = info.dest if info is not None else name.replace("-", "_")
        positive = table.get("--" + name[3:]) if name.startswith("no-") else None
        if info is not None and positive is not None and positive.dest == info.dest:  # --no-x of --x
            out[key] = False
        elif eq:
            out[key] = value
        elif (info is None or info.takes_value) and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = args[i + 1]
            i += 1
        elif key.startswith("no_"):
            out[key[3:]] = False
        else:
            out[key] = True
        i += 1
    return out


def as_int(value: Any, default: Any = None) -> Any:
    """``value`` as an int; ``default`` when it is None, a switch (a bool) or not a number
    (``args.extra_args_parse`` refuses a flag whose value is not a number)."""
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def flag_int(flags: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``flags[key]`` (from :func:`parse_flags`) as an int, else ``default`` (see :func:`as_int`)."""
    return as_int(flags.get(key), default)


def _int(flags: Mapping[str, Any], key: str, default: int = 1) -> int:
    return flag_int(flags, key, default)


def _truthy(flags: Mapping[str, Any], *keys: str) -> bool:
    return any(flags.get(k) not in (None, False, "false", "False", "0") for k in keys)


def _float(flags: Mapping[str, Any], key: str) -> float:
    try:
        return float(flags.get(key) or 0)
    except (TypeError, ValueError):
        return 0.0


_PROBES: dict[str, Callable[[Mapping[str, Any], Mapping[str, str]], bool]] = {
    "pipeline_parallel": lambda f, e: _int(f, "pp_size") > 1 or _int(f, "pipeline_parallel_size") > 1,
    "multi_node_tp": lambda f, e: _int(f, "nnodes") > 1,
    "dp_attention": lambda f, e: _truthy(f, "enable_dp_attention") or _int(f, "attn_dp_size") > 1,
    "expert_parallel": lambda f, e: _int(f, "ep_size") > 1,
    "eplb": lambda f, e: _truthy(f, "enable_eplb"),
    "context_parallel": lambda f, e: (
        _int(f, "attn_cp_size") > 1 or _int(f, "dcp_size") > 1 or _truthy(f, "enable_prefill_cp")
    ),
    "speculative_decoding": lambda f, e: f.get("speculative_algorithm") is not None,
    "ragged_verify": lambda f, e: f.get("speculative_algorithm") is not None
    and e.get("SGLANG_RAGGED_VERIFY_MODE", "static").lower() != "static",
    "two_batch_overlap": lambda f, e: _truthy(f, "enable_two_batch_overlap", "enable_single_batch_overlap"),
    "lora": lambda f, e: _truthy(f, "enable_lora", "lora_paths"),
    "pd_disaggregation": lambda f, e: (f.get("disaggregation_mode") or "null") != "null",
    "return_routed_experts": lambda f, e: _truthy(f, "enable_return_routed_experts"),
    "return_indexer_topk": lambda f, e: _truthy(f, "enable_return_indexer_topk"),
    "kv_offload": lambda f, e: _truthy(
        f, "enable_hierarchical_cache", "disaggregation_decode_enable_offload_kvcache", "enable_lmcache", "enable_flexkv"
    ),
    "hisparse": lambda f, e: _truthy(f, "enable_hisparse"),
    "memory_release": lambda f, e: _truthy(f, "enable_memory_saver", "enable_weights_cpu_backup"),
    "cpu_offload": lambda f, e: _float(f, "cpu_offload_gb") > 0 or _int(f, "offload_group_size", 0) > 0,
    "torch_compile": lambda f, e: _truthy(f, "enable_torch_compile"),
    "deterministic_inference": lambda f, e: _truthy(f, "enable_deterministic_inference", "rl_on_policy_target"),
    "eagle3_hidden_states": lambda f, e: str(f.get("speculative_algorithm") or "").upper() == "EAGLE3",
}


def features_in_use(args: Sequence[str], env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The plugin-relevant SGLang features the arguments (and env) turn on, by catalog name."""
    flags = parse_flags(args)
    env = env or {}
    return frozenset(name for name, probe in _PROBES.items() if probe(flags, env))
