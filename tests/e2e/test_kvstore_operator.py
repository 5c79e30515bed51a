"""Issue 9's Mooncake master in the running operator, end to end on the local control plane.

A PDDeployment with ``kvCache.hicache.storage.backend: mooncake`` (the GB300 example, one
replica per role) is applied to the dev cluster; the operator runs as a process with
``--slo-interval 2``. The operator creates the master's Deployment and Service with the
other shared objects; kwok runs its pod on a loopback IP. The test then starts the REAL
``mooncake_master`` (mooncake-transfer-engine 0.3.13.post1) with the container's rendered
arguments, bound to that pod IP instead of 0.0.0.0 and on the ports the Deployment
declares, as the stand-in for the container. The operator's scraper probes it every
interval on the pod IP (``/health`` and ``/metrics``), and:

1. before it runs: ``KVStoreReady`` False (``MasterUnreachable``, naming the pod's URL);
2. running: ``KVStoreReady`` True, its figures on the operator's ``/metrics``
   (``sglang_pd_kvstore_*``), and the operator writes nothing while nothing changes;
3. SIGKILL: False within two intervals, one Warning event ``KVStoreNotReady``;
4. restarted: True again, a Normal event ``KVStoreReady``.

Skips only when ``mooncake_master`` cannot run here (the package, its binary or
``libibverbs.so.1`` missing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import load_example
from simkit import master_binary
from opkit import OperatorProcess, condition, free_port, kapply, kget, looked, pods, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
LBL = "pd.sglang-operator.io"
NAME = "kv-e2e"
MASTER = f"{NAME}-mooncake-master"
INTERVAL = 2.0


# --------------------------------------------------------------------------- the real master


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


class MasterProcess:
    """mooncake_master with given arguments; :meth:`start` waits for ``/health``."""

    def __init__(self, binary: str, args: list[str], health_url: str, log: Path) -> None:
        self.binary, self.args, self.health_url, self.log = binary, args, health_url, log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> float:
        """Start; returns the seconds until ``/health`` answered. Raises AssertionError when it exits."""
        started = time.monotonic()
        out = self.log.open("ab")
        self.proc = subprocess.Popen([self.binary, *self.args], stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"mooncake_master exited with {self.proc.returncode}:\n{self.tail()}")
            if _answers(self.health_url):
                return time.monotonic() - started
            time.sleep(0.1)
        raise AssertionError(f"mooncake_master did not answer {self.health_url} in {timeout:.0f}s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL, as when the master pod is lost."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> str:
    """The binary, once it has been seen to serve on loopback (skip when it cannot load)."""
    path = master_binary()
    rpc, metrics = free_port(), free_port()
    m = MasterProcess(path, [f"--rpc_port={rpc}", f"--metrics_port={metrics}", "--rpc_address=127.0.0.1",
                             "--metrics_host=127.0.0.1"], f"http://127.0.0.1:{metrics}/health",
                      tmp_path_factory.mktemp("mooncake") / "probe.log")
    try:
        m.start(timeout=20)
    except AssertionError as e:
        if "error while loading shared libraries" in m.tail():
            pytest.skip(f"mooncake_master cannot load here (install libibverbs1): {m.tail()[-300:]}")
        raise AssertionError(str(e)) from None
    finally:
        m.kill()
    return path


# --------------------------------------------------------------------------- cluster side


def _spec(ns: str) -> dict:
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"].pop("kernels", None)
    for role in ("prefill", "decode", "gateway"):
        doc["spec"][role]["replicas"] = 1
    doc["spec"]["kvCache"] = {"hicache": {"storage": {"backend": "mooncake"}}}
    return doc


def _kv(cluster, ns: str) -> dict | None:
    return condition(kget(cluster, "pddeployment", NAME, "-n", ns), "KVStoreReady")


def _events(cluster, ns: str, reason: str) -> list[dict]:
    got = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},reason={reason}")
    return (got or {}).get("items", [])


def _samples(op: OperatorProcess) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _writes(op: OperatorProcess) -> float:
    return sum(v for (name, _), v in _samples(op).items() if name == "sglang_pd_operator_api_writes_total")


def _poll_until(predicate, *, timeout: float, interval: float = 0.1) -> float:
    """Seconds until ``predicate()`` is truthy (AssertionError after ``timeout``)."""
    start = time.monotonic()
    wait_for(predicate, timeout=timeout, interval=interval, what="condition")
    return time.monotonic() - start


def _master_args(deployment: dict, ip: str) -> tuple[list[str], int]:
    """The container's rendered args bound to ``ip`` instead of 0.0.0.0; and the metrics port it declares."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = [a.replace("=0.0.0.0", f"={ip}") for a in container["args"]]
    assert f"--rpc_port={ports['rpc']}" in args and f"--metrics_port={ports['metrics']}" in args, (args, ports)
    assert f"--rpc_address={ip}" in args and f"--metrics_host={ip}" in args, args
    return args, ports["metrics"]


def test_operator_runs_probes_and_reports_the_mooncake_master(cluster, ns, binary, tmp_path):
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log",
                         extra_args=["--slo-interval", str(INTERVAL)]).start()
    master: MasterProcess | None = None
    try:
        kapply(cluster, _spec(ns))
        # 1. the master's Deployment and Service are applied with the other shared objects
        dep = wait_for(lambda: kget(cluster, "deployment", MASTER, "-n", ns), timeout=60, what="master Deployment")
        svc = kget(cluster, "service", MASTER, "-n", ns)
        assert svc is not None and {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"rpc": 50051,
                                                                                          "metrics": 9003}
        assert f"{LBL}/compat-key" not in dep["metadata"]["labels"]
        assert dep["metadata"]["ownerReferences"][0]["name"] == NAME
        pod = wait_for(lambda: next((p for p in pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=mooncake-master")
                                     if (p.get("status") or {}).get("podIP")), None),
                       timeout=60, what="master pod with an IP")  # fmt: skip
        ip = pod["status"]["podIP"]
        assert ip.startswith("127."), ip
        args, metrics_port = _master_args(dep, ip)
        url = f"http://{ip}:{metrics_port}"

        # nothing listens on the pod's IP yet: False, naming where the operator looked
        c = wait_for(lambda: (c := _kv(cluster, ns)) and c["reason"] == "MasterUnreachable" and c,
                     timeout=60, what="KVStoreReady False/MasterUnreachable")  # fmt: skip
        assert c["status"] == "False" and url in c["message"] and "unreachable" in c["message"], c
        print(f"before the master runs: {c['reason']}: {c['message']}")

        # 2. the real master on the pod's IP and declared ports
        master = MasterProcess(binary, args, f"{url}/health", tmp_path / "mooncake_master.log")
        up = master.start()
        took = _poll_until(lambda: (c := _kv(cluster, ns)) and c["status"] == "True", timeout=8 * INTERVAL)
        c = _kv(cluster, ns)
        assert c["reason"] == "MasterReady" and f"Mooncake master at {url} serves (leader)" in c["message"], c
        assert "0 keys" in c["message"] and "0 clients" in c["message"], c
        print(f"mooncake_master answered {up:.2f}s after start; KVStoreReady True {took:.2f}s after that "
              f"(interval {INTERVAL:g}s): {c['message']}")
        labels = (("deployment", NAME), ("namespace", ns))
        samples = wait_for(lambda: (s := _samples(op)).get(("sglang_pd_kvstore_up", labels)) == 1.0 and s,
                           timeout=4 * INTERVAL, what="sglang_pd_kvstore_up 1")  # fmt: skip
        for family in ("sglang_pd_kvstore_keys", "sglang_pd_kvstore_capacity_bytes", "sglang_pd_kvstore_clients"):
            assert (family, labels) in samples, family
        assert any(n == "sglang_pd_kvstore_requests_total" and dict(lb).get("deployment") == NAME
                   for n, lb in samples)  # fmt: skip
        assert not _events(cluster, ns, "KVStoreNotReady")

        # nothing changes, nothing is written (status, children, events) over three intervals
        looked(op, "PDDeployment", ns, NAME, more=1)
        before = _writes(op)
        looked(op, "PDDeployment", ns, NAME, more=3)
        assert _writes(op) == before, "the operator wrote while nothing changed"

        # 3. SIGKILL: False within two intervals, one Warning event
        master.kill()
        killed = time.monotonic()
        took = _poll_until(lambda: (c := _kv(cluster, ns)) and c["status"] == "False", timeout=8 * INTERVAL)
        c = _kv(cluster, ns)
        print(f"KVStoreReady False {took:.2f}s after SIGKILL: {c['reason']}: {c['message']}")
        assert took <= 2 * INTERVAL, f"KVStoreReady turned False {took:.2f}s after the kill (> 2 intervals)"
        assert c["reason"] == "MasterUnreachable" and url in c["message"], c
        warnings = wait_for(lambda: _events(cluster, ns, "KVStoreNotReady"), timeout=10, what="Warning event")
        assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
        assert warnings[0]["message"].startswith("MasterUnreachable: Mooncake master at"), warnings[0]["message"]
        wait_for(lambda: _samples(op).get(("sglang_pd_kvstore_up", labels)) == 0.0, timeout=4 * INTERVAL,
                 what="sglang_pd_kvstore_up 0")  # fmt: skip
        assert time.monotonic() - killed < 30

        # 4. restarted on the same pod IP and ports: True again
        master.start()
        took = _poll_until(lambda: (c := _kv(cluster, ns)) and c["status"] == "True", timeout=8 * INTERVAL)
        print(f"KVStoreReady True {took:.2f}s after the restart answered")
        wait_for(lambda: _events(cluster, ns, "KVStoreReady"), timeout=10, what="Normal event KVStoreReady")
        assert len(_events(cluster, ns, "KVStoreNotReady")) == 1     # one Warning per transition, not per interval
    finally:
        if master is not None:
            master.kill()
        if not op.alive():
            print(op.log_tail())
        op.stop()
