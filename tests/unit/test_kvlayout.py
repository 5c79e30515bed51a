"""planning/kvlayout.py: the DeepSeek-V4 attention backend and PD KV layout, as SGLang 0.5.23 resolves them.

Expected values come from docs/sglang-0.5.23-facts.md section a (the decision table run
against the real sglang==0.5.23 code); tests/contract/test_kvlayout_matrix.py compares
every cell with the real functions. These tests need no SGLang.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_pd_operator.planning.kvlayout import (
    LayoutInputs,
    LayoutRefusal,
    compressed_layout,
    predict_layout,
    resolve_attention_backend,
    resolve_kv_cache_dtype,
    select_main_layout,
)

VENDOR = {
    "sm_103": "nvidia", "sm_100": "nvidia", "sm_90a": "nvidia", "sm_89": "nvidia", "gfx950": "amd", "gfx942": "amd",
}  # fmt: skip
V41 = "v41,c4:v41,c128:v41"
V41_NEW = "v41_new,c4:v41_new,c128:v41_new"
V4 = "v4,c4:v4,c128:v4"


def inputs(backend="auto", layout="auto", compressed="auto", isa="sm_103", *, model_type="deepseek_v41",
           dtype="fp8_e4m3", pd=True, attention_tp=1, ratios=(4, 128)) -> LayoutInputs:  # fmt: skip
    return LayoutInputs(
        backend=backend,
        layout_env=layout,
        compressed_env=compressed,
        isa=isa,
        vendor=VENDOR[isa],
        model_type=model_type,
        kv_cache_dtype=dtype,
        pd=pd,
        attention_tp=attention_tp,
        compression_ratios=ratios,
    )


# (isa, backend, SGLANG_DSV4_KV_LAYOUT) -> (backend, PD string) or the start of SGLang's refusal.
# The facts table (PD decode, DeepSeek-V4.1, fp8_e4m3, ratios {4, 128}, compressed unset).
FACTS_TABLE = [
    ("sm_103", "auto", "auto", ("flashmla_mega", V41)),
    ("sm_103", "auto", "v4", ("flashmla", V4)),  # an explicit v4 keeps auto off flashmla_mega
    ("sm_103", "auto", "v41", ("flashmla_mega", V41)),
    ("sm_103", "auto", "v41_new", ("flashmla_mega", V41_NEW)),
    ("sm_100", "flashmla", "v4", ("flashmla", V4)),
    ("sm_100", "flashmla", "auto", ("flashmla", V41)),
    ("sm_100", "flashmla", "v41_new", ("flashmla", V41_NEW)),
    ("sm_103", "flashmla_mega", "v4", ("flashmla_mega", V41)),  # mega forces v41 whatever the env says
    ("sm_103", "flashmla_mega", "v41_new", ("flashmla_mega", V41_NEW)),
    ("sm_103", "trtllm", "auto", "--dsv4-attn-backend trtllm does not support PD"),
    ("sm_90a", "trtllm", "auto", "--dsv4-attn-backend trtllm requires an SM100/SM103"),
    ("sm_90a", "auto", "auto", ("flashmla", V4)),
    ("sm_90a", "flashmla", "v4", ("flashmla", V4)),
    ("sm_90a", "auto", "v41", "the V4.1 KV cache layouts need an SM100 / SM103 GPU"),
    ("sm_90a", "flashmla", "v41_new", "the V4.1 KV cache layouts need an SM100 / SM103 GPU"),
    ("sm_90a", "flashmla_mega", "auto", "--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103"),
    ("gfx950", "flashmla_mega", "auto", "--dsv4-attn-backend flashmla_mega requires DeepSeek-V4.1 on SM100/SM103"),
    ("gfx950", "auto", "auto", ("flashmla", V41)),
    ("gfx950", "auto", "v4", ("flashmla", V4)),
    ("gfx950", "flashmla", "v41", ("flashmla", V41)),
    ("gfx950", "auto", "v41_new", "V4.1 KV layouts on HIP require gfx950 with aiter_sparse"),
    ("gfx942", "auto", "auto", ("flashmla", V4)),
    ("gfx942", "flashmla", "v41", "V4.1 KV layouts on HIP require gfx950 with aiter_sparse"),
]


@pytest.mark.parametrize("isa, backend, layout, expected", FACTS_TABLE)
def test_facts_decision_table(isa, backend, layout, expected):
    if isinstance(expected, str):
        with pytest.raises(LayoutRefusal) as e:
            predict_layout(inputs(backend, layout, isa=isa))
        assert str(e.value).startswith(expected)
    else:
        p = predict_layout(inputs(backend, layout, isa=isa))
        assert (p.attention_backend, p.pd_string) == expected
        assert p.main_layout == expected[1].split(",")[0]


@pytest.mark.parametrize(
    "layout, compressed, ratios, expected",
    [
        ("v41", "fp4", (4, 128), "v41,c4:v41_fp4,c128:v41_fp4"),
        ("v41", "fp8", (4, 128), V41),
        ("v41_new", "fp4", (4, 128), "v41_new,c4:v41_fp4_new,c128:v41_fp4_new"),
        ("v41", "auto", (1, 2, 4, 128), "v41,c1:v41_fp4,c2:v41_fp4,c4:v41,c128:v41"),  # ratio 1/2: fp4 by default
        ("v41", "fp8", (1, 2, 4, 128), "v41,c1:v41,c2:v41,c4:v41,c128:v41"),
        ("v41", "auto", (128, 0, 4, 4), V41),  # sorted, de-duplicated, ratio 0 (no compressed cache) dropped
        ("v4", "fp8", (4, 128), V4),
        ("v4", "auto", (1, 2), "v4,c1:v4,c2:v4"),
        ("v41", "AUTO", (4, 128), V41),  # SGLang lower-cases the variables
    ],
)
def test_compressed_layouts(layout, compressed, ratios, expected):
    assert predict_layout(inputs("flashmla", layout, compressed, ratios=ratios)).pd_string == expected


def test_v4_main_cache_refuses_fp4():
    with pytest.raises(LayoutRefusal, match="the V4 main cache only pairs with V4 caches"):
        predict_layout(inputs("flashmla", "v4", "fp4"))
    with pytest.raises(LayoutRefusal, match="only pairs with V4"):
        compressed_layout("v4", 4, "fp4")
    assert compressed_layout("v4", 4, "fp8") == "v4"
    assert compressed_layout("v41_new", 2, None) == "v41_fp4_new"
    assert compressed_layout("v41_new", 4, "auto") == "v41_new"


def test_auto_backend_needs_every_condition_for_flashmla_mega():
    assert resolve_attention_backend(inputs()) == "flashmla_mega"
    assert resolve_attention_backend(inputs(model_type="deepseek_v4")) == "flashmla"  # V4, not V4.1
    assert resolve_attention_backend(inputs(dtype="bfloat16")) == "flashmla"  # bf16 KV forbids mega
    assert resolve_attention_backend(inputs(layout="v4")) == "flashmla"
    assert resolve_attention_backend(inputs(isa="sm_90a")) == "flashmla"
    assert resolve_attention_backend(inputs(isa="gfx950")) == "flashmla"
    # aggregated serving with attention TP > 1 keeps auto off mega; PD does not care
    assert resolve_attention_backend(inputs(pd=False, attention_tp=4)) == "flashmla"
    assert resolve_attention_backend(inputs(pd=False, attention_tp=1)) == "flashmla_mega"
    assert resolve_attention_backend(inputs(pd=True, attention_tp=4)) == "flashmla_mega"


def test_bf16_kv_on_blackwell_keeps_layout_auto_at_v41_via_flashmla():
    p = predict_layout(inputs(dtype="bfloat16"))
    assert (p.attention_backend, p.pd_string) == ("flashmla", V41)


def test_trtllm_refusals_in_sglangs_order():
    with pytest.raises(LayoutRefusal, match="requires an SM100/SM103"):
        resolve_attention_backend(inputs("trtllm", isa="sm_90a", dtype="bfloat16"))
    with pytest.raises(LayoutRefusal, match="requires kv_cache_dtype=fp8_e4m3, got bfloat16"):
        resolve_attention_backend(inputs("trtllm", dtype="bfloat16"))
    with pytest.raises(LayoutRefusal, match="does not support PD"):
        resolve_attention_backend(inputs("trtllm"))
    # Aggregated serving: trtllm keeps its uniform FP8 pool, only with layout auto/v4 and compressed auto/fp8.
    p = predict_layout(inputs("trtllm", "v4", pd=False))
    assert (p.attention_backend, p.main_layout, p.pd_string) == ("trtllm", "v4", "uniform_fp8")
    with pytest.raises(LayoutRefusal, match="uniform FP8 pools"):
        select_main_layout(inputs("trtllm", "v41", pd=False), "trtllm")
    with pytest.raises(LayoutRefusal, match="uniform FP8 pools"):
        select_main_layout(inputs("trtllm", "auto", "fp4", pd=False), "trtllm")


def test_unknown_values_are_refused():
    with pytest.raises(LayoutRefusal, match="unknown SGLANG_DSV4_KV_LAYOUT='v5'"):
        select_main_layout(inputs(layout="v5"), "flashmla")
    with pytest.raises(LayoutRefusal, match="unknown --dsv4-attn-backend"):
        resolve_attention_backend(inputs("fa3"))


def test_kv_cache_dtype_resolution():
    assert resolve_kv_cache_dtype("auto", is_deepseek_v4=True) == "fp8_e4m3"
    assert resolve_kv_cache_dtype("bfloat16", is_deepseek_v4=True) == "bfloat16"
    for bad in ("bf16", "fp8_e5m2", "mxfp8", "nvfp4"):
        with pytest.raises(LayoutRefusal, match="not supported for DeepseekV4ForCausalLM"):
            resolve_kv_cache_dtype(bad, is_deepseek_v4=True)
    for any_dtype in ("auto", "bf16", "fp8_e5m2", "mxfp8"):
        assert resolve_kv_cache_dtype(any_dtype, is_deepseek_v4=False) == any_dtype


ANY_INPUTS = st.builds(
    inputs,
    backend=st.sampled_from(["auto", "flashmla", "flashmla_mega", "trtllm"]),
    layout=st.sampled_from(["auto", "v4", "v41", "v41_new"]),
    compressed=st.sampled_from(["auto", "fp8", "fp4"]),
    isa=st.sampled_from(sorted(VENDOR)),
    model_type=st.sampled_from(["deepseek_v41", "deepseek_v4"]),
    dtype=st.sampled_from(["fp8_e4m3", "bfloat16"]),
    pd=st.booleans(),
    attention_tp=st.sampled_from([1, 2, 4, 8]),
    ratios=st.lists(st.sampled_from([0, 1, 2, 4, 128]), max_size=5).map(tuple),
)


@settings(max_examples=400)
@given(i=ANY_INPUTS)
def test_layout_string_invariants(i):
    """Whatever the inputs: a refusal, or a string whose parts are consistent with each other."""
    try:
        p = predict_layout(i)
    except LayoutRefusal:
        return
    assert p.attention_backend in ("flashmla", "flashmla_mega", "trtllm")
    if p.pd_string == "uniform_fp8":
        assert p.attention_backend == "trtllm" and not i.pd
        return
    parts = p.pd_string.split(",")
    assert parts[0] == p.main_layout in ("v4", "v41", "v41_new")
    ratios = [int(x.split(":")[0][1:]) for x in parts[1:]]
    assert ratios == sorted(set(i.compression_ratios) - {0})
    encodings = [x.split(":")[1] for x in parts[1:]]
    if p.main_layout == "v4":
        assert set(encodings) <= {"v4"}
    else:
        assert all(e.startswith("v41") for e in encodings)
        assert all(e.endswith("_new") == (p.main_layout == "v41_new") for e in encodings)
    if p.main_layout != "v4":  # V4.1 layouts only where SGLang builds them
        assert i.isa in ("sm_100", "sm_103", "gfx950")
    if p.attention_backend == "flashmla_mega":
        assert i.isa in ("sm_100", "sm_103") and i.model_type == "deepseek_v41" and p.main_layout != "v4"
    assert "trtllm" != p.attention_backend or not i.pd  # never under PD


@settings(max_examples=200)
@given(i=ANY_INPUTS)
def test_sm100_and_sm103_resolve_alike(i):
    """SGLang asks for compute capability major 10: B200/GB200 and B300/GB300 resolve the same."""
    if i.isa not in ("sm_100", "sm_103"):
        return
    other = LayoutInputs(**{**i.__dict__, "isa": "sm_103" if i.isa == "sm_100" else "sm_100"})

    def outcome(x):
        try:
            return predict_layout(x)
        except LayoutRefusal as e:
            return str(e)

    assert outcome(i) == outcome(other)
