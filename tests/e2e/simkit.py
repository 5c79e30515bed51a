"""Engine simulators and the real smg gateway as processes, answering at kwok pod IPs.

kwok gives pods loopback IPs (127.10x.y.z), so a process bound to a pod's IP and port is
reached exactly as the real engine would be: by smg's Kubernetes discovery (pod IP +
``--service-discovery-port``, bootstrap port from the pod annotation) and by the
operator's scraper (pod IP:30000/metrics, gateway pod IP:29000/metrics). Every process
started here is stopped by :meth:`Processes.stop_all` (the test fixture calls it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = ROOT / "tools" / "engine_simulator"
LOADGEN = ROOT / "tools" / "loadgen.py"
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"


def smg_binary() -> str | None:
    """The smg==1.13.0 console script: $SMG_BIN, PATH, the project venv, the contract venv."""
    candidates = [os.environ.get("SMG_BIN"), shutil.which("smg"), str(Path(sys.executable).with_name("smg")),
                  str(ROOT / ".venv" / "bin" / "smg"), "/tmp/contract-venv/bin/smg"]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def master_binary() -> str:
    """The mooncake_master executable of the installed mooncake-transfer-engine, or skip (pytest)."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mooncake-transfer-engine is not installed (pip install -r requirements/contract.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / "mooncake_master"
    if not path.exists():
        found = shutil.which("mooncake_master", path=os.path.dirname(sys.executable))
        if not found:
            pytest.skip("the mooncake package ships no mooncake_master binary")
        return found
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return str(path)


def get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


class Processes:
    """Child processes of one test, each in its own session with a log file in ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_dir,
                                env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str) -> None:
        """SIGTERM, then SIGKILL after 10 s; waits for the process."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def log(self, name: str, lines: int = 40) -> str:
        try:
            return "\n".join((self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_simulator(procs: Processes, pod: dict[str, Any], *, model: str, served_model_name: str,
                    extra: list[str] | None = None) -> str:
    """A simulator for an engine pod: its role, bound to its IP:30000 (prefill: its bootstrap
    port from the pod annotation too). Returns the pod's name (the process name)."""
    meta = pod["metadata"]
    role = meta["labels"]["pd.sglang-operator.io/role"]
    ip = pod["status"]["podIP"]
    argv = [sys.executable, str(SIMULATOR), "--role", role, "--host", ip, "--port", "30000",
            "--model", model, "--served-model-name", served_model_name, *(extra or [])]
    if role == "prefill":
        argv += ["--bootstrap-port", meta["annotations"][BOOTSTRAP_ANNOTATION]]
    procs.start(meta["name"], argv)
    return meta["name"]


def wait_answering(urls: list[str], *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        pending = [u for u in pending if not answers(u)]
        if pending:
            time.sleep(0.2)
    if pending:
        raise AssertionError(f"not answering after {timeout:.0f}s: {pending}")


def with_address(args: list[str], *, host: str, port: int | None = None, prometheus_port: int | None = None
                 ) -> list[str]:
    """``args`` (smg launch arguments) with --host/--prometheus-host set to ``host`` and, when
    given, --port / --prometheus-port replaced; everything else unchanged."""
    out = list(args)
    replace = {"--host": host, "--prometheus-host": host}
    if port is not None:
        replace["--port"] = str(port)
    if prometheus_port is not None:
        replace["--prometheus-port"] = str(prometheus_port)
    for flag, value in replace.items():
        i = out.index(flag)
        out[i + 1] = value
    return out


def start_smg(procs: Processes, args: list[str], *, kubeconfig: Path, name: str = "smg") -> None:
    """``smg launch ARGS`` with the cluster's kubeconfig (kube-rs reads $KUBECONFIG)."""
    smg = smg_binary()
    assert smg is not None
    procs.start(name, [smg, "launch", *args], env={"KUBECONFIG": str(kubeconfig)})
