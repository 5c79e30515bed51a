"""The operator's plugin feature detection equals SGLang's own FEATURE_PROBES.

``sglang_pd_operator.planning.features.features_in_use(args, env)`` emulates the probes
of sglang 0.5.23 ``srt/kernel_plugins/nvidia/binding.py`` (and the AMD binding's
``_PROBES``) on a rendered argument list. Here the same arguments are parsed by the real
``prepare_server_args`` and the real probes run on the result (with the env applied);
feature names map to the ``Feature`` enum names lower-cased. Inputs: every example's
rendered commands, the commands of generated valid specs, and generated argument lists
whose extra flags turn features on (including option aliases such as --enable-hicache).
"""

from __future__ import annotations

import os
import sys
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402
from test_engine_args_contract import example_docs, flat_args, plan_of, valid_pdd_docs  # noqa: E402

from sglang_pd_operator.planning.features import (  # noqa: E402
    FEATURE_DESCRIPTIONS,
    VENDOR_FEATURES,
    features_in_use,
)

pytestmark = pytest.mark.contract

VENDORS = ("nvidia", "amd")

# (tokens, env) that turn a feature on (or, with a zero value, leave it off), including
# the aliases SGLang's parser accepts for the same destination.
FEATURE_ARGS: tuple[tuple[str, ...], ...] = (
    ("--enable-eplb",),
    ("--enable-lora",),
    ("--lora-paths", "a=/loras/a"),
    ("--enable-torch-compile",),
    ("--enable-two-batch-overlap",),
    ("--enable-single-batch-overlap",),
    ("--enable-hierarchical-cache",),
    ("--enable-hicache",),
    ("--disaggregation-decode-enable-offload-kvcache",),
    ("--enable-lmcache",),
    ("--enable-flexkv",),
    ("--cpu-offload-gb", "0"),
    ("--cpu-offload-gb", "16"),
    ("--offload-group-size", "4"),
    ("--attn-cp-size", "2"),
    ("--attention-context-parallel-size", "2"),
    ("--dcp-size", "2"),
    ("--decode-context-parallel-size", "2"),
    ("--enable-prefill-cp",),
    ("--pp-size", "2"),
    ("--pipeline-parallel-size", "2"),
    ("--nnodes", "2"),
    ("--ep-size", "4"),
    ("--expert-parallel-size", "2"),
    ("--ep", "8"),
    ("--attn-dp-size", "4"),
    ("--attention-data-parallel-size", "2"),
    ("--enable-dp-attention",),
    ("--enable-return-routed-experts",),
    ("--enable-return-indexer-topk",),
    ("--enable-hisparse",),
    ("--enable-memory-saver",),
    ("--enable-weights-cpu-backup",),
    ("--enable-deterministic-inference",),
    ("--rl-on-policy-target", "fsdp"),
    ("--speculative-algorithm", "DSPARK"),
    ("--speculative-algorithm", "EAGLE3"),
    ("--speculative-algorithm", "eagle3"),
    ("--disaggregation-mode", "prefill"),
    ("--disaggregation-mode", "null"),
    ("--mem-fraction-static", "0.8"),
)


def real_names(server_args, vendor: str, env: dict[str, str]) -> set[str]:
    """SGLang's features of ``vendor`` for parsed args, lower-cased enum names."""
    with mock.patch.dict(os.environ, env):
        return {n.lower() for n in real.real_features_in_use(server_args, vendor)}


def assert_same_features(args: list[str], env: dict[str, str]) -> None:
    ours = features_in_use(args, env)
    parsed = real.parse_engine_args(args, env)
    for vendor in VENDORS:
        theirs = real_names(parsed, vendor, env)
        assert ours & VENDOR_FEATURES[vendor] == theirs, (vendor, args, env)


def test_feature_names_and_descriptions_are_sglangs():
    """Operator feature names = Feature enum names lower-cased; descriptions = enum values."""
    for vendor in VENDORS:
        enum = real.real_plugin_features(vendor)
        probed = {n.lower() for n in enum} - {"partitioned_gpu"}  # checked at install, not probed
        assert VENDOR_FEATURES[vendor] == probed, vendor
        for name, value in enum.items():
            if name.lower() in FEATURE_DESCRIPTIONS:
                assert FEATURE_DESCRIPTIONS[name.lower()] == value
    assert set(FEATURE_DESCRIPTIONS) == VENDOR_FEATURES["nvidia"] | VENDOR_FEATURES["amd"]


@pytest.mark.parametrize("name, doc", example_docs(), ids=[n for n, _ in example_docs()])
def test_example_features_match_sglang(name, doc):
    plan = plan_of(doc)
    for role in (plan.prefill, plan.decode):
        assert_same_features(flat_args(role), role.command.env_dict())  # a multi-node role as its pods run it
        assert "pd_disaggregation" in role.features  # every role of a PDDeployment is PD
        assert ("multi_node_tp" in role.features) == role.inputs.multi_node


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(doc=valid_pdd_docs())
def test_generated_spec_features_match_sglang(doc):
    plan = plan_of(doc)
    assume(plan.valid)
    for role in (plan.prefill, plan.decode):
        assert_same_features(flat_args(role), role.command.env_dict())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picked=st.lists(st.sampled_from(FEATURE_ARGS), max_size=5, unique=True),
    tp=st.sampled_from(["1", "4", "8"]),
    ragged=st.sampled_from([None, "static", "dynamic", "STATIC"]),
    inline=st.booleans(),
)
def test_generated_args_features_match_sglang(picked, tp, ragged, inline):
    args = ["--model-path", real.DUMMY_MODEL_PATH, "--tp-size", tp]
    for flag in picked:
        if inline and len(flag) == 2:
            args.append(f"{flag[0]}={flag[1]}")  # argparse's --flag=value spelling
        else:
            args += list(flag)
    env = {} if ragged is None else {"SGLANG_RAGGED_VERIFY_MODE": ragged}
    assert_same_features(args, env)


def test_feature_flags_turn_features_on():
    """Each feature has at least one probe input here that SGLang sees as on (no vacuous table)."""
    seen: set[str] = set()
    for flag in FEATURE_ARGS:
        args = ["--model-path", real.DUMMY_MODEL_PATH, *flag]
        parsed = real.parse_engine_args(args)
        for vendor in VENDORS:
            seen |= real_names(parsed, vendor, {"SGLANG_RAGGED_VERIFY_MODE": "dynamic"})
    assert seen >= VENDOR_FEATURES["nvidia"] - {"ragged_verify"}
    parsed = real.parse_engine_args(["--model-path", real.DUMMY_MODEL_PATH, "--speculative-algorithm", "DSPARK"])
    assert "ragged_verify" in real_names(parsed, "nvidia", {"SGLANG_RAGGED_VERIFY_MODE": "dynamic"})
