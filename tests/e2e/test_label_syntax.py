"""api/labels.py (the label syntax the operator checks when it parses a spec) against the real API server.

The operator refuses a ``nodeSelector`` key or value, or a toleration key or value, that
the API server would refuse in a Pod template (so a bad key never creates half a group:
one role's Deployment applied, the next refused). Its rules are a restatement of
k8s.io/apimachinery's IsQualifiedName and IsValidLabelValue; this test holds them to the
real kube-apiserver: for each candidate, a Pod is created with ``dryRun=All`` and the
server's verdict must equal ours, ``check``'s, and the API server's verdict on a
PDDeployment carrying it (the CRD's CEL rule on nodeSelector keys and toleration keys, the
patterns on values, built from the same regexes in api/labels.py).
"""

from __future__ import annotations

import pytest
from helpers import load_example
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sglang_pd_operator.api.labels import label_key_problem, label_value_problem
from sglang_pd_operator.api.load import SpecError, parse_pddeployment
from sglang_pd_operator.api.v1alpha1 import GROUP, VERSION

pytestmark = pytest.mark.e2e

KEYS = [
    "gpu", "nvidia.com/gpu.product", "topology.kubernetes.io/zone", "a", "A_b.c-d", "x" * 63, "x" * 64,
    "bad key!", "-lead", "trail-", "_x", "x_", "a/b/c", "/name", "prefix/", "UPPER.com/x", "ex_ample.com/x",
    "example.com/" + "y" * 63, "example.com/" + "y" * 64, ("a" * 63 + ".") * 3 + "b" * 61 + "/x",
    ("a" * 63 + ".") * 3 + "b" * 62 + "/x", "a..b/x", "a.b./x", "9.9/x", "k" + "é", "with space",
]
VALUES = ["", "v", "NVIDIA-GB300", "a.b_c-d", "x" * 63, "x" * 64, "-v", "v-", "bad value", "a/b", "é"]


def _server_refuses(api: k8s.CoreV1Api, ns: str, selector: dict[str, str] | None = None,
                    toleration: dict[str, str] | None = None) -> bool:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "label-syntax-", "namespace": ns},
           "spec": {"nodeSelector": selector or {}, "tolerations": [toleration] if toleration else [],
                    "containers": [{"name": "c", "image": "busybox"}]}}
    try:
        api.create_namespaced_pod(ns, pod, dry_run="All")
    except ApiException as e:
        assert e.status == 422, (selector, e.status, e.body)
        return True
    return False


def _crd_refuses(api: k8s.CustomObjectsApi, ns: str, selector: dict[str, str] | None = None,
                 toleration: dict[str, str] | None = None) -> bool:
    """The API server's verdict on a PDDeployment carrying the candidate (the CRD's schema and CEL rules)."""
    doc = load_example()
    doc["metadata"] = {"name": "label-syntax", "namespace": ns}
    if selector is not None:
        doc["spec"]["prefill"]["nodeSelector"] = selector
    if toleration is not None:
        doc["spec"]["decode"]["tolerations"] = [toleration]
    try:
        api.create_namespaced_custom_object(GROUP, VERSION, ns, "pddeployments", doc, dry_run="All")
    except ApiException as e:
        assert e.status == 422, (selector, toleration, e.status, e.body)
        return True
    return False


def _check_refuses(selector: dict[str, str] | None = None, toleration: dict[str, str] | None = None) -> bool:
    doc = load_example()
    if selector is not None:
        doc["spec"]["prefill"]["nodeSelector"] = selector
    if toleration is not None:
        doc["spec"]["decode"]["tolerations"] = [toleration]
    try:
        parse_pddeployment(doc)
    except SpecError as e:  # the error check and the operator report (planning.plan.schema_problem)
        field = "spec.prefill.nodeSelector" if selector is not None else "spec.decode.tolerations"
        assert len(e.errors) == 1 and e.errors[0].field.startswith(field), e
        return True
    return False


def test_label_keys_and_values_judged_as_the_api_server_judges_them(cluster, crds):
    api = k8s.CoreV1Api(cluster.api_client())
    custom = k8s.CustomObjectsApi(cluster.api_client())
    ns = "default"
    disagree = []

    def compare(what: str, candidate: str, ours: str | None, **where) -> None:
        pod = _server_refuses(api, ns, **where)  # Kubernetes' own validation of a Pod
        verdicts = {"pod": pod, "ours": ours is not None, "check": _check_refuses(**where),
                    "crd": _crd_refuses(custom, ns, **where)}  # the CRD's CEL rules and patterns, in the API server
        if len(set(verdicts.values())) != 1:
            disagree.append((what, candidate, verdicts, ours))

    for key in KEYS:
        compare("key", key, label_key_problem(key), selector={key: "v"})
        # a toleration's key is a label key, its value (operator Equal) a label value
        compare("toleration key", key, label_key_problem(key),
                toleration={"key": key, "operator": "Equal", "value": "v", "effect": "NoSchedule"})
    for value in VALUES:
        compare("value", value, label_value_problem(value), selector={"gpu": value})
        compare("toleration value", value, label_value_problem(value),
                toleration={"key": "gpu", "operator": "Equal", "value": value, "effect": "NoSchedule"})
    assert not disagree, disagree
    refused = sum(label_key_problem(k) is not None for k in KEYS) + sum(label_value_problem(v) is not None for v in VALUES)
    assert 10 <= refused < len(KEYS) + len(VALUES)  # both verdicts exercised
