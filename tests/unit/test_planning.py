"""Planning: the compat key, role resolution and the plan's behaviour (no SGLang, no cluster).

The compat key (planning/compat.py, plan._compat_inputs; docs/compat-key.md) must change
when and only when an input that must be equal on both roles changes: hypothesis applies
edits to key inputs and to non-key inputs of every example and checks both directions.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st

from sglang_pd_operator.api.load import SpecError, parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.planning import compat
from sglang_pd_operator.planning.engine_args import MANAGED_FLAGS
from sglang_pd_operator.planning.features import features_in_use, parse_flags
from sglang_pd_operator.planning.memory import TAIL_GRAPH_BYTES_PER_GPU, bounded_replay_on
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.planning.structs import Plan
from sglang_pd_operator.planning.sglang_flags import flag_table, validate_args

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))}
CATALOG = builtin_catalog()
GB300, DEP, H200, MI355X, QWEN = (
    "dsv41-flash-gb300-low-latency.yaml",
    "dsv41-flash-gb300-throughput-dep.yaml",
    "dsv41-flash-h200-flashmla.yaml",
    "dsv41-flash-mi355x-amd-mono.yaml",
    "qwen3-30b-a3b-paged-experts.yaml",
)
COMPAT_INPUTS = {
    "model", "revision", "sglangVersion", "image", "kvLayout", "attentionBackend", "pageSize", "kvCacheDtype",
    "transferBackend", "decodeAllocationPolicy", "samplingMaskMaxTokens", "kvChecksum", "speculative", "pairShape",
}  # fmt: skip


def plan_of(doc: dict) -> Plan:
    return build_plan(parse_pddeployment(copy.deepcopy(doc)), CATALOG)


def example(name: str) -> dict:
    return copy.deepcopy(EXAMPLES[name])


def edit(doc: dict, path: str, value) -> dict:
    """A copy of ``doc`` with the dotted ``path`` set to ``value`` (mappings created on the way; None removes it,
    as a null field is refused by a server-side apply)."""
    doc = copy.deepcopy(doc)
    node = doc
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return doc


def resolved_key_inputs(plan: Plan) -> tuple:
    """What the handshake compares, per role, as the operator resolves it."""
    return tuple(
        (r.kv_layout_string, r.layout.attention_backend if r.layout else None, r.inputs.page_size, r.kv_cache_dtype)
        for r in (plan.prefill, plan.decode)
    )


# --------------------------------------------------------------------------- the compat key function


def test_compat_key_is_a_stable_hash_of_the_inputs():
    inputs = {"model": "m", "revision": "r", "pageSize": 256, "speculative": {"algorithm": "DSPARK", "blockSize": 5}}
    key = compat.compat_key(inputs)
    assert re.fullmatch(r"[0-9a-f]{10}", key)
    # sha256 of sorted, compact JSON: the same in every process and Python version.
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    assert key == hashlib.sha256(canonical).hexdigest()[:10]
    assert compat.compat_key(dict(reversed(list(inputs.items())))) == key  # order does not matter
    assert compat.compat_key({**inputs, "pageSize": 64}) != key
    assert compat.compat_key({**inputs, "speculative": {"algorithm": "DSPARK", "blockSize": 3}}) != key
    with pytest.raises(TypeError):
        compat.compat_key({"x": object()})


GOLDEN = "c2b3b18b2e"  # sha256 of {"model":"deepseek-ai/DeepSeek-V4.1-Flash","revision":"3f2c1e9"}


def test_compat_key_golden_value():
    """Pinned: a change here re-keys (and so rolls) every running deployment; do it on purpose."""
    assert compat.compat_key({"model": "deepseek-ai/DeepSeek-V4.1-Flash", "revision": "3f2c1e9"}) == GOLDEN
    assert compat.KEY_LENGTH == 10


def test_differing_inputs():
    assert compat.differing_inputs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": None}) == ["b"]
    assert compat.differing_inputs({"a": 1}, {"b": 1}) == ["a", "b"]
    assert compat.differing_inputs({}, {}) == []


def test_compat_inputs_are_exactly_the_documented_list():
    plan = plan_of(example(GB300))
    assert set(plan.prefill.compat_inputs) == COMPAT_INPUTS
    doc = (ROOT / "docs" / "compat-key.md").read_text()
    for name in COMPAT_INPUTS:
        assert f"`{name}`" in doc, f"docs/compat-key.md does not document {name}"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_have_one_key_for_both_roles(name):
    plan = plan_of(example(name))
    assert plan.valid
    assert plan.prefill.compat_key == plan.decode.compat_key == plan.compat_key
    assert plan.prefill.compat_inputs == plan.decode.compat_inputs


def test_examples_have_distinct_keys():
    keys = {plan_of(example(n)).compat_key for n in EXAMPLES}
    assert len(keys) == len(EXAMPLES)


# --------------------------------------------------------------------------- key vs non-key edits

# Edits that must NOT change the key: scheduling, sizing, routing and per-role knobs that do
# not enter SGLang's PD handshake. (path, strategy of values)
NON_KEY_EDITS = [
    ("spec.prefill.replicas", st.integers(0, 16)),
    ("spec.decode.replicas", st.integers(0, 16)),
    ("spec.prefill.resources", st.sampled_from([{"cpu": "32"}, {"memory": "300Gi"}, {"sharedMemory": "32Gi"}])),
    ("spec.decode.resources", st.sampled_from([{"cpu": "16", "memory": "200Gi"}, {}])),
    ("spec.prefill.nodeSelector", st.dictionaries(st.sampled_from(["zone", "pool"]), st.sampled_from(["a", "b"]))),
    ("spec.decode.nodeSelector", st.dictionaries(st.sampled_from(["zone", "pool"]), st.sampled_from(["x", "y"]))),
    ("spec.decode.tolerations", st.just([{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}])),
    ("spec.gateway.policy", st.sampled_from(["random", "round_robin", "cache_aware", "power_of_two", "least_load"])),
    ("spec.gateway.replicas", st.integers(0, 8)),
    ("spec.gateway.port", st.integers(1024, 65535)),
    ("spec.slo", st.sampled_from([None, {"ttft": {"p90": "1s"}, "window": "10m"}, {"itl": {"p99": "50ms"}}])),
    ("spec.rollout", st.sampled_from([{}, {"maxSurgeGPUs": 8}, {"progressDeadline": "1h", "onFailure": "Keep"}])),
    ("spec.disaggregation.bootstrapPort", st.integers(1024, 65535)),
    ("spec.prefill.extraArgs", st.sampled_from([[], ["--max-running-requests", "64"], ["--context-length", "8192"]])),
    ("spec.decode.extraArgs", st.sampled_from([[], ["--watchdog-timeout", "600"], ["--schedule-policy", "lpm"]])),
    ("spec.decode.env", st.sampled_from([[], [{"name": "SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS", "value": "0"}]])),
    ("metadata.name", st.sampled_from(["a", "b-2", "serving"])),
    ("metadata.namespace", st.sampled_from(["x", "default"])),
    ("spec.rlRollout", st.booleans()),
]

# Edits of must-equal inputs: the key changes whenever the value changes.
KEY_EDITS = [
    ("spec.model.revision", st.sampled_from(["3f2c1e9", "main", "a1b2c3d", "v2"])),
    ("spec.runtime.image", st.sampled_from(["lmsysorg/sglang:v0.5.23-cu130", "lmsysorg/sglang:v0.5.23-cu129", "r/x"])),
    ("spec.runtime.sglangVersion", st.sampled_from(["0.5.23", "0.5.24", "0.5.23.post1"])),
    ("spec.transfer.backend", st.sampled_from(["mooncake", "nixl"])),
    ("spec.disaggregation.samplingMaskMaxTokens", st.sampled_from([None, 1024, 4096, 8192])),
    ("spec.disaggregation.kvChecksum", st.booleans()),
]
DSPARK_CONFIGS = [None, {"algorithm": "DSPARK"}] + [{"algorithm": "DSPARK", "blockSize": b} for b in (3, 5)]
DSV4_SPECULATIVE_EDITS = [("spec.speculative", st.sampled_from(DSPARK_CONFIGS))]
# Edits of the KV layout inputs: the key follows what SGLang resolves (layout string,
# backend, page size, dtype), not the raw field.
LAYOUT_EDITS = [
    ("spec.kvLayout.attentionBackend", st.sampled_from(["auto", "flashmla", "flashmla_mega"])),
    ("spec.kvLayout.layout", st.sampled_from(["auto", "v4", "v41", "v41_new"])),
    ("spec.kvLayout.compressed", st.sampled_from(["auto", "fp8", "fp4"])),
    ("spec.kvLayout.pageSize", st.sampled_from([16, 64, 128, 256])),
    ("spec.kvLayout.dtype", st.sampled_from(["auto", "fp8_e4m3", "bfloat16"])),
]


def _value(path: str, doc: dict):
    node = doc
    for p in path.split("."):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


@settings(max_examples=150, deadline=None)
@given(base=st.sampled_from(sorted(EXAMPLES)), data=st.data())
def test_non_key_edits_keep_the_key(base, data):
    doc = example(base)
    before = plan_of(doc)
    for path, values in data.draw(st.lists(st.sampled_from(NON_KEY_EDITS), min_size=1, max_size=4)):
        doc = edit(doc, path, data.draw(values))
    after = plan_of(doc)
    assert after.compat_key == before.compat_key
    assert after.decode.compat_key == before.decode.compat_key


@settings(max_examples=150, deadline=None)
@given(base=st.sampled_from(sorted(EXAMPLES)), data=st.data())
def test_key_edits_change_the_key_iff_the_value_changes(base, data):
    doc = example(base)
    edits = KEY_EDITS + (DSV4_SPECULATIVE_EDITS if base != QWEN else [])
    path, values = data.draw(st.sampled_from(edits))
    value = data.draw(values)
    changed = edit(doc, path, value)
    before, after = plan_of(doc), plan_of(changed)
    same_value = parse_pddeployment(copy.deepcopy(doc)).spec == parse_pddeployment(copy.deepcopy(changed)).spec
    assert (after.compat_key == before.compat_key) == same_value, (path, value)
    assert after.prefill.compat_key == after.decode.compat_key  # spec-level inputs move both roles


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from([GB300, DEP, H200, MI355X]), data=st.data())
def test_layout_edits_change_the_key_iff_the_resolved_layout_changes(base, data):
    doc = example(base)
    changed = doc
    for path, values in data.draw(st.lists(st.sampled_from(LAYOUT_EDITS), min_size=1, max_size=3)):
        changed = edit(changed, path, data.draw(values))
    before, after = plan_of(doc), plan_of(changed)
    assume(after.prefill.layout is not None and after.decode.layout is not None)  # not refused
    same = resolved_key_inputs(before) == resolved_key_inputs(after)
    assert (after.compat_key == before.compat_key) == same


def test_resolved_not_raw_layout_inputs_key_the_group():
    """layout auto vs v41 under flashmla_mega on GB300 is the same PD layout: same key; pageSize 64 vs 256
    for DeepSeek-V4 is the same page size (SGLang forces 256): same key; flashmla instead of auto: new key."""
    base = plan_of(example(GB300)).compat_key
    assert plan_of(edit(example(GB300), "spec.kvLayout.layout", "v41")).compat_key == base
    assert plan_of(edit(example(GB300), "spec.kvLayout.pageSize", 256)).compat_key == base
    assert plan_of(edit(example(GB300), "spec.kvLayout.dtype", "auto")).compat_key == base  # auto -> fp8_e4m3
    assert plan_of(edit(example(GB300), "spec.kvLayout.attentionBackend", "flashmla")).compat_key != base
    qwen = plan_of(example(QWEN)).compat_key
    assert plan_of(edit(example(QWEN), "spec.kvLayout.pageSize", 32)).compat_key != qwen  # not DeepSeek: raw size


def test_role_override_that_diverges_splits_the_roles_keys():
    doc = edit(example(QWEN), "spec.decode.kvLayout", {"pageSize": 32, "dtype": "auto"})
    plan = plan_of(doc)
    assert plan.prefill.compat_key != plan.decode.compat_key
    assert not plan.valid
    assert [p.field for p in plan.problems if p.rule == "must_equal_fields"] == ["spec.decode.kvLayout.pageSize"]


def test_parallelism_keys_the_group_where_the_handshake_compares_it():
    """DeepSeek-V4.1 DSpark compares the roles' attention TP at the handshake: DEP -> TP on both
    roles is a new group (rolled as a pair), while a TP change of a model SGLang re-shards for
    keeps the group; PP and DCP sizes always key it (conn.py _resolve_rank_mapping)."""
    dep = example(DEP)
    tp_both = edit(edit(dep, "spec.prefill.parallelism", {"tp": 4, "ep": 4}), "spec.decode.parallelism", {"tp": 4})
    assert plan_of(tp_both).valid and plan_of(dep).valid
    assert plan_of(tp_both).compat_key != plan_of(dep).compat_key
    qwen = example(QWEN)
    wider = edit(qwen, "spec.decode.parallelism", {"tp": 2})
    assert plan_of(wider).compat_key == plan_of(qwen).compat_key
    pp = edit(edit(qwen, "spec.prefill.extraArgs", ["--pp-size", "2"]), "spec.decode.extraArgs", ["--pp-size", "2"])
    assert plan_of(pp).compat_key != plan_of(qwen).compat_key
    shape = plan_of(dep).prefill.compat_inputs["pairShape"]
    assert shape == {"prefill": {"pp": 1, "dcp": 1, "attentionTP": 1, "attentionCP": 1},
                     "decode": {"pp": 1, "dcp": 1, "attentionTP": 1, "attentionCP": 1}}


def test_plugin_and_engram_are_not_key_inputs():
    base = plan_of(example(GB300)).compat_key
    assert plan_of(edit(example(GB300), "spec.kernels.plugin", "none")).compat_key == base
    assert plan_of(edit(example(GB300), "spec.engram", {"placement": "host"})).compat_key == base


# --------------------------------------------------------------------------- plan behaviour


@settings(max_examples=100, deadline=None)
@given(
    base=st.sampled_from(sorted(EXAMPLES)),
    accelerator=st.sampled_from(["gb300", "h200", "mi355x", "l40s", "nope"]),
    model=st.sampled_from(["deepseek-ai/DeepSeek-V4.1-Flash", "Qwen/Qwen3-30B-A3B", "acme/unknown"]),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    extra=st.sampled_from([[], ["--bogus"], ["--tp-size", "2"], ["--attn-cp-size", "x"], ["--enable-prefill-cp"]]),
)
def test_build_plan_is_total(base, accelerator, model, tp, extra):
    """Never raises for a schema-valid spec; every problem names a spec field and a fix."""
    doc = edit(edit(edit(example(base), "spec.accelerator", accelerator), "spec.model.name", model),
               "spec.decode.parallelism", {"tp": tp})  # fmt: skip
    doc = edit(doc, "spec.decode.extraArgs", extra)
    try:
        plan = plan_of(doc)
    except SpecError:  # refused by the CRD's CEL rules: not a schema-valid spec
        reject()
    for p in plan.problems:
        assert p.field.startswith(("spec.", "metadata.")) and p.fix and p.rule and "\n" not in p.message
    assert plan.valid == (not [p for p in plan.problems if p.severity == "error"])
    if accelerator == "nope":
        assert not plan.valid and "spec.accelerator" in {p.field for p in plan.problems}


def test_dsv4_page_size_is_256_in_args_and_key():
    plan = plan_of(example(GB300))  # the example asks for pageSize 64
    for role in (plan.prefill, plan.decode):
        args = list(role.command.args)
        assert args[args.index("--page-size") + 1] == "256"
        assert role.compat_inputs["pageSize"] == 256
    assert [p.rule for p in plan.problems if p.field == "spec.kvLayout.pageSize"] == ["dsv4_page_size"]


def test_plugin_flag_is_rendered_on_decode_only():
    plan = plan_of(example(GB300))
    assert "--enable-nvidia-megakernel" in plan.decode.command.args
    assert "--enable-nvidia-megakernel" not in plan.prefill.command.args
    plan = plan_of(example(MI355X))
    assert "--enable-amd-monokernel" in plan.decode.command.args


def test_dep_renders_attn_dp_size_not_the_deprecated_switch():
    plan = plan_of(example(DEP))
    for role in (plan.prefill, plan.decode):
        flags = parse_flags(role.command.args)
        assert flags["attn_dp_size"] == "4" and "enable_dp_attention" not in flags and "dp_size" not in flags
        assert role.inputs.attention_tp == 1
        assert {"dp_attention", "expert_parallel", "pd_disaggregation", "speculative_decoding"} <= role.features


@pytest.mark.parametrize(
    "parallelism, extra, attention_tp, attention_cp",
    [
        ({"tp": 4}, [], 4, 1),
        ({"tp": 4, "dp": 4, "ep": 4, "dpAttention": True}, [], 1, 1),
        ({"tp": 4, "dp": 2, "dpAttention": True}, [], 2, 1),
        ({"tp": 4}, ["--attn-cp-size", "2"], 2, 2),
        ({"tp": 4}, ["--attention-context-parallel-size=2"], 2, 2),  # alias and = spelling
        ({"tp": 4}, ["--enable-prefill-cp", "--cp-strategy", "interleave"], 1, 4),  # V4: CP = tp / attn DP
        ({"tp": 4}, ["--enable-prefill-cp", "--attn-cp-size", "2"], 1, 4),  # V4 ignores the explicit size
    ],
)
def test_attention_tp_and_cp(parallelism, extra, attention_tp, attention_cp):
    doc = edit(edit(example(GB300), "spec.prefill.parallelism", parallelism), "spec.prefill.extraArgs", extra)
    inputs = plan_of(doc).prefill.inputs
    assert (inputs.attention_tp, inputs.attention_cp) == (attention_tp, attention_cp)


def test_dspark_prefill_cp_pairs_with_tp_decode_on_mla():
    """conn.py accepts prefill attention TP x CP == decode attention TP for MLA models (text only:
    DeepSeek-V4.1's vision tower refuses attention CP, models/deepseek_v4.py:4684)."""
    args = ["--enable-prefill-cp", "--cp-strategy", "interleave"]
    plan = plan_of(edit(example(GB300), "spec.prefill.extraArgs", [*args, "--language-model-only"]))
    assert plan.valid, [p.line() for p in plan.problems]
    with_vision = plan_of(edit(example(GB300), "spec.prefill.extraArgs", args))
    assert [p.rule for p in with_vision.problems if p.severity == "error"] == ["dsv41_vision_parallelism"]
    doc = edit(example(DEP), "spec.decode.parallelism", {"tp": 4})
    assert "dspark_attention_tp_equal" in {p.rule for p in plan_of(doc).problems}


def test_bounded_replay_and_tail_graph_memory():
    plan = plan_of(example(GB300))
    assert bounded_replay_on(plan.spec, plan.decode.inputs)
    assert plan.decode.memory.gpu_outside_kv_bytes == TAIL_GRAPH_BYTES_PER_GPU
    rl = plan_of(edit(edit(example(GB300), "spec.kernels.plugin", "none"), "spec.rlRollout", True))
    assert "--no-enable-decoder-swa-bounded-replay" in rl.decode.command.args
    assert rl.decode.memory.gpu_outside_kv_bytes == 0
    # PD on ROCm does not run bounded replay (deepseek_v4_hook), so no tail-graph memory there.
    amd = plan_of(example(MI355X))
    assert not bounded_replay_on(amd.spec, amd.decode.inputs) and amd.decode.memory.gpu_outside_kv_bytes == 0
    tail_off = [{"name": "SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS", "value": "0"}]
    no_tail = plan_of(edit(example(GB300), "spec.decode.env", tail_off))
    assert no_tail.decode.memory.gpu_outside_kv_bytes == 0 and no_tail.prefill.memory.gpu_outside_kv_bytes > 0
    cp = plan_of(edit(example(GB300), "spec.prefill.extraArgs", ["--enable-prefill-cp", "--cp-strategy", "interleave"]))
    assert cp.prefill.memory.gpu_outside_kv_bytes == 0  # CP turns bounded replay off


def test_eagle_on_deepseek_v4_renders_top_k_1():
    doc = edit(edit(example(H200), "spec.model.name", "deepseek-ai/DeepSeek-V4-Flash"), "spec.speculative",
               {"algorithm": "EAGLE", "numSteps": 3, "numDraftTokens": 4})  # fmt: skip
    del doc["spec"]["engram"]
    plan = plan_of(doc)
    assert plan.valid, [p.line() for p in plan.problems]
    assert parse_flags(plan.decode.command.args)["speculative_eagle_topk"] == "1"
    v41 = plan_of(edit(example(H200), "spec.speculative", {"algorithm": "EAGLE"}))
    assert "dsv4_speculative_algorithm" in {p.rule for p in v41.problems}  # V4.1: DSpark only


# --------------------------------------------------------------------------- flags and features


def test_every_alias_of_a_managed_flag_is_managed():
    """A knob has one place: no alias of a flag the operator renders slips through extraArgs."""
    table = flag_table()
    managed_dests = {table[f].dest for f in MANAGED_FLAGS if f in table}
    aliases = {opt for opt, info in table.items() if info.dest in managed_dests}
    assert aliases <= set(MANAGED_FLAGS), sorted(aliases - set(MANAGED_FLAGS))


def test_parse_flags_maps_aliases_to_sglang_dests():
    flags = parse_flags(
        ["--enable-hicache", "--tensor-parallel-size", "4", "--ep=2", "--no-enable-decoder-swa-bounded-replay",
         "--enable-lora", "--unknown-x", "v", "--monokernel-backend", "amd"]
    )  # fmt: skip
    assert flags == {
        "enable_hierarchical_cache": True,
        "tp_size": "4",
        "ep_size": "2",
        "enable_decoder_swa_bounded_replay": False,
        "enable_lora": True,
        "unknown_x": "v",
        "enable_amd_monokernel": "amd",
    }


def test_a_switch_never_swallows_the_next_token():
    assert parse_flags(["--enable-eplb", "stray"]) == {"enable_eplb": True}
    assert features_in_use(["--enable-eplb", "stray"]) == frozenset({"eplb"})


@pytest.mark.parametrize(
    "args, env, features",
    [
        (["--disaggregation-mode", "decode"], {}, {"pd_disaggregation"}),
        (["--disaggregation-mode", "null"], {}, set()),
        (["--enable-hicache"], {}, {"kv_offload"}),
        (["--cpu-offload-gb", "0"], {}, set()),
        (["--cpu-offload-gb", "0.5"], {}, {"cpu_offload"}),
        (["--speculative-algorithm", "DSPARK"], {"SGLANG_RAGGED_VERIFY_MODE": "dynamic"},
         {"speculative_decoding", "ragged_verify"}),
        (["--speculative-algorithm", "eagle3"], {}, {"speculative_decoding", "eagle3_hidden_states"}),
        (["--attn-dp-size", "1"], {}, set()),
        (["--pipeline-parallel-size", "2"], {}, {"pipeline_parallel"}),
        (["--lora-paths", "a=/x", "b=/y"], {}, {"lora"}),
        (["--rl-on-policy-target", "fsdp"], {}, {"deterministic_inference"}),
    ],
)  # fmt: skip
def test_features_in_use(args, env, features):
    assert features_in_use(args, env) == frozenset(features)


def test_unknown_flag_values_are_one_problem():
    errors = validate_args(["--mem-fraction-statc", "0.8", "--max-running-requests", "8"])
    assert [(e.index, e.message) for e in errors] == [
        (0, "--mem-fraction-statc is not a flag of SGLang 0.5.23; did you mean --mem-fraction-static")
    ]
    assert [e.index for e in validate_args(["stray", "--enable-eplb=1"])] == [0, 1]
