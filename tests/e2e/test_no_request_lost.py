"""No request fails across scaling, pod deletion, in-place updates and operator restarts (issue 25, item 5).

Bounded load (loopback only: kwok pod IPs 127.10x.y.z; about 3 requests per second, each
about 1 s long; at most ``MAX_REQUESTS``; it stops by itself) goes through the REAL smg
gateway (its Kubernetes discovery, the operator's rendered arguments) to one engine
simulator per engine pod, while the operator (a separate process) makes each change.

The kubelet's container start and stop is played by ``loadkit.KubeletStandIn`` (engine pods
here: the test starts smg on the gateway pod's address itself): it starts a simulator for
every engine pod that gets an IP, runs a deleted pod's rendered preStop hook (timed: the
drain cost per change) before it stops the simulator, and holds each pod with a finalizer
until then, as a kubelet holds a terminating pod and its IP. For one control change it stops
the simulator at once instead (a pod killed outright): the requests that loses are counted
and reported, not asserted.

smg removes a worker when its pod's deletion timestamp appears (its own discovery code),
so "stop taking new requests" is smg's behaviour, not the harness's. A paired rollout, a
deleted gateway pod and the release upgrade under load enter through the gateway Service
(``loadkit.ServiceProxyStandIn``): test_no_request_lost_rollout.py and test_release_upgrade.py.

The table of requests sent / failed and the drain time per change is printed (``-s``)
and, with ``SGLANG_PD_LOAD_TABLE=<file>``, written as JSON.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import load_example
from loadkit import ChangeTable, KubeletStandIn, Load, print_table
from opkit import OperatorProcess, kapply, kget, pods, ready_now, wait_for
from simkit import Prober, get_json, probe_policy, smg_binary, start_smg, wait_answering, with_address

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
SIM = ["--ttft-median", "0.05", "--itl-median", "0.05", "--itl-sigma", "0.05", "--prefill-median", "0.05"]


def _doc(ns: str) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["prefill"]["replicas"] = 2  # a deleted pod's role keeps serving through the other one
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["gateway"]["replicas"] = 1
    doc["spec"]["rollout"] = {"drainGracePeriod": "20s"}
    return doc


def _ready(cluster, ns):
    return ready_now(kget(cluster, "pdd", NAME, "-n", ns))


def _workers(gateway: str) -> tuple[int, int]:
    stats = get_json(gateway + "/workers")["stats"]
    return stats["prefill_count"], stats["decode_count"]


def _engine_pods(cluster, ns, role):
    return [p for p in pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role={role}")
            if not p["metadata"].get("deletionTimestamp")]


def _gone(cluster, ns, role, before: set[str], count: int) -> bool:
    """None of ``before`` is left (not even terminating: the stand-in lets a pod go once drained)
    and ``count`` pods of ``role`` exist."""
    now = {p["metadata"]["name"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role={role}")}
    return not (before & now) and len(now) == count


def test_no_request_fails_across_scale_down_pod_deletion_in_place_update_and_operator_restart(
        cluster, crds, ns, procs, tmp_path, cluster_log):
    if smg_binary() is None:
        pytest.fail("the smg binary (smg==1.13.0) is not installed: ./hack/setup.sh --contract installs it")
    policy = probe_policy(ns, role=("prefill", "decode"))  # engine pods Ready only once their probes pass
    kapply(cluster, policy)
    time.sleep(2)  # the API server's admission chain picks up a new policy within about a second
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log").start()
    table: list[dict] = []
    changes = None
    doc = _doc(ns)
    model = doc["spec"]["model"]
    try:
        with (Prober(cluster.api_client(), ns),
              KubeletStandIn(cluster, procs, ns, NAME, model=model, sim_extra=SIM, gateways=False) as kubelet):
            kapply(cluster, doc)
            ready = wait_for(lambda: _ready(cluster, ns), timeout=120, what="Ready")
            gateway = _start_gateway(cluster, procs, ns, ready)
            with Load(gateway, model["servedModelName"]) as load:
                time.sleep(3)  # a baseline under load
                changes = ChangeTable(load, kubelet, table)
                _changes(cluster, ns, tmp_path, op, kubelet, changes, gateway)
                baseline = list(load.results)
    finally:
        op.stop()
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
        print_table(table, cluster_log, "no request lost")
        out = os.environ.get("SGLANG_PD_LOAD_TABLE")
        if out:
            Path(out).write_text(json.dumps(table, indent=1))
    assert baseline and all(r[2] for r in sorted(baseline)[:5]), "the load did not go through before the first change"
    assert len(table) == 6
    assert not changes.failed_outside(), changes.failed_outside()  # no failure ended between the rows
    for row in table:
        assert row["sent"] >= 3, row  # the change happened under load
        if "control" not in row["change"]:
            assert row["failed"] == 0, row
    drained = [row for row in table if ("deleted" in row["change"] or "scale-down" in row["change"])
               and "control" not in row["change"]]
    assert all(row["drain_s"] for row in drained), table  # the preStop ran for every pod that went away


def _start_gateway(cluster, procs, ns: str, ready: dict) -> str:
    """The real smg with the operator's rendered arguments on the gateway pod's address, once it
    registered both prefill and decode pods; returns its URL."""
    key = ready["status"]["compatKey"]
    rendered = kget(cluster, "deployment", f"{NAME}-{key[:6]}-gateway", "-n", ns)
    rendered = rendered["spec"]["template"]["spec"]["containers"][0]["args"]
    (gw_pod,) = pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=gateway")
    args = with_address(rendered, host=gw_pod["status"]["podIP"])
    gateway = f"http://{gw_pod['status']['podIP']}:{args[args.index('--port') + 1]}"
    start_smg(procs, args, kubeconfig=cluster.kubeconfig)
    wait_answering([gateway + "/health"], timeout=30)
    wait_for(lambda: _workers(gateway) == (2, 2), timeout=90, what="smg registered 2 prefill + 2 decode")
    return gateway


def _changes(cluster, ns, tmp_path, op, kubelet, table: ChangeTable, gateway) -> None:
    """Each change under load, one row of ``table`` each."""
    change = table.change

    def delete(role):
        (victim, *_) = _engine_pods(cluster, ns, role)
        cluster.kubectl("delete", "pod", victim["metadata"]["name"], "-n", ns, "--wait=false")
        return victim["metadata"]["name"]

    for role in ("decode", "prefill"):
        gone: list[str] = []
        change(f"deleted {role} pod",
               lambda r=role: gone.append(delete(r)),
               lambda r=role: (gone and _gone(cluster, ns, r, set(gone), 2)
                               and _workers(gateway) == (2, 2)))

    restarted: list[OperatorProcess] = []

    def restart():
        op.stop()
        restarted.append(OperatorProcess(kubeconfig=cluster.kubeconfig,
                                         log_path=tmp_path / "operator-2.log").start())

    change("operator restart", restart,
           lambda: restarted and _ready(cluster, ns) and _workers(gateway) == (2, 2))

    toleration = {"key": "example.com/e2e", "operator": "Exists", "effect": "NoSchedule"}
    before = {p["metadata"]["name"] for p in _engine_pods(cluster, ns, "decode")}
    change("in-place update (decode toleration)",
           lambda: cluster.kubectl("patch", "pdd", NAME, "-n", ns, "--type", "merge",
                                   "-p", json.dumps({"spec": {"decode": {"tolerations": [toleration]}}})),
           lambda: (_ready(cluster, ns) and _gone(cluster, ns, "decode", before, 2)
                    and _workers(gateway) == (2, 2)))

    # the control: a decode pod killed outright (no preStop) loses what it had in flight
    kubelet.drain = False
    gone_killed: list[str] = []
    change("deleted decode pod, killed outright (control, no drain)",
           lambda: gone_killed.append(delete("decode")),
           lambda: (gone_killed and _gone(cluster, ns, "decode", set(gone_killed), 2)
                    and _workers(gateway) == (2, 2)))
    kubelet.drain = True

    change("decode scale-down 2->1",
           lambda: cluster.kubectl("patch", "pdd", NAME, "-n", ns, "--type", "merge",
                                   "-p", json.dumps({"spec": {"decode": {"replicas": 1}}})),
           lambda: _ready(cluster, ns) and _gone(cluster, ns, "decode", set(), 1)
           and _workers(gateway) == (2, 1))
    if restarted:
        restarted[0].stop()
