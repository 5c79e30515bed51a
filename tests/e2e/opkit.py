"""Helpers for operator e2e tests: run the operator as a process, wait for conditions, read objects.

Imported by the e2e test modules (pytest's pythonpath includes tests/e2e through
conftest). Nothing here fakes the API server: every call goes to the dev cluster.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_BIN = Path(sys.executable).parent / "sglang-pd-operator"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.5, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; raise AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """``sglang-pd-operator run`` as a child process with its own log file and metrics port."""

    def __init__(self, *, kubeconfig: Path, log_path: Path, resync: float = 2.0):
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.resync = resync
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONSAFEPATH": "1"}
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                str(OPERATOR_BIN), "run", "--kubeconfig", str(self.kubeconfig), "--resync", str(self.resync),
                "--metrics-port", str(self.metrics_port), "--liveness-port", "0",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            start_new_session=True,
        )  # fmt: skip
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process (SIGKILL by default: a crash, no cleanup) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        """Graceful stop (SIGTERM)."""
        self.kill(signal.SIGTERM)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def kget(cluster, *args: str) -> dict[str, Any] | None:
    """``kubectl get ... -o json`` as a dict, or None when it fails (e.g. not found)."""
    res = cluster.kubectl("get", *args, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    return json.loads(res.stdout)


def kapply(cluster, obj: dict[str, Any] | list[dict[str, Any]], *, check: bool = True) -> subprocess.CompletedProcess:
    """``kubectl apply -f -`` of one object or a list (server-side, as GitOps tools do)."""
    docs = obj if isinstance(obj, list) else [obj]
    return cluster.kubectl(
        "apply", "--server-side", "--field-manager=e2e-user", "-f", "-", input=yaml.safe_dump_all(docs), check=check
    )


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition of ``type_`` in ``obj.status.conditions``, or None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def model_store(namespace: str) -> list[dict[str, Any]]:
    """A statically bound PV + PVC named model-store in ``namespace`` (kwok pods never read it)."""
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


def children(cluster, namespace: str, name: str) -> dict[str, list[str]]:
    """Names of the objects the operator made for PDDeployment ``name``, by kind."""
    out: dict[str, list[str]] = {}
    sel = f"pd.sglang-operator.io/deployment={name}"
    for kind in ("deployments", "configmaps", "services", "serviceaccounts", "roles", "rolebindings"):
        got = kget(cluster, kind, "-n", namespace, "-l", sel) or {"items": []}
        out[kind] = sorted(i["metadata"]["name"] for i in got["items"])
    return out


def pods(cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """Pods matching ``selector``."""
    return (kget(cluster, "pods", "-n", namespace, "-l", selector) or {"items": []})["items"]
