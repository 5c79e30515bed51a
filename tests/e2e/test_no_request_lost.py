"""No request fails across scaling, pod deletion, in-place updates and operator restarts (issue 25, item 5).

Bounded load (loopback only: kwok pod IPs 127.10x.y.z; about 3 requests per second, each
about 1 s long; at most ``MAX_REQUESTS``; it stops by itself) goes through the REAL smg
gateway (its Kubernetes discovery, the operator's rendered arguments) to one engine
simulator per engine pod, while the operator (a separate process) makes each change.

kwok runs no container, so two parts of the kubelet are played here, named for what they
stand in for:

- :class:`KubeletStandIn` starts a simulator for every engine pod that gets an IP (the
  container starting) and, when a pod is deleted (its deletion timestamp, or it is gone),
  runs the pod's rendered preStop hook (the exact command: ``python3`` is this
  interpreter, the pod's loopback is its IP, as ``simkit.run_probe`` does for exec probes)
  and then stops the simulator (SIGTERM), timing the hook: the drain cost per change.
- For one control change it stops the simulator at once instead (a pod killed outright):
  the requests that loses are counted and reported, not asserted.
- It holds each engine pod with a finalizer until the pod's simulator has stopped, as a
  kubelet holds a terminating pod (and its IP) until its containers are gone: kwok alone
  deletes a pod at once and hands its IP to the next pod, whose simulator then cannot
  bind it while the old one drains.

smg removes a worker when its pod's deletion timestamp appears (its own discovery code),
so "stop taking new requests" is smg's behaviour, not the harness's. A paired rollout and
the release upgrade under load need a stand-in for Service routing (no kube-proxy here)
and are not covered here; tests/e2e/test_rollout.py and test_release_upgrade.py cover
their objects.

The table of requests sent / failed and the drain time per change is printed (``-s``)
and, with ``SGLANG_PD_LOAD_TABLE=<file>``, written as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import load_example
from opkit import OperatorProcess, kapply, kget, pods, ready_now, wait_for
from simkit import (POD_LOOPBACK, Prober, get_json, probe_policy, smg_binary, start_simulator, start_smg,
                    wait_answering, with_address)

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
MAX_REQUESTS = 1500
RATE_PER_S = 3.0
MAX_TOKENS = 20
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


@dataclass
class Load:
    """Open-loop requests at ``RATE_PER_S`` through the gateway; each one's (start, end, ok, why)."""

    gateway: str
    model: str
    results: list[tuple[float, float, bool, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _one(self) -> None:
        t0 = time.monotonic()
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": MAX_TOKENS}).encode()
        req = urllib.request.Request(self.gateway + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer = json.loads(resp.read())
                ok = resp.status == 200 and bool(answer["choices"][0]["message"]["content"])
                why = "" if ok else f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            ok, why = False, f"HTTP {err.code} {err.read()[:120]!r}"
        except Exception as err:  # noqa: BLE001 - every failure is counted, with its reason
            ok, why = False, f"{type(err).__name__}: {err}"
        self.results.append((t0, time.monotonic(), ok, why))

    def _run(self) -> None:
        sent = 0
        next_at = time.monotonic()
        while not self.stop.is_set() and sent < MAX_REQUESTS:
            threading.Thread(target=self._one, daemon=True).start()
            sent += 1
            next_at += 1.0 / RATE_PER_S
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "Load":
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        deadline = time.monotonic() + 70
        while time.monotonic() < deadline and threading.active_count() > 3 and self._inflight():
            time.sleep(0.2)

    def _inflight(self) -> bool:
        return any(t.name.startswith("Thread") and t.is_alive() and t is not self.thread
                   for t in threading.enumerate())

    def between(self, start: float, end: float) -> list[tuple[float, float, bool, str]]:
        """Requests sent in [start, end)."""
        return [r for r in list(self.results) if start <= r[0] < end]


class KubeletStandIn:
    """The kubelet's container start and stop for engine pods (see the module docstring)."""

    FINALIZER = "e2e.sglang-operator.io/kubelet-stand-in"

    def __init__(self, cluster, procs, ns: str, *, model: dict, drain: bool = True) -> None:
        self.cluster, self.procs, self.ns, self.model, self.drain = cluster, procs, ns, model, drain
        self.running: dict[str, dict] = {}  # pod name -> pod as it was started
        self.drains: list[tuple[str, float, str]] = []  # (pod, seconds, hook output)
        self.killed: list[str] = []
        self.stop = threading.Event()
        self.busy = 0
        self.lock = threading.Lock()

    def adopt(self, pods_: list[dict]) -> None:
        """Pods whose simulators the test started itself (``serve_pd``)."""
        for p in pods_:
            self._hold(p["metadata"]["name"], True)
            self.running[p["metadata"]["name"]] = p

    def _hold(self, name: str, on: bool) -> None:
        """Add (or remove) the finalizer that keeps a terminating pod, and its IP, until its simulator stopped."""
        patch = {"metadata": {"finalizers": [self.FINALIZER] if on else None}}
        self.cluster.kubectl("patch", "pod", name, "-n", self.ns, "--type", "merge", "-p", json.dumps(patch),
                             check=False)

    def _stop_pod(self, name: str, pod: dict) -> None:
        try:
            if self.drain:
                c = pod["spec"]["containers"][0]
                cmd = c["lifecycle"]["preStop"]["exec"]["command"]
                argv = [pod["status"]["podIP"] if a == POD_LOOPBACK else a for a in cmd]
                argv[0] = sys.executable
                t0 = time.monotonic()
                res = subprocess.run(argv, capture_output=True, text=True,
                                     timeout=pod["spec"]["terminationGracePeriodSeconds"])
                self.drains.append((name, time.monotonic() - t0, (res.stdout + res.stderr).strip()))
            else:
                self.killed.append(name)
            self.procs.stop(name)
            self._hold(name, False)
        finally:
            with self.lock:
                self.busy -= 1

    def _loop(self) -> None:
        sel = f"{LBL}/deployment={NAME},{LBL}/role in (prefill,decode)"
        while not self.stop.is_set():
            try:
                now = {p["metadata"]["name"]: p for p in pods(self.cluster, self.ns, sel)}
            except Exception:  # noqa: BLE001 - the next look retries
                now = None
            if now is not None:
                for name, p in now.items():
                    if (name not in self.running and not p["metadata"].get("deletionTimestamp")
                            and p["status"].get("podIP")):
                        self._hold(name, True)
                        start_simulator(self.procs, p, model=self.model["name"],
                                        served_model_name=self.model["servedModelName"], extra=SIM)
                        self.running[name] = p
                for name in list(self.running):
                    p = now.get(name)
                    if p is None or p["metadata"].get("deletionTimestamp"):
                        pod = self.running.pop(name)
                        with self.lock:
                            self.busy += 1
                        threading.Thread(target=self._stop_pod, args=(name, pod), daemon=True).start()
            self.stop.wait(0.2)

    def settled(self) -> bool:
        with self.lock:
            return self.busy == 0

    def __enter__(self) -> "KubeletStandIn":
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        deadline = time.monotonic() + 60
        while not self.settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in list(self.running):  # the namespace's teardown waits for its pods to go
            self._hold(name, False)


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
    doc = _doc(ns)
    model = doc["spec"]["model"]
    try:
        with Prober(cluster.api_client(), ns), KubeletStandIn(cluster, procs, ns, model=model) as kubelet:
            kapply(cluster, doc)
            ready = wait_for(lambda: _ready(cluster, ns), timeout=120, what="Ready")
            gateway = _start_gateway(cluster, procs, ns, ready)
            with Load(gateway, model["servedModelName"]) as load:
                time.sleep(3)  # a baseline under load
                _changes(cluster, ns, tmp_path, op, kubelet, load, gateway, table)
                baseline = list(load.results)
    finally:
        op.stop()
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
        for row in table:
            cluster_log(f"== no request lost: {row['change']}: sent {row['sent']}, failed {row['failed']}, "
                        f"drain {row['drain_s']} s, window {row['seconds']} s {row['failures'] or ''}")
        out = os.environ.get("SGLANG_PD_LOAD_TABLE")
        if out:
            Path(out).write_text(json.dumps(table, indent=1))
    assert baseline and all(r[2] for r in sorted(baseline)[:5]), "the load did not go through before the first change"
    assert len(table) == 6
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


def _changes(cluster, ns, tmp_path, op, kubelet, load, gateway, table) -> None:
    """Each change under load, one row of ``table`` each."""

    def change(what: str, act, converged) -> None:
        drains_before = len(kubelet.drains)
        start = time.monotonic()
        act()
        wait_for(lambda: converged() and kubelet.settled(), timeout=120, interval=0.3, what=what)
        time.sleep(2)  # requests sent just before convergence finish inside the window
        end = time.monotonic()
        sent = load.between(start, end)
        failed = [r for r in sent if not r[2]]
        drains = kubelet.drains[drains_before:]
        table.append({"change": what, "sent": len(sent), "failed": len(failed),
                      "drain_s": [round(d[1], 1) for d in drains], "seconds": round(end - start, 1),
                      "failures": sorted({r[3] for r in failed})[:3]})

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
