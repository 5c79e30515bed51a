"""planning/sglang_defaults.py: SGLang 0.5.23's memory defaults as the rules restate them.

``mem_fraction_static_upper_bound`` follows memory_hook.py ``handle_gpu_memory_settings``;
the differential test (tests/contract/test_oracle_differential.py
``test_default_static_fraction_bound_holds``) holds it to the fraction SGLang resolves for
every role of its corpus. These cases pin the formula's branches.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.planning.features import parse_flags
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.planning.sglang_defaults import mem_fraction_static_upper_bound

ROOT = Path(__file__).resolve().parents[2]
CATALOG = builtin_catalog()


def _bound(accelerator: str, role: str, *, tp: int = 4, extra: list[str] = (), env: dict | None = None) -> float | None:
    doc = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-paged-experts.yaml").read_text())
    doc["spec"]["accelerator"] = accelerator
    doc["spec"].pop("pagedExperts", None)
    for name in ("prefill", "decode"):
        doc["spec"][name] = {"replicas": 1, "parallelism": {"tp": tp}, "extraArgs": list(extra),
                             "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    plan = build_plan(parse_pddeployment(doc), CATALOG)
    r = getattr(plan, role)
    return mem_fraction_static_upper_bound(r.inputs, parse_flags(list(r.command.args)), env or {})


def test_a_given_fraction_is_the_bound_capped_at_one():
    assert _bound("h200", "decode", extra=["--mem-fraction-static", "0.8"]) == pytest.approx(0.8)
    assert _bound("h200", "decode", extra=["--mem-fraction-static", "1.3"]) == 1.0
    assert _bound("h200", "decode", extra=["--mem-fraction-static", "most"]) is None


def test_a_large_gpus_decode_keeps_sglangs_10_gib_floor():
    # H200: 131 GiB = 134144 MiB; decode reserves max(512 + 2048 x 1.5 + 4 x 128, 10240) MiB
    assert _bound("h200", "decode") == pytest.approx((134144 - 10240) / 134144 + 0.0005)


def test_a_prefill_reserves_one_and_a_half_mib_per_token_of_its_chunk():
    # H200's default chunk is 8192 tokens: 512 + 8192 x 1.5 + 4 x 128 = 13312 MiB
    assert _bound("h200", "prefill") == pytest.approx((134144 - 13312) / 134144 + 0.0005)
    # a smaller chunk reserves less, but never below 2048 tokens' worth or the 10 GiB floor
    assert _bound("h200", "prefill", extra=["--chunked-prefill-size", "4096"]) == pytest.approx(
        (134144 - 10240) / 134144 + 0.0005)


def test_a_small_gpu_has_no_floor():
    # L40S: 44 GiB = 45056 MiB, default chunk 4096: 512 + 6144 + 2 x 128
    assert _bound("l40s", "prefill", tp=2) == pytest.approx((45056 - 6912) / 45056 + 0.0005)
    assert _bound("l40s", "decode", tp=2) == pytest.approx((45056 - (512 + 3072 + 256)) / 45056 + 0.0005)


def test_post_capture_kv_sizing_reserves_only_the_floor():
    # overrides.py post_capture_kv_sizing_planned may skip the graph and activation reserve
    bound = _bound("h200", "prefill", env={"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "true"})
    assert bound == pytest.approx((134144 - (1536 + 512)) / 134144 + 0.0005)
    assert _bound("h200", "prefill", env={"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "0"}) == _bound("h200", "prefill")


def test_a_prefill_without_chunking_reserves_for_its_whole_batch():
    # memory_hook.py: chunked prefill off -> activation_tokens = max(max_prefill_tokens, 2048);
    # H200: 512 + 16384 x 1.5 + 4 x 128 = 25600 MiB (a gen13-01727-like prefill SGLang refused)
    assert _bound("h200", "prefill", extra=["--chunked-prefill-size", "-1"]) == pytest.approx(
        (134144 - 25600) / 134144 + 0.0005)
    assert _bound("h200", "prefill", extra=["--chunked-prefill-size", "-1", "--max-prefill-tokens", "4096"]) == \
        pytest.approx((134144 - 10240) / 134144 + 0.0005)
