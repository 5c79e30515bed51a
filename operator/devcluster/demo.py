"""``dev demo``: the main job on the local control plane, start to finish.

Starts the dev cluster, installs the CRDs, runs the operator as a process, applies the
GB300 example, prints the resolved plan and every child object once the PDDeployment is
Ready, then keeps running until Ctrl-C (``--once``: stop right away). Also home of the
pieces the e2e tests reuse: :class:`OperatorProcess` and :func:`model_store`.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[2]
GB300_EXAMPLE = REPO / "examples" / "dsv41-flash-gb300-low-latency.yaml"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_command() -> list[str]:
    """How to start this package's command line from any directory (the venv's entry point)."""
    exe = Path(sys.executable).parent / "sglang-pd-operator"
    return [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "sglang_pd_operator.cli"]


_LIVE: set["OperatorProcess"] = set()


@atexit.register
def _stop_leftovers() -> None:
    """Kill operator processes a failed test or an interrupted demo did not stop."""
    for op in list(_LIVE):
        op.kill()


class OperatorProcess:
    """``sglang-pd-operator run`` as a child process in its own session, logging to a file.

    Started processes are killed at interpreter exit if nobody stopped them, so a failing
    test cannot leave an operator retrying against a cluster that is gone.
    """

    def __init__(
        self,
        *,
        kubeconfig: Path,
        log_path: Path,
        resync: float = 2.0,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ):
        self.kubeconfig = Path(kubeconfig)
        self.env = dict(env or {})
        self.log_path = Path(log_path)
        self.resync = resync
        self.extra_args = list(extra_args or [])
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        """Start the process; returns self."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONSAFEPATH": "1", **self.env}
        self._log = open(self.log_path, "ab")
        argv = [
            *operator_command(), "run", "--kubeconfig", str(self.kubeconfig), "--resync", str(self.resync),
            "--metrics-port", str(self.metrics_port), "--liveness-port", "0", *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd="/", start_new_session=True)
        _LIVE.add(self)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process group (SIGKILL by default: a crash, no cleanup) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        _LIVE.discard(self)

    def stop(self) -> None:
        """Graceful stop (SIGTERM)."""
        self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        """The process is running."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the operator's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def model_store(namespace: str) -> list[dict[str, Any]]:
    """A statically bound PV + PVC named ``model-store`` in ``namespace`` (kwok pods never read it)."""
    pv = f"model-store-{namespace}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": "/tmp/model-store"},
                "claimRef": {"namespace": namespace, "name": "model-store"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "model-store", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Ti"}},
            },
        },
    ]


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _ready(cluster, namespace: str, name: str) -> dict | None:
    res = cluster.kubectl("get", "pdd", name, "-n", namespace, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    obj = json.loads(res.stdout)
    gen = obj["metadata"].get("generation")
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready" and c["status"] == "True" and c.get("observedGeneration") == gen:
            return obj
    return None


def run_demo(*, cluster, example: Path, log: Callable[[str], None], once: bool) -> int:
    """Drive the demo on a running ``cluster``; returns a process exit code."""
    doc = yaml.safe_load(example.read_text())
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    log("== installing the CRDs (server-side apply of crds/)")
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/pddeployments.pd.sglang-operator.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(model_store(namespace)))

    log("== the resolved plan (sglang-pd-operator check)")
    check = subprocess.run([*operator_command(), "check", str(example)], capture_output=True, text=True, cwd="/")
    log(check.stdout.rstrip())

    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=cluster.run_dir / "operator.log", resync=5).start()
    log(f"== operator running (pid {op.proc.pid}, log {op.log_path}, metrics http://127.0.0.1:{op.metrics_port}/metrics)")
    try:
        log(f"== kubectl apply -f {example.relative_to(REPO)}")
        log(cluster.kubectl("apply", "-f", str(example)).stdout.rstrip())
        start = time.monotonic()
        try:
            obj = _wait(lambda: _ready(cluster, namespace, name), 120, f"{namespace}/{name} Ready")
        except TimeoutError as e:
            log(f"error: {e}\n--- operator log ---\n{op.log_tail()}")
            return 1
        log(f"== Ready after {time.monotonic() - start:.1f}s")
        log(cluster.kubectl("get", "pdd", "-n", namespace).stdout.rstrip())
        log("== status")
        log(yaml.safe_dump({k: obj["status"][k] for k in ("conditions", "prefill", "decode", "gateway", "compatKey", "kvLayout")}, sort_keys=False).rstrip())
        log("== child objects")
        sel = f"pd.sglang-operator.io/deployment={name}"
        log(cluster.kubectl("get", "deployments,services,configmaps,serviceaccounts,roles,rolebindings", "-n", namespace, "-l", sel).stdout.rstrip())
        log(cluster.kubectl("get", "pods", "-n", namespace, "-l", sel, "-o", "wide").stdout.rstrip())
        cm = f"{name}-{obj['status']['compatKey'][:6]}-decode-config"
        log(f"== the decode role's SGLang config file (ConfigMap {cm})")
        log(json.loads(cluster.kubectl("get", "configmap", cm, "-n", namespace, "-o", "json").stdout)["data"]["config.yaml"].rstrip())
        if once:
            return 0
        log(f"== running; try: KUBECONFIG={cluster.kubeconfig} kubectl get pdd -A   (Ctrl-C stops everything)")
        while op.alive():
            time.sleep(1)
        log(f"error: the operator exited\n{op.log_tail()}")
        return 1
    finally:
        op.stop()
