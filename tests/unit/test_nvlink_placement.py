"""NVLink placement of multi-node replicas (issue 27, item 1): clique affinity, its default, the one-clique limit.

Plans and renders the wide-EP example (DEP64 decode on 16 GB300 trays) and variants; the
e2e (tests/e2e/test_nvlink.py) runs the rendered affinity through the real kube-scheduler.
"""

from __future__ import annotations

import copy

import pytest
from helpers import EXAMPLES, load_example

from sglang_pd_operator.api import lws
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.nvlink import nvlink_mode, uses_compute_domain
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.render import render_all
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render.multinode import GROUP_CLIQUE_WEIGHT, PAIR_CLIQUE_WEIGHT

WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"
CLIQUE = "nvidia.com/gpu.clique"


def _doc(**placement) -> dict:
    doc = load_example(WIDE_EP)
    if placement:
        doc["spec"]["placement"] = placement
    return doc


def _plan(catalog, doc: dict):
    return build_plan(parse_pddeployment(doc), catalog)


def _workloads(plan) -> dict[str, dict]:
    return {o["metadata"]["labels"][L.LABEL_ROLE]: o for o in render_all(plan)
            if o["kind"] in ("Deployment", lws.KIND) and L.LABEL_ROLE in o["metadata"]["labels"]}


def _templates(workload: dict) -> list[dict]:
    return lws.pod_templates(workload)


def test_the_catalog_marks_nvl72_as_multi_node_nvlink_and_hgx_not(catalog):
    gb300, h200 = catalog.accelerator("gb300"), catalog.accelerator("h200")
    assert gb300.multi_node_nvlink and gb300.nvlinkCliqueLabel == CLIQUE and gb300.nodes_per_clique == 18
    assert catalog.accelerator("gb200").multi_node_nvlink
    assert not h200.multi_node_nvlink and h200.nodes_per_clique == 1


def test_by_default_every_rank_of_a_gb300_group_is_required_in_its_own_groups_clique(catalog):
    plan = _plan(catalog, _doc())
    assert plan.valid, [p.line() for p in plan.problems]
    assert nvlink_mode(plan.spec, plan.decode) == "required"
    assert nvlink_mode(plan.spec, plan.prefill) == "none"  # one tray: NVLink inside it
    decode = _workloads(plan)["decode"]
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    for template in _templates(decode):  # leader and worker alike
        terms = template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == [{"labelSelector": {"matchLabels": {lws.LABEL_NAME: name}},
                          "matchLabelKeys": [lws.LABEL_GROUP_KEY], "topologyKey": CLIQUE}]
    assert "affinity" not in _workloads(plan)["prefill"]["spec"]["template"]["spec"]
    # LWS's exclusive annotation is not used (1:1 exclusive, see render/multinode.py)
    assert lws.ANNOTATION_EXCLUSIVE_TOPOLOGY not in (decode["metadata"].get("annotations") or {})


def test_preferred_renders_a_preferred_term_and_none_renders_no_affinity(catalog):
    plan = _plan(catalog, _doc(nvlinkDomain="preferred"))
    assert plan.valid
    aff = _templates(_workloads(plan)["decode"])[0]["spec"]["affinity"]["podAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in aff
    [term] = aff["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == GROUP_CLIQUE_WEIGHT and term["podAffinityTerm"]["topologyKey"] == CLIQUE
    plan = _plan(catalog, _doc(nvlinkDomain="none"))
    assert plan.valid and not uses_compute_domain(plan.spec, plan.decode)
    for template in _templates(_workloads(plan)["decode"]):
        assert "affinity" not in template["spec"]


def test_pair_domain_makes_both_roles_prefer_the_other_roles_clique(catalog):
    plan = _plan(catalog, _doc(pairDomain="preferred"))
    assert plan.valid
    w = _workloads(plan)
    prefill_pref = w["prefill"]["spec"]["template"]["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert prefill_pref == [{"weight": PAIR_CLIQUE_WEIGHT, "podAffinityTerm": {
        "labelSelector": {"matchLabels": L.selector_labels(plan.name, "decode", plan.compat_key)},
        "topologyKey": CLIQUE}}]
    decode_aff = _templates(w["decode"])[1]["spec"]["affinity"]["podAffinity"]
    assert decode_aff["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == CLIQUE
    [pair] = decode_aff["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pair["podAffinityTerm"]["labelSelector"]["matchLabels"] == L.selector_labels(
        plan.name, "prefill", plan.compat_key)


def _too_big(doc: dict) -> dict:
    """Decode of 128 GPUs: tp 64 x pp 2 on 32 trays, more than one NVL72 clique."""
    doc = copy.deepcopy(doc)
    d = doc["spec"]["decode"]
    d["parallelism"]["nodes"] = 32
    d["extraArgs"] = [*d["extraArgs"], "--pp-size", "2"]
    return doc


def test_a_replica_larger_than_one_clique_is_refused_naming_the_field_and_both_fixes(catalog):
    plan = _plan(catalog, _too_big(_doc()))
    found = [p for p in plan.problems if p.rule == "replica_fits_nvlink_clique"]
    assert len(found) == 1 and found[0].severity == "error"
    assert found[0].field == "spec.decode.parallelism.nodes"
    assert "128 GPUs" in found[0].message and "72 GPUs, 18 nodes" in found[0].message
    assert "nvlinkDomain: none" in found[0].fix and "at most 18 nodes" in found[0].fix


def test_opting_into_rdma_across_cliques_lifts_the_limit(catalog):
    plan = _plan(catalog, _too_big(_doc(nvlinkDomain="none")))
    assert not [p for p in plan.problems if p.rule == "replica_fits_nvlink_clique"]


def test_nvlink_domain_on_an_accelerator_without_multi_node_nvlink_warns_and_places_nothing(catalog):
    doc = load_example(EXAMPLES / "dsv41-flash-gb300-multi-node.yaml")
    doc["spec"]["placement"] = {"nvlinkDomain": "required"}
    plan = _plan(catalog, doc)
    assert nvlink_mode(plan.spec, plan.decode) == "required"
    override = catalog.model_copy(update={"accelerators": {
        **catalog.accelerators, "gb300": catalog.accelerators["gb300"].model_copy(update={"nvlinkCliqueLabel": None})}})
    plan = _plan(override, doc)
    warn = [p for p in plan.problems if p.rule == "replica_fits_nvlink_clique"]
    assert warn and all(p.severity == "warning" and p.field == "spec.placement.nvlinkDomain" for p in warn)
    assert nvlink_mode(plan.spec, plan.decode) == "none"
    for workload in _workloads(plan).values():
        for template in _templates(workload):
            assert "affinity" not in template["spec"]


@pytest.mark.parametrize("value", ["always", "Required"])
def test_the_crd_enum_refuses_unknown_modes(value):
    from sglang_pd_operator.api.crd import pddeployment_crd
    schema = pddeployment_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    enum = schema["properties"]["spec"]["properties"]["placement"]["properties"]["nvlinkDomain"]["enum"]
    assert value not in enum and set(enum) == {"required", "preferred", "none"}
