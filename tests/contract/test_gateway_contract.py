"""Every rendered gateway command is parsed by the REAL smg==1.13.0 parser.

The gateway Deployment runs ``smg launch <gateway_args(plan)>``. Here those arguments
(taken from the rendered Deployment, as the container runs them) go through
``smg.launch_router.parse_router_args`` (what ``smg launch`` calls) and the parsed
RouterArgs must say: PD mode, Kubernetes discovery in the deployment's namespace, both
role selectors carrying the compat key label and the role label (and selecting exactly
the rendered pods of that role), the engine port as discovery port, the spec's policy,
the metrics port the Deployment exposes, the bootstrap-port annotation the prefill pods
carry.
"""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402
from test_engine_args_contract import example_docs, plan_of, valid_pdd_docs  # noqa: E402

from sglang_pd_operator.api import lws  # noqa: E402
from sglang_pd_operator.planning.engine_args import ENGINE_PORT  # noqa: E402
from sglang_pd_operator.planning.structs import Plan  # noqa: E402
from sglang_pd_operator.render import render_all  # noqa: E402
from sglang_pd_operator.render import labels as L  # noqa: E402
from sglang_pd_operator.render.gateway import GATEWAY_METRICS_PORT, gateway_args  # noqa: E402

pytestmark = pytest.mark.contract


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def assert_gateway_contract(plan: Plan) -> None:
    objs = render_all(plan)
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    gw = deployments[L.group_object_name(plan.name, plan.compat_key, L.ROLE_GATEWAY)]
    container = gw["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["smg", "launch"]
    assert container["args"] == gateway_args(plan)
    ra = real.parse_smg_args(container["args"])

    assert ra.pd_disaggregation is True
    assert ra.selected_discovery_provider() == "kubernetes"
    assert ra.service_discovery_namespace == plan.namespace
    assert ra.service_discovery_port == ENGINE_PORT
    assert ra.policy == plan.spec.gateway.policy
    assert ra.port == plan.spec.gateway.port
    assert ra.prometheus_port == GATEWAY_METRICS_PORT
    assert {"name": "metrics", "containerPort": ra.prometheus_port, "protocol": "TCP"} in container["ports"]
    assert ra.bootstrap_port_annotation == L.ANNOTATION_BOOTSTRAP_PORT

    key = plan.compat_key
    for role, selector in (("prefill", ra.prefill_selector), ("decode", ra.decode_selector)):
        assert selector[L.LABEL_COMPAT_KEY] == key
        assert selector[L.LABEL_ROLE] == role
    # smg lists pods by the labels common to both selectors: that must pin deployment and key
    # (and leaders only when both roles span nodes).
    common = dict(set(ra.prefill_selector.items()) & set(ra.decode_selector.items()))
    both_multi = plan.prefill.inputs.multi_node and plan.decode.inputs.multi_node
    assert common == {L.LABEL_DEPLOYMENT: plan.name, L.LABEL_COMPAT_KEY: key,
                      **({lws.LABEL_WORKER_INDEX: lws.LEADER_INDEX} if both_multi else {})}

    # Each selector matches exactly its role's serving pods: every pod of a single-node role, the
    # leader (worker index 0, as LWS labels it) of a multi-node one, never its workers; prefill
    # pods carry the bootstrap port.
    workloads = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", lws.KIND)}
    pods, workers = {}, {}
    for role in ("prefill", "decode", L.ROLE_GATEWAY):
        workload = workloads[L.group_object_name(plan.name, key, role)]
        templates = lws.pod_templates(workload)
        pods[role] = dict(templates[0]["metadata"])
        if workload["kind"] == lws.KIND:
            pods[role]["labels"] = {**pods[role]["labels"], lws.LABEL_WORKER_INDEX: lws.LEADER_INDEX}
            workers[role] = {**templates[-1]["metadata"]["labels"], lws.LABEL_WORKER_INDEX: "1"}
    assert _selects(ra.prefill_selector, pods["prefill"]["labels"])
    assert _selects(ra.decode_selector, pods["decode"]["labels"])
    assert not _selects(ra.prefill_selector, pods["decode"]["labels"])
    assert not _selects(ra.decode_selector, pods["prefill"]["labels"])
    assert not _selects(ra.prefill_selector, pods["gateway"]["labels"])
    for role, labels in workers.items():
        assert not _selects(ra.prefill_selector, labels) and not _selects(ra.decode_selector, labels), role
    port = pods["prefill"]["annotations"][ra.bootstrap_port_annotation]
    assert int(port) == plan.spec.disaggregation.bootstrapPort
    assert ra.bootstrap_port_annotation not in pods["decode"].get("annotations", {})

    # Another compat key of the same deployment is never selected.
    other = gateway_args(plan, compat_key="0" * len(key))
    ra_other = real.parse_smg_args(other)
    assert not _selects(ra_other.prefill_selector, pods["prefill"]["labels"])
    assert not _selects(ra_other.decode_selector, pods["decode"]["labels"])


@pytest.mark.parametrize("name, doc", example_docs(), ids=[n for n, _ in example_docs()])
def test_example_gateway_commands_parse(name, doc):
    plan = plan_of(doc)
    assert plan.valid
    assert_gateway_contract(plan)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(doc=valid_pdd_docs())
def test_generated_gateway_commands_parse(doc):
    plan = plan_of(doc)
    assume(plan.valid)
    assert_gateway_contract(plan)


def test_gateway_extra_args_reach_smg():
    _, doc = example_docs()[0]
    doc["spec"]["gateway"]["extraArgs"] = ["--prefill-policy", "bucket", "--health-check-endpoint", "/health_generate"]
    plan = plan_of(doc)
    ra = real.parse_smg_args(gateway_args(plan))
    assert ra.prefill_policy == "bucket" and ra.health_check_endpoint == "/health_generate"
    assert ra.pd_disaggregation is True
