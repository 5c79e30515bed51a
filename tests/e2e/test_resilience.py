"""Two operators on one cluster, and an API connection that hangs: the control loop's resilience.

1. Two ``sglang-pd-operator run`` processes started with the default leader-election
   flags against one cluster: only one reconciles (the other's writes and reconciles,
   read from its own /metrics, stay at 0), the log names who leads, and when the leader
   is killed (-9, no release) the other takes over and reconciles the next edit; a third
   started with ``--no-leader-elect`` refuses to run beside it (exit 2).
2. A hung API connection: the operator reaches the API server through a loopback TCP
   proxy (:class:`StallingProxy`) that, on command, freezes every established
   connection (no byte forwarded, nothing closed: what a half-open connection looks
   like), and later also accepts new connections and never answers. The test plays the
   kubelet: it restarts the process when it exits or when ``/healthz`` on the metrics
   port (the chart's liveness probe) fails three times in a row. The operator must
   reconcile an edit made meanwhile, by recovering or by being restarted; alive with a
   green probe and not reconciling is the failure ("frozen silently").

Each test fails on 468abb0 (leader election off by default; no timeout on any call).
"""

from __future__ import annotations

import re
import signal
import time
import urllib.error
import urllib.request

import pytest
from helpers import ROOT, load_example
from netkit import StallingProxy, proxied_kubeconfig
from opkit import OperatorProcess, condition, kapply, kget, looked, wait_for

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
LEASE, LEASE_NS = "sglang-pd-operator", "default"  # the defaults: no --operator-namespace, no kubeconfig namespace


def _spec(ns: str, decode: int) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["decode"]["replicas"] = decode
    return doc


def _reconciled(cluster, ns: str, decode: int):
    """The PDDeployment's status speaks for its generation and the decode Deployment asks for ``decode`` pods."""
    obj = kget(cluster, "pddeployment", NAME, "-n", ns)
    if not obj or (obj.get("status") or {}).get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    deps = (kget(cluster, "deployments", "-n", ns, "-l", f"{LBL}/deployment={NAME},{LBL}/role=decode") or {}).get("items")
    return obj if deps and all(d["spec"]["replicas"] == decode for d in deps) else None


def _ready(cluster, ns: str):
    obj = kget(cluster, "pddeployment", NAME, "-n", ns)
    c = condition(obj, "Ready")
    return obj if c and c["status"] == "True" and c.get("observedGeneration") == obj["metadata"]["generation"] else None


def _metric(op: OperatorProcess, name: str) -> float:
    """Sum of one family on the process's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _work(op: OperatorProcess) -> tuple[float, float]:
    """(API writes, PDDeployment reconciles) the process counted."""
    return (_metric(op, "sglang_pd_operator_api_writes_total"),
            _metric(op, "sglang_pd_operator_reconcile_duration_seconds_count"))


def _log(op: OperatorProcess) -> str:
    return op.log_path.read_text(errors="replace") if op.log_path.exists() else ""


def _holder(cluster) -> str | None:
    return ((kget(cluster, "lease", LEASE, "-n", LEASE_NS) or {}).get("spec") or {}).get("holderIdentity")


def _leads(op: OperatorProcess) -> str | None:
    """The identity the process logged when it acquired the Lease, None before."""
    m = re.search(r"acquired the leader lease \S+: this replica \((\S+)\) leads", _log(op))
    return m.group(1) if m else None


# ---------------------------------------------------------------- 1. two instances, default flags


def test_two_default_operators_one_reconciles_the_log_says_who_and_the_other_takes_over(cluster, crds, ns, tmp_path):
    a = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op-a.log").start()
    b = None
    try:
        # a Lease left by an earlier test's killed operator expires within its duration (15 s)
        ident_a = wait_for(lambda: _leads(a), timeout=45, what="op-a leads")
        b = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op-b.log").start()
        wait_for(lambda: f"is held by {ident_a}; this replica" in _log(b), timeout=30,
                 what=f"op-b logs that {ident_a} leads")
        assert _holder(cluster) == ident_a
        kapply(cluster, _spec(ns, decode=1))
        wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
        looked(a, "PDDeployment", ns, NAME, more=3)  # three of op-a's reconciles: op-b's resync is as short
        writes_a, reconciles_a = _work(a)
        assert writes_a > 0 and reconciles_a > 0, (writes_a, reconciles_a)
        assert _work(b) == (0, 0), f"the follower reconciled: {_work(b)}\n{b.log_tail()}"
        assert _leads(b) is None

        a.kill(signal.SIGKILL)  # a crash: the Lease is not released; op-b waits out its duration
        killed = time.monotonic()
        ident_b = wait_for(lambda: _leads(b), timeout=40, what="op-b takes over")
        took_over = time.monotonic() - killed
        assert ident_b != ident_a and _holder(cluster) == ident_b
        # a third one without election refuses to start beside the leader, naming it
        c = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op-c.log",
                            extra_args=["--no-leader-elect"]).start()
        assert c.proc.wait(timeout=60) == 2, c.log_tail()
        assert f"refusing to run: {ident_b} holds the leader lease {LEASE_NS}/{LEASE}" in _log(c), c.log_tail()
        kapply(cluster, _spec(ns, decode=2))
        wait_for(lambda: _reconciled(cluster, ns, decode=2), timeout=60, what="op-b reconciles the edit")
        assert _work(b)[0] > 0
        print(f"op-b took over {took_over:.1f}s after op-a was killed; op-a wrote {writes_a:.0f} times before")
    finally:
        a.stop()
        if b is not None:
            b.stop()


# ---------------------------------------------------------------- 2. a hung API connection


def chart_liveness_probe() -> dict[str, int]:
    """The chart's livenessProbe timing (seconds, threshold) from its Deployment template."""
    text = (ROOT / "charts" / "sglang-pd-operator" / "templates" / "deployment.yaml").read_text()
    block = text.split("livenessProbe:", 1)[1].split("readinessProbe:", 1)[0]
    got = {k: int(v) for k, v in re.findall(r"(initialDelaySeconds|periodSeconds|timeoutSeconds|failureThreshold): (\d+)", block)}
    assert set(got) == {"initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold"}, got
    return got


class Kubelet:
    """Restarts the operator like a kubelet: on exit (after a 5 s backoff), or when the chart's liveness probe fails.

    The probe is the chart's own (``charts/.../templates/deployment.yaml`` livenessProbe:
    initial delay, period, timeout, failure threshold), so a restart here is one the
    chart's pod would get; each restart is recorded with its cause (an exit code, or what
    ``/healthz`` named as stuck).
    """

    def __init__(self, op: OperatorProcess):
        self.op = op
        self.restarts: list[str] = []
        self._failures = 0
        self._down_since: float | None = None
        self.last_failure = ""
        self.probe_spec = chart_liveness_probe()
        self._started, self._last_probe = time.monotonic(), float("-inf")

    def start(self) -> None:
        self.op.start()
        self._started, self._last_probe = time.monotonic(), float("-inf")

    def probe(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.op.metrics_port}/healthz",
                                        timeout=self.probe_spec["timeoutSeconds"]) as resp:
                return resp.status == 200
        except urllib.error.HTTPError as e:  # 503: the body names what is stuck
            self.last_failure = e.read().decode(errors="replace").strip().replace("\n", "; ")
            return False
        except (urllib.error.URLError, OSError) as e:
            self.last_failure = f"no answer: {e}"
            return False

    def tick(self) -> None:
        now = time.monotonic()
        if not self.op.alive():
            code = self.op.proc.returncode if self.op.proc is not None else None
            if self._down_since is None:
                self._down_since = now
            if now - self._down_since >= 5:
                self.restarts.append(f"exited {code}")
                self._down_since = None
                self.start()
            return
        spec = self.probe_spec
        if now - self._started < spec["initialDelaySeconds"] or now - self._last_probe < spec["periodSeconds"]:
            return
        self._last_probe = now
        if self.probe():
            self._failures = 0
            return
        self._failures += 1
        if self._failures >= spec["failureThreshold"]:
            self.restarts.append(f"liveness failed ({self.last_failure})")
            self._failures = 0
            self.op.kill(signal.SIGKILL)
            self.start()

    def until(self, predicate, *, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = predicate()
            if got:
                return got
            self.tick()
            time.sleep(1)
        raise AssertionError(f"{what}: not within {timeout:.0f}s; restarts {self.restarts}; the operator is "
                             f"{'alive' if self.op.alive() else 'down'}, /healthz "
                             f"{'green' if self.op.alive() and self.probe() else 'failing'}\n{self.op.log_tail(40)}")


def test_hung_api_connection_the_operator_recovers_or_is_restarted_never_freezes(cluster, crds, ns, tmp_path):
    host, port = re.match(r"https://([\d.]+):(\d+)", cluster.server).groups()
    proxy = StallingProxy((host, int(port)))
    op = OperatorProcess(kubeconfig=proxied_kubeconfig(cluster, proxy, tmp_path / "kubeconfig"),
                         log_path=tmp_path / "operator.log")
    kubelet = Kubelet(op)
    try:
        kubelet.start()
        kapply(cluster, _spec(ns, decode=1))  # the test itself talks to the API server directly
        kubelet.until(lambda: _ready(cluster, ns), timeout=120, what="Ready through the proxy")

        # 1. every established connection freezes (pooled connections, watch streams); new ones work
        proxy.stall()
        start = time.monotonic()
        kapply(cluster, _spec(ns, decode=2))
        kubelet.until(lambda: _reconciled(cluster, ns, decode=2), timeout=150, what="edit reconciled after a stall")
        stalled_s, restarts_1 = time.monotonic() - start, list(kubelet.restarts)
        # the client's timeouts recovered it, not a restart (a restart would also have passed the wait)
        assert restarts_1 == [], f"the stall needed a restart: {restarts_1}"

        # 2. the API server vanishes for 30 s: connections accepted, never answered; then it is back
        proxy.blackhole(True)
        start = time.monotonic()
        kapply(cluster, _spec(ns, decode=1))
        while time.monotonic() - start < 30:
            kubelet.tick()
            time.sleep(1)
        proxy.blackhole(False)
        kubelet.until(lambda: _reconciled(cluster, ns, decode=1), timeout=150, what="edit reconciled after an outage")
        outage_s = time.monotonic() - start
        restarts_2 = kubelet.restarts[len(restarts_1):]
        # the leader that cannot renew exits (code 3, docs/resilience.md), never frozen until liveness kills it
        assert restarts_2[:1] == ["exited 3"], restarts_2
        assert not [r for r in restarts_2 if r.startswith("liveness")], restarts_2
        print(f"stall: reconciled after {stalled_s:.0f}s (restarts {restarts_1}); 30 s outage: reconciled "
              f"{outage_s:.0f}s after it began (restarts {kubelet.restarts[len(restarts_1):]})")
    finally:
        op.stop()
        proxy.close()
