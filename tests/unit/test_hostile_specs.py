"""The hostile specs of issue 26: each refused by check, naming its field and the fix, and the rules behind them.

The five that passed ``check`` before (an overflowing progressDeadline, 65 nodeSelector
entries, a PVC path leaving its volume, an image reference with a space, NUL and
right-to-left-override characters in names and values), then the pieces that make
``check`` see what the API server sees: the generated CRD schema walked with Go's regex
and integer semantics (api/structural.py), and the patterns of api/text.py meaning the
same in RE2 (the API server), Rust's regex (pydantic) and google-re2 (structural.py).
"""

from __future__ import annotations

import copy
import json

import pytest
import re2
from pydantic import BaseModel, Field

from sglang_pd_operator.api import text
from sglang_pd_operator.api.cel import violations
from sglang_pd_operator.api.load import parse_pddeployment, rule_violations, SpecError
from sglang_pd_operator.api.structural import structural_errors
from sglang_pd_operator.api.v1alpha1 import duration_nanoseconds, parse_duration
from sglang_pd_operator.planning.engine_args import model_path
from sglang_pd_operator.planning.plan import plan_object


def _errors(doc, catalog):
    _, problems = plan_object(doc, catalog)
    return [p for p in problems if p.severity == "error"]


# --------------------------------------------------------------------------- the five
def test_an_overflowing_progress_deadline_is_refused_with_the_largest_value(gb300_doc, catalog):
    gb300_doc["spec"]["rollout"] = {"progressDeadline": "99999999999999h"}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.rollout.progressDeadline"
    assert "596523h14m7s" in err.message and err.fix == "write at most 596523h14m7s"


def test_the_largest_progress_deadline_passes_and_renders_an_int32(gb300_doc, catalog):
    gb300_doc["spec"]["rollout"] = {"progressDeadline": "596523h14m7s"}
    plan, problems = plan_object(gb300_doc, catalog)
    assert not [p for p in problems if p.severity == "error"]
    from sglang_pd_operator.planning.rollout import progress_deadline_seconds

    assert progress_deadline_seconds(plan.spec) == 2**31 - 1


@pytest.mark.parametrize("value", ["596523h14m8s", "596523h14m7.000000001s", "2562048h", "1" + "0" * 40 + "ms"])
def test_every_duration_past_the_bound_is_refused_exactly(gb300_doc, catalog, value):
    """One nanosecond past 2^31-1 s is refused (Go parses to the nanosecond; a float would not see it)."""
    gb300_doc["spec"]["rollout"] = {"drainGracePeriod": value}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.rollout.drainGracePeriod"


def test_the_duration_bound_is_a_cel_rule_too():
    """kubectl apply refuses it (the CRD's rule on every duration), not only check."""
    def fields(deadline):
        return [v.field for v in violations({"metadata": {"name": "x"}, "spec": {"rollout": {"progressDeadline": deadline}}})]

    assert fields("596523h14m8s") == ["spec.rollout.progressDeadline"]
    assert fields("99999999999999h") == ["spec.rollout.progressDeadline"]  # would overflow: refused by the guard
    assert fields("596523h14m7s") == []


@pytest.mark.parametrize("value", ["abc", "30d", "1y", "30", "9999999999h", "2562048h", "99999999999999h",
                                   "1h1h1h1h1h", "596523h14m8s", "8999999999999ms"])
def test_no_duration_rule_fails_to_evaluate(value):
    """The API server prints "type conversion error" and the literal word "string" for a rule that fails
    on a value that is no duration (a fresh user's report): every duration rule guards duration() so that it runs
    only on values Go parses, and a bad value meets the rule's own message, which names the field."""
    doc = {"metadata": {"name": "x"}, "spec": {"rollout": {"progressDeadline": value},
                                               "slo": {"ttft": {"p90": "1s"}, "window": value}}}
    found = violations(doc)
    assert found and {v.field for v in found} == {"spec.rollout.progressDeadline", "spec.slo.window"}, found
    assert not [v for v in found if "not evaluable" in v.message], found
    forms = [v for v in found if "must be a duration: a number with unit" in v.message]
    assert bool(forms) == (value in ("abc", "30d", "1y", "30")), found


@pytest.mark.parametrize("value", ["1s", "0000001h", "1h2m3s500ms", "2147483647000ms", "2147483647s",
                                   "35791394m", "1.5h"])
def test_the_duration_guard_passes_every_duration_up_to_the_bound(value):
    doc = {"metadata": {"name": "x"}, "spec": {"rollout": {"progressDeadline": value}}}
    assert violations(doc) == []


def test_a_duration_of_more_than_four_parts_is_refused_by_check_too(gb300_doc, catalog):
    gb300_doc["spec"]["rollout"] = {"drainGracePeriod": "1s1s1s1s1s"}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.rollout.drainGracePeriod" and "more than 4 parts" in err.message


@pytest.mark.parametrize("deadline,ok", [("0s", False), ("0ms", False), ("999ms", False), ("0.5s", False),
                                         ("1s", True), ("1000ms", True), ("30m", True)])
def test_progress_deadline_has_a_minimum_in_the_schema(deadline, ok):
    """``progressDeadline: 0s`` failed every rollout at once (a fresh user's report): the CRD refuses under 1s."""
    doc = {"metadata": {"name": "x"}, "spec": {"rollout": {"progressDeadline": deadline}}}
    bad = [v for v in violations(doc) if v.field == "spec.rollout.progressDeadline"]
    assert (not bad) == ok, bad
    if not ok:
        assert "at least 1s" in bad[0].message and "set 1s or more" in bad[0].message


@pytest.mark.parametrize("deadline,ok", [("0s", False), ("999ms", False), ("1s", True)])
def test_progress_deadline_has_the_same_minimum_in_check(gb300_doc, catalog, deadline, ok):
    gb300_doc["spec"]["rollout"] = {"progressDeadline": deadline}
    found = [p for p in _errors(gb300_doc, catalog) if p.field == "spec.rollout.progressDeadline"]
    assert (not found) == ok, found
    if not ok:
        (err,) = found
        assert "shorter than 1s" in err.message and err.fix.startswith("set 1s or more")


def test_duration_nanoseconds_truncates_fractions_as_go():
    assert duration_nanoseconds("1.5h") == 5400 * 10**9
    assert duration_nanoseconds("0.0000000019s") == 1  # Go truncates below the nanosecond
    assert duration_nanoseconds("596523h14m7s") == (2**31 - 1) * 10**9


@pytest.mark.parametrize("text, seconds", [("700ms", 0.7), ("0.1s", 0.1), ("1.1s", 1.1), ("2.5m", 150.0),
                                           ("1h30m", 5400.0), ("0.3s", 0.3)])
def test_parse_duration_gives_the_float_nearest_the_exact_duration(text, seconds):
    # summing float(n) * 0.001 made "700ms" 0.7000000000000001, and the decode engine's
    # --bucket-* flags showed it (a fresh user's finding)
    assert parse_duration(text) == seconds and repr(parse_duration(text)) == repr(seconds)


def test_65_node_selector_entries_are_refused_as_the_api_server_does(gb300_doc, catalog):
    gb300_doc["spec"]["decode"]["nodeSelector"] = {f"k{i}": "v" for i in range(65)}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.decode.nodeSelector" and "65 entries" in err.message and "64" in err.fix


@pytest.mark.parametrize("path", ["/../../../etc/shadow", "/models/../../etc", "/a/./b", "//etc", "/a//b",
                                  "relative", "/a/\x00b", "/..", "/a/.."])
def test_a_pvc_path_that_could_leave_its_volume_is_refused(gb300_doc, catalog, path):
    gb300_doc["spec"]["model"]["source"] = {"pvc": {"claimName": "models", "path": path}}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.model.source.pvc.path" and "cannot leave the volume" in err.fix


@pytest.mark.parametrize("path, mounted", [("/", "/models"), ("/DeepSeek-V4.1-Flash", "/models/DeepSeek-V4.1-Flash"),
                                           ("/a/...b/...", "/models/a/...b/..."), ("/a/b/", "/models/a/b"),
                                           ("/.hidden/v1", "/models/.hidden/v1")])
def test_a_confined_pvc_path_stays_under_the_mount(gb300_doc, catalog, path, mounted):
    gb300_doc["spec"]["model"]["source"] = {"pvc": {"claimName": "models", "path": path}}
    assert text.confined_path_problem(path) is None
    plan, problems = plan_object(gb300_doc, catalog)
    assert not [p for p in problems if p.severity == "error"]
    assert model_path(plan.spec) == mounted


@pytest.mark.parametrize("image", ["lmsysorg/sglang:v0.5.23 cu129", " lmsysorg/sglang:v0.5.23", "lmsys/SGLang:x",
                                   "lmsysorg/sglang:", "lmsysorg/sglang@sha256:abc", "a" * 64,
                                   "lmsysorg/sglang:v0.5.23\n", "registry:5000/a/" + "b" * 256])
def test_an_image_reference_outside_the_grammar_is_refused(gb300_doc, catalog, image):
    gb300_doc["spec"]["runtime"]["image"] = image
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.runtime.image" and "image reference" in err.fix + err.message


@pytest.mark.parametrize("image", ["lmsysorg/sglang:v0.5.23-cu130", "localhost:5000/sglang", "Registry.Example/a/b:t",
                                   "[::1]:5000/sglang:x", "sglang@sha256:" + "a" * 64, "ubuntu"])
def test_an_image_reference_in_the_grammar_passes(gb300_doc, catalog, image):
    gb300_doc["spec"]["runtime"]["image"] = image
    assert _errors(gb300_doc, catalog) == []


@pytest.mark.parametrize("field, value", [
    (("model", "servedModelName"), "abc\x00def"),
    (("model", "servedModelName"), "deepseek\u202e"),
    (("model", "servedModelName"), "a\nb"),
    (("decode", "extraArgs"), ["--log-level\x1b[31m"]),
    (("prefill", "accelerator"), "gb300\u2066"),
])
def test_control_and_bidi_characters_are_refused_in_names_and_flags(gb300_doc, catalog, field, value):
    gb300_doc["spec"][field[0]][field[1]] = value
    errs = _errors(gb300_doc, catalog)
    assert errs and errs[0].field.startswith(f"spec.{field[0]}.{field[1]}") and "control characters" in errs[0].fix


@pytest.mark.parametrize("value", ["a\x00b", "a\u202eb", "a\rb", "a\x85b"])
def test_control_and_bidi_characters_are_refused_in_env_values(gb300_doc, catalog, value):
    gb300_doc["spec"]["decode"]["env"] = [{"name": "X", "value": value}]
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.decode.env[0].value" and "control characters" in err.fix


def test_a_multi_line_env_value_passes(gb300_doc, catalog):
    gb300_doc["spec"]["decode"]["env"] = [{"name": "PEM", "value": "-----BEGIN-----\n\tabc\n-----END-----"}]
    assert _errors(gb300_doc, catalog) == []


# --------------------------------------------------------------------------- found by the differential
# Two classes the CRD differential found (docs/validation.md, "The classes of disagreement found"):
# a toleration the PDDeployment accepted and the rendered Deployment's Pod template did not
# (core/v1 ValidateTolerations), and a perUserSpeed of 1e300 that broke check's CEL evaluation.
TOLERATION_ROLES = ("prefill", "decode", "gateway")


@pytest.mark.parametrize("role", TOLERATION_ROLES)
@pytest.mark.parametrize("toleration, rule_field, fix", [
    ({"operator": "Equal", "value": "x", "effect": "NoSchedule"}, "operator", "set operator: Exists or give a key"),
    ({"key": "", "operator": "Equal"}, "operator", "set operator: Exists or give a key"),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "value": "present"}, "value",
     "remove the value or use operator: Equal"),
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "x", "effect": "NoSchedule", "tolerationSeconds": 30},
     "tolerationSeconds", "set effect: NoExecute or remove tolerationSeconds"),
    ({"key": "nvidia.com/gpu", "tolerationSeconds": 30}, "tolerationSeconds",
     "set effect: NoExecute or remove tolerationSeconds"),
])
def test_a_toleration_core_v1_refuses_is_refused_by_check_and_the_crd(gb300_doc, catalog, role, toleration,
                                                                     rule_field, fix):
    """Seeds 26000 #184 (prefill), 26003 #34 (decode), 26003 #43 (gateway) at 8f16918: an empty-key toleration
    with operator Equal passed the CRD and was refused in the rendered Deployment. Now the CRD's CEL rules
    (as core/v1 validates tolerations) refuse it, and check runs the same rules."""
    gb300_doc["spec"][role]["tolerations"] = [toleration]
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == f"spec.{role}.tolerations[0].{rule_field}", err.line()
    assert err.fix == fix and err.rule == "schema", err.line()
    cel_fields = [v.field for v in violations({"metadata": {"name": "x"}, "spec": {role: {"tolerations": [toleration]}}})]
    assert cel_fields == [f"spec.{role}.tolerations[0].{rule_field}"]


@pytest.mark.parametrize("toleration", [
    {"operator": "Exists"},  # matches every taint
    {"operator": "Exists", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "value": ""},
    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
])
def test_a_toleration_core_v1_accepts_passes(gb300_doc, catalog, toleration):
    for role in TOLERATION_ROLES:
        gb300_doc["spec"][role]["tolerations"] = [toleration]
    assert _errors(gb300_doc, catalog) == []
    assert violations({"metadata": {"name": "x"}, "spec": {r: {"tolerations": [toleration]} for r in TOLERATION_ROLES}}) == []


@pytest.mark.parametrize("percentile", ["p50", "p90", "p99"])
@pytest.mark.parametrize("speed", [100_000.5, 1e6, 1e300])
def test_a_per_user_speed_past_100000_tokens_per_second_is_refused(gb300_doc, catalog, percentile, speed):
    """A perUserSpeed of 1e300 once broke the evaluation of check's CEL rules; the schema bounds it."""
    gb300_doc["spec"]["slo"]["perUserSpeed"] = {percentile: speed}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == f"spec.slo.perUserSpeed.{percentile}" and err.rule == "schema", err.line()
    assert "100000" in err.line(), err.line()


@pytest.mark.parametrize("speed", [0.5, 40, 100_000])
def test_a_per_user_speed_up_to_100000_passes(gb300_doc, catalog, speed):
    gb300_doc["spec"]["slo"]["perUserSpeed"] = {"p90": speed}
    assert _errors(gb300_doc, catalog) == []


def test_the_per_user_speed_bound_is_in_the_crd():
    from sglang_pd_operator.api.crd import all_crds

    crd = next(c for c in all_crds().values() if c["spec"]["names"]["kind"] == "PDDeployment")
    speed = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["slo"][
        "properties"]["perUserSpeed"]["properties"]
    for percentile in ("p50", "p90", "p99"):
        assert speed[percentile]["maximum"] == 100_000 and speed[percentile].get("exclusiveMaximum") in (None, False)


def test_a_spec_too_large_for_the_record_in_its_workloads_is_refused_naming_the_part(gb300_doc, catalog):
    """Every workload records the spec in its annotations (262,144 bytes at most per object): a spec past
    planning.size.MAX_SPEC_BYTES had every Deployment refused although the API server accepted it."""
    from sglang_pd_operator.planning.size import MAX_SPEC_BYTES, record_bytes

    gb300_doc["spec"]["decode"]["env"] = [{"name": f"E{i}", "value": "x" * 30_000} for i in range(9)]
    assert record_bytes(gb300_doc["spec"]) > MAX_SPEC_BYTES
    (err,) = _errors(gb300_doc, catalog)
    assert (err.field, err.rule) == ("spec.decode.env", "spec_size"), err.line()
    assert "262,144" in err.message and f"at most {MAX_SPEC_BYTES:,} bytes" in err.fix, err.line()


def test_the_spec_size_counts_as_the_record_writes_it(gb300_doc, catalog):
    """ASCII escapes count (a non-ASCII character is 6 bytes in the record), and one field holding
    most of the spec is named down to the item; the size is reported with schema errors too."""
    from sglang_pd_operator.planning.size import MAX_SPEC_BYTES, record_bytes

    gb300_doc["spec"]["prefill"]["extraArgs"] = ["--x", "--y=" + "é" * (MAX_SPEC_BYTES // 6)]
    assert len(json.dumps(gb300_doc["spec"], ensure_ascii=False)) < MAX_SPEC_BYTES < record_bytes(gb300_doc["spec"])
    fields = {(p.field, p.rule) for p in _errors(gb300_doc, catalog)}
    assert ("spec.prefill.extraArgs[1]", "spec_size") in fields, fields
    gb300_doc["spec"]["kvLayout"]["pageSize"] = "256"  # a schema error as well: both are reported
    _, problems = plan_object(gb300_doc, catalog)
    assert {p.rule for p in problems if p.severity == "error"} >= {"schema", "spec_size"}


def test_a_large_spec_under_the_bound_passes(gb300_doc, catalog):
    gb300_doc["spec"]["decode"]["env"] = [{"name": f"E{i}", "value": "x" * 30_000} for i in range(6)]
    assert _errors(gb300_doc, catalog) == []


# --------------------------------------------------------------------------- structural.py
def _pdd(gb300_doc):
    return copy.deepcopy(gb300_doc)


def test_structural_patterns_are_re2_searches_not_python_re(gb300_doc):
    """Python's re matches '$' before a final newline; RE2 (the API server's Go regexp) does not."""
    gb300_doc["spec"]["model"]["revision"] = "main\n"
    assert [e.field for e in structural_errors(gb300_doc)] == ["spec.model.revision"]


def test_structural_integers_must_fit_int64(gb300_doc):
    gb300_doc["spec"]["rollout"] = {"maxSurgeGPUs": 2**63}
    (err,) = structural_errors(gb300_doc)
    assert err.field == "spec.rollout.maxSurgeGPUs" and "64-bit" in err.message
    gb300_doc["spec"]["rollout"] = {"maxSurgeGPUs": 2**63 - 1}
    assert structural_errors(gb300_doc) == []


def test_structural_counts_lists_maps_and_code_points(gb300_doc):
    gb300_doc["spec"]["decode"]["tolerations"] = [{"operator": "Exists"}] * 33
    gb300_doc["spec"]["model"]["servedModelName"] = "\u00e9" * 256  # 256 code points, 512 UTF-8 bytes: fits
    assert [e.field for e in structural_errors(gb300_doc)] == ["spec.decode.tolerations"]


def test_structural_refuses_a_null_list_item(gb300_doc):
    gb300_doc["spec"]["decode"]["extraArgs"] = [None]
    with pytest.raises(SpecError) as e:
        parse_pddeployment(gb300_doc)
    assert [err.field for err in e.value.errors] == ["spec.decode.extraArgs[0]"]


def test_an_example_passes_structural_and_cel(gb300_doc):
    assert structural_errors(gb300_doc) == [] and rule_violations(gb300_doc) == []


# --------------------------------------------------------------------------- the patterns agree
_SAMPLES = ["plain", "", "a b", "a\x00", "\t", "a\nb", "a\rb", "\x7f", "\x85", "\u202a", "\u202e", "\u2066", "\u2069",
            "\u200e", "\u200f", "\u061c", "\u2028", "\u00e9\u4e2d\U0001f600", "/", "/a", "/a/", "/..", "/.../x",
            "/a/../b", "//", "/./", "/.a", "/a.", "lmsysorg/sglang:v0.5.23", "lmsysorg/sglang:v0.5.23\n",
            "x:\u00e9", "[::1]:5000/a", "a@sha256:" + "f" * 64, "A/b", "a/B"]


@pytest.mark.parametrize("pattern", [text.PRINTABLE_PATTERN, text.PRINTABLE_LINES_PATTERN,
                                     text.VOLUME_PATH_PATTERN, text.IMAGE_PATTERN])
def test_each_pattern_means_the_same_in_re2_and_in_pydantic(pattern):
    """RE2 (the API server; structural.py) and pydantic's Rust regex give the same verdicts."""

    class M(BaseModel):
        v: str = Field(pattern=pattern)

    for sample in _SAMPLES:
        in_re2 = re2.search(pattern, sample) is not None
        try:
            M(v=sample)
            in_pydantic = True
        except Exception:
            in_pydantic = False
        assert in_re2 == in_pydantic, (pattern, sample)


def test_the_path_pattern_and_its_words_agree():
    for sample in _SAMPLES:
        if sample.startswith("/") and sample.isprintable():
            assert (re2.search(text.VOLUME_PATH_PATTERN, sample) is not None) == (
                text.confined_path_problem(sample) is None), sample


def test_apply_patches_are_sent_as_utf8_json():
    """A character outside the BMP reaches the YAML-reading apply endpoint as UTF-8, never as a surrogate escape."""
    import json

    from sglang_pd_operator.reconcilers.kube import apply_body

    obj = {"metadata": {"name": "x", "annotations": {"a": "deepseek \U0001f600 \u00e9"}}}
    body = apply_body(obj)
    assert b"\\ud83d" not in body and "\U0001f600".encode() in body
    assert json.loads(body.decode("utf-8")) == obj
