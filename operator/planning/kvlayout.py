"""Predict a role's DeepSeek-V4 attention backend and PD KV layout string, as SGLang 0.5.23 does.

SGLang resolves the layout only after weights load; the decode side then compares the
two strings at the PD handshake and raises "KV layout mismatch". This module runs the
same decision before any pod exists, from the role's settings and its accelerator ISA:

- ``resolve_attention_backend`` mirrors ``_default_dsv4_attention_backend`` and the
  flashmla_mega / trtllm assertions of ``apply_deepseek_v4_defaults``
  (sglang/srt/arg_groups/deepseek_v4_hook.py);
- ``select_main_layout`` mirrors ``select_dsv4_kv_layout``
  (sglang/srt/mem_cache/deepseek_v4_memory_pool.py);
- ``compressed_layout`` mirrors ``resolve_compressed_kv_layout`` (same file);
- ``predict_layout`` joins them into the string ``pd_kv_layout()`` returns, e.g.
  ``v41,c4:v41,c128:v41``.

Where SGLang raises, these functions raise :class:`LayoutRefusal` with SGLang's reason.
The contract tests (tests/contract/test_kvlayout_matrix.py) compare every combination
with the real functions of sglang==0.5.23 under patched device queries.
"""

from __future__ import annotations

from dataclasses import dataclass

BLACKWELL_ISAS = ("sm_100", "sm_103")
HIP_V41_ISAS = ("gfx950",)
DSV4_KV_DTYPES = ("fp8_e4m3", "bfloat16")


class LayoutRefusal(ValueError):
    """SGLang would refuse this combination at startup; ``str()`` is SGLang's reason."""


@dataclass(frozen=True)
class LayoutInputs:
    """What decides one role's layout.

    ``backend``: requested --dsv4-attn-backend (auto | flashmla | flashmla_mega | trtllm);
    ``layout_env`` / ``compressed_env``: the values of SGLANG_DSV4_KV_LAYOUT and
    SGLANG_DSV4_COMPRESSED_KV_LAYOUT the role's pods get; ``isa``: the accelerator ISA
    (sm_103, sm_100, sm_90a, gfx950); ``vendor``: nvidia (CUDA) or amd (HIP);
    ``model_type``: the HF config model_type (deepseek_v41 ...); ``kv_cache_dtype``: the
    resolved --kv-cache-dtype; ``pd``: PD disaggregation on; ``attention_tp``: attention
    TP size (matters only without PD); ``compression_ratios``: the model's compressed
    caches (DeepSeek-V4.1: 4 and 128).
    """

    backend: str
    layout_env: str
    compressed_env: str
    isa: str
    vendor: str
    model_type: str
    kv_cache_dtype: str
    pd: bool = True
    attention_tp: int = 1
    compression_ratios: tuple[int, ...] = (4, 128)


@dataclass(frozen=True)
class LayoutPrediction:
    """The resolved attention backend, main layout and PD layout string of one role."""

    attention_backend: str
    main_layout: str
    pd_string: str


def resolve_kv_cache_dtype(requested: str, *, is_deepseek_v4: bool) -> str:
    """--kv-cache-dtype after SGLang's DeepSeek-V4 default (overrides.py _deepseek_v4_kv_cache_dtype).

    For DeepseekV4ForCausalLM, ``auto`` becomes ``fp8_e4m3`` and only fp8_e4m3 or
    bfloat16 are accepted; raises :class:`LayoutRefusal` otherwise (note: ``bf16`` is
    not accepted there, only ``bfloat16``). Other models keep the requested value.
    """
    if not is_deepseek_v4:
        return requested
    dtype = "fp8_e4m3" if requested == "auto" else requested
    if dtype not in DSV4_KV_DTYPES:
        raise LayoutRefusal(f"{dtype} is not supported for DeepseekV4ForCausalLM")
    return dtype


def _is_sm100(inputs: LayoutInputs) -> bool:
    return inputs.vendor == "nvidia" and inputs.isa in BLACKWELL_ISAS


def resolve_attention_backend(inputs: LayoutInputs) -> str:
    """The --dsv4-attn-backend SGLang ends up with; raises :class:`LayoutRefusal` where it asserts.

    auto -> flashmla_mega only when the model is deepseek_v41, the GPU is CUDA SM100/SM103,
    the KV dtype is fp8_e4m3, not (aggregated with attention TP > 1) and the layout env
    is auto/v41/v41_new; otherwise flashmla. flashmla_mega needs DeepSeek-V4.1 on
    SM100/SM103; trtllm needs SM100/SM103, fp8_e4m3 KV and no PD disaggregation.
    Source: sglang 0.5.23 arg_groups/deepseek_v4_hook.py.
    """
    backend = inputs.backend
    if backend == "auto":
        mega_ok = (
            inputs.model_type == "deepseek_v41"
            and _is_sm100(inputs)
            and inputs.kv_cache_dtype == "fp8_e4m3"
            and not (not inputs.pd and inputs.attention_tp > 1)
            and inputs.layout_env.lower() in ("auto", "v41", "v41_new")
        )
        return "flashmla_mega" if mega_ok else "flashmla"
    if backend == "flashmla_mega":
        if not (inputs.model_type == "deepseek_v41" and _is_sm100(inputs)):
            raise LayoutRefusal("--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103.")
    elif backend == "trtllm":
        if not _is_sm100(inputs):
            raise LayoutRefusal("--dsv4-attn-backend trtllm requires an SM100/SM103 (Blackwell) GPU.")
        if inputs.kv_cache_dtype not in ("auto", "fp8_e4m3"):
            raise LayoutRefusal(
                f"--dsv4-attn-backend trtllm requires kv_cache_dtype=fp8_e4m3, got {inputs.kv_cache_dtype}."
            )
        if inputs.pd:
            raise LayoutRefusal("--dsv4-attn-backend trtllm does not support PD disaggregation yet.")
    elif backend != "flashmla":
        raise LayoutRefusal(f"unknown --dsv4-attn-backend {backend!r}")
    return backend


def select_main_layout(inputs: LayoutInputs, attention_backend: str) -> tuple[str, str | None]:
    """(main layout, compressed option or None) as ``select_dsv4_kv_layout`` returns them.

    Raises :class:`LayoutRefusal` where SGLang asserts or raises: a V4.1 layout on a GPU
    that is neither SM100/SM103 nor gfx950 with aiter_sparse, v41_new on HIP, trtllm with
    a packed V4.1 layout. Source: sglang 0.5.23 mem_cache/deepseek_v4_memory_pool.py.
    """
    mode = inputs.layout_env.lower()
    option = inputs.compressed_env.lower()
    if attention_backend == "flashmla_mega" and mode != "v41_new":
        mode = "v41"
    if attention_backend == "trtllm":
        if mode not in ("auto", "v4") or option not in ("auto", "fp8"):
            raise LayoutRefusal("trtllm uses uniform FP8 pools, not the packed V4.1 KV layouts")
        return "uniform_fp8", None
    if mode == "v4":
        return "v4", None if option == "auto" else option
    if mode not in ("v41", "v41_new", "auto"):
        raise LayoutRefusal(f"unknown SGLANG_DSV4_KV_LAYOUT={mode!r}")
    if inputs.vendor == "amd":
        supported = inputs.isa in HIP_V41_ISAS
        if mode == "auto" and not supported:
            return "v4", None
        if not supported or mode == "v41_new":
            raise LayoutRefusal(
                "V4.1 KV layouts on HIP require gfx950 with aiter_sparse attention, "
                "which reads the block-split v41 layout"
            )
        return "v41", option
    if mode == "auto" and not _is_sm100(inputs):
        return "v4", None
    if not _is_sm100(inputs):
        raise LayoutRefusal("the V4.1 KV cache layouts need an SM100 / SM103 GPU")
    return ("v41_new" if mode == "v41_new" else "v41"), option


def compressed_layout(main: str, ratio: int, option: str | None) -> str:
    """Layout of one compression ratio's cache next to ``main`` (resolve_compressed_kv_layout).

    V4 main pairs only with V4 (option fp4 raises :class:`LayoutRefusal`); with a V4.1
    main, fp4 (or auto for ratios 1 and 2) gives v41_fp4, else v41; the interleaved
    ``_new`` arrangement follows the main layout.
    """
    if option == "auto":
        option = None
    if main == "v4":
        if option not in (None, "fp8"):
            raise LayoutRefusal("the V4 main cache only pairs with V4 caches")
        return "v4"
    use_fp4 = option == "fp4" or (option is None and ratio in (1, 2))
    encoding = "v41_fp4" if use_fp4 else "v41"
    return f"{encoding}_new" if main == "v41_new" else encoding


def predict_layout(inputs: LayoutInputs) -> LayoutPrediction:
    """The role's resolved backend and PD KV layout string (``pd_kv_layout()``).

    Returns e.g. ``LayoutPrediction("flashmla_mega", "v41", "v41,c4:v41,c128:v41")``.
    Raises :class:`LayoutRefusal` with SGLang's reason where SGLang would refuse.
    """
    backend = resolve_attention_backend(inputs)
    main, option = select_main_layout(inputs, backend)
    if main == "uniform_fp8":
        return LayoutPrediction(backend, "v4", "uniform_fp8")
    parts = [main] + [
        f"c{ratio}:{compressed_layout(main, ratio, option)}"
        for ratio in sorted(set(inputs.compression_ratios) - {0})
    ]
    return LayoutPrediction(backend, main, ",".join(parts))
