"""IMEX channels for multi-node replicas on GB200 / GB300 (issue 27, item 2): one ComputeDomain per replica.

Render, the reconcile with and without the ComputeDomain API, the per-replica domains made
and pruned as replicas come and go, and readiness counted from each replica's own domain,
on the in-memory ``Kube`` of test_multinode.py. The admission policy that points each pod at
its replica's channel runs in the real API server in the e2e (tests/e2e/test_nvlink.py,
test_kueue.py); here its output is what the test pods carry.
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


def test_the_wide_ep_decode_gets_one_compute_domain_per_replica_and_every_rank_the_placeholder(catalog):
    plan = _plan(catalog)
    objs = _by_kind(plan)
    [domain] = objs[cd.KIND]
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1" and domain["metadata"]["name"] == f"{name}-0"
    assert domain["spec"] == {"numNodes": 16, "channel": {"resourceClaimTemplate": {"name": f"{name}-0-channel"},
                                                          "allocationMode": "Single"}}
    assert domain["metadata"]["labels"][L.LABEL_COMPAT_KEY] == plan.compat_key
    assert domain["metadata"]["labels"][cd.GROUP_INDEX_LABEL] == "0"
    assert domain["metadata"]["ownerReferences"][0]["kind"] == "PDDeployment"
    [workload] = objs[lws.KIND]
    for template in lws.pod_templates(workload):
        # a template that never exists, which the admission policy replaces with the pod's replica's
        assert template["spec"]["resourceClaims"] == [{"name": "imex-channel",
                                                       "resourceClaimTemplateName": f"{name}-replica-channel"}]
        assert template["metadata"]["labels"][cd.GROUP_DOMAIN_LABEL] == name
        [engine] = template["spec"]["containers"]
        assert engine["resources"]["claims"] == [{"name": "imex-channel"}]
    [prefill] = [d for d in objs["Deployment"] if d["metadata"]["labels"][L.LABEL_ROLE] == "prefill"]
    assert "resourceClaims" not in prefill["spec"]["template"]["spec"]  # one tray: no IMEX channel
    assert cd.GROUP_DOMAIN_LABEL not in prefill["spec"]["template"]["metadata"]["labels"]
    order = [o["kind"] for o in render_all(plan) if o["metadata"]["name"].startswith(name)]
    assert order.index(cd.KIND) < order.index(lws.KIND)  # the domain before the pods that claim its channel


def test_each_replica_gets_a_domain_of_its_nodes_and_none_opts_out(catalog):
    doc = load_example(WIDE_EP)
    doc["spec"]["decode"]["replicas"] = 2
    domains = _by_kind(_plan(catalog, doc))[cd.KIND]
    name = L.group_object_name(_plan(catalog, doc).name, _plan(catalog, doc).compat_key, "decode")
    assert [(d["metadata"]["name"], d["spec"]["numNodes"], d["metadata"]["labels"][cd.GROUP_INDEX_LABEL])
            for d in domains] == [(f"{name}-0", 16, "0"), (f"{name}-1", 16, "1")]
    doc["spec"]["placement"] = {"nvlinkDomain": "none"}
    objs = _by_kind(_plan(catalog, doc))
    assert cd.KIND not in objs
    for t in lws.pod_templates(objs[lws.KIND][0]):
        assert "resourceClaims" not in t["spec"] and cd.GROUP_DOMAIN_LABEL not in t["metadata"]["labels"]
    both = load_example(EXAMPLES / "dsv41-flash-gb300-multi-node.yaml")
    assert cd.KIND in _by_kind(_plan(catalog, both))  # both roles on gb300 across nodes: one domain each
    assert len(_by_kind(_plan(catalog, both))[cd.KIND]) == 2


def test_the_admission_policy_names_the_placeholder_label_and_claim_the_templates_use(catalog):
    """The policy's selector, claim name and the template name it builds are the rendering's own
    (the real API server runs it in the e2e); the chart and crds/policies/ carry this object."""
    policy, binding = cd.admission_policy()
    assert (policy["apiVersion"], policy["kind"], binding["kind"]) == (
        "admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == cd.POLICY_NAME
    assert policy["spec"]["matchConstraints"]["objectSelector"] == {
        "matchExpressions": [{"key": cd.GROUP_DOMAIN_LABEL, "operator": "Exists"}]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    [mutation] = policy["spec"]["mutations"]
    expression = mutation["applyConfiguration"]["expression"]
    assert f"name: '{cd.POD_CLAIM}'" in expression
    assert f"object.metadata.labels['{cd.GROUP_DOMAIN_LABEL}'] + '-' + " in expression and "+ '-channel'" in expression
    assert f"'{cd.LWS_GROUP_INDEX}'" in expression and f"'{cd.POD_INDEX}'" in expression
    assert cd.LWS_GROUP_INDEX == lws.LABEL_GROUP_INDEX
    import yaml
    from helpers import ROOT
    files = sorted((ROOT / "crds" / "policies").glob("*.yaml"))
    assert [yaml.safe_load(f.read_text()) for f in files] == [binding, policy]


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


def test_replica_domains_are_created_once_never_patched_and_pruned_when_their_replica_is_gone(catalog):
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, lws_served=True, cd_served=True)
    plan = _plan(catalog)
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    assert [(o["kind"], o["metadata"]["name"]) for o in kube.created] == [(cd.KIND, f"{name}-0")]
    assert cd.KIND not in {o["kind"] for o in kube.applied}
    body = _body()
    body["spec"]["decode"]["replicas"] = 2  # a second replica: its own domain; the first is left as it is
    body["metadata"]["generation"] = 2
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1010.0, lws_served=True, cd_served=True)
    assert [o["metadata"]["name"] for o in kube.created] == [f"{name}-0", f"{name}-1"]
    assert sorted(n for (k, n) in kube.objects if k == cd.KIND) == [f"{name}-0", f"{name}-1"]
    # back to one replica while replica 1 still has a pod: its domain stays until the pod is gone
    labels = {L.LABEL_DEPLOYMENT: plan.name, L.LABEL_COMPAT_KEY: plan.compat_key, L.LABEL_ROLE: "decode",
              lws.LABEL_GROUP_INDEX: "1"}
    kube.objects[("Pod", "leftover")] = _ready_pod("leftover", labels, "gb300-3") | {"metadata": {
        "name": "leftover", "namespace": plan.namespace, "labels": labels}}
    body = _body()
    body["metadata"]["generation"] = 3
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1020.0, lws_served=True, cd_served=True)
    assert (cd.KIND, f"{name}-1") not in kube.deleted
    del kube.objects[("Pod", "leftover")]
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1030.0, lws_served=True, cd_served=True)
    assert (cd.KIND, f"{name}-1") in kube.deleted and (cd.KIND, f"{name}-0") not in kube.deleted


def test_deleting_a_group_deletes_its_compute_domains(catalog):
    plan = _plan(catalog)
    domain = _by_kind(plan)[cd.KIND][0]
    kube = MemoryKube([domain])
    P._delete_group(kube, name=plan.name, namespace=plan.namespace, key=plan.compat_key, lws_served=True,
                    cd_served=True)
    assert (cd.KIND, domain["metadata"]["name"]) in kube.deleted
    kube = MemoryKube([domain])
    P._delete_group(kube, name=plan.name, namespace=plan.namespace, key=plan.compat_key, lws_served=True)
    assert kube.deleted == []  # the kind is not served: nothing of it is listed


def _observed_ready(plan, *, nodes: dict[str, list[dict]] | None, status: dict[str, str] | None = None,
                    replicas: int = 1, claim: str | None = None) -> tuple[int, str]:
    """(decode replicas observed ready, the group's unschedulable reason): ``replicas`` groups of 16 pods on
    gb300-<16 g + i>, each pod's claim pointed at its replica's template (as the admission policy does) or
    at ``claim``; ``nodes``: group index -> its domain's ``status.nodes`` (a group absent: no domain)."""
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan)}
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    group = _with_status(objs[(lws.KIND, name)], replicas=replicas, readyReplicas=replicas, updatedReplicas=replicas)
    group["spec"]["replicas"] = replicas
    labels = dict(group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
    pods, domains = [], []
    for g in range(replicas):
        for i in range(16):
            pod = _ready_pod(f"d-{g}-{i}", {**labels, lws.LABEL_WORKER_INDEX: str(i), lws.LABEL_GROUP_INDEX: str(g)},
                             f"gb300-{16 * g + i}")
            template = claim or cd.claim_template_name(cd.group_domain_name(name, g))
            pod["spec"]["resourceClaims"] = [{"name": cd.POD_CLAIM, "resourceClaimTemplateName": template}]
            pods.append(pod)
        if nodes is not None and str(g) in nodes:
            domain = copy.deepcopy(objs[(cd.KIND, f"{name}-0")])
            domain["metadata"]["name"] = cd.group_domain_name(name, g)
            domain["metadata"]["labels"][cd.GROUP_INDEX_LABEL] = str(g)
            state = (status or {}).get(str(g), "Ready" if nodes[str(g)] else "NotReady")
            domains.append(_with_status(domain, status=state, nodes=nodes[str(g)]))
    kube = MemoryKube([group, *domains, *pods])
    observed = observe(kube, name=plan.name, namespace=plan.namespace, lws_served=True, cd_served=True)
    g = observed.groups[plan.compat_key]
    return g.workloads["decode"].ready, g.unschedulable_reason


def _joined(group: int, status: str = "Ready") -> list[dict]:
    return [{"name": f"gb300-{16 * group + i}", "cliqueID": f"u.{group}", "index": i, "status": status}
            for i in range(16)]


def test_a_replica_is_ready_only_when_its_own_compute_domain_is_ready_with_every_node(catalog):
    doc = load_example(WIDE_EP)
    doc["spec"]["decode"]["replicas"] = 2
    plan = _plan(catalog, doc)
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0), "1": _joined(1)})[0] == 2
    one_not_ready = _joined(1)
    one_not_ready[7]["status"] = "NotReady"
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0), "1": one_not_ready})[0] == 1
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0), "1": _joined(1)[:15]})[0] == 1  # one not joined
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0)})[0] == 1                   # replica 1: no domain
    # replica 1's nodes listed Ready in replica 0's domain do not make replica 1 ready
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0) + _joined(1)})[0] == 1
    assert _observed_ready(plan, replicas=2, nodes={"0": _joined(0), "1": _joined(1)},
                           status={"1": "NotReady"})[0] == 1                                      # the domain's own verdict


def test_pods_the_admission_policy_missed_wait_and_status_says_what_to_install(catalog):
    plan = _plan(catalog)
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    ready, why = _observed_ready(plan, nodes={"0": _joined(0)}, claim=cd.placeholder_template(name))
    assert ready == 1  # (the domain lists the nodes: here only the reason is asked about)
    assert cd.POLICY_NAME in why and "channelPerReplicaPolicy" in why and "crds/policies" in why
    assert why.endswith("then delete the waiting pods") and len(why) < 300  # whole in status (clipped at 300)
    assert "d-0-0" in why
    _, why = _observed_ready(plan, nodes={"0": _joined(0)})
    assert why == ""


def test_a_leaderworkerset_before_0_3_0_keeps_its_one_shared_domain(catalog):
    """A group an older operator made (held, restarted by nobody): its pods name ``<lws>-channel`` of the one
    domain ``<lws>`` without a group index, which still counts its groups ready."""
    plan = _plan(catalog)
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan)}
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    group = _with_status(objs[(lws.KIND, name)], replicas=1, readyReplicas=1, updatedReplicas=1)
    for t in lws.pod_templates(group):
        t["metadata"]["labels"].pop(cd.GROUP_DOMAIN_LABEL)
        t["spec"]["resourceClaims"] = [{"name": cd.POD_CLAIM, "resourceClaimTemplateName": f"{name}-channel"}]
    labels = dict(group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
    pods = [_ready_pod(f"d-{i}", {**labels, lws.LABEL_WORKER_INDEX: str(i), lws.LABEL_GROUP_INDEX: "0"}, f"gb300-{i}")
            for i in range(16)]
    shared = copy.deepcopy(objs[(cd.KIND, f"{name}-0")])
    shared["metadata"]["name"] = name
    shared["metadata"]["labels"].pop(cd.GROUP_INDEX_LABEL)
    kube = MemoryKube([group, _with_status(shared, status="Ready", nodes=_joined(0)), *pods])
    observed = observe(kube, name=plan.name, namespace=plan.namespace, lws_served=True, cd_served=True)
    assert observed.groups[plan.compat_key].workloads["decode"].ready == 1


def test_imex_ready_groups_counts_whole_groups_only():
    status = {"status": {"nodes": [{"name": "a"}, {"name": "b", "status": "Ready"}, {"name": "c", "status": "Failed"}]}}
    # a node without a per-node status (drivers before it existed) counts as joined
    assert imex_ready_groups(lambda g: status, {"0": ["a", "b"], "1": ["b", "c"], "2": ["a", ""]}, 2) == 1
    assert imex_ready_groups(lambda g: status, {"0": ["a"]}, 2) == 0  # a pod of the group does not exist yet
    assert imex_ready_groups(lambda g: None, {"0": ["a", "b"]}, 2) == 0


def test_the_operator_watches_compute_domains_where_they_are_served():
    watched = watched_kind(cd.API_VERSION, cd.KIND)
    assert watched is not None and watched.optional and watched.plural == "computedomains"


def test_the_cache_keeps_the_claim_that_shows_a_missed_policy(catalog):
    """The operator reads pods from its cache's trimmed copies (runtime/cache.py trim): the IMEX claim must
    survive the trim, or a replica the policy missed would wait without status saying why."""
    from sglang_pd_operator.reconcilers.observe import unschedulable_reason
    from sglang_pd_operator.runtime.cache import trim

    plan = _plan(catalog)
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    pod = _ready_pod("d-0", {cd.GROUP_DOMAIN_LABEL: name}, "")
    pod["spec"]["resourceClaims"] = [{"name": cd.POD_CLAIM, "resourceClaimTemplateName": cd.placeholder_template(name)}]
    pod["spec"]["containers"] = [{"name": "engine", "image": "x", "env": [{"name": "A", "value": "b"}]}]
    assert cd.POLICY_NAME in (unschedulable_reason(trim(pod)) or "")
    pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = f"{name}-0-channel"  # the policy acted
    assert unschedulable_reason(trim(pod)) is None
