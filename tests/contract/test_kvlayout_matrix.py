"""The operator's KV layout prediction equals SGLang 0.5.23's, cell by cell.

For the whole matrix attention backend (auto, flashmla, flashmla_mega, trtllm) x
SGLANG_DSV4_KV_LAYOUT (auto, v4, v41, v41_new) x SGLANG_DSV4_COMPRESSED_KV_LAYOUT
(auto, fp8, fp4) x ISA (sm_103, sm_100, sm_90a, gfx950) x KV dtype (fp8_e4m3, bfloat16)
for DeepSeek-V4.1 under PD, ``kvlayout.predict_layout`` must return the attention
backend the real DeepSeek-V4 hook resolves to and the PD layout string the real
``select_dsv4_kv_layout`` + ``pd_kv_layout`` produce, with SGLang's device queries
patched to that ISA (tests/contract/sglang_real.py) - or raise ``LayoutRefusal`` exactly
where SGLang raises, with SGLang's reason. Extra cells: DeepSeek-V4 (model_type
deepseek_v4), gfx942, other compression ratios, aggregated serving, and both PD modes.
"""

from __future__ import annotations

import itertools
import os
import sys
from unittest import mock

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402

from sglang_pd_operator.planning.kvlayout import LayoutInputs, LayoutRefusal, predict_layout  # noqa: E402

pytestmark = pytest.mark.contract

BACKENDS = ("auto", "flashmla", "flashmla_mega", "trtllm")
LAYOUTS = ("auto", "v4", "v41", "v41_new")
COMPRESSED = ("auto", "fp8", "fp4")
ISAS = ("sm_103", "sm_100", "sm_90a", "gfx950")
DTYPES = ("fp8_e4m3", "bfloat16")
VENDOR = {"sm_103": "nvidia", "sm_100": "nvidia", "sm_90a": "nvidia", "gfx950": "amd", "gfx942": "amd"}

MATRIX = list(itertools.product(BACKENDS, LAYOUTS, COMPRESSED, ISAS, DTYPES))
assert len(MATRIX) == 384

EXTRA = (
    # DeepSeek-V4 (not V4.1): no flashmla_mega, auto -> flashmla
    [("deepseek_v4", b, lay, c, isa, "fp8_e4m3", (4, 128), "decode", ())
     for b in BACKENDS for lay in LAYOUTS for c in ("auto", "fp4") for isa in ("sm_103", "sm_90a", "gfx950")]
    # gfx942 (HIP without aiter_sparse V4.1 support)
    + [("deepseek_v41", b, lay, "auto", "gfx942", "fp8_e4m3", (4, 128), "decode", ())
       for b in ("auto", "flashmla") for lay in LAYOUTS]
    # checkpoints with ratio-1/2 compressed caches, and the prefill side
    + [("deepseek_v41", b, lay, c, "sm_103", "fp8_e4m3", (1, 2, 4, 128), mode, ())
       for b in ("auto", "flashmla") for lay in ("auto", "v41", "v41_new") for c in COMPRESSED
       for mode in ("prefill", "decode")]
    # aggregated serving: attention TP > 1 keeps auto off flashmla_mega; DP attention brings it back
    + [("deepseek_v41", "auto", lay, "auto", isa, "fp8_e4m3", (4, 128), "null", extra)
       for lay in ("auto", "v41") for isa in ("sm_103", "sm_90a")
       for extra in ((), ("--tp-size", "4"), ("--tp-size", "4", "--attn-dp-size", "4"))]
)  # fmt: skip


def _attention_tp(extra: tuple[str, ...]) -> int:
    flags = dict(zip(extra[::2], extra[1::2]))
    return int(flags.get("--tp-size", 1)) // int(flags.get("--attn-dp-size", 1))


def _compare(*cell):
    # The real DeepSeek-V4 hook sets SGLANG_* defaults in os.environ on ROCm: keep them local.
    with mock.patch.dict(os.environ):
        return _compare_cell(*cell)


def _compare_cell(model_type, backend, layout, compressed, isa, dtype, ratios, mode, extra):
    inputs = LayoutInputs(
        backend=backend,
        layout_env=layout,
        compressed_env=compressed,
        isa=isa,
        vendor=VENDOR[isa],
        model_type=model_type,
        kv_cache_dtype=dtype,
        pd=mode != "null",
        attention_tp=_attention_tp(extra),
        compression_ratios=ratios,
    )
    try:
        ours = predict_layout(inputs)
        refusal = None
    except LayoutRefusal as e:
        ours, refusal = None, str(e)
    kwargs = dict(
        isa=isa,
        kv_layout_env=layout,
        compressed_env=compressed,
        model_type=model_type,
        compression_ratios=ratios,
        disaggregation_mode=mode,
        kv_cache_dtype=dtype,
        extra_argv=extra,
    )
    try:
        theirs = real.real_pd_kv_layout(attn_backend=backend, **kwargs)
    except (AssertionError, ValueError) as e:
        assert refusal is not None, f"SGLang refuses ({e}) but the operator predicts {ours}"
        assert refusal.rstrip(".") in str(e), f"operator reason {refusal!r} is not SGLang's {str(e)!r}"
        return "refused"
    assert refusal is None, f"the operator refuses ({refusal}) but SGLang gives {theirs}"
    assert ours.pd_string == theirs
    argv = ["--model-path", real.DUMMY_MODEL_PATH, "--disaggregation-mode", mode, "--kv-cache-dtype", dtype,
            "--dsv4-attn-backend", backend, *extra]  # fmt: skip
    env = {"SGLANG_DSV4_KV_LAYOUT": layout, "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": compressed}
    assert ours.attention_backend == real.real_dsv4_attn_backend(argv, isa=isa, model_type=model_type, env=env)
    assert ours.main_layout == ("v4" if theirs == "uniform_fp8" else theirs.split(",")[0])
    return theirs


@pytest.mark.parametrize("backend, layout, compressed, isa, dtype", MATRIX)
def test_dsv41_pd_matrix(backend, layout, compressed, isa, dtype):
    _compare("deepseek_v41", backend, layout, compressed, isa, dtype, (4, 128), "decode", ())


@pytest.mark.parametrize("model_type, backend, layout, compressed, isa, dtype, ratios, mode, extra", EXTRA)
def test_extra_cells(model_type, backend, layout, compressed, isa, dtype, ratios, mode, extra):
    _compare(model_type, backend, layout, compressed, isa, dtype, ratios, mode, extra)


def test_matrix_is_not_vacuous():
    """Known cells from docs/sglang-0.5.23-facts.md come out as documented, refusals included."""
    seen = {
        cell: _compare("deepseek_v41", *cell, (4, 128), "decode", ())
        for cell in [
            ("auto", "auto", "auto", "sm_103", "fp8_e4m3"),
            ("flashmla", "v4", "auto", "sm_100", "fp8_e4m3"),
            ("flashmla", "v41", "fp4", "sm_103", "fp8_e4m3"),
            ("flashmla_mega", "v41_new", "fp4", "sm_103", "fp8_e4m3"),
            ("auto", "auto", "auto", "sm_103", "bfloat16"),
            ("auto", "v41", "auto", "sm_90a", "fp8_e4m3"),
            ("auto", "v41_new", "auto", "gfx950", "fp8_e4m3"),
            ("trtllm", "auto", "auto", "sm_103", "fp8_e4m3"),
            ("flashmla", "v4", "fp4", "sm_103", "fp8_e4m3"),
        ]
    }
    assert list(seen.values()) == [
        "v41,c4:v41,c128:v41",
        "v4,c4:v4,c128:v4",
        "v41,c4:v41_fp4,c128:v41_fp4",
        "v41_new,c4:v41_fp4_new,c128:v41_fp4_new",
        "v41,c4:v41,c128:v41",  # bf16 keeps auto off flashmla_mega, but layout auto still picks v41
        "refused",
        "refused",
        "refused",
        "refused",
    ]
