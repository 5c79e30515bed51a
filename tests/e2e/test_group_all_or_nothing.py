"""A new compat group is created all or nothing, on the real API server (issue 26).

A real ValidatingAdmissionPolicy (no webhook server) refuses only the decode Deployment of
the group. The operator dry-runs every child before it writes one, so the refusal leaves
no child of the new group behind (not the prefill Deployment, not a ConfigMap, not a
Service); ``Reconciled`` names the refused child and the policy's answer. Removing the
policy converges to Ready. Before issue 26 the prefill role's ConfigMap, Deployment and
Service were created and stayed while the decode Deployment was refused.
"""

from __future__ import annotations

import json

import pytest
from helpers import load_example
from opkit import condition, kapply, kget, operator_process, ready_now, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NAME = "whole"
LBL = "pd.sglang-operator.io"
DENIAL = "e2e policy: decode engines are not allowed in this namespace"


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    yield from operator_process(cluster, tmp_path_factory.mktemp("operator"))


def _spec(ns: str) -> dict:
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 1
    return doc


def _deny_decode(ns: str) -> list[dict]:
    name = f"e2e-deny-decode-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
            "validations": [{"expression": "!object.metadata.name.endsWith('-decode')", "message": DENIAL}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}},
    }
    return [policy, binding]


def _denied_now(cluster, ns: str) -> bool:
    probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe-decode", "namespace": ns},
             "spec": {"selector": {"matchLabels": {"a": "b"}},
                      "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    res = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
    return res.returncode != 0 and DENIAL in res.stderr


def _group_children(cluster, ns: str) -> list[str]:
    out = []
    for kind in ("deployments", "configmaps", "services"):
        got = kget(cluster, kind, "-n", ns, "-l", f"{LBL}/deployment={NAME},{LBL}/compat-key") or {"items": []}
        out += [f"{kind}/{i['metadata']['name']}" for i in got["items"]]
    return out


def test_a_refused_child_leaves_no_other_child_of_the_new_group(cluster, operator, ns):
    objs = _deny_decode(ns)
    kapply(cluster, objs)
    try:
        wait_for(lambda: _denied_now(cluster, ns), timeout=30, what="the policy denies decode Deployments")
        kapply(cluster, _spec(ns))
        obj = wait_for(lambda: (o := kget(cluster, "pddeployment", NAME, "-n", ns)) and
                       (c := condition(o, "Reconciled")) and c["status"] == "False" and o,
                       timeout=60, what="Reconciled=False")
        rec = condition(obj, "Reconciled")
        print("Reconciled:", rec)
        assert rec["reason"] == "AdmissionDenied"
        assert "dry-run apply Deployment" in rec["message"] and f"{ns}/{NAME}-" in rec["message"]
        assert "-decode" in rec["message"] and DENIAL in rec["message"]
        left = _group_children(cluster, ns)
        assert left == [], f"the refused group left children behind: {left}"
    finally:
        for o in objs[::-1]:
            cluster.kubectl("delete", o["kind"], o["metadata"]["name"], "--ignore-not-found", check=False)
    obj = wait_for(lambda: ready_now(kget(cluster, "pddeployment", NAME, "-n", ns)), timeout=120,
                   what="Ready once the policy is gone")
    assert condition(obj, "Reconciled")["status"] == "True"
    assert any(c.endswith("-decode") for c in _group_children(cluster, ns))
