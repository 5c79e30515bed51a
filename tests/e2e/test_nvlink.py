"""Wide EP on GB300 NVL72 gets its NVLink fabric, end to end (issue 27, items 1, 2, 4, 5).

On the dev cluster: the fake GB300 trays carry ``nvidia.com/gpu.clique`` (racks of 18:
gb300-0..17, gb300-18..35, and a partial rack gb300-36..39), each publishes its IMEX
channel as a DRA device (resource.k8s.io/v1 ResourceSlice), and the ComputeDomain API is
served with a STAND-IN controller (devtools/sglang_pd_operator_dev/cluster/imex.py: the
driver cannot be built here). Real: kube-apiserver, kube-scheduler (pod affinity and DRA
allocation), kube-controller-manager (ResourceClaims from the template), the LWS
controller and its webhook, the operator running as the chart's ServiceAccount.

1. The wide-EP example as written (placement default: required): its 16 decode ranks run
   on 16 trays of one clique, every rank's IMEX channel claim names its replica's template
   (the chart's MutatingAdmissionPolicy, run by the real API server) and is allocated on
   its own node, the replica's ComputeDomain is Ready with those 16 nodes, the PDDeployment Ready. Printed:
   rank -> node -> clique. Deleting one tray's pod recreates the whole group (LWS), again
   inside one clique, Ready again (the deleted pod is held Terminating, as a kubelet's
   drain holds it, until LWS deleted the leader: ``opkit.delete_lws_worker``).
2. A second DEP64 group that cannot fit in any clique (the first holds 16 of its rack's
   18 trays, 3 trays of the other rack cordoned): it never runs across cliques: every
   bound pod of it shares one clique, the rest wait Pending with the scheduler naming the
   pod affinity, and its PDDeployment is not Ready. Without gang admission its leader is
   bound while it waits (docs/multi-node.md "Limit without gang admission").

Leader-first placement (the same docs section) would let the first group's leader pick
the 4-tray partial rack and wait there; test 1 cordons that rack so the outcome does not
depend on the scheduler's tie-break, and says so.
"""

from __future__ import annotations

import time

import pytest
from helpers import load_example
from opkit import condition, delete_lws_worker, kapply, kget, pods, ready_now, wait_for
from test_multinode import WIDE_EP, _engine_pods, chart_operator, lws_cluster  # noqa: F401 (fixtures)

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api import lws

CLIQUE = "nvidia.com/gpu.clique"
PARTIAL = [f"gb300-{i}" for i in range(36, 40)]


def _doc(ns: str, name: str | None = None) -> dict:
    doc = load_example(WIDE_EP)
    doc["metadata"]["namespace"] = ns
    if name:
        doc["metadata"]["name"] = name
    return doc


def _cordon(c, nodes: list[str], on: bool) -> None:
    for n in nodes:
        c.kubectl("cordon" if on else "uncordon", n)


def _clique(c, node: str) -> str:
    return kget(c, "node", node)["metadata"]["labels"][CLIQUE]


@pytest.fixture
def cordoned(lws_cluster):
    """Nodes a test cordons, uncordoned afterwards."""
    held: list[str] = []

    def cordon(nodes: list[str]) -> None:
        _cordon(lws_cluster, nodes, True)
        held.extend(nodes)

    yield cordon
    _cordon(lws_cluster, held, False)


def test_wide_ep_lands_in_one_clique_with_a_ready_compute_domain(lws_cluster, chart_operator, ns, cordoned):
    c = lws_cluster
    served = c.kubectl("get", "crd", cd.CRD_NAME, check=False)
    assert served.returncode == 0, "the dev cluster serves no ComputeDomain API (its IMEX stand-in is missing)"
    cordoned(PARTIAL)  # see the module doc: leader-first placement
    started = time.monotonic()
    kapply(c, _doc(ns))
    name = "dsv41-flash-wide-ep"
    obj = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=300, what="wide-EP Ready")
    converged = time.monotonic() - started
    decode = _engine_pods(c, ns, name, "decode")
    assert len(decode) == 16
    placement = sorted((int(p["metadata"]["labels"][lws.LABEL_WORKER_INDEX]), p["spec"]["nodeName"],
                        _clique(c, p["spec"]["nodeName"])) for p in decode)
    assert len({node for _, node, _ in placement}) == 16
    assert len({clique for _, _, clique in placement}) == 1, placement
    # the replica's own ComputeDomain, Ready, listing exactly the group's nodes in that clique
    key = obj["status"]["compatKey"]
    domain_name = f"{name}-{key[:6]}-decode-0"
    domains = kget(c, "computedomains.resource.nvidia.com", "-n", ns)["items"]
    assert sorted(d["metadata"]["name"] for d in domains) == [domain_name]
    domain = kget(c, "computedomains.resource.nvidia.com", domain_name, "-n", ns)
    assert domain["spec"]["numNodes"] == 16
    assert domain["status"]["status"] == "Ready"
    listed = {n["name"]: n for n in domain["status"]["nodes"]}
    assert set(listed) == {node for _, node, _ in placement}
    assert {n["cliqueID"] for n in listed.values()} == {placement[0][2]}
    # every rank's claim names its replica's template (the chart's admission policy rewrote the placeholder at the
    # pod's creation, in the real API server), and the real scheduler allocated it on the rank's own node
    claims = {cl["metadata"]["name"]: cl for cl in kget(c, "resourceclaims", "-n", ns)["items"]}
    for p in decode:
        assert p["spec"]["resourceClaims"] == [{"name": cd.POD_CLAIM,
                                                "resourceClaimTemplateName": f"{domain_name}-channel"}], p["spec"]
        [status] = p["status"]["resourceClaimStatuses"]
        claim = claims[status["resourceClaimName"]]
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == p["spec"]["nodeName"] and result["driver"] == "compute-domain.nvidia.com"
    assert obj["status"]["decode"]["replicas"] == "1/1"
    print(f"\nwide-EP on NVL72: Ready {converged:.1f}s after apply; ComputeDomain {domain_name} Ready, 16 nodes")
    for rank, node, clique in placement:
        print(f"  decode rank {rank:2d} -> {node} -> clique {clique}")
    # a tray's pod deleted: LWS recreates the whole group, again inside one clique, the domain Ready again
    worker = next(p for p in decode if p["metadata"]["labels"][lws.LABEL_WORKER_INDEX] == "5")
    old_uids = {p["metadata"]["uid"] for p in decode}
    delete_lws_worker(c, ns, worker["metadata"]["name"])  # held Terminating until LWS deleted the leader (opkit)

    def regrouped():
        now = _engine_pods(c, ns, name, "decode")
        fresh = [p for p in now if p["metadata"]["uid"] not in old_uids and p["spec"].get("nodeName")]
        ok = ready_now(kget(c, "pdd", name, "-n", ns))
        return now if len(fresh) == 16 and len(now) == 16 and ok else None

    again = wait_for(regrouped, timeout=300, what="the group recreated and Ready")
    cliques = {_clique(c, p["spec"]["nodeName"]) for p in again}
    assert len(cliques) == 1, cliques
    domain = kget(c, "computedomains.resource.nvidia.com", domain_name, "-n", ns)
    assert domain["status"]["status"] == "Ready"
    assert {n["name"] for n in domain["status"]["nodes"]} >= {p["spec"]["nodeName"] for p in again}
    print(f"  rank 5's pod deleted: the group was recreated in clique {cliques.pop()}, Ready again")


def test_a_group_that_fits_no_clique_never_spreads_across_cliques(lws_cluster, chart_operator, ns, cordoned):
    c = lws_cluster
    cordoned(PARTIAL)
    kapply(c, _doc(ns, "wide-ep-a"))
    wait_for(lambda: ready_now(kget(c, "pdd", "wide-ep-a", "-n", ns)), timeout=300, what="the first group Ready")
    first = {p["spec"]["nodeName"] for p in _engine_pods(c, ns, "wide-ep-a", "decode")}
    [held] = {_clique(c, n) for n in first}
    other = [n["metadata"]["name"] for n in kget(c, "nodes", "-l", "pd.sglang-operator.io/accelerator=gb300")["items"]
             if n["metadata"]["labels"][CLIQUE] not in (held, _clique(c, PARTIAL[0]))]
    cordoned(other[:3])  # 15 free trays there, 2 (minus the prefill's) in the first group's rack: no room for 16
    kapply(c, _doc(ns, "wide-ep-b"))

    def waiting():
        mine = _engine_pods(c, ns, "wide-ep-b", "decode")
        pending = [p for p in mine if not p["spec"].get("nodeName")]
        why = [cond.get("message", "") for p in pending for cond in p["status"].get("conditions") or []
               if cond.get("reason") == "Unschedulable"]
        return mine if len(mine) == 16 and pending and why and all("affinity" in w for w in why) else None

    mine = wait_for(waiting, timeout=180, what="the second group's unplaceable ranks Pending on pod affinity")
    bound = {p["spec"]["nodeName"] for p in mine if p["spec"].get("nodeName")}
    assert len({_clique(c, n) for n in bound}) <= 1, "a group never spreads over cliques"
    st = kget(c, "pdd", "wide-ep-b", "-n", ns)
    assert not ready_now(st)
    assert st["status"]["decode"]["replicas"] == "0/1"
    print(f"\nunplaceable DEP64 group: {len(bound)} rank(s) bound in one clique, {16 - len(bound)} Pending "
          "on pod affinity, PDDeployment not Ready")
    assert pods(c, ns, "pd.sglang-operator.io/deployment=wide-ep-a")  # the first keeps serving


def test_without_the_admission_policy_a_replica_waits_and_status_says_what_to_install(lws_cluster, chart_operator, ns,
                                                                                      cordoned):
    """The chart's policy binding removed (as on a cluster that installed the CRDs but not the chart's policy): the
    replica's pods keep the placeholder claim, none gets an IMEX channel or joins another replica's domain, and
    the PDDeployment says which policy to install; with the binding back, new pods get their replica's channel."""
    c = lws_cluster
    cordoned(PARTIAL)
    # the chart's (start_chart_operator) and crds/policies/' (the session's install_crds): both act on a pod
    bindings = kget(c, "mutatingadmissionpolicybindings", "-l", "app.kubernetes.io/component=imex-channel-per-replica")["items"]
    assert bindings, "no IMEX admission policy binding installed"
    for binding in bindings:
        c.kubectl("delete", "mutatingadmissionpolicybinding", binding["metadata"]["name"])
    name = "wide-ep-nopolicy"
    try:
        def unbound():  # the API server stops applying a policy shortly after its binding is deleted
            kapply(c, _doc(ns, name))
            pods = _engine_pods(c, ns, name, "decode")
            if not pods:
                return None
            if any(p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
                   != cd.placeholder_template(p["metadata"]["labels"][cd.GROUP_DOMAIN_LABEL]) for p in pods):
                c.kubectl("delete", "pdd", name, "-n", ns, "--wait=true")  # made before the binding was gone
                return None
            return pods

        wait_for(unbound, timeout=120, interval=2, what="pods made without the admission policy")

        def says_why():
            obj = kget(c, "pdd", name, "-n", ns)
            msg = (condition(obj, "Progressing") or {}).get("message", "")
            return obj if "no MutatingAdmissionPolicy pointed pod" in msg and "channelPerReplicaPolicy" in msg else None

        obj = wait_for(says_why, timeout=120, what="status naming the missing admission policy")
        assert not ready_now(obj)
        pods = _engine_pods(c, ns, name, "decode")
        assert pods and all(not (p["status"].get("resourceClaimStatuses") or [{}])[0].get("resourceClaimName")
                            for p in pods), "a pod without its replica's template got a claim"
        print(f"\nwithout the policy binding: {len(pods)} decode pods wait; Progressing says: "
              f"{condition(obj, 'Progressing')['message'][:160]}...")
    finally:
        c.kubectl("delete", "pdd", name, "-n", ns, "--wait=false", check=False)
        for binding in bindings:
            kapply(c, {k: v for k, v in binding.items() if k != "status"} | {
                "metadata": {"name": binding["metadata"]["name"], "labels": binding["metadata"].get("labels", {})}})
