"""The long patterns as CEL rules (a fresh user's report): the API server's error names the field and says the
form in words and the fix, instead of quoting a regex of up to ~700 characters."""

from __future__ import annotations

import pytest

from sglang_pd_operator.api import crd
from sglang_pd_operator.api.cel import violations
from sglang_pd_operator.api.v1alpha1 import CEL_PATTERN_FORMS, DURATION_PATTERN, PATTERN_FORMS
from sglang_pd_operator.api.text import IMAGE_PATTERN, PRINTABLE_PATTERN, VOLUME_PATH_PATTERN


def _spec_schema():
    return crd.pddeployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _nodes(node, path="spec"):
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}.*")


@pytest.mark.parametrize("field,pattern", [
    ("spec.model.source.pvc.path", VOLUME_PATH_PATTERN),
    ("spec.runtime.image", IMAGE_PATTERN),
    ("spec.gateway.image", IMAGE_PATTERN),
    ("spec.model.servedModelName", PRINTABLE_PATTERN),
    ("spec.rollout.progressDeadline", DURATION_PATTERN),
    ("spec.slo.window", DURATION_PATTERN),
])
def test_a_long_pattern_is_a_cel_rule_naming_the_field_and_the_form(field, pattern):
    node = dict(_nodes(_spec_schema()))[field]
    assert "pattern" not in node and node["maxLength"]  # maxLength bounds the rule's cost
    rule = node["x-kubernetes-validations"][0]
    assert rule["message"] == f"{field}: must be {PATTERN_FORMS[pattern]}; change the value to that form"
    assert "\\x{" not in rule["message"] and "^" not in rule["message"]


def test_every_long_pattern_left_is_too_costly_for_a_rule():
    """A CEL_PATTERN_FORMS pattern stays a pattern only where its rule would exceed the cost budget
    (the extraArgs items and env values: 256 per role of 4,096 and 32,768 characters)."""
    left = [path for path, node in _nodes(_spec_schema()) if node.get("pattern") in CEL_PATTERN_FORMS]
    assert left and all(p.endswith(("extraArgs[*]", "env[*].value")) for p in left), left


def test_every_rule_stays_well_inside_the_api_servers_cost_limit():
    for path, node in _nodes(_spec_schema()):
        for rule in node.get("x-kubernetes-validations") or []:
            if rule["rule"].startswith("self.matches("):
                pattern = next(p for p in CEL_PATTERN_FORMS if crd.pattern_rule(path, p)["rule"] == rule["rule"])
                assert crd.pattern_rule_cost(node["maxLength"], pattern, 1) <= crd.PATTERN_RULE_COST_BUDGET


@pytest.mark.parametrize("field,edit", [
    ("spec.model.source.pvc.path", lambda s: s["model"].__setitem__("source", {"pvc": {"claimName": "m",
                                                                                        "path": "/../etc"}})),
    ("spec.runtime.image", lambda s: s.__setitem__("runtime", {"image": "lmsysorg/sglang:v0.5.23 cu130"})),
    ("spec.rollout.progressDeadline", lambda s: s.__setitem__("rollout", {"progressDeadline": "30d"})),
])
def test_the_rule_refuses_in_check_as_the_api_server_does(field, edit):
    """The rules are evaluated with RE2 (the API server's regex engine) in check's CEL evaluator too."""
    spec = {"model": {"name": "m"}}
    edit(spec)
    found = [v for v in violations({"metadata": {"name": "x"}, "spec": spec}) if v.field == field]
    assert found and found[0].message.startswith(f"{field}: must be "), found
    assert not [v for v in found if "not evaluable" in v.message], found
