"""The real Mooncake Store master read by the operator's health check; a rail mismatch refused by the operator.

``mooncake_master`` from mooncake-transfer-engine==0.3.13.post1 (requirements/
contract.txt; it needs libibverbs.so.1, Debian's libibverbs1, and no GPU) runs on
loopback with the flags render/mooncake.py gives the master pod, as the stand-in for
that pod. reconcilers/kvstore.py's probe reads its ``/health`` and ``/metrics``; killing
the process turns ``KVStoreReady`` False, starting it again turns it True. The exporter
(``KVStoreCollector``) follows.

The last test applies a spec whose prefill and decode NICs sit on rail classes that
cannot reach each other to the dev cluster, with the operator running as a process, and
reads the refusal (Valid=False naming both roles' devices) from the object's status.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pytest
from helpers import load_example
from simkit import master_binary
from opkit import OperatorProcess, condition, free_port, kapply, kget, wait_for
from prometheus_client import CollectorRegistry, generate_latest

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.metrics import kvstore as M
from sglang_pd_operator.reconcilers import kvstore as K
from sglang_pd_operator.render.mooncake import master_args, mooncake_spec

pytestmark = pytest.mark.e2e


def hicache_plan():
    doc = load_example()
    doc["spec"]["kvCache"] = {"hicache": {"storage": {"backend": "mooncake"}}}
    return build_plan(parse_pddeployment(doc), builtin_catalog())


class Master:
    """One mooncake_master process on loopback, started with the rendered flags."""

    def __init__(self, binary: str, plan, log: Path):
        self.binary, self.log = binary, log
        self.rpc_port, self.metrics_port = free_port(), free_port()
        mc = mooncake_spec(plan)
        rendered = master_args(mc)
        # the pod's flags, with this machine's ports and loopback binding instead of 0.0.0.0
        self.args = [a for a in rendered if not a.startswith(("--rpc_port=", "--metrics_port=", "--rpc_address=",
                                                              "--metrics_host="))]  # fmt: skip
        self.args += [f"--rpc_port={self.rpc_port}", f"--metrics_port={self.metrics_port}",
                      "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1"]  # fmt: skip
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def start(self) -> "Master":
        out = self.log.open("ab")
        self.proc = subprocess.Popen([self.binary, *self.args], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                hint = " (install libibverbs1)" if "libibverbs" in tail else ""
                raise AssertionError(f"mooncake_master exited with {self.proc.returncode}{hint}:\n{tail}")
            if M.probe_master(self.url, timeout=1).ready:
                return self
            time.sleep(0.2)
        raise AssertionError(f"mooncake_master did not answer /health in 30s:\n{self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL, as when the master pod is lost
            self.proc.wait(timeout=10)


@pytest.fixture
def master(tmp_path):
    m = Master(master_binary(), hicache_plan(), tmp_path / "mooncake_master.log")
    yield m
    m.kill()


def test_health_check_follows_the_real_master_through_kill_and_restart(master):
    plan = hicache_plan()
    key = f"{plan.namespace}/{plan.name}"
    registry = CollectorRegistry()
    collector = M.KVStoreCollector()
    registry.register(collector)

    t0 = time.monotonic()
    master.start()
    print(f"mooncake_master /health ready {time.monotonic() - t0:.2f}s after start")
    health = K.observe_kvstore(kube=None, plan=plan, url=master.url)
    cond = K.kvstore_condition(health)
    assert (cond.type, cond.status, cond.reason) == ("KVStoreReady", "True", "MasterReady")
    assert health.role == "leader" and health.state == "serving"
    # the metrics scrape: the master's own families, read and exported
    for name in ("master_key_count", "master_allocated_bytes", "master_total_capacity_bytes",
                 "master_active_clients", "master_put_start_requests_total"):  # fmt: skip
        assert name in health.metrics, sorted(health.metrics)[:20]
    assert health.keys == 0 and "0 keys" in cond.message
    collector.publish(key, health)
    text = generate_latest(registry).decode()
    assert f'sglang_pd_kvstore_up{{deployment="{plan.name}",namespace="{plan.namespace}"}} 1.0' in text
    assert "sglang_pd_kvstore_keys{" in text and 'operation="put_start"' in text

    started = time.monotonic()
    master.kill()
    down = K.observe_kvstore(kube=None, plan=plan, url=master.url)
    cond = K.kvstore_condition(down)
    assert (cond.status, cond.reason) == ("False", "MasterUnreachable")
    assert master.url in cond.message and "unreachable" in cond.message
    print(f"KVStoreReady False {time.monotonic() - started:.2f}s after SIGKILL")
    collector.publish(key, down)
    assert f'sglang_pd_kvstore_up{{deployment="{plan.name}",namespace="{plan.namespace}"}} 0.0' in (
        generate_latest(registry).decode()
    )

    restarted = time.monotonic()
    master.start()
    back = wait_for(lambda: (h := K.observe_kvstore(kube=None, plan=plan, url=master.url)).ready and h,
                    timeout=30, what="KVStoreReady True after restart")  # fmt: skip
    assert K.kvstore_condition(back).status == "True"
    print(f"KVStoreReady True {time.monotonic() - restarted:.2f}s after restart")


# --------------------------------------------------------------------------- rail refusal


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    op = OperatorProcess(kubeconfig=cluster.kubeconfig,
                         log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()  # fmt: skip
    yield op
    if not op.alive():
        print(op.log_tail())
    op.stop()


def test_rails_that_cannot_reach_each_other_are_refused_naming_both_roles_devices(cluster, operator):
    ns = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        doc = {
            "apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "rails", "namespace": ns},
            "spec": {
                "model": {"name": "Qwen/Qwen3-30B-A3B", "revision": "main", "source": {"pvc": {"claimName": "m"}}},
                "runtime": {"image": "lmsysorg/sglang:v0.5.23-cu129", "sglangVersion": "0.5.23"},
                "accelerator": "h200",
                "transfer": {"backend": "mooncake"},
                "prefill": {"replicas": 1, "parallelism": {"tp": 8}, "transfer": {"ibDevices": ["mlx5_0", "mlx5_1"]}},
                "decode": {"replicas": 1, "parallelism": {"tp": 8}, "accelerator": "mi355x",
                           "transfer": {"ibDevices": ["bnxt_re0"]}},
            },
        }  # fmt: skip
        kapply(cluster, doc)
        obj = wait_for(
            lambda: (o := kget(cluster, "pddeployment", "rails", "-n", ns)) and condition(o, "Valid") and o,
            timeout=30, what="Valid condition",
        )  # fmt: skip
        valid = condition(obj, "Valid")
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "prefill IB devices mlx5_0 (infiniband), mlx5_1 (infiniband)" in valid["message"]
        assert "decode IB devices bnxt_re0 (roce)" in valid["message"]
        assert any(p["field"] == "spec.prefill.transfer.ibDevices" for p in obj["status"]["problems"])
        deps = kget(cluster, "deployments", "-n", ns) or {"items": []}
        assert deps["items"] == []  # nothing was created for a refused spec
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
