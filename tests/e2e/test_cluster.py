"""The dev cluster itself (issue 2): real control plane, kwok GPU nodes, harness hygiene.

What a later e2e test relies on is checked here: a GPU Deployment is scheduled onto the
right fake node and becomes Available, Jobs complete (or fail on request), deletion
garbage-collects, kubectl and helm work with the written kubeconfig; and what makes the
harness safe to use: parallel runs do not collide, stale runs are cleaned (only our own
processes), a killed harness leaves no process behind, a missing Go proxy is named.
Waits are bounded (they fail with a message), never assertions on speed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from sglang_pd_operator_dev.cluster import nodes as devnodes
from sglang_pd_operator_dev.cluster import paths, procs, state
from sglang_pd_operator_dev.cluster.demo import (GB300_EXAMPLE, OperatorProcess, install_crds, model_store,
                                                 oracle_unavailable)
from sglang_pd_operator_dev.cluster.handle import Cluster

pytestmark = pytest.mark.e2e

REPO = paths.repo_root()
DEVCLUSTER = [sys.executable, "-m", "sglang_pd_operator_dev.cluster"]


def wait_for(predicate, *, what: str, timeout_s: float = 120.0, every_s: float = 0.25):
    """Poll ``predicate`` until it returns a truthy value (returned); fail after timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)


def apply(cluster, namespace: str, *objects: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump_all(objects))


def deployment(name: str, *, replicas: int = 1, gpus: int = 0, accelerator: str | None = None,
               annotations: dict | None = None) -> dict:
    container = {"name": "engine", "image": "example.invalid/engine:1"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec = {"containers": [container]}
    if accelerator:
        spec["nodeSelector"] = {"pd.sglang-operator.io/accelerator": accelerator}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name},
                                           "annotations": annotations or {}},
                              "spec": spec}},
    }


def job(name: str, *, annotations: dict | None = None, backoff_limit: int = 0) -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": backoff_limit,
                 "template": {"metadata": {"annotations": annotations or {}},
                              "spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "main",
                                                       "image": "example.invalid/tool:1"}]}}},
    }


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*DEVCLUSTER, *args], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=timeout)


# --- the cluster works ---------------------------------------------------------------


def test_gpu_deployment_lands_on_gb300_node_and_becomes_available(cluster, namespace):
    apply(cluster, namespace, deployment("engine", gpus=4, accelerator="gb300"))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Available",
                    "deployment/engine", "--timeout=120s")

    core = k8s.CoreV1Api(cluster.api_client())
    (pod,) = core.list_namespaced_pod(namespace, label_selector="app=engine").items
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["pd.sglang-operator.io/accelerator"] == "gb300"
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-GB300"
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
    assert pod.status.phase == "Running"
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    # Pod IPs are loopback addresses inside the node's own pod CIDR (for the simulator).
    ip = ipaddress.ip_address(pod.status.pod_ip)
    assert ip.is_loopback
    assert ip in ipaddress.ip_network(node.spec.pod_cidr)


def test_gpu_requests_beyond_a_node_stay_pending(cluster, namespace):
    # 8 GPUs never fit a 4-GPU GB300 node: the scheduler must refuse, not kwok accept.
    apply(cluster, namespace, deployment("too-big", gpus=8, accelerator="gb300"))
    core = k8s.CoreV1Api(cluster.api_client())

    def unschedulable():
        pods = core.list_namespaced_pod(namespace, label_selector="app=too-big").items
        return pods and any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                            for c in pods[0].status.conditions or [])

    wait_for(unschedulable, what="the 8-GPU pod to be reported Unschedulable")
    (pod,) = core.list_namespaced_pod(namespace, label_selector="app=too-big").items
    assert pod.spec.node_name is None


def test_job_completes(cluster, namespace):
    apply(cluster, namespace, job("migrate"))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/migrate",
                    "--timeout=120s")
    status = json.loads(cluster.kubectl("get", "-n", namespace, "job/migrate",
                                        "-o", "json").stdout)["status"]
    assert status["succeeded"] == 1


def test_fail_annotation_fails_the_job(cluster, namespace):
    apply(cluster, namespace, job("doomed", annotations={"pd.sglang-operator.io/kwok-fail": "true"}))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Failed", "job/doomed",
                    "--timeout=120s")


def test_ready_annotation_holds_and_releases_readiness(cluster, namespace):
    apply(cluster, namespace,
          deployment("warming", annotations={"pd.sglang-operator.io/kwok-ready": "false"}))
    core = k8s.CoreV1Api(cluster.api_client())

    def running_pod():
        pods = core.list_namespaced_pod(namespace, label_selector="app=warming").items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    pod = wait_for(running_pod, what="the pod to run")
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "False"
    assert pod.status.pod_ip

    cluster.kubectl("annotate", "-n", namespace, f"pod/{pod.metadata.name}",
                    "pd.sglang-operator.io/kwok-ready=true", "--overwrite")
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready",
                    f"pod/{pod.metadata.name}", "--timeout=120s")
    after = core.read_namespaced_pod(pod.metadata.name, namespace)
    assert after.status.pod_ip == pod.status.pod_ip


def test_deleting_a_deployment_garbage_collects_its_pods(cluster, namespace):
    apply(cluster, namespace, deployment("doomed", replicas=3))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Available", "deployment/doomed",
                    "--timeout=120s")
    core = k8s.CoreV1Api(cluster.api_client())
    apps = k8s.AppsV1Api(cluster.api_client())
    assert len(core.list_namespaced_pod(namespace, label_selector="app=doomed").items) == 3

    # Background propagation: only the Deployment is deleted by the API call; the garbage
    # collector (kube-controller-manager) must remove the ReplicaSet, then its pods.
    cluster.kubectl("delete", "-n", namespace, "deployment/doomed", "--cascade=background")
    wait_for(lambda: not apps.list_namespaced_replica_set(namespace).items,
             what="the ReplicaSet to be garbage-collected")
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector="app=doomed").items,
             what="the pods to be garbage-collected")


def test_fake_nodes_follow_node_pools_file(cluster):
    pools = devnodes.load_pools(paths.node_pools_file())
    core = k8s.CoreV1Api(cluster.api_client())
    for pool in pools:
        found = core.list_node(label_selector=f"{devnodes.POOL_LABEL}={pool.name}").items
        assert len(found) == pool.count, pool.name
        for node in found:
            assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
            assert node.metadata.labels["pd.sglang-operator.io/accelerator"] == pool.name
            for resource in ("cpu", "memory", "rdma/hca"):
                assert node.status.capacity[resource] == pool.capacity[resource]
    by_pool = {p.name: p for p in pools}
    assert by_pool["gb300"].count >= 4 and by_pool["gb300"].capacity["nvidia.com/gpu"] == "4"
    assert by_pool["h200"].count >= 2 and by_pool["h200"].capacity["nvidia.com/gpu"] == "8"
    assert by_pool["mi355x"].count >= 2 and by_pool["mi355x"].capacity["amd.com/gpu"] == "8"
    assert by_pool["l40s"].count >= 2 and by_pool["l40s"].capacity["nvidia.com/gpu"] == "8"


def test_kubectl_and_helm_work_with_the_kubeconfig(cluster, tmp_path):
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    kubectl = subprocess.run([str(cluster.bin_dir / "kubectl"), "get", "nodes", "-o", "name"],
                             env=env, capture_output=True, text=True, check=True)
    assert "node/gb300-0" in kubectl.stdout.split()
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")

    assert cluster.helm("version", "--short").stdout.startswith("v3.")
    # A real install through the kubeconfig: helm renders, applies and waits for readiness.
    cluster.helm("create", str(tmp_path / "demo"))
    cluster.helm("install", "demo", str(tmp_path / "demo"), "--namespace", "helm-demo",
                 "--create-namespace", "--wait", "--timeout", "120s")
    listed = json.loads(cluster.helm("list", "-n", "helm-demo", "-o", "json").stdout)
    assert [r["status"] for r in listed] == ["deployed"]
    cluster.helm("uninstall", "demo", "-n", "helm-demo", "--wait")


def test_build_is_cached():
    result = run_cli("build")
    assert result.returncode == 0, result.stderr
    assert "cache hit" in result.stdout


# --- harness hygiene -----------------------------------------------------------------


def _up_detached(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([*DEVCLUSTER, "up", "--detach", "--no-oracle", "--run-dir", str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _down(run_dir: Path) -> None:
    run_cli("down", "--run-dir", str(run_dir), timeout=120)


def test_two_clusters_in_parallel_do_not_collide(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    try:
        starting = [_up_detached(r) for r in runs]
        outputs = [p.communicate(timeout=600)[0] for p in starting]
        for proc, out in zip(starting, outputs):
            assert proc.returncode == 0, out
        states = [state.load(r) for r in runs]
        ports = [set(s.ports.values()) for s in states]
        assert not ports[0] & ports[1]
        assert states[0].pod_network != states[1].pod_network
        assert states[0].server != states[1].server
        pids = [{p.pid for p in s.processes} for s in states]
        assert not pids[0] & pids[1]
        # `up` prints what a shell needs; with it, a bare `kubectl` is the cluster's own version
        for out, s in zip(outputs, states):
            lines = out.splitlines()
            assert f"export KUBECONFIG={s.kubeconfig}" in lines and f"export PATH={s.bin_dir}:$PATH" in lines, out
        shell_env = {**os.environ, "KUBECONFIG": states[0].kubeconfig, "PATH": f"{states[0].bin_dir}:{os.environ['PATH']}"}
        version = json.loads(subprocess.run(["kubectl", "version", "-o", "json"], env=shell_env, capture_output=True,
                                            text=True, check=True).stdout)
        assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]
        for run_dir in runs:
            kubectl = subprocess.run(
                [states[0].bin_dir + "/kubectl", f"--kubeconfig={run_dir / 'kubeconfig'}",
                 "get", "nodes", "-o", "name"], capture_output=True, text=True, check=True)
            assert len(kubectl.stdout.split()) >= 8
            # each run has its own etcd data directory
            assert (run_dir / "etcd-data").is_dir()
    finally:
        for run_dir in runs:
            _down(run_dir)
    for s in states:
        assert not [p for p in s.processes if procs.is_ours(p)]


def test_stale_run_is_cleaned_but_foreign_processes_are_spared(tmp_path):
    run_dir = tmp_path / "run"
    foreign = subprocess.Popen(["sleep", "600"])
    try:
        first = _up_detached(run_dir)
        out = first.communicate(timeout=600)[0]
        assert first.returncode == 0, out
        old = state.load(run_dir)
        # Crash: the API server dies; everything else keeps running.
        apiserver = next(p for p in old.processes if p.name == "kube-apiserver")
        os.kill(apiserver.pid, signal.SIGKILL)
        wait_for(lambda: not procs.is_ours(apiserver), what="the API server to die")
        # A record whose pid now belongs to someone else (pid reuse) must not be signalled.
        impostor = procs.ProcessRecord(name="recycled", pid=foreign.pid, start_ticks=1,
                                       boot_id=procs.boot_id(), exe="sleep", log="")
        state.save(old.with_process(impostor))
        leftovers = [p for p in old.processes if procs.is_ours(p)]
        assert leftovers

        status = run_cli("status", "--run-dir", str(run_dir))
        assert status.returncode == 1 and "stale" in status.stdout

        second = run_cli("up", "--detach", "--no-oracle", "--run-dir", str(run_dir), timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "stale run" in second.stdout and "leftover processes" in second.stdout
        assert not [p for p in leftovers if procs.is_ours(p)]
        assert foreign.poll() is None, "a process the harness did not start was killed"
        assert run_cli("status", "--run-dir", str(run_dir)).returncode == 0
    finally:
        _down(run_dir)
        foreign.kill()
        foreign.wait()


def test_killed_harness_leaves_no_processes(tmp_path):
    run_dir = tmp_path / "run"
    harness = subprocess.Popen([*DEVCLUSTER, "up", "--no-oracle", "--run-dir", str(run_dir)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = wait_for(lambda: (s := state.load(run_dir)) and s.phase == "ready" and s,
                         what="the foreground cluster to be ready", timeout_s=600)
        assert len(ready.processes) == 7  # five control-plane components, the LWS controller, the IMEX stand-in
        harness.kill()  # SIGKILL: no handler, no atexit, no finally runs
        harness.wait()
        wait_for(lambda: not [p for p in ready.processes if procs.is_ours(p)],
                 what="every component to exit after its harness died")
        # The next `up` sees a stale run (owner gone) and starts cleanly.
        again = run_cli("up", "--detach", "--no-oracle", "--run-dir", str(run_dir), timeout=600)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "stale run" in again.stdout
    finally:
        harness.kill()
        _down(run_dir)


def test_ctrl_c_stops_a_foreground_cluster(tmp_path):
    run_dir = tmp_path / "run"
    harness = subprocess.Popen([*DEVCLUSTER, "up", "--no-oracle", "--run-dir", str(run_dir)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = wait_for(lambda: (s := state.load(run_dir)) and s.phase == "ready" and s,
                         what="the foreground cluster to be ready", timeout_s=600)
        harness.send_signal(signal.SIGINT)
        out = harness.communicate(timeout=120)[0]
        assert "stopped" in out
        assert not [p for p in ready.processes if procs.is_ours(p)]
        assert state.load(run_dir).phase == "stopped"
    finally:
        harness.kill()
        _down(run_dir)


def test_unreachable_go_proxy_is_named_with_the_module(tmp_path):
    env = {**os.environ, "GOPROXY": "http://127.0.0.1:9", "GOFLAGS": "-mod=mod",
           "GOMODCACHE": str(tmp_path / "empty-modcache"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}  # empty binary cache: must build
    env.pop(paths.BIN_DIR_ENV, None)
    result = run_cli("build", env=env, timeout=300)
    assert result.returncode != 0
    message = result.stderr
    assert "Go module proxy could not be reached" in message
    assert "GOPROXY=http://127.0.0.1:9" in message
    # names a module with its version, e.g. "cel.dev/expr@v0.25.2"
    go_mod = (paths.source_dir() / "go.mod").read_text()
    named = message.split("downloading Go module ", 1)[1].split(":", 1)[0]
    module, version = named.split("@")
    assert f"{module} {version}" in go_mod
    assert not list((tmp_path / "cache").rglob("kube-apiserver")), "no half-built cache"


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc/<pid>/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = {int(x) for x in task.read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def test_up_runs_the_sglang_oracle_so_valid_comes_from_sglang(tmp_path):
    """Issue 24, item 4: ``dev cluster up`` (not only the demo) runs ``oracle serve`` from this venv as a
    process of the run; an operator started with the printed SGLANG_PD_ORACLE_URL gets ``Valid`` from
    SGLang's own verdict; ``status`` shows the service; ``down`` stops it and its SGLang workers."""
    why = oracle_unavailable()
    if why:
        pytest.fail(f"the SGLang oracle cannot run from this venv: {why} (./hack/setup.sh --contract installs sglang)")
    run_dir = tmp_path / "run"
    started = time.monotonic()
    up = run_cli("up", "--detach", "--run-dir", str(run_dir), timeout=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        took = time.monotonic() - started
        exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
                       if line.startswith("export "))
        url = exports.get("SGLANG_PD_ORACLE_URL")
        assert url and "SGLang oracle service ready" in up.stdout, up.stdout
        st = state.load(run_dir)
        (oracle,) = [r for r in st.processes if r.name == "oracle"]
        assert procs.is_ours(oracle)
        status = run_cli("status", "--run-dir", str(run_dir))
        assert status.returncode == 0 and f"{url} (ready" in status.stdout, status.stdout

        running = Cluster.from_run_dir(run_dir)
        assert running.oracle_url == url
        install_crds(running)
        doc = yaml.safe_load(GB300_EXAMPLE.read_text())
        ns = doc["metadata"]["namespace"]
        running.kubectl("create", "namespace", ns)
        running.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(model_store(ns)))
        op = OperatorProcess(kubeconfig=running.kubeconfig, log_path=tmp_path / "operator.log",
                             env={"SGLANG_PD_ORACLE_URL": url}).start()  # what the printed export gives `run`
        try:
            running.kubectl("apply", "-f", str(GB300_EXAMPLE))

            def valid():
                got = json.loads(running.kubectl("get", "pdd", doc["metadata"]["name"], "-n", ns, "-o", "json").stdout)
                cond = next((c for c in (got.get("status") or {}).get("conditions") or [] if c["type"] == "Valid"), {})
                return cond if cond.get("status") == "True" else None

            cond = wait_for(valid, what="Valid=True", timeout_s=300)
            assert cond["reason"] == "SGLangAccepted" and "SGLang 0.5.23" in cond["message"], cond
        finally:
            op.stop()
        workers = _children(oracle.pid)
        assert workers, "the oracle service started no SGLang worker"
        print(f"dev cluster up with the oracle: {took:.1f}s; Valid: {cond['reason']}: {cond['message'][:160]}")
    finally:
        _down(run_dir)
    assert not procs.is_ours(oracle)
    wait_for(lambda: not any(Path(f"/proc/{w}").exists() and procs.is_running(w) for w in workers),
             what="the oracle's SGLang workers to exit with it", timeout_s=30)
