"""No request fails across a paired rollout and a deleted gateway pod, with the traffic entering
through the gateway Service (issue 25, item 5).

Bounded load (loopback only; 3 requests per second, each about 1 s long, each on a new
connection; at most ``Load.max_requests``; it stops by itself) enters through the
PDDeployment's gateway Service, reaches the REAL smg of a gateway pod (two of them, each
with its pod's rendered arguments and its own Kubernetes discovery) and an engine simulator
per engine pod, while the operator (a separate process) makes each change:

1. a deleted gateway pod: the Service stops sending it new connections at once (its
   deletion timestamp), its rendered preStop waits until smg's own in-flight gauges read 0,
   then smg stops; the Deployment's replacement gets Ready only once its smg registered a
   prefill and a decode worker (``/readiness``);
   (then the control: a gateway's smg killed outright, SIGKILL, and then its pod deleted:
   what it loses is counted and reported, and must not be 0, or the load could not see a
   lost request);
2. a paired rollout (a new runtime image, so a new compat key): the new group comes up
   beside the old one, the operator cuts the Service over once the new group (its gateways
   included) is Ready, the old group drains for ``drainGracePeriod`` and is deleted: every
   old pod runs its preStop (gateways: smg's gauges; engines: SGLang's).

What stands in for what (``loadkit``): the kubelet's container start/stop and the Service
routing (kube-proxy cannot route here: the API server refuses loopback EndpointSlices; the
module docstring of ``loadkit`` says what was tried). Each row of the printed table: requests
sent / failed while the change ran, and the drain seconds of every pod that went away.
``SGLANG_PD_LOAD_TABLE=<file>`` also writes it as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import load_example
from loadkit import LBL, ChangeTable, KubeletStandIn, Load, ServiceProxyStandIn, print_table, smg_registered
from opkit import OperatorProcess, kapply, kget, pods, ready_now, wait_for
from simkit import Prober, probe_policy

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
SIM = ["--ttft-median", "0.05", "--itl-median", "0.05", "--itl-sigma", "0.05", "--prefill-median", "0.05"]
NEW_IMAGE = "lmsysorg/sglang:v0.5.23-cu130-post1"


def _doc(ns: str) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 2  # a deleted gateway pod's Service keeps the other one
    doc["spec"]["rollout"] = {"drainGracePeriod": "10s"}
    return doc


def _group_pods(cluster, ns: str, key: str, role: str | None = None) -> list[dict]:
    sel = f"{LBL}/deployment={NAME},{LBL}/compat-key={key}" + (f",{LBL}/role={role}" if role else "")
    return [p for p in pods(cluster, ns, sel) if not p["metadata"].get("deletionTimestamp")]


def _registered(cluster, ns: str, key: str) -> bool:
    return smg_registered(cluster, ns, NAME, key, gateways=2, prefill=1, decode=1)


def test_paired_rollout_and_a_deleted_gateway_pod_lose_no_request(cluster, crds, ns, procs, tmp_path, cluster_log):
    policy = probe_policy(ns, role=("prefill", "decode", "gateway"))  # Ready only once the rendered probes pass
    kapply(cluster, policy)
    time.sleep(2)  # the API server's admission chain picks up a new policy within about a second
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log").start()
    doc = _doc(ns)
    model = doc["spec"]["model"]
    rows: list[dict] = []
    routed: dict[str, int] = {}
    try:
        with (Prober(cluster.api_client(), ns),
              KubeletStandIn(cluster, procs, ns, NAME, model=model, sim_extra=SIM) as kubelet):
            kapply(cluster, doc)
            old = wait_for(lambda: ready_now(kget(cluster, "pdd", NAME, "-n", ns)), timeout=180,
                           what="Ready")["status"]["compatKey"]
            wait_for(lambda: _registered(cluster, ns, old), timeout=90, what="both gateways' smg registered 1P + 1D")
            with (ServiceProxyStandIn(cluster.api_client(), ns, NAME) as svc,
                  Load(svc.url, model["servedModelName"]) as load):
                time.sleep(3)  # a baseline under load
                table = ChangeTable(load, kubelet, rows)
                baseline = list(load.results)

                gone: list[str] = []

                def delete_gateway(crash: bool):
                    (gw, *_) = _group_pods(cluster, ns, old, "gateway")
                    gone.append(gw["metadata"]["name"])
                    if crash:
                        # the control kills a gateway with a request in flight through it (one sent and
                        # not yet answered), so that it has something to lose whatever the timing
                        wait_for(lambda: svc.awaiting(gone[-1]) >= 1, timeout=30, interval=0.02,
                                 what=f"a request in flight through {gone[-1]}")
                        kubelet.crash(gone[-1])
                    cluster.kubectl("delete", "pod", gone[-1], "-n", ns, "--wait=false")

                def replaced():
                    names = {p["metadata"]["name"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=gateway")}
                    return gone[-1] not in names and len(svc.endpoints) == 2 and _registered(cluster, ns, old)

                table.change("deleted gateway pod", lambda: delete_gateway(False), replaced)
                # the control: a gateway whose smg dies first (SIGKILL), then its pod is deleted (no preStop):
                # what it had in flight, and what the Service sent it before the deletion, fails
                kubelet.drain = False
                table.change("gateway smg killed, then its pod deleted (control, no drain)",
                             lambda: delete_gateway(True), replaced)
                kubelet.drain = True

                changed = _doc(ns)
                changed["spec"]["runtime"]["image"] = NEW_IMAGE
                new: dict[str, str] = {}

                def rolled_out():
                    o = ready_now(kget(cluster, "pdd", NAME, "-n", ns))
                    if not o or o["status"]["compatKey"] == old or o["status"]["rollout"]["phase"] != "Complete":
                        return False
                    new["key"] = o["status"]["compatKey"]
                    return (not pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/compat-key={old}")
                            and {p for p, _, _ in svc.endpoints}
                            == {p["metadata"]["name"] for p in _group_pods(cluster, ns, new["key"], "gateway")})

                table.change("paired rollout (new runtime image, new compat key)", lambda: kapply(cluster, changed),
                             rolled_out, timeout=300)
                routed = dict(svc.connections)
    finally:
        op.stop()
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
        print_table(rows, cluster_log, "no request lost (through the Service)")
        cluster_log(f"== connections per gateway pod (Service stand-in): {routed}")
        out = os.environ.get("SGLANG_PD_LOAD_TABLE")
        if out:
            Path(out).with_suffix(".rollout.json").write_text(json.dumps(rows, indent=1))
    assert baseline and all(r[2] for r in sorted(baseline)[:5]), "the load did not go through before the first change"
    assert len(rows) == 3
    assert not table.failed_outside(), table.failed_outside()  # no failure ended between the rows
    gateway_row, control_row, rollout_row = rows
    for row in rows:
        assert row["sent"] >= 3, row  # the change happened under load
        if "control" not in row["change"]:
            assert row["failed"] == 0, row
    assert control_row["failed"] >= 1, f"the control lost nothing: the harness cannot see a lost request {control_row}"
    # the deleted gateway ran its preStop (a number of seconds, not "no preStop")
    assert isinstance(gateway_row["drain_s"].get(gone[0]), float), gateway_row
    # every pod of the old group drained through its preStop: 2 gateways (one the replacement), prefill, decode
    old_pods = {p: s for p, s in rollout_row["drain_s"].items() if p.startswith(f"{NAME}-{old[:6]}-")}
    assert len(old_pods) == 4 and all(isinstance(s, float) for s in old_pods.values()), rollout_row
    # the Service sent traffic to the new group's gateways after the cutover
    assert any(p.startswith(f"{NAME}-{new['key'][:6]}-gateway") and n for p, n in routed.items()), routed


def test_the_service_stand_in_routes_to_what_the_endpointslice_controller_publishes(cluster, ns):
    """``ServiceProxyStandIn.ready_endpoints`` against the real EndpointSlice controller: on a node whose
    pod CIDR is not loopback (so the API server accepts the slices), a Ready pod, a NotReady pod and a
    terminating pod behind one Service with a named targetPort; the endpoints the stand-in would route
    to are exactly the ones the real slice says are ready."""
    node, app, cidr = f"drift-{ns}"[:63], f"drift-{ns}"[:63], "10.244.77.0/24"
    taint = {"key": "e2e.sglang-operator.io/drift", "value": "x", "effect": "NoSchedule"}
    cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": {"type": "kwok-drift"},
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": [taint]},
        "status": {"capacity": {"cpu": "8", "memory": "16Gi", "pods": "10"},
                   "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "10"}}}))
    held = "e2e.sglang-operator.io/hold"
    try:
        def pod(name: str, annotations: dict, finalizers: list) -> dict:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "annotations": annotations,
                                 "finalizers": finalizers},
                    "spec": {"nodeName": node, "tolerations": [{**taint, "operator": "Equal"}],
                             "containers": [{"name": "web", "image": "example.invalid/web:1",
                                             "ports": [{"name": "web", "containerPort": 8080}]}]}}

        kapply(cluster, [pod("ready", {}, []), pod("not-ready", {"pd.sglang-operator.io/kwok-ready": "false"}, []),
                         pod("terminating", {}, [held])])
        kapply(cluster, [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": app, "namespace": ns},
                          "spec": {"selector": {"app": app},
                                   "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}}])

        def ready_in(name):
            p = kget(cluster, "pod", name, "-n", ns) or {}
            return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])

        wait_for(lambda: ready_in("ready") and ready_in("terminating"), timeout=60, what="kwok ran the pods")
        cluster.kubectl("delete", "pod", "terminating", "-n", ns, "--wait=false")
        compared: dict = {}

        def agree():
            svc = kget(cluster, "service", app, "-n", ns)
            live = kget(cluster, "pods", "-n", ns, "-l", f"app={app}")["items"]
            slices = kget(cluster, "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={app}")["items"]
            real = {(a, port["port"]) for s in slices for e in s.get("endpoints") or []
                    if (e.get("conditions") or {}).get("ready") for a in e["addresses"] for port in s.get("ports") or []}
            terminating = {e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or []
                           if (e.get("conditions") or {}).get("terminating")}
            ours = {(ip, port) for _, ip, port in ServiceProxyStandIn.ready_endpoints(svc, live, "http")}
            compared.update(real=real, ours=ours, terminating=terminating)
            return "terminating" in terminating and len(live) == 3 and real == ours

        try:
            wait_for(agree, timeout=60, what="the stand-in's endpoints equal the real EndpointSlice's ready ones")
        except AssertionError as e:
            raise AssertionError(f"{e}: {compared}") from None
        ready_ip = kget(cluster, "pod", "ready", "-n", ns)["status"]["podIP"]
        assert compared["ours"] == {(ready_ip, 8080)}, compared  # NotReady and terminating pods get no new connection
    finally:
        cluster.kubectl("patch", "pod", "terminating", "-n", ns, "--type", "merge", "-p",
                        json.dumps({"metadata": {"finalizers": None}}), check=False)
        cluster.kubectl("delete", "pods", "-n", ns, "-l", f"app={app}", "--wait=false", check=False)
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
