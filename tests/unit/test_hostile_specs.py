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

import pytest
import re2
from pydantic import BaseModel, Field

from sglang_pd_operator.api import text
from sglang_pd_operator.api.cel import violations
from sglang_pd_operator.api.load import parse_pddeployment, rule_violations, SpecError
from sglang_pd_operator.api.structural import structural_errors
from sglang_pd_operator.api.v1alpha1 import duration_nanoseconds
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
    assert fields("99999999999999h") == ["spec.rollout.progressDeadline"]  # overflows: not evaluable, refused
    assert fields("596523h14m7s") == []


def test_duration_nanoseconds_truncates_fractions_as_go():
    assert duration_nanoseconds("1.5h") == 5400 * 10**9
    assert duration_nanoseconds("0.0000000019s") == 1  # Go truncates below the nanosecond
    assert duration_nanoseconds("596523h14m7s") == (2**31 - 1) * 10**9


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
