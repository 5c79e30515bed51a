"""Gang admission with the real Kueue, end to end (issue 27, items 3-5).

On the dev cluster (40 fake GB300 trays in NVL72 racks of 18, 18 and 4, labelled
``nvidia.com/gpu.clique``) this module starts the real Kueue controller manager
(sigs.k8s.io/kueue v0.17.0, built from its Go module into the binary cache, webhooks on
127.0.0.1: devtools cluster.start_kueue) beside the real LWS controller, and makes Kueue's
topology-aware scheduling objects: a Topology with the clique and the node name as levels,
a ResourceFlavor, a ClusterQueue and a LocalQueue. The operator runs as the chart's
ServiceAccount. PDDeployments name the LocalQueue in ``spec.scheduling.queueName``; the
operator labels each LeaderWorkerSet with it and asks Kueue for one clique per replica.

1. Two wide-EP deployments compete for one rack (the ResourceFlavor is rack 0's 18 trays;
   prefill pods sit in the partial rack, outside it): Kueue admits one decode group whole
   (16 ranks, one clique); the other waits whole: none of its 16 pods is ever bound while
   the first holds the rack, and its PDDeployment says Ready=False WaitingForCapacity with
   Kueue's reason from the Workload. Deleting the first admits the second, whole.
2. Two decode replicas (two LWS groups of 16) on all three racks: Kueue gives each group
   its own clique (the kube-scheduler's leader-first affinity alone could start both leaders
   in one rack, docs/multi-node.md); both Ready, one ComputeDomain with 32 Ready nodes.
3. A group whose queue offers only the 4-tray partial rack never fits: all 16 pods stay
   gated, none bound, and the PDDeployment says WaitingForCapacity with Kueue's reason.

The operator runs with the chart's ``scheduling.defaultQueueName`` (its rendered
``--default-queue-name`` flag): test 2's PDDeployment names no queue and is admitted
through the default one (``status.scheduling`` says ``operatorDefault``); tests 1 and 3
name their own, which wins over the default.

Real: kube-apiserver, kube-scheduler (binds Kueue's assignments, allocates the IMEX claims),
kube-controller-manager, Kueue, LWS, the operator. Stand-ins: kwok's pods and nodes, the
ComputeDomain controller (devtools imex.py).
"""

from __future__ import annotations

import re
import time

import pytest
from helpers import load_example
from opkit import condition, kapply, kget, looked, ready_now, wait_for
from opkit import pods as list_pods
from test_multinode import WIDE_EP, _engine_pods, lws_cluster, start_chart_operator, stop_chart_operator  # noqa: F401

from sglang_pd_operator.api import kueue, lws
from sglang_pd_operator_dev.cluster import build
from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster import kueue as dev_kueue

CLIQUE = "nvidia.com/gpu.clique"
QUEUE = "gb300"
PREFILL_RACK = [f"gb300-{i}" for i in range(36, 40)]  # the partial rack: prefill pods in test 1
#: The chart's scheduling.defaultQueueName for this module's operator: the LocalQueue of test 2.
DEFAULT_QUEUE = "all-racks"


@pytest.fixture(scope="module")
def kueue_cluster(lws_cluster, cluster_log):
    """The session cluster with the real Kueue running for this module; stopped (webhooks removed) after."""
    if build.find_kueue() is None:
        cluster_log("kueue: not in the cache; building it now (hack/test.sh builds it before pytest)")
    started = time.monotonic()
    devcluster.start_kueue(lws_cluster.run_dir, log=cluster_log)
    cluster_log(f"kueue: serving its webhooks {time.monotonic() - started:.1f}s after start")
    yield lws_cluster
    devcluster.stop_kueue(lws_cluster.run_dir)


@pytest.fixture(scope="module")
def queue_operator(lws_cluster, tmp_path_factory):
    """The operator as the chart's ServiceAccount (test_multinode's ``chart_operator``) with the chart's
    ``scheduling.defaultQueueName`` set: its rendered ``--default-queue-name`` is passed on."""
    op = start_chart_operator(lws_cluster, tmp_path_factory.mktemp("chart-sa-kueue"),
                              sets=(f"scheduling.defaultQueueName={DEFAULT_QUEUE}",),
                              chart_flags=("--default-queue-name",))
    assert f"--default-queue-name={DEFAULT_QUEUE}" in op.extra_args
    yield op
    stop_chart_operator(op)


def _clique(c, node: str) -> str:
    return kget(c, "node", node)["metadata"]["labels"][CLIQUE]


def _queue(c, ns: str, name: str, *, node_labels: dict[str, str], gpus: int = 160) -> None:
    objs = dev_kueue.queue_objects(name=name, namespace=ns, node_labels=node_labels, gpus=gpus)
    kapply(c, objs[:3])  # cluster-scoped: Topology, ResourceFlavor, ClusterQueue
    def active():
        cq = kget(c, "clusterqueues.kueue.x-k8s.io", name)
        return True if (condition(cq, "Active") or {}).get("status") == "True" else (cq or {}).get("status")

    wait_for(lambda: active() is True, timeout=60, what=f"ClusterQueue {name} Active (status: {active()})")
    kapply(c, objs[3])


def _drop_queue(c, name: str) -> None:
    for kind in ("clusterqueues", "resourceflavors", "topologies"):
        c.kubectl("delete", f"{kind}.kueue.x-k8s.io", name, "--wait=false", check=False)


def _doc(ns: str, name: str, *, queue: str | None, decode_replicas: int = 1, prefill_clique: str | None = None) -> dict:
    """The wide-EP example in ``ns``; ``queue``: its spec.scheduling.queueName (None: the operator's default)."""
    doc = load_example(WIDE_EP)
    doc["metadata"].update(namespace=ns, name=name)
    if queue is not None:
        doc["spec"]["scheduling"] = {"queueName": queue}
    doc["spec"]["decode"]["replicas"] = decode_replicas
    if prefill_clique:  # keep the (single-node, unqueued) prefill out of the contested rack
        doc["spec"]["prefill"]["nodeSelector"] = {CLIQUE: prefill_clique}
    return doc


def _bound(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["spec"].get("nodeName")]


def _workloads(c, ns: str) -> list[dict]:
    return (kget(c, "workloads.kueue.x-k8s.io", "-n", ns) or {}).get("items") or []


def _explain(c, ns: str, name: str) -> str:
    """What a timed-out wait in this module needs to show: the PDDeployment's conditions, every pod of
    the namespace (group, node, gates, why unscheduled), Kueue's Workloads and the ComputeDomains."""
    lines = []
    st = kget(c, "pdd", name, "-n", ns) or {}
    lines.append(f"pdd {name} generation {st.get('metadata', {}).get('generation')}: "
                 f"status {({k: v for k, v in (st.get('status') or {}).items() if k != 'conditions'})}")
    for cd in (st.get("status") or {}).get("conditions") or []:
        lines.append(f"  {cd['type']}={cd['status']} {cd.get('reason')} (gen {cd.get('observedGeneration')}): "
                     f"{cd.get('message', '')[:300]}")
    for p in (kget(c, "pods", "-n", ns) or {}).get("items") or []:
        labels = p["metadata"].get("labels") or {}
        sched = next((cd for cd in p["status"].get("conditions") or [] if cd["type"] == "PodScheduled"), {})
        claims = [r.get("resourceClaimTemplateName") for r in p["spec"].get("resourceClaims") or []]
        lines.append(f"  pod {p['metadata']['name']} group {labels.get(lws.LABEL_GROUP_INDEX)} "
                     f"phase {p['status'].get('phase')} node {p['spec'].get('nodeName')} "
                     f"gates {[g['name'] for g in p['spec'].get('schedulingGates') or []]} claims {claims} "
                     f"deleting {bool(p['metadata'].get('deletionTimestamp'))} "
                     f"scheduled {sched.get('status')} {sched.get('reason')} {sched.get('message', '')[:200]}")
    for w in _workloads(c, ns):
        conds = [(cd["type"], cd["status"], cd.get("reason"), cd.get("message", "")[:200])
                 for cd in (w.get("status") or {}).get("conditions") or []]
        lines.append(f"  workload {w['metadata']['name']} admitted {kueue.admitted(w)}: {conds}")
    for d in (kget(c, "computedomains.resource.nvidia.com", "-n", ns) or {}).get("items") or []:
        lines.append(f"  computedomain {d['metadata']['name']} numNodes {d['spec'].get('numNodes')} "
                     f"status {(d.get('status') or {}).get('status')} "
                     f"nodes {[n.get('name') for n in (d.get('status') or {}).get('nodes') or []]}")
    busy = [(p["metadata"]["namespace"], p["metadata"]["name"], p["spec"].get("nodeName"))
            for p in (kget(c, "pods", "-A") or {}).get("items") or []
            if (p["spec"].get("nodeName") or "").startswith("gb300-") and p["metadata"]["namespace"] != ns]
    lines.append(f"  pods of other namespaces on gb300 trays: {busy}")
    log = c.run_dir / "logs" / "imex-standin.log"
    if log.exists():
        lines.append("  imex-standin.log (last 10 lines):")
        lines += [f"    {ln[:300]}" for ln in log.read_text(errors="replace").splitlines()[-10:]]
    return "\n".join(lines)


def test_two_groups_competing_for_one_rack_are_admitted_one_at_a_time(kueue_cluster, queue_operator, ns):
    c = kueue_cluster
    rack0 = _clique(c, "gb300-0")
    _queue(c, ns, QUEUE, node_labels={CLIQUE: rack0})
    try:
        _compete(c, ns, rack0, prefill_clique=_clique(c, PREFILL_RACK[0]))
    finally:
        for dep in ("wide-ep-a", "wide-ep-b"):
            c.kubectl("delete", "pdd", dep, "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "localqueue", QUEUE, "-n", ns, "--wait=false", check=False)
        _drop_queue(c, QUEUE)


def _compete(c, ns: str, rack0: str, *, prefill_clique: str) -> None:
    kapply(c, [_doc(ns, "wide-ep-a", queue=QUEUE, prefill_clique=prefill_clique),
               _doc(ns, "wide-ep-b", queue=QUEUE, prefill_clique=prefill_clique)])
    samples = 0
    first = None

    def one_admitted():
        nonlocal samples, first
        both = list_pods(c, ns, "pd.sglang-operator.io/deployment in (wide-ep-a,wide-ep-b),pd.sglang-operator.io/role=decode")
        a = [p for p in both if p["metadata"]["labels"]["pd.sglang-operator.io/deployment"] == "wide-ep-a"]
        b = [p for p in both if p["metadata"]["labels"]["pd.sglang-operator.io/deployment"] == "wide-ep-b"]
        bound = {"wide-ep-a": len(_bound(a)), "wide-ep-b": len(_bound(b))}
        samples += 1
        # never half each: at any moment at most one group has a bound pod
        assert min(bound.values()) == 0, f"both groups hold trays of the rack at once: {bound}"
        winner = next((d for d, n in bound.items() if n == 16), None)
        ready = winner and ready_now(kget(c, "pdd", winner, "-n", ns))
        if ready and len(a) == len(b) == 16:
            first = winner
            return True
        return False

    started = time.monotonic()
    wait_for(one_admitted, timeout=300, interval=0.2, what="one group admitted whole and Ready",
             explain=lambda: _explain(c, ns, "wide-ep-a"))
    second = "wide-ep-b" if first == "wide-ep-a" else "wide-ep-a"
    held = _engine_pods(c, ns, first, "decode")
    placement = sorted((int(p["metadata"]["labels"][lws.LABEL_WORKER_INDEX]), p["spec"]["nodeName"]) for p in held)
    assert {_clique(c, n) for _, n in placement} == {rack0}
    # the other waits whole: every pod of its group exists, gated, none bound; its status says why (Kueue's words)
    waiting = _engine_pods(c, ns, second, "decode")
    assert len(waiting) == 16 and not _bound(waiting)
    gated = [p for p in waiting if any(cd.get("reason") == "SchedulingGated" for cd in p["status"].get("conditions") or [])]
    assert len(gated) == 16

    def says_why():
        st = kget(c, "pdd", second, "-n", ns)
        ready = condition(st, "Ready") or {}
        return st if ready.get("reason") == "WaitingForCapacity" else None

    st = wait_for(says_why, timeout=60, what=f"{second} Ready=False WaitingForCapacity")
    message = condition(st, "Ready")["message"]
    [mine] = [w for w in _workloads(c, ns) if not kueue.admitted(w)
              and w["metadata"]["annotations"].get("kueue.x-k8s.io/job-owner-name", "").startswith(second)]
    assert kueue.waiting_reason(mine) in message, (message, mine["status"])
    events = c.kubectl("get", "events", "-n", ns, "--field-selector",
                       f"involvedObject.name={second},reason=WaitingForCapacity", "-o", "name").stdout
    assert events.strip(), "a WaitingForCapacity event on the waiting PDDeployment"
    took = time.monotonic() - started
    print(f"\nKueue, one rack (clique {rack0}) for two DEP64 groups: {first} admitted whole and Ready "
          f"{took:.1f}s after apply ({samples} samples of both groups' pods, one LIST each, never both bound)")
    for rank, node in placement:
        print(f"  {first} decode rank {rank:2d} -> {node} -> clique {rack0}")
    print(f"  {second}: 16 pods gated, 0 bound; Ready=False WaitingForCapacity: {message}")

    # the first goes: the second is admitted, whole, into the same rack
    c.kubectl("delete", "pdd", first, "-n", ns, "--wait=false")
    freed = time.monotonic()

    def second_whole():
        pods = _engine_pods(c, ns, second, "decode")
        ok = ready_now(kget(c, "pdd", second, "-n", ns))
        return pods if ok and len(_bound(pods)) == 16 else None

    pods = wait_for(second_whole, timeout=300, what=f"{second} admitted whole and Ready",
                    explain=lambda: _explain(c, ns, second))
    later = sorted((int(p["metadata"]["labels"][lws.LABEL_WORKER_INDEX]), p["spec"]["nodeName"]) for p in pods)
    assert {_clique(c, n) for _, n in later} == {rack0}
    print(f"  {first} deleted: {second} admitted whole and Ready {time.monotonic() - freed:.1f}s later")
    for rank, node in later:
        print(f"  {second} decode rank {rank:2d} -> {node} -> clique {rack0}")


def test_two_replicas_fill_two_cliques(kueue_cluster, queue_operator, ns):
    """Also the operator's default queue: the PDDeployment names none, the chart's default admits it."""
    c = kueue_cluster
    name = "wide-ep-x2"
    _queue(c, ns, DEFAULT_QUEUE, node_labels={"pd.sglang-operator.io/accelerator": "gb300"})
    try:
        kapply(c, _doc(ns, name, queue=None, decode_replicas=2))
        started = time.monotonic()
        obj = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=420, what="two replicas Ready",
                       explain=lambda: _explain(c, ns, name))
        converged = time.monotonic() - started
        pods = _engine_pods(c, ns, name, "decode")
        assert len(pods) == 32
        by_group: dict[str, list[tuple[int, str, str]]] = {}
        for p in pods:
            node = p["spec"]["nodeName"]
            by_group.setdefault(p["metadata"]["labels"][lws.LABEL_GROUP_INDEX], []).append(
                (int(p["metadata"]["labels"][lws.LABEL_WORKER_INDEX]), node, _clique(c, node)))
        cliques = {g: {cl for _, _, cl in ranks} for g, ranks in by_group.items()}
        assert all(len(s) == 1 for s in cliques.values()), cliques  # each group inside one clique
        assert len(set().union(*cliques.values())) == 2, cliques  # the two groups in two cliques
        key = obj["status"]["compatKey"]
        # one ComputeDomain per replica: each Ready with exactly its group's 16 nodes, all in the group's clique
        for group, ranks in by_group.items():
            domain_name = f"{name}-{key[:6]}-decode-{group}"
            domain = kget(c, "computedomains.resource.nvidia.com", domain_name, "-n", ns)
            assert domain["spec"]["numNodes"] == 16 and domain["status"]["status"] == "Ready"
            assert {n["name"] for n in domain["status"]["nodes"]} == {node for _, node, _ in ranks}
            assert {n["cliqueID"] for n in domain["status"]["nodes"]} == cliques[group]
            claims = {p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] for p in pods
                      if p["metadata"]["labels"][lws.LABEL_GROUP_INDEX] == group}
            assert claims == {f"{domain_name}-channel"}
        assert len(kget(c, "computedomains.resource.nvidia.com", "-n", ns)["items"]) == 2
        assert obj["status"]["decode"]["replicas"] == "2/2"
        admitted = [w for w in _workloads(c, ns) if kueue.admitted(w)]
        assert len(admitted) == 2
        # through the default queue: the LeaderWorkerSet's label, Kueue's Workloads, and status say so
        assert "scheduling" not in kget(c, "pdd", name, "-n", ns)["spec"]
        group = kget(c, "leaderworkersets.leaderworkerset.x-k8s.io", f"{name}-{key[:6]}-decode", "-n", ns)
        assert group["metadata"]["labels"][kueue.QUEUE_LABEL] == DEFAULT_QUEUE
        assert {w["spec"]["queueName"] for w in admitted} == {DEFAULT_QUEUE}
        assert obj["status"]["scheduling"] == {"queueName": DEFAULT_QUEUE, "queueSource": "operatorDefault"}
        print(f"\nKueue, two DEP64 replicas of {name} (no queueName: the operator's default {DEFAULT_QUEUE}): "
              f"Ready {converged:.1f}s after apply, one clique each")
        for group in sorted(by_group):
            print(f"  decode group {group}: ComputeDomain {name}-{key[:6]}-decode-{group} Ready, 16 nodes")
            for rank, node, clique in sorted(by_group[group]):
                print(f"  decode group {group} rank {rank:2d} -> {node} -> clique {clique}")
    finally:
        c.kubectl("delete", "pdd", name, "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "localqueue", DEFAULT_QUEUE, "-n", ns, "--wait=false", check=False)
        _drop_queue(c, DEFAULT_QUEUE)


def test_a_group_that_fits_no_clique_waits_whole_and_says_why(kueue_cluster, queue_operator, ns):
    """The queue's only flavor is the partial rack (4 trays): a 16-rank group never fits. Kueue keeps all 16
    pods gated (none bound, ever: unlike the kube-scheduler alone, whose leader takes a tray while it waits,
    tests/e2e/test_nvlink.py), and the PDDeployment says WaitingForCapacity with Kueue's reason."""
    c = kueue_cluster
    partial = _clique(c, PREFILL_RACK[0])
    _queue(c, ns, "partial", node_labels={CLIQUE: partial})
    name = "wide-ep-too-big"
    try:
        kapply(c, _doc(ns, name, queue="partial", prefill_clique=partial))

        def waiting():
            st = kget(c, "pdd", name, "-n", ns)
            ready = condition(st, "Ready") or {}
            pods = _engine_pods(c, ns, name, "decode")
            return (st, pods) if ready.get("reason") == "WaitingForCapacity" and len(pods) == 16 else None

        st, pods = wait_for(waiting, timeout=180, what="the too-big group WaitingForCapacity with its 16 pods",
                            explain=lambda: _explain(c, ns, name))
        [workload] = _workloads(c, ns)
        assert not kueue.admitted(workload)
        reason = kueue.waiting_reason(workload)
        message = condition(st, "Ready")["message"]
        # Kueue's reason names the pod set it tried last (leader or worker), which alternates
        # between its scheduling attempts: compare with that name left out
        same = re.compile(r"pod set \w+")
        assert same.sub("pod set *", reason) in same.sub("pod set *", message) and "decode group 0" in message, (
            message, reason)
        assert st["status"]["scheduling"] == {"queueName": "partial", "queueSource": "spec"}  # the spec's wins
        # still none bound, and still waiting, after the operator looked again (its reconcile counter)
        c.kubectl("annotate", "pdd", name, "-n", ns, "e2e/poke=1", "--overwrite")
        looked(queue_operator, "PDDeployment", ns, name, more=1)
        assert (condition(kget(c, "pdd", name, "-n", ns), "Ready") or {}).get("reason") == "WaitingForCapacity"
        pods = _engine_pods(c, ns, name, "decode")
        assert len(pods) == 16 and not _bound(pods), [p["spec"].get("nodeName") for p in pods]
        assert not ready_now(kget(c, "pdd", name, "-n", ns))
        print(f"\nKueue, a DEP64 group whose queue has only the 4-tray partial rack: 16 pods gated, 0 bound; "
              f"Ready=False WaitingForCapacity: {message}")
    finally:
        c.kubectl("delete", "pdd", name, "-n", ns, "--wait=false", check=False)
        c.kubectl("delete", "localqueue", "partial", "-n", ns, "--wait=false", check=False)
        _drop_queue(c, "partial")
