"""Smoke tests of tests/contract/sglang_real.py: each wrapper reaches the real
sglang==0.5.23 / smg==1.13.0 code and returns what that code decides. Skipped when
the packages are not installed (see requirements/contract.txt)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402

pytestmark = pytest.mark.contract

DECODE = [
    "--model-path", "/nonexistent/DeepSeek-V4.1-Flash",
    "--disaggregation-mode", "decode",
    "--disaggregation-transfer-backend", "mooncake",
    "--tp-size", "4",
    "--page-size", "64",
    "--kv-cache-dtype", "fp8_e4m3",
    "--enable-nvidia-megakernel",
]  # fmt: skip


def test_parse_engine_args_reads_pd_launch_command():
    args = real.parse_engine_args(DECODE, env={"HF_HUB_OFFLINE": "1"})
    assert args.disaggregation_mode == "decode"
    assert args.disaggregation_transfer_backend == "mooncake"
    assert (args.tp_size, args.page_size, args.kv_cache_dtype) == (4, 64, "fp8_e4m3")
    assert args.enable_nvidia_megakernel is True
    assert args.dsv4_attn_backend == "auto"
    assert args.disaggregation_bootstrap_port == 8998
    assert args.enable_decoder_swa_bounded_replay is None  # resolved later


def test_parse_engine_args_rejects_unknown_flags_and_bad_choices():
    with pytest.raises(real.EngineArgsError, match="unrecognized arguments: --no-such-flag"):
        real.parse_engine_args(["--model-path", "/m", "--no-such-flag"])
    with pytest.raises(real.EngineArgsError, match="invalid choice: 'fp8'"):
        real.parse_engine_args(["--model-path", "/m", "--kv-cache-dtype", "fp8"])


@pytest.mark.parametrize(
    "isa, backend, env, expected",
    [
        ("sm_103", "auto", None, "v41,c4:v41,c128:v41"),  # auto -> flashmla_mega under PD
        ("sm_100", "flashmla", None, "v4,c4:v4,c128:v4"),  # environ default v4
        ("sm_100", "flashmla", "auto", "v41,c4:v41,c128:v41"),
        ("sm_103", "flashmla_mega", "v41_new", "v41_new,c4:v41_new,c128:v41_new"),
        ("sm_90a", "auto", "auto", "v4,c4:v4,c128:v4"),
        ("gfx950", "auto", "auto", "v41,c4:v41,c128:v41"),
    ],
)
def test_real_pd_kv_layout(isa, backend, env, expected):
    assert (
        real.real_pd_kv_layout(
            isa=isa, attn_backend=backend, kv_layout_env=env, compressed_env=None,
            model_type="deepseek_v41",
        )
        == expected
    )


def test_real_pd_kv_layout_compressed_fp4():
    assert (
        real.real_pd_kv_layout(
            isa="sm_103", attn_backend="flashmla", kv_layout_env="v41", compressed_env="fp4",
            model_type="deepseek_v41",
        )
        == "v41,c4:v41_fp4,c128:v41_fp4"
    )


@pytest.mark.parametrize(
    "isa, backend, env, compressed, exc, message",
    [
        ("sm_90a", "flashmla", "v41", None, AssertionError, "need an SM100 / SM103 GPU"),
        ("gfx950", "flashmla", "v41_new", None, ValueError, "require gfx950 with aiter_sparse"),
        ("sm_103", "trtllm", None, None, AssertionError, "does not support PD disaggregation"),
        ("sm_90a", "flashmla_mega", None, None, AssertionError, "requires DeepSeek-V4.1 on SM100/SM103"),
        ("sm_103", "flashmla", "v4", "fp4", AssertionError, "only pairs with V4 caches"),
    ],
)
def test_real_pd_kv_layout_raises_where_sglang_raises(isa, backend, env, compressed, exc, message):
    with pytest.raises(exc, match=message):
        real.real_pd_kv_layout(
            isa=isa, attn_backend=backend, kv_layout_env=env, compressed_env=compressed,
            model_type="deepseek_v41",
        )


def test_real_dsv4_attn_backend_auto():
    pd = ["--model-path", "/m", "--disaggregation-mode", "prefill", "--tp-size", "4"]
    assert real.real_dsv4_attn_backend(pd, isa="sm_103") == "flashmla_mega"
    assert real.real_dsv4_attn_backend(pd, isa="sm_90a") == "flashmla"
    assert real.real_dsv4_attn_backend(pd, isa="sm_103", model_type="deepseek_v4") == "flashmla"
    # aggregated serving with attention TP > 1 stays on flashmla
    assert real.real_dsv4_attn_backend(["--model-path", "/m", "--tp-size", "4"], isa="sm_103") == "flashmla"


def test_real_features_in_use():
    args = real.parse_engine_args(DECODE + ["--ep-size", "4", "--attn-dp-size", "4"])
    assert real.real_features_in_use(args) == {
        "PD_DISAGGREGATION", "EXPERT_PARALLEL", "DP_ATTENTION",
    }  # fmt: skip
    plain = real.parse_engine_args(["--model-path", "/m", "--tp-size", "4"])
    assert real.real_features_in_use(plain, "amd") == set()
    assert real.real_plugin_features("nvidia")["PD_DISAGGREGATION"] == "PD disaggregation"
    assert "EAGLE3_HIDDEN_STATES" in real.real_plugin_features("amd")


def test_real_paged_experts_check():
    real.real_paged_experts_check(num_resident=16, top_k=8)  # accepted
    with pytest.raises(RuntimeError, match=r"at least the router's top-k \(8\)"):
        real.real_paged_experts_check(num_resident=4, top_k=8)
    with pytest.raises(RuntimeError, match="--tp-size must be 1.*speculative decoding"):
        real.real_paged_experts_check(num_resident=16, top_k=8, tp_size=2, speculative_algorithm="DSPARK")


def test_real_mooncake_store_config():
    cfg = real.real_mooncake_store_config(
        '{"master_server_address": "127.0.0.1:50051", "protocol": "tcp",'
        ' "global_segment_size": "8gb", "tenant_id": "compat-abc"}',
        env={"MOONCAKE_LOCAL_HOSTNAME": None, "LOCAL_HOSTNAME": None},
    )
    assert cfg.master_server_address == "127.0.0.1:50051"
    assert cfg.global_segment_size == 8 * 1024**3
    assert (cfg.protocol, cfg.tenant_id, cfg.metadata_server) == ("tcp", "compat-abc", "P2PHANDSHAKE")
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        real.real_mooncake_store_config(
            None,
            env={"MOONCAKE_MASTER": None, "MOONCAKE_CLIENT": None,
                 "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH": None},
        )  # fmt: skip


def test_parse_smg_args_pd_kubernetes():
    ra = real.parse_smg_args(
        "launch --pd-disaggregation --discovery-provider kubernetes"
        " --prefill-selector app=x role=prefill --decode-selector app=x role=decode"
        " --service-discovery-namespace ns --policy cache_aware --prometheus-port 29000".split()
    )
    assert ra.pd_disaggregation is True
    assert ra.selected_discovery_provider() == "kubernetes"
    assert ra.prefill_selector == {"app": "x", "role": "prefill"}
    assert ra.decode_selector == {"app": "x", "role": "decode"}
    assert (ra.service_discovery_namespace, ra.policy, ra.prometheus_port) == ("ns", "cache_aware", 29000)
    assert ra.bootstrap_port_annotation == "sglang.ai/bootstrap-port"
    with pytest.raises(real.EngineArgsError, match="invalid choice: 'nope'"):
        real.parse_smg_args(["--policy", "nope"])


def test_smg_binary_reports_version():
    out = subprocess.run([real.smg_binary(), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "1.13.0" in out.stdout
