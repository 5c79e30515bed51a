"""No request fails across scaling, pod deletion, in-place updates and operator restarts (issue 25, item 5).

Bounded load (loopback only: kwok pod IPs 127.10x.y.z; about 3 requests per second, each
about 1 s long (20 tokens); at most ``Load.max_requests``; it stops by itself) goes through the REAL smg
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
so "stop taking new requests" is smg's behaviour, not the harness's.

A drain that finds nothing running shows only the hook's floor (its 2 s settle and two
quiet reads): the deleted decode pod and the decode scale-down therefore run with long
generations (``LONG_TOKENS`` tokens, about 5 s each, from ``LONG_WARM_S`` before the change
until a decode pod is going away; smg routes round robin here, so both decode pods have
some, and the deleted pod is the busier one), so the pod's preStop finds
requests running (its gauges, read when the hook starts, are printed as "in flight at
preStop") and waits for them: their drain must
take longer than the in-place update's, whose decode pods had only 1 s requests, and no
request may fail. The operator restart's window closes only once the new operator has
reconciled the PDDeployment (``RESTART_RECONCILES`` on its own metrics). A paired rollout, a
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
from loadkit import ChangeTable, KubeletStandIn, Load, gauges_sum, print_table
from opkit import OperatorProcess, kapply, kget, pods, ready_now, reconciles, wait_for
from simkit import Prober, get_json, probe_policy, smg_binary, start_smg, wait_answering, with_address

from sglang_pd_operator.render.drain import ENGINE_GAUGES

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
SIM = ["--ttft-median", "0.05", "--itl-median", "0.05", "--itl-sigma", "0.05", "--prefill-median", "0.05"]
#: Tokens of a long generation: about 5 s at the simulator's 0.05 s per token (short ones: Load's 20, about 1 s).
LONG_TOKENS = 100
#: Seconds of long generations before a change, so that every decode pod has some running when it is made.
LONG_WARM_S = 3.0
#: Reconciles of the PDDeployment the restarted operator must have finished before its row's window closes.
RESTART_RECONCILES = 2
SHORT_TOKENS = Load.max_tokens
SIM_PORT = 30000  # each engine simulator's HTTP and /metrics port (simkit.start_simulator)


def _doc(ns: str) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["prefill"]["replicas"] = 2  # a deleted pod's role keeps serving through the other one
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["gateway"]["replicas"] = 1
    # smg's default cache_aware sends the load's one prompt ("hi") to one decode worker and leaves the other
    # idle; round_robin keeps both busy, so whichever pod a scale-down takes has requests in flight
    doc["spec"]["gateway"]["policy"] = "round_robin"
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
    # a drain that found long generations running waited for them: longer than a drain of decode pods
    # that had only 1 s requests (the in-place update's), by more than the poll interval
    (in_place,) = [row for row in table if row["change"].startswith("in-place update")]
    idle = max(in_place["drain_s"].values())
    long_rows = [row for row in table if "long generations" in row["change"]]
    assert len(long_rows) == 2, table
    for row in long_rows:
        assert all(n > 0 for n in row["in_flight"].values()) and row["in_flight"], row
        assert all(s > idle + 1.0 for s in row["drain_s"].values()), (row, idle)
    (restart_row,) = [row for row in table if row["change"] == "operator restart"]
    assert restart_row["reconciles"] >= RESTART_RECONCILES, restart_row


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

    def delete(role, victim=None):
        victim = victim or _engine_pods(cluster, ns, role)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
        return victim

    chosen: dict[str, float] = {}

    def busiest_decode() -> str:
        """The decode pod with the most requests in flight; every decode pod's count is kept in ``chosen``."""
        busy = {p["metadata"]["name"]: gauges_sum(p["status"]["podIP"], SIM_PORT, list(ENGINE_GAUGES))
                for p in _engine_pods(cluster, ns, "decode")}
        chosen.clear()
        chosen.update(busy)
        return max(busy, key=busy.get)

    def scale_down():
        busiest_decode()  # the counts before (the ReplicaSet controller picks the pod that goes)
        cluster.kubectl("patch", "pdd", NAME, "-n", ns, "--type", "merge",
                        "-p", json.dumps({"spec": {"decode": {"replicas": 1}}}))

    def long_generations(act, taken=lambda: True):
        """``act`` made while long generations run on every decode pod, until ``taken()`` (a decode pod is
        going away); short requests again from then on."""
        def run():
            table.load.max_tokens = LONG_TOKENS
            time.sleep(LONG_WARM_S)
            try:
                act()
                wait_for(taken, timeout=60, interval=0.1, what="a decode pod going away")
            finally:
                table.load.max_tokens = SHORT_TOKENS
        return run

    gone: list[str] = []
    row = change("deleted decode pod (long generations in flight)",
                 long_generations(lambda: gone.append(delete("decode", busiest_decode()))),
                 lambda: gone and _gone(cluster, ns, "decode", set(gone), 2) and _workers(gateway) == (2, 2))
    row["note"] = f"(decode pods' requests in flight when the busiest was chosen: {chosen}) "
    gone_prefill: list[str] = []
    change("deleted prefill pod",
           lambda: gone_prefill.append(delete("prefill")),
           lambda: (gone_prefill and _gone(cluster, ns, "prefill", set(gone_prefill), 2)
                    and _workers(gateway) == (2, 2)))

    restarted: list[OperatorProcess] = []

    def restart():
        op.stop()
        restarted.append(OperatorProcess(kubeconfig=cluster.kubeconfig,
                                         log_path=tmp_path / "operator-2.log").start())

    def reconciled() -> float:
        """Reconciles of the PDDeployment the restarted operator finished (0 until its metrics answer)."""
        try:
            return reconciles(restarted[0], "PDDeployment", ns, NAME)
        except OSError:
            return 0.0

    row = change("operator restart", restart,
                 lambda: (restarted and reconciled() >= RESTART_RECONCILES and _ready(cluster, ns)
                          and _workers(gateway) == (2, 2)))
    row["reconciles"] = reconciled()
    row["note"] = f"(the new operator reconciled the PDDeployment {row['reconciles']:.0f} times) "

    # the control: a decode pod killed outright (no preStop) loses what it had in flight
    kubelet.drain = False
    gone_killed: list[str] = []
    change("deleted decode pod, killed outright (control, no drain)",
           lambda: gone_killed.append(delete("decode")),
           lambda: (gone_killed and _gone(cluster, ns, "decode", set(gone_killed), 2)
                    and _workers(gateway) == (2, 2)))
    kubelet.drain = True

    toleration = {"key": "example.com/e2e", "operator": "Exists", "effect": "NoSchedule"}
    before = {p["metadata"]["name"] for p in _engine_pods(cluster, ns, "decode")}
    change("in-place update (decode toleration)",
           lambda: cluster.kubectl("patch", "pdd", NAME, "-n", ns, "--type", "merge",
                                   "-p", json.dumps({"spec": {"decode": {"tolerations": [toleration]}}})),
           lambda: (_ready(cluster, ns) and _gone(cluster, ns, "decode", before, 2)
                    and _workers(gateway) == (2, 2)))

    row = change("decode scale-down 2->1 (long generations in flight)",
                 long_generations(scale_down, lambda: len(_engine_pods(cluster, ns, "decode")) < 2),
                 lambda: _ready(cluster, ns) and _gone(cluster, ns, "decode", set(), 1)
                 and _workers(gateway) == (2, 1))
    row["note"] = f"(decode pods' requests in flight just before the patch: {chosen}) "
    if restarted:
        restarted[0].stop()
