"""IMEX channels for multi-node replicas on GB200 / GB300 (issue 27, item 2): one ComputeDomain per LeaderWorkerSet.

Render, the reconcile with and without the ComputeDomain API, and readiness counted from
the ComputeDomain's ``status.nodes``, on the in-memory ``Kube`` of test_multinode.py. The
e2e (tests/e2e/test_nvlink.py) runs it against a real API server with the CRD installed.
"""

from __future__ import annotations

import copy

from helpers import EXAMPLES, MemoryKube, load_example

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api import lws
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers.observe import imex_ready_groups, observe
from sglang_pd_operator.render import render_all
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.runtime.cache import watched_kind

WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"


def _body() -> dict:
    doc = load_example(WIDE_EP)
    doc["metadata"].update(uid="u1", generation=1)
    return doc


def _with_status(obj: dict, **status) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["generation"] = 1
    obj["status"] = {"observedGeneration": 1, **status}
    return obj


def _ready_pod(name: str, labels: dict, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": {"nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def _plan(catalog, doc=None):
    plan = build_plan(parse_pddeployment(doc or load_example(WIDE_EP)), catalog)
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def _by_kind(plan) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in render_all(plan, owner={"apiVersion": "x/v1", "kind": "PDDeployment", "name": "x", "uid": "u"}):
        out.setdefault(o["kind"], []).append(o)
    return out


def test_the_wide_ep_decode_gets_one_compute_domain_and_every_rank_its_channel(catalog):
    plan = _plan(catalog)
    objs = _by_kind(plan)
    [domain] = objs[cd.KIND]
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1" and domain["metadata"]["name"] == name
    assert domain["spec"] == {"numNodes": 16, "channel": {"resourceClaimTemplate": {"name": f"{name}-channel"},
                                                          "allocationMode": "Single"}}
    assert domain["metadata"]["labels"][L.LABEL_COMPAT_KEY] == plan.compat_key
    assert domain["metadata"]["ownerReferences"][0]["kind"] == "PDDeployment"
    [workload] = objs[lws.KIND]
    for template in lws.pod_templates(workload):
        assert template["spec"]["resourceClaims"] == [{"name": "imex-channel",
                                                       "resourceClaimTemplateName": f"{name}-channel"}]
        [engine] = template["spec"]["containers"]
        assert engine["resources"]["claims"] == [{"name": "imex-channel"}]
    [prefill] = [d for d in objs["Deployment"] if d["metadata"]["labels"][L.LABEL_ROLE] == "prefill"]
    assert "resourceClaims" not in prefill["spec"]["template"]["spec"]  # one tray: no IMEX channel
    order = [o["kind"] for o in render_all(plan) if o["metadata"]["name"].startswith(name)]
    assert order.index(cd.KIND) < order.index(lws.KIND)  # the domain before the pods that claim its channel


def test_numnodes_counts_every_group_and_none_opts_out(catalog):
    doc = load_example(WIDE_EP)
    doc["spec"]["decode"]["replicas"] = 2
    assert _by_kind(_plan(catalog, doc))[cd.KIND][0]["spec"]["numNodes"] == 32
    doc["spec"]["placement"] = {"nvlinkDomain": "none"}
    objs = _by_kind(_plan(catalog, doc))
    assert cd.KIND not in objs
    for t in lws.pod_templates(objs[lws.KIND][0]):
        assert "resourceClaims" not in t["spec"]
    both = load_example(EXAMPLES / "dsv41-flash-gb300-multi-node.yaml")
    assert cd.KIND in _by_kind(_plan(catalog, both))  # both roles on gb300 across nodes: one domain each
    assert len(_by_kind(_plan(catalog, both))[cd.KIND]) == 2


def test_without_the_compute_domain_api_nothing_is_created_and_status_names_the_driver(catalog):
    kube = MemoryKube()
    outcome = P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, lws_served=True, cd_served=False)
    assert outcome.valid and kube.applied == [] and kube.created == []
    conds = {c["type"]: c for c in kube.status[-1]["conditions"]}
    assert conds["Valid"]["status"] == "True"
    for t in ("Reconciled", "Ready", "Progressing"):
        assert (conds[t]["status"], conds[t]["reason"]) == ("False", "ComputeDomainMissing")
    message = conds["Reconciled"]["message"]
    assert "resource.nvidia.com/v1beta1" in message and "computedomains.resource.nvidia.com" in message
    assert "nvidia-dra-driver-gpu" in message and "decode nodes 16 on gb300" in message
    assert "nvlinkDomain: none" in message
    assert [r for r, _ in kube.events] == ["ComputeDomainMissing"]
    body = _body()
    body["status"] = kube.status[-1]
    writes = kube.total_writes
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1010.0, lws_served=True, cd_served=False)
    assert kube.total_writes == writes and len(kube.events) == 1
    # opting out of the fabric needs no driver
    doc = _body()
    doc["spec"]["placement"] = {"nvlinkDomain": "none"}
    plain = MemoryKube()
    P.reconcile(kube=plain, body=doc, catalog=catalog, now=1000.0, lws_served=True, cd_served=False)
    assert lws.KIND in {o["kind"] for o in plain.applied} and plain.created == []


def test_the_compute_domain_is_created_once_and_never_patched(catalog):
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, lws_served=True, cd_served=True)
    assert [o["kind"] for o in kube.created] == [cd.KIND]
    assert cd.KIND not in {o["kind"] for o in kube.applied}
    body = _body()
    body["spec"]["decode"]["replicas"] = 2  # numNodes would change: the spec is immutable, so it is left
    body["metadata"]["generation"] = 2
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1010.0, lws_served=True, cd_served=True)
    assert len(kube.created) == 1
    [domain] = [o for (k, _), o in kube.objects.items() if k == cd.KIND]
    assert domain["spec"]["numNodes"] == 16


def test_deleting_a_group_deletes_its_compute_domain(catalog):
    plan = _plan(catalog)
    domain = _by_kind(plan)[cd.KIND][0]
    kube = MemoryKube([domain])
    P._delete_group(kube, name=plan.name, namespace=plan.namespace, key=plan.compat_key, lws_served=True,
                    cd_served=True)
    assert (cd.KIND, domain["metadata"]["name"]) in kube.deleted
    kube = MemoryKube([domain])
    P._delete_group(kube, name=plan.name, namespace=plan.namespace, key=plan.compat_key, lws_served=True)
    assert kube.deleted == []  # the kind is not served: nothing of it is listed


def _observed_ready(plan, *, nodes: list[dict] | None, domain_present: bool = True) -> int:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan)}
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    group = _with_status(objs[(lws.KIND, name)], replicas=1, readyReplicas=1, updatedReplicas=1)
    labels = dict(group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
    pods = []
    for i in range(16):
        pods.append(_ready_pod(f"d-{i}", {**labels, lws.LABEL_WORKER_INDEX: str(i), lws.LABEL_GROUP_INDEX: "0"},
                               f"gb300-{i}"))
    extra = []
    if domain_present:
        extra.append(_with_status(objs[(cd.KIND, name)], status="Ready" if nodes else "NotReady", nodes=nodes or []))
    kube = MemoryKube([group, *extra, *pods])
    return observe(kube, name=plan.name, namespace=plan.namespace, lws_served=True,
                   cd_served=True).groups[plan.compat_key].workloads["decode"].ready


def test_a_group_is_ready_only_when_every_node_of_it_is_ready_in_its_compute_domain(catalog):
    plan = _plan(catalog)
    every = [{"name": f"gb300-{i}", "cliqueID": "u.0", "index": i, "status": "Ready"} for i in range(16)]
    assert _observed_ready(plan, nodes=every) == 1
    one_not_ready = copy.deepcopy(every)
    one_not_ready[7]["status"] = "NotReady"
    assert _observed_ready(plan, nodes=one_not_ready) == 0
    assert _observed_ready(plan, nodes=every[:15]) == 0  # a node has not joined
    assert _observed_ready(plan, nodes=None) == 0
    assert _observed_ready(plan, nodes=every, domain_present=False) == 0


def test_imex_ready_groups_counts_whole_groups_only():
    status = {"status": {"nodes": [{"name": "a"}, {"name": "b", "status": "Ready"}, {"name": "c", "status": "Failed"}]}}
    # a node without a per-node status (drivers before it existed) counts as joined
    assert imex_ready_groups(status, {"0": ["a", "b"], "1": ["b", "c"], "2": ["a", ""]}, 2) == 1
    assert imex_ready_groups(status, {"0": ["a"]}, 2) == 0  # a pod of the group does not exist yet
    assert imex_ready_groups(None, {"0": ["a", "b"]}, 2) == 0


def test_the_operator_watches_compute_domains_where_they_are_served():
    watched = watched_kind(cd.API_VERSION, cd.KIND)
    assert watched is not None and watched.optional and watched.plural == "computedomains"
