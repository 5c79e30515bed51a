"""Engine simulators and the real smg gateway as processes, answering at kwok pod IPs.

kwok gives pods loopback IPs (127.10x.y.z), so a process bound to a pod's IP and port is
reached exactly as the real engine would be: by smg's Kubernetes discovery (pod IP +
``--service-discovery-port``, bootstrap port from the pod annotation) and by the
operator's scraper (pod IP:30000/metrics, gateway pod IP:29000/metrics). Every process
started here is stopped by :meth:`Processes.stop_all` (the test fixture calls it).

kwok runs no probes: its stages make a pod Ready at once. A test that needs readiness
decided by the rendered probes installs :func:`probe_policy` (a MutatingAdmissionPolicy
that starts the chosen pods NotReady) and runs a :class:`Prober`, which plays the
kubelet's prober against the simulators and writes its verdict where kwok reads it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATOR = ROOT / "tools" / "engine_simulator"
LOADGEN = ROOT / "tools" / "loadgen.py"
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"  # on every pod of a LeaderWorkerSet group


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


@dataclass
class PDStack:
    """A PDDeployment's pods served for real: one simulator per engine pod and the real smg
    on the gateway pod's address. ``engine``: the engine pods; ``by_role``: prefill / decode
    pods; ``gateway``: smg's URL; ``served``: the served model name; ``key``: the compat key."""

    engine: list[dict[str, Any]]
    by_role: dict[str, list[dict[str, Any]]]
    gateway_pod: dict[str, Any]
    gateway: str
    served: str
    key: str


def serve_pd(cluster, procs: Processes, ready: dict[str, Any], *, sim_extra: list[str]) -> PDStack:
    """Start a simulator for every engine pod of the Ready PDDeployment ``ready`` (``sim_extra``
    appended to each one's arguments, plus ``--seed <i>``) and smg with the operator's rendered
    gateway arguments; returns once smg registered every prefill and decode pod it serves (of a
    multi-node role, the LeaderWorkerSet leaders)."""
    from opkit import kget, pods, wait_for

    ns, name = ready["metadata"]["namespace"], ready["metadata"]["name"]
    lbl = "pd.sglang-operator.io"
    model = ready["spec"]["model"]
    served = model["servedModelName"]
    engine = pods(cluster, ns, f"{lbl}/deployment={name},{lbl}/role in (prefill,decode)")
    by_role = {r: [p for p in engine if p["metadata"]["labels"][f"{lbl}/role"] == r] for r in ("prefill", "decode")}
    for i, p in enumerate(engine):
        start_simulator(procs, p, model=model["name"], served_model_name=served, extra=["--seed", str(i), *sim_extra])
    wait_answering([f"http://{p['status']['podIP']}:30000/health" for p in engine])
    key = ready["status"]["compatKey"]
    rendered = kget(cluster, "deployment", f"{name}-{key[:6]}-gateway", "-n", ns)
    rendered = rendered["spec"]["template"]["spec"]["containers"][0]["args"]
    (gw_pod,) = pods(cluster, ns, f"{lbl}/deployment={name},{lbl}/role=gateway")
    args = with_address(rendered, host=gw_pod["status"]["podIP"])
    gateway = f"http://{gw_pod['status']['podIP']}:{args[args.index('--port') + 1]}"
    start_smg(procs, args, kubeconfig=cluster.kubeconfig)
    wait_answering([gateway + "/health"], timeout=30)
    # smg serves every pod of a single-node role, the leader (worker index 0) of a multi-node one
    serving = {r: [p for p in pods_ if p["metadata"]["labels"].get(LWS_WORKER_INDEX, "0") == "0"]
               for r, pods_ in by_role.items()}
    n_p, n_d = len(serving["prefill"]), len(serving["decode"])
    wait_for(lambda: (w := get_json(gateway + "/workers"))["stats"]["prefill_count"] == n_p
             and w["stats"]["decode_count"] == n_d, timeout=60, what=f"smg registered {n_p} prefill + {n_d} decode")
    return PDStack(engine=engine, by_role=by_role, gateway_pod=gw_pod, gateway=gateway, served=served, key=key)


def run_load(gateway: str, model: str, out: Path, *, requests: int, concurrency: int, max_tokens: int,
             background: bool = False):
    """tools/loadgen.py against ``gateway``, as a user would run it: its JSON report (``out``),
    or with ``background`` the running process."""
    argv = [sys.executable, str(LOADGEN), "--url", gateway, "--model", model, "--requests", str(requests),
            "--concurrency", str(concurrency), "--max-tokens", str(max_tokens), "--out", str(out)]
    env = {"PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin"}
    if background:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=out.parent, env=env)
    res = subprocess.run(argv, capture_output=True, text=True, cwd=out.parent, timeout=180, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    print(res.stdout)
    return json.loads(out.read_text())


# --------------------------------------------------------------------------- readiness
KWOK_READY = "pd.sglang-operator.io/kwok-ready"
#: The address an exec probe names for "this pod": inside a pod it is the pod's own loopback.
POD_LOOPBACK = "127.0.0.1"


def probe_policy(namespace: str, *, role: str | tuple[str, ...] = "prefill") -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy and its binding: pods of ``role`` (one or several) created in ``namespace`` get
    ``pd.sglang-operator.io/kwok-ready: "false"``, so kwok starts them Running but NotReady
    and leaves their readiness to a :class:`Prober` (the kubelet's part). Cluster-scoped
    objects named after the namespace; delete them after the test."""
    name = f"kwok-probe-{namespace}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                    "expression": 'Object{metadata: Object.metadata{annotations: {"%s": "false"}}}' % KWOK_READY}}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "objectSelector": {"matchExpressions": [{"key": "pd.sglang-operator.io/role", "operator": "In",
                                                             "values": [role] if isinstance(role, str) else list(role)}]},
                },
            },
        },
    ]


def run_probe(pod: dict[str, Any], container: dict[str, Any], probe: dict[str, Any]) -> tuple[bool, str]:
    """Run one Kubernetes probe of ``container`` against the pod as the kubelet would; (passed, message).

    exec: the command with the container's literal env, ``python3`` being this
    interpreter, and 127.0.0.1 (the pod's loopback inside its network namespace) replaced
    by the pod IP, since kwok pods share this machine's loopback and the simulator binds the
    pod IP; killed after ``timeoutSeconds``. httpGet: GET on the pod IP (named ports
    resolved from the container), 200-399 passes. tcpSocket: a connect.
    """
    ip = pod["status"]["podIP"]
    timeout = float(probe.get("timeoutSeconds", 1))
    ports = {p["name"]: p["containerPort"] for p in container.get("ports") or [] if p.get("name")}
    if "exec" in probe:
        argv = [ip if a == POD_LOOPBACK else a for a in probe["exec"]["command"]]
        if argv and argv[0] in ("python3", "python"):
            argv[0] = sys.executable
        env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}}
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return False, f"exec timed out after {timeout:.0f}s"
        return res.returncode == 0, (res.stdout + res.stderr).strip()
    if "httpGet" in probe:
        h = probe["httpGet"]
        port = ports.get(h["port"], h["port"])
        try:
            with urllib.request.urlopen(f"http://{ip}:{port}{h.get('path', '/')}", timeout=timeout) as resp:
                return 200 <= resp.status < 400, f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            return False, f"HTTP {err.code}"
        except (urllib.error.URLError, ConnectionError, OSError) as err:
            return False, str(err)
    if "tcpSocket" in probe:
        port = probe["tcpSocket"]["port"]
        try:
            socket.create_connection((ip, int(ports.get(port, port))), timeout=timeout).close()
            return True, "connected"
        except OSError as err:
            return False, str(err)
    return True, "no handler"


class Prober:
    """The kubelet's prober for kwok pods whose readiness a test hands over (see :func:`probe_policy`).

    A thread lists the namespace's pods carrying the ``kwok-ready`` annotation every 0.2 s
    and, per container, runs the rendered startupProbe until it passes, then the
    readinessProbe every ``periodSeconds``, with ``successThreshold`` /
    ``failureThreshold`` as the kubelet counts them. The verdict becomes the annotation
    (``"true"`` / ``"false"``), which kwok's stages (hack/cluster/kwok) turn into the pod's
    Ready condition, so the API server, the operator and smg see exactly what the rendered
    probe decided. ``history``: (monotonic time, pod, probe kind, passed, message).
    """

    def __init__(self, api, namespace: str) -> None:
        from kubernetes import client as k8s

        self.core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.history: list[tuple[float, str, str, bool, str]] = []
        self._state: dict[tuple[str, str], dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Prober":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pods = self.core.list_namespaced_pod(self.namespace, _request_timeout=10).items
            except Exception:  # noqa: BLE001 - the API server can be busy; try again next tick
                pods = []
            for pod in pods:
                ann = pod.metadata.annotations or {}
                if KWOK_READY not in ann or pod.metadata.deletion_timestamp or not pod.status.pod_ip:
                    continue
                self._probe_pod(self.core.api_client.sanitize_for_serialization(pod))
            self._stop.wait(0.2)

    def _probe_pod(self, pod: dict[str, Any]) -> None:
        name, now = pod["metadata"]["name"], time.monotonic()
        verdicts = []
        for c in pod["spec"]["containers"]:
            st = self._state.setdefault((name, c["name"]), {"started": "startupProbe" not in c, "next": 0.0,
                                                             "ok": 0, "fail": 0, "ready": False})
            kind = "readinessProbe" if st["started"] else "startupProbe"
            probe = c.get(kind)
            if probe is None:
                st["ready"] = st["started"] = True
            elif now >= st["next"]:
                st["next"] = now + float(probe.get("periodSeconds", 10))
                passed, message = run_probe(pod, c, probe)
                self.history.append((time.monotonic(), name, kind, passed, message))
                if kind == "startupProbe":
                    if passed:
                        st["started"], st["next"] = True, 0.0
                else:
                    st["ok"], st["fail"] = (st["ok"] + 1, 0) if passed else (0, st["fail"] + 1)
                    if st["ok"] >= int(probe.get("successThreshold", 1)):
                        st["ready"] = True
                    elif st["fail"] >= int(probe.get("failureThreshold", 3)) or not st["ready"]:
                        st["ready"] = False
            verdicts.append(st["ready"])
        want = "true" if verdicts and all(verdicts) else "false"
        if pod["metadata"]["annotations"].get(KWOK_READY) != want:
            self.core.patch_namespaced_pod(name, self.namespace, {"metadata": {"annotations": {KWOK_READY: want}}})


# --------------------------------------------------------------------------- a fleet that follows scaling
class SimulatorFleet:
    """A simulator for every engine pod of a PDDeployment, following its scaling: a thread lists the
    deployment's prefill and decode pods every 0.5 s, starts a simulator (``start_simulator``, with
    ``extra`` and ``--seed <n>``) for each new pod that has an IP, and stops the simulator of a pod
    that is gone. ``started``: (monotonic time, pod name, role) of every start. Use as a context
    manager; stopping it stops its simulators."""

    def __init__(self, api, procs: Processes, namespace: str, name: str, *, model: str, served_model_name: str,
                 extra: list[str] | None = None) -> None:
        from kubernetes import client as k8s

        self.core = k8s.CoreV1Api(api)
        self.procs, self.namespace, self.name = procs, namespace, name
        self.model, self.served, self.extra = model, served_model_name, list(extra or [])
        self.running: dict[str, str] = {}  # pod name -> uid
        self.started: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SimulatorFleet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.running):
            self.procs.stop(pod)

    def _run(self) -> None:
        selector = f"pd.sglang-operator.io/deployment={self.name},pd.sglang-operator.io/role in (prefill,decode)"
        while not self._stop.is_set():
            try:
                items = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _request_timeout=10).items
            except Exception:  # noqa: BLE001 - a busy API server: next tick
                items = None
            if items is not None:
                live = {}
                for pod in items:
                    if pod.metadata.deletion_timestamp or not pod.status.pod_ip:
                        continue
                    live[pod.metadata.name] = pod.metadata.uid
                    if self.running.get(pod.metadata.name) != pod.metadata.uid:
                        body = self.core.api_client.sanitize_for_serialization(pod)
                        start_simulator(self.procs, body, model=self.model, served_model_name=self.served,
                                        extra=[*self.extra, "--seed", str(len(self.started))])
                        self.running[pod.metadata.name] = pod.metadata.uid
                        self.started.append((time.monotonic(), pod.metadata.name,
                                             pod.metadata.labels["pd.sglang-operator.io/role"]))
                for gone in set(self.running) - set(live):
                    self.procs.stop(gone)
                    del self.running[gone]
            self._stop.wait(0.5)
