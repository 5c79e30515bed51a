"""Errors for the inputs the fresh-user check found accepted: each names its field and the fix."""

from __future__ import annotations

from sglang_pd_operator.planning.plan import plan_object


def _errors(doc, catalog):
    plan, problems = plan_object(doc, catalog)
    return [p for p in problems if p.severity == "error"]


def test_a_bad_node_selector_key_names_the_field_and_the_key(gb300_doc, catalog):
    gb300_doc["spec"]["prefill"]["nodeSelector"] = {"bad key!": "x"}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.prefill.nodeSelector" and "'bad key!' is not a valid label key" in err.message


def test_a_bad_toleration_value_names_the_toleration(gb300_doc, catalog):
    gb300_doc["spec"]["decode"]["tolerations"] = [{"key": "gpu", "operator": "Equal", "value": "bad value",
                                                   "effect": "NoSchedule"}]
    (err,) = _errors(gb300_doc, catalog)
    assert err.field.startswith("spec.decode.tolerations") and "value" in err.field + err.message


def test_a_zero_slo_window_is_refused_with_the_minimum(gb300_doc, catalog):
    gb300_doc["spec"]["slo"] = {"ttft": {"p90": "800ms"}, "window": "0s"}
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.slo.window" and "at least 10s" in err.message and "10s or more" in err.fix


def test_an_empty_served_model_name_is_refused(gb300_doc, catalog):
    gb300_doc["spec"]["model"]["servedModelName"] = ""
    (err,) = _errors(gb300_doc, catalog)
    assert err.field == "spec.model.servedModelName"
