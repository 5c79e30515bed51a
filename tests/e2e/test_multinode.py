"""Multi-node engines end to end: LeaderWorkerSet groups from one PDDeployment (issue 14).

Two parts:

1. Without the LeaderWorkerSet controller (runs on any dev cluster): a cluster of its
   own whose API server does not serve LeaderWorkerSets, nor ComputeDomains (no NVIDIA
   DRA driver: ``imex_channels=False``). A multi-node PDDeployment gets
   ``LeaderWorkerSetMissing`` naming what to install and creates nothing, while a
   single-node one beside it becomes Ready; then LWS's CRD (from its pinned Go module) is
   installed and the running operator notices on its own and creates the LeaderWorkerSet,
   which the real API server accepts against LWS's schema. In the same cluster, with
   LWS's CRD served, the wide-EP example with its default NVLink placement gets
   ``ComputeDomainMissing`` and creates nothing (checked after the operator looked again);
   the ComputeDomain CRD installed, the running operator creates the ComputeDomain and the
   LeaderWorkerSet.
2. Acceptance, with the real LWS controller of the dev cluster (its pod webhook injects
   LWS_LEADER_ADDRESS / LWS_WORKER_INDEX and the worker-index label; the session
   ``cluster`` runs it): the wide-EP example (DEP64 decode on 16 fake GB300 nodes)
   converges with every rank Running and Ready and each pod's command expanding to its
   own ``--node-rank`` and the leader's address; the real smg lists only leaders in
   ``/workers`` (an engine simulator answers on every pod IP, workers included);
   deleting one worker pod recreates its group only; a KV-layout change rolls both
   roles into new groups while a watcher proves no gateway ever selects two keys. The
   operator runs as the chart's ServiceAccount (a TokenRequest token; RBAC proven by use).
   These tests need that controller: on a cluster without it they skip, which fails
   under SGLANG_PD_OPERATOR_STRICT=1.

The largest run's pods, nodes and convergence time are printed (``-s``).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, ROOT, load_example
from kubernetes import client as k8s
from opkit import (OperatorProcess, condition, delete_lws_worker, kapply, kget, looked, model_store, pods, rbac_denials,
                   ready_now, wait_for)
from simkit import get_json, serve_pd, smg_binary
from test_helm import sa_kubeconfig
from test_rollout import _selector_keys

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api import lws
from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster import imex
from sglang_pd_operator_dev.cluster.demo import install_crds
from sglang_pd_operator.oracle.judge import expand_refs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LBL = "pd.sglang-operator.io"
WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"
MULTI_NODE = EXAMPLES / "dsv41-flash-gb300-multi-node.yaml"
CHART = ROOT / "charts" / "sglang-pd-operator"
RELEASE, OPERATOR_NS = "mn", "sglang-mn"
SA = f"{RELEASE}-sglang-pd-operator"


def _load_schemas():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kubeconform_schemas", ROOT / "hack" / "kubeconform" / "schemas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _doc(path: Path, ns: str, **role_replicas: int) -> dict:
    """The example in ``ns``, out of NVLink placement (``spec.placement.nvlinkDomain: none``): these tests
    are about LeaderWorkerSet groups; clique affinity and ComputeDomains are tests/e2e/test_nvlink.py's."""
    doc = load_example(path)
    doc["metadata"]["namespace"] = ns
    doc["spec"]["placement"] = {"nvlinkDomain": "none"}
    for role, n in role_replicas.items():
        doc["spec"][role]["replicas"] = n
    return doc


def _lws_served(cluster) -> bool:
    return cluster.kubectl("get", "crd", lws.CRD_NAME, check=False).returncode == 0


def _install_lws_crd(cluster) -> None:
    """LWS's CRD from its pinned Go module (what the dev cluster installs), Established."""
    crd = _load_schemas().lws_crds()[0]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(crd))
    established = lambda: (c := condition(kget(cluster, "crd", lws.CRD_NAME), "Established")) and c["status"] == "True"  # noqa: E731
    wait_for(established, timeout=60, what=f"{lws.CRD_NAME} Established")


# ---------------------------------------------------------------- 1. without the controller


#: The dev cluster's LWS webhook configurations (devtools/sglang_pd_operator_dev/cluster/lws.py: "lws-" + the module's names).
LWS_WEBHOOKS = (("mutatingwebhookconfiguration", "lws-mutating-webhook-configuration"),
                ("validatingwebhookconfiguration", "lws-validating-webhook-configuration"))


def _missing(c, ns: str, name: str, reason: str) -> str:
    """Wait until PDDeployment ``name`` is not reconciled for ``reason`` (an API the cluster does not serve);
    assert Valid True and Reconciled, Ready and Progressing False with that reason for its generation.
    Returns the message."""

    def missing():
        obj = kget(c, "pdd", name, "-n", ns)
        rec = condition(obj, "Reconciled")
        return obj if rec and rec["reason"] == reason else None

    obj = wait_for(missing, timeout=60, what=reason)
    conds = {t: condition(obj, t) for t in ("Valid", "Reconciled", "Ready", "Progressing")}
    assert conds["Valid"]["status"] == "True"
    for t in ("Reconciled", "Ready", "Progressing"):
        assert (conds[t]["status"], conds[t]["reason"]) == ("False", reason), conds[t]
        assert conds[t]["observedGeneration"] == obj["metadata"]["generation"]
    return conds["Reconciled"]["message"]


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory, cluster_log):
    """A dev cluster of this module's own, without LeaderWorkerSet and without NVIDIA's DRA driver:
    the harness's LWS controller stopped, its webhook configurations and CRD deleted (the session
    cluster's LWS must stay for part 2), no ComputeDomain API (``imex_channels=False``), i.e. a
    cluster where nobody installed either."""
    run_dir = tmp_path_factory.mktemp("bare-cluster")
    c = devcluster.start_cluster(run_dir=run_dir, log=cluster_log, imex_channels=False)
    try:
        if hasattr(devcluster, "stop_lws_controller"):
            devcluster.stop_lws_controller(run_dir)
        for kind, name in LWS_WEBHOOKS:
            c.kubectl("delete", kind, name, "--ignore-not-found")
        c.kubectl("delete", "crd", lws.CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")
        install_crds(c)
        yield c
    finally:
        c.stop(log=cluster_log)


def test_without_lws_nothing_is_created_until_it_is_installed(bare_cluster, tmp_path):
    c = bare_cluster
    ns = f"mn-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    kapply(c, model_store(ns))
    # the default resync (300 s): LWS installed later must be noticed without it
    op = OperatorProcess(kubeconfig=c.kubeconfig, log_path=tmp_path / "operator.log", resync=300).start()
    try:
        kapply(c, [_doc(WIDE_EP, ns), _doc(EXAMPLES / "dsv41-flash-h200-flashmla.yaml", ns)])

        message = _missing(c, ns, "dsv41-flash-wide-ep", "LeaderWorkerSetMissing")
        assert lws.API_VERSION in message and lws.TESTED_VERSIONS[0] in message and "kubectl apply" in message
        # nothing half-created: not the single-node prefill, not the gateway, not a Service
        wait_for(lambda: ready_now(kget(c, "pdd", "dsv41-flash-h200", "-n", ns)), timeout=90,
                 what="the single-node PDDeployment beside it Ready")
        for kind in ("deployments", "services", "configmaps", "kernelbuilds", "serviceaccounts"):
            got = kget(c, kind, "-n", ns, "-l", f"{LBL}/deployment=dsv41-flash-wide-ep")
            assert got is not None and got["items"] == [], (kind, got and [i["metadata"]["name"] for i in got["items"]])
        events = kget(c, "events", "-n", ns, "--field-selector", "involvedObject.name=dsv41-flash-wide-ep")
        assert [e["reason"] for e in events["items"] if e["type"] == "Warning"] == ["LeaderWorkerSetMissing"]

        # installing LWS later is noticed by the running operator (discovery, then a poll of the
        # kind kopf could not watch at start): the group is created and the API server takes it
        _install_lws_crd(c)
        installed = time.monotonic()
        made = wait_for(lambda: (got := kget(c, "leaderworkersets", "-n", ns)) and got["items"], timeout=60,
                        what="the LeaderWorkerSet created after LWS was installed")
        print(f"\nLWS installed: the operator created the group {time.monotonic() - installed:.1f}s later")
        (lws_obj,) = made
        assert lws_obj["spec"]["leaderWorkerTemplate"]["size"] == 16
        # the reconcile that applied it writes status after its writes
        reconciled = lambda: (o := kget(c, "pdd", "dsv41-flash-wide-ep", "-n", ns)) and \
            (condition(o, "Reconciled") or {}).get("status") == "True" and o  # noqa: E731
        obj = wait_for(reconciled, timeout=30, what="Reconciled True")
        # no LWS controller here: the group never gets pods, so the PDDeployment is not Ready
        assert condition(obj, "Ready")["status"] == "False"
        assert obj["status"]["decode"]["replicas"] == "0/1" and obj["status"]["decode"]["pods"] == "0/16"
        # the kind it did not find at start: the loop found it, lists and watches it, and says so
        wait_for(lambda: "leaderworkersets are served since the operator started" in op.log_tail(400), timeout=30,
                 what="the operator to watch leaderworkersets")
    finally:
        op.stop()
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_without_the_compute_domain_api_nothing_is_created_until_it_is_installed(bare_cluster, tmp_path):
    """ComputeDomainMissing on a real API server (issue 27 item 2): LWS's CRD is served (installed by the
    test above, or here when run alone), NVIDIA's ComputeDomain CRD is not."""
    c = bare_cluster
    assert c.kubectl("get", "crd", cd.CRD_NAME, check=False).returncode != 0, "this cluster must not serve ComputeDomains"
    if not _lws_served(c):
        _install_lws_crd(c)
    ns = f"cd-{uuid.uuid4().hex[:6]}"
    name = "dsv41-flash-wide-ep"
    c.kubectl("create", "namespace", ns)
    kapply(c, model_store(ns))
    # the default resync (300 s): the CRD installed later must be noticed without it
    op = OperatorProcess(kubeconfig=c.kubeconfig, log_path=tmp_path / "operator.log", resync=300).start()
    try:
        doc = load_example(WIDE_EP)  # as written: nvlinkDomain defaults to required on gb300
        doc["metadata"]["namespace"] = ns
        assert "placement" not in doc["spec"]
        kapply(c, doc)

        message = _missing(c, ns, name, "ComputeDomainMissing")
        for said in (cd.API_VERSION, cd.CRD_NAME, "nvidia-dra-driver-gpu", "nvlinkDomain: none", "decode nodes 16 on gb300"):
            assert said in message, (said, message)
        # proof the operator looked again (its own metrics; a label change queues it, no resync is due),
        # then nothing half-created: not the single-node prefill, not the gateway, not a Service, no LWS
        looked(op, "PDDeployment", ns, name, more=1,
               poke=lambda: c.kubectl("label", "pdd", name, "-n", ns, "e2e-poke=1", "--overwrite"))
        for kind in ("deployments", "services", "configmaps", "kernelbuilds", "serviceaccounts", "roles",
                     "rolebindings", "leaderworkersets", "resourceclaimtemplates"):
            got = kget(c, kind, "-n", ns, "-l", f"{LBL}/deployment={name}")
            assert got is not None and got["items"] == [], (kind, got and [i["metadata"]["name"] for i in got["items"]])
        assert (kget(c, "leaderworkersets", "-n", ns) or {"items": [None]})["items"] == []
        events = kget(c, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")
        assert [e["reason"] for e in events["items"] if e["type"] == "Warning"] == ["ComputeDomainMissing"]

        # the driver's CRD installed (the dev cluster's restatement of it; no controller runs here):
        # the running operator notices and creates the ComputeDomain and the LeaderWorkerSet
        c.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(imex.crd()))
        established = lambda: (x := condition(kget(c, "crd", cd.CRD_NAME), "Established")) and x["status"] == "True"  # noqa: E731
        wait_for(established, timeout=60, what=f"{cd.CRD_NAME} Established")
        installed = time.monotonic()

        def made():
            domains = (kget(c, "computedomains.resource.nvidia.com", "-n", ns) or {}).get("items") or []
            groups = (kget(c, "leaderworkersets", "-n", ns) or {}).get("items") or []
            return (domains, groups) if domains and groups else None

        (domain,), (group,) = wait_for(made, timeout=60, what="the ComputeDomain and LeaderWorkerSet created after the CRD")
        print(f"\nComputeDomain CRD installed: the operator created {domain['metadata']['name']} and its "
              f"LeaderWorkerSet {time.monotonic() - installed:.1f}s later")
        assert domain["spec"]["numNodes"] == 16 and group["spec"]["leaderWorkerTemplate"]["size"] == 16
        # replica 0's domain; the pod template names the placeholder the chart's admission policy replaces
        workload = group["metadata"]["name"]
        assert domain["metadata"]["name"] == cd.group_domain_name(workload, 0)
        assert domain["spec"]["channel"]["resourceClaimTemplate"]["name"] == f"{workload}-0-channel"
        template = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        assert [x["resourceClaimTemplateName"] for x in template["spec"]["resourceClaims"]] == \
            [cd.placeholder_template(workload)]
        assert template["metadata"]["labels"][cd.GROUP_DOMAIN_LABEL] == workload
        reconciled = lambda: (o := kget(c, "pdd", name, "-n", ns)) and \
            (condition(o, "Reconciled") or {}).get("status") == "True" and o  # noqa: E731
        obj = wait_for(reconciled, timeout=30, what="Reconciled True")
        assert condition(obj, "Ready")["status"] == "False"  # no LWS controller and no driver here: no pods
        wait_for(lambda: "computedomains are served since the operator started" in op.log_tail(400), timeout=30,
                 what="the operator to watch computedomains")
    finally:
        op.stop()
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# ---------------------------------------------------------------- 2. acceptance, with the LWS controller


@pytest.fixture(scope="module")
def lws_cluster(cluster, crds):
    """The session cluster, which must run the real LeaderWorkerSet controller (issue 14 part 1)."""
    if not _lws_served(cluster):
        pytest.skip("the dev cluster serves no LeaderWorkerSet API: its LWS controller (issue 14 part 1) is not "
                    "part of this checkout")
    return cluster


@pytest.fixture(scope="module")
def chart_operator(lws_cluster, tmp_path_factory):
    """``sglang-pd-operator run`` as the chart's ServiceAccount: the chart's ServiceAccount, RBAC and IMEX
    admission policy (``helm template``, nothing else of the chart) applied, and a TokenRequest token of it."""
    op = start_chart_operator(lws_cluster, tmp_path_factory.mktemp("chart-sa"))
    yield op
    stop_chart_operator(op)


def start_chart_operator(c, tmp: Path, *, sets: tuple[str, ...] = (), chart_flags: tuple[str, ...] = ()) -> OperatorProcess:
    """The operator of :func:`chart_operator`, started: the chart rendered with ``--set`` ``sets``, its
    ServiceAccount and RBAC applied, and of the operator container's rendered args those whose flag is in
    ``chart_flags`` (e.g. ``--default-queue-name``) passed on, so the chart's value is what reaches the flag."""
    c.kubectl("create", "namespace", OPERATOR_NS, check=False)
    args = ["template", RELEASE, str(CHART), "--namespace", OPERATOR_NS]
    for s in sets:
        args += ["--set", s]
    docs = [d for d in yaml.safe_load_all(c.helm(*args).stdout) if d]
    # the RBAC, and the admission policy that gives each replica its own IMEX channel (issue 27)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                             "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")]
    for d in rbac:
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            d["metadata"].setdefault("namespace", OPERATOR_NS)
    kapply(c, rbac)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    rendered = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    passed = [a for a in rendered if a.split("=", 1)[0] in chart_flags]
    assert len(passed) >= len(chart_flags), f"the chart rendered none of {chart_flags} with {sets}: {rendered}"
    kubeconfig = sa_kubeconfig(c, tmp / "kubeconfig", namespace=OPERATOR_NS, sa=SA)  # checks `auth whoami`
    return OperatorProcess(kubeconfig=kubeconfig, log_path=tmp / "operator.log", extra_args=[
        "--leader-elect", f"--leader-elect-lease={SA}", *passed],
        env={"POD_NAME": "mn-0", "POD_NAMESPACE": OPERATOR_NS}).start()


def stop_chart_operator(op: OperatorProcess) -> None:
    """Stop ``op``; fail when its log shows an RBAC denial (the chart's ServiceAccount lacks a permission)."""
    op.stop()
    log = op.log_path.read_text(errors="replace")
    bad = rbac_denials(log)
    assert not bad, "the chart's ServiceAccount hit RBAC denials:\n" + "\n".join(bad[:10])


def _engine_pods(c, ns: str, name: str, role: str | None = None) -> list[dict]:
    sel = f"{LBL}/deployment={name}," + (f"{LBL}/role={role}" if role else f"{LBL}/role in (prefill,decode)")
    return pods(c, ns, sel)


def _running_ready(pod: dict) -> bool:
    st = pod.get("status") or {}
    return st.get("phase") == "Running" and any(x["type"] == "Ready" and x["status"] == "True"
                                                for x in st.get("conditions") or [])


def _pod_env(pod: dict) -> dict[str, str]:
    (container,) = [x for x in pod["spec"]["containers"] if x["name"] == "sglang"]
    return {e["name"]: e.get("value", "") for e in container.get("env") or [] if "value" in e}


def _expanded_args(pod: dict) -> list[str]:
    """The engine container's args as the kubelet runs them ($(VAR) from the container's env)."""
    (container,) = [x for x in pod["spec"]["containers"] if x["name"] == "sglang"]
    env = _pod_env(pod)
    return [expand_refs(a, env) for a in container["args"]]


def test_wide_ep_converges_with_every_rank_ready_and_its_own_node_rank(lws_cluster, chart_operator, ns):
    c = lws_cluster
    started = time.monotonic()
    kapply(c, _doc(WIDE_EP, ns))
    name = "dsv41-flash-wide-ep"
    obj = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=300, what="wide-EP Ready")
    converged = time.monotonic() - started
    decode = _engine_pods(c, ns, name, "decode")
    prefill = _engine_pods(c, ns, name, "prefill")
    assert len(decode) == 16 and len(prefill) == 1
    nodes = {p["spec"]["nodeName"] for p in decode + prefill}
    assert len(nodes) == 17, "one whole GB300 node per engine pod"
    for p in decode + prefill:
        assert _running_ready(p), p["metadata"]["name"]
        node = kget(c, "node", p["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GB300"
    (leader,) = [p for p in decode if p["metadata"]["labels"][lws.LABEL_WORKER_INDEX] == "0"]
    leader_address = _pod_env(leader)[lws.ENV_LEADER_ADDRESS]
    assert leader_address.startswith(leader["metadata"]["name"] + "."), leader_address
    ranks = set()
    for p in decode:
        args = _expanded_args(p)
        rank = args[args.index("--node-rank") + 1]
        assert rank == p["metadata"]["labels"][lws.LABEL_WORKER_INDEX] == _pod_env(p)[lws.ENV_WORKER_INDEX]
        assert args[args.index("--dist-init-addr") + 1] == f"{leader_address}:20000"
        assert _pod_env(p)[lws.ENV_LEADER_ADDRESS] == leader_address
        ranks.add(int(rank))
    assert ranks == set(range(16))
    st = obj["status"]
    assert (st["decode"]["replicas"], st["decode"]["pods"], st["decode"]["nodesPerReplica"]) == ("1/1", "16/16", 16)
    assert st["pods"] == "17/17"
    table = c.kubectl("get", "pdd", name, "-n", ns).stdout
    assert "17/17" in table, table
    # the decode group's Service is the operator's, adopted by LWS as the pods' subdomain
    svc_name = f"{name}-{st['compatKey'][:6]}-decode"
    assert leader["spec"]["subdomain"] == svc_name
    svc = kget(c, "service", svc_name, "-n", ns)
    assert svc["spec"]["publishNotReadyAddresses"] is True and svc["metadata"]["labels"][f"{LBL}/role"] == "decode"
    # deleted while the group runs, LWS recreates its own (as controller): the operator's apply joins it
    c.kubectl("delete", "service", svc_name, "-n", ns)

    def service_back():
        got = kget(c, "service", svc_name, "-n", ns)
        rec = condition(kget(c, "pdd", name, "-n", ns), "Reconciled")
        labels = ((got or {}).get("metadata") or {}).get("labels") or {}
        return got if labels.get(f"{LBL}/role") == "decode" and rec and rec["status"] == "True" else None

    svc = wait_for(service_back, timeout=60, what="the group Service back with the operator's labels")
    assert svc["spec"]["selector"][f"{LBL}/compat-key"] == st["compatKey"]
    print(f"\nwide-EP: {len(decode) + len(prefill)} engine pods on {len(nodes)} GB300 nodes (+1 gateway pod), "
          f"Ready {converged:.1f}s after apply")


def test_smg_lists_only_leaders(lws_cluster, chart_operator, ns, procs):
    if smg_binary() is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed")
    c = lws_cluster
    name = "dsv41-flash-mn"
    kapply(c, _doc(MULTI_NODE, ns))
    ready = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=300, what="multi-node Ready")
    # a simulator on every engine pod, the workers' too (smg would register them if its selectors
    # matched), and the real smg with the rendered arguments, until it registered the leaders
    stack = serve_pd(c, procs, ready, sim_extra=[])
    assert len(stack.engine) == 6
    leaders = {f"http://{p['status']['podIP']}:30000" for p in stack.engine
               if p["metadata"]["labels"][lws.LABEL_WORKER_INDEX] == lws.LEADER_INDEX}
    assert len(leaders) == 2
    time.sleep(3)  # the workers' simulators answer too: time for smg to (wrongly) pick them up
    gateway = stack.gateway
    workers = get_json(gateway + "/workers")
    assert {w["url"] for w in workers["workers"]} == leaders, (workers, procs.log("smg"))
    assert workers["stats"]["prefill_count"] == 1 and workers["stats"]["decode_count"] == 1


def test_deleting_a_worker_recreates_its_group_only(lws_cluster, chart_operator, ns):
    c = lws_cluster
    name = "dsv41-flash-mn"
    kapply(c, _doc(MULTI_NODE, ns, decode=2))
    wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=300, what="Ready")
    decode = _engine_pods(c, ns, name, "decode")
    groups: dict[str, dict[str, str]] = {}
    for p in decode:
        groups.setdefault(p["metadata"]["labels"][lws.LABEL_GROUP_INDEX], {})[p["metadata"]["name"]] = p["metadata"]["uid"]
    assert sorted(groups) == ["0", "1"] and all(len(g) == 4 for g in groups.values())
    victim = next(n for n in groups["0"] if n.endswith("-0-2"))  # a worker (index 2) of group 0
    seen: list[str] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            r = condition(kget(c, "pdd", name, "-n", ns), "Ready")
            seen.append(r["status"] if r else "?")
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        deleted_at = delete_lws_worker(c, ns, victim)  # held Terminating until LWS deleted group 0's leader

        def recreated():
            group0 = [p for p in _engine_pods(c, ns, name, "decode") if p["metadata"]["labels"][lws.LABEL_GROUP_INDEX] == "0"]
            now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in group0 if _running_ready(p)}
            if len(now) == 4 and not set(now.values()) & set(groups["0"].values()):
                return now
            state.update({p["metadata"]["name"]: ("old" if p["metadata"]["uid"] in groups["0"].values() else "new",
                                                  (p.get("status") or {}).get("phase"), _running_ready(p),
                                                  bool(p["metadata"].get("deletionTimestamp"))) for p in group0})
            return None

        state: dict[str, tuple] = {}
        began = time.monotonic()
        try:
            wait_for(recreated, timeout=120, what="group 0 recreated, every pod new")
        except AssertionError as e:
            raise AssertionError(f"{e}; group 0 (name: uid old/new, phase, ready, terminating): {state}") from None
        print(f"group 0 recreated and Ready {time.monotonic() - began:.1f} s after LWS deleted its leader")
        obj = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=120, what="Ready again")
    finally:
        stop.set()
        thread.join(timeout=5)
    group1 = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _engine_pods(c, ns, name, "decode")
              if p["metadata"]["labels"][lws.LABEL_GROUP_INDEX] == "1"}
    assert group1 == groups["1"], "group 1 was touched"
    ready = condition(obj, "Ready")
    left = "False" in seen or time.mktime(time.strptime(ready["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")) >= deleted_at - 1
    assert left, f"the PDDeployment never left Ready ({seen[:20]} ...)"


@dataclass
class GroupWatcher:
    """Samples every gateway's selected keys and each group's readiness (Deployments and LeaderWorkerSets)."""

    api: k8s.ApiClient
    namespace: str
    name: str
    samples: list[tuple[dict[str, set[str]], dict[str, bool], str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self):
        sel = f"{LBL}/deployment={self.name}"
        apps, custom, core = k8s.AppsV1Api(self.api), k8s.CustomObjectsApi(self.api), k8s.CoreV1Api(self.api)
        gateways, parts = {}, {}
        for d in apps.list_namespaced_deployment(self.namespace, label_selector=sel).items:
            key, role = d.metadata.labels[f"{LBL}/compat-key"], d.metadata.labels[f"{LBL}/role"]
            parts.setdefault(key, {})[role] = bool(d.spec.replicas) and (d.status.ready_replicas or 0) == d.spec.replicas
            if role == "gateway":
                gateways[d.metadata.name] = _selector_keys(d.spec.template.spec.containers[0].args)
        for o in custom.list_namespaced_custom_object(lws.GROUP, lws.VERSION, self.namespace, lws.PLURAL,
                                                      label_selector=sel)["items"]:
            key, role = o["metadata"]["labels"][f"{LBL}/compat-key"], o["metadata"]["labels"][f"{LBL}/role"]
            want = o["spec"].get("replicas", 1)
            parts.setdefault(key, {})[role] = want > 0 and (o.get("status") or {}).get("readyReplicas", 0) == want
        try:
            service_key = (core.read_namespaced_service(self.name, self.namespace).spec.selector or {}).get(
                f"{LBL}/compat-key")
        except k8s.ApiException:
            service_key = None
        ready = {k: all(v.get(r, False) for r in ("prefill", "decode", "gateway")) for k, v in parts.items()}
        return gateways, ready, service_key

    def run(self):
        while not self._stop.is_set():
            self.samples.append(self.sample())
            time.sleep(0.05)

    def __enter__(self):
        self.samples.append(self.sample())
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)


def test_a_kv_layout_change_rolls_both_roles_into_new_groups_never_pairing_two_keys(lws_cluster, chart_operator, ns):
    c = lws_cluster
    name = "dsv41-flash-mn"
    doc = _doc(MULTI_NODE, ns)
    doc["spec"]["rollout"] = {"drainGracePeriod": "3s"}
    kapply(c, doc)
    old = wait_for(lambda: ready_now(kget(c, "pdd", name, "-n", ns)), timeout=300, what="Ready")["status"]["compatKey"]
    old_lws = {o["metadata"]["name"] for o in kget(c, "leaderworkersets", "-n", ns)["items"]}
    doc["spec"]["kvLayout"]["compressed"] = "fp8"  # v41 main layout: the compressed caches change, so does the key
    with GroupWatcher(c.api_client(), ns, name) as watcher:
        kapply(c, doc)
        obj = wait_for(lambda: (o := ready_now(kget(c, "pdd", name, "-n", ns))) and o["status"]["compatKey"] != old
                       and o["status"]["rollout"]["phase"] == "Complete" and o, timeout=300, what="rollout Complete")
        new = obj["status"]["compatKey"]
        wait_for(lambda: watcher.samples and set(watcher.samples[-1][1]) == {new}, timeout=60, what="old groups gone")
    assert obj["status"]["kvLayout"] != "v41,c1:v41_fp4,c2:v41_fp4"
    new_lws = {o["metadata"]["name"] for o in kget(c, "leaderworkersets", "-n", ns)["items"]}
    assert new_lws and not new_lws & old_lws and all(new[:6] in n for n in new_lws)  # both roles: new LWS objects
    for gateways, ready, service_key in watcher.samples:
        for gw, keys in gateways.items():
            assert len(keys) == 1, f"gateway {gw} selects compat keys {keys}"
        assert service_key is not None and ready.get(service_key), "the Service pointed at a group not Ready"
    assert any(len(s[1]) == 2 for s in watcher.samples), "the new groups never stood beside the old ones"
