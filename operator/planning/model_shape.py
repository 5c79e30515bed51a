"""The sizes a model's Hugging Face config fixes and SGLang divides by the parallel widths (pure).

SGLang reads these from ``config.json`` while it builds the layers (and fails in
``divide()`` when a width does not divide them): attention heads, KV heads, DeepSeek-V4's
output groups, routed experts, the MoE and dense intermediate sizes. :func:`model_shape`
reads them from the catalog's copy of the config (kernels/hf-configs/), lifting a
``text_config`` the way sglang/srt/configs/deepseek_v41.py does. The SGLang oracle runs
SGLang's own ``ensure_divisibility`` on the same sizes (oracle/model_checks.py); the
differential test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Sizes from a model's config: ``heads``, ``kv_heads`` (None for MLA), ``o_groups`` (DeepSeek-V4),
    ``experts`` (routed, 0 for dense models), ``moe_intermediate``, ``intermediate`` (dense MLP, None
    when every layer is MoE)."""

    heads: int | None
    kv_heads: int | None
    o_groups: int | None
    experts: int
    moe_intermediate: int | None
    intermediate: int | None


def _int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_shape(config: dict[str, Any], *, mla: bool) -> ModelShape:
    """The :class:`ModelShape` of a config.json mapping; ``mla`` (catalog ModelFacts.mla) drops KV heads."""
    text = config.get("text_config")
    flat = {**text, **{k: v for k, v in config.items() if k != "text_config"}} if isinstance(text, dict) else config
    experts = _int(flat, "n_routed_experts", "num_experts", "num_local_experts") or 0
    dense = not experts or bool(_int(flat, "first_k_dense_replace")) or bool(flat.get("mlp_only_layers"))
    is_dsv4 = "DeepseekV4ForCausalLM" in (flat.get("architectures") or []) or "DeepseekV41ForCausalLM" in (
        flat.get("architectures") or []
    )
    return ModelShape(
        heads=_int(flat, "num_attention_heads"),
        kv_heads=None if mla else _int(flat, "num_key_value_heads"),
        o_groups=_int(flat, "o_groups") if is_dsv4 else None,
        experts=experts,
        moe_intermediate=_int(flat, "moe_intermediate_size") if experts else None,
        intermediate=_int(flat, "intermediate_size") if dense else None,
    )
