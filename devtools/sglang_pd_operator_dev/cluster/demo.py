"""``dev demo``: the main job on the local control plane, start to finish.

Starts the dev cluster, installs the CRDs (and waits until the API server serves them),
creates the example's namespace and its ``model-store`` PV and PVC, runs the operator as
a process, applies the GB300 example (or ``--example``), prints the resolved plan and
every child object once the PDDeployment is Ready, then keeps running until Ctrl-C,
printing what to paste in a second terminal (``--once``: stop right away); if its operator
exits meanwhile, the cluster stays up until Ctrl-C (:func:`serve_until_interrupted`). When the
PDDeployment does not get Ready, it prints why: its conditions and the namespace's recent
Warning events. Also home of the pieces the e2e tests reuse: :class:`OperatorProcess`,
:func:`install_crds` and :func:`model_store`.
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

from sglang_pd_operator_dev.cluster import components, rest
from sglang_pd_operator_dev.cluster.cluster import admin_api
from sglang_pd_operator_dev.cluster.handle import ToolFailed
from sglang_pd_operator_dev.cluster.paths import repo_root

REPO = repo_root()
GB300_EXAMPLE = REPO / "examples" / "dsv41-flash-gb300-low-latency.yaml"
#: Seconds the demo waits for the PDDeployment to be Ready.
READY_TIMEOUT_S = 120.0


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def operator_command() -> list[str]:
    """How to start this package's command line from any directory (the venv's entry point)."""
    exe = Path(sys.executable).parent / "sglang-pd-operator"
    return [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "sglang_pd_operator.cli"]


_LIVE: set[Any] = set()


@atexit.register
def _stop_leftovers() -> None:
    """Kill operator processes a failed test or an interrupted demo did not stop."""
    for op in list(_LIVE):
        op.kill()


class OperatorProcess:
    """``sglang-pd-operator run`` as a child process in its own session, logging to a file.

    Started processes are killed at interpreter exit if nobody stopped them, so a failing
    test cannot leave an operator retrying against a cluster that is gone.
    ``resync``: seconds passed as ``--resync`` (None: the operator's own default);
    ``command``: the command line to run instead of this package's (e.g. another
    checkout's ``.venv/bin/sglang-pd-operator``, as benchmarks/bench_scale.py does).
    """

    def __init__(
        self,
        *,
        kubeconfig: Path,
        log_path: Path,
        resync: float | None = 2.0,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ):
        self.kubeconfig = Path(kubeconfig)
        self.env = dict(env or {})
        self.log_path = Path(log_path)
        self.resync = resync
        self.extra_args = list(extra_args or [])
        self.command = list(command) if command else operator_command()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> "OperatorProcess":
        """Start the process; returns self."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONSAFEPATH": "1", **self.env}
        self._log = open(self.log_path, "ab")
        resync = ["--resync", str(self.resync)] if self.resync is not None else []
        argv = [
            *self.command, "run", "--kubeconfig", str(self.kubeconfig), *resync,
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


class OracleProcess:
    """``sglang-pd-operator oracle serve`` from this venv as a child process in its own session (the
    dev cluster's SGLang oracle service, as the chart's ``oracle.enabled`` runs it in a cluster).

    ``warm``: accelerators whose workers start at once; :meth:`wait_ready` waits for
    ``/readyz``. Killed at interpreter exit if nobody stopped it. Needs sglang 0.5.23 in
    this venv (``hack/setup.sh --contract`` or ``sglang-pd-operator sglang install``);
    :func:`oracle_unavailable` says why not.
    """

    def __init__(self, *, log_path: Path, warm: tuple[str, ...] = ("gb300",), port: int | None = None,
                 extra_args: list[str] | None = None):
        self.log_path = Path(log_path)
        self.warm = tuple(warm)
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The service's base URL (what ``run --oracle-url`` takes)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "OracleProcess":
        """Start the process; returns self."""
        self._log = open(self.log_path, "ab")
        argv = [*operator_command(), "oracle", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--warm", ",".join(self.warm), *self.extra_args]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd="/",
                                     env={**os.environ, "PYTHONSAFEPATH": "1"}, start_new_session=True)
        _LIVE.add(self)
        return self

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until ``/readyz`` answered 200 (its warm workers imported SGLang); raises
        TimeoutError (or RuntimeError when the process exited) with the log's tail."""
        import urllib.error
        import urllib.request

        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if not self.alive():
                raise RuntimeError(f"oracle serve exited\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - start
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"oracle serve not ready in {timeout:.0f}s\n{self.log_tail()}")

    def stats(self) -> dict[str, Any]:
        """The service's ``/stats`` (queue, cache hits, judged ...)."""
        import urllib.request

        with urllib.request.urlopen(self.url + "/stats", timeout=5) as r:
            return json.load(r)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the process group (the service and its SGLang workers); SIGKILL by default."""
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

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the service's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def oracle_unavailable() -> str | None:
    """Why ``oracle serve`` cannot run from this venv (sglang 0.5.23 missing), None when it can."""
    from sglang_pd_operator.oracle import unavailable

    return unavailable()


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


def install_crds(cluster, *, log: Callable[[str], None] | None = None, timeout: float = 60.0) -> list[str]:
    """Server-side apply ``crds/`` and wait until each CRD is Established and a plain list
    of its resource answers 200 in every served version; returns the CRD names. Then
    ``crds/policies/`` too (the admission policy that gives each multi-node GB200 / GB300
    replica its own IMEX channel), as ``kubectl apply -f crds/ -f crds/policies/`` installs
    the operator without the chart.

    Established alone is not enough: until the API server's watch cache of a new resource
    has started, a list or watch of it answers 429 "storage is (re)initializing", and an
    operator started in that window logs a failed request (kopf retries it). The list is
    sent without retries (``rest.Api``), as kopf's first one is. Raises TimeoutError with
    the last answer after ``timeout`` seconds.
    """
    start = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    api = admin_api(components.Layout(run_dir=Path(cluster.run_dir)), cluster.server)
    names = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        name, group, plural = crd["metadata"]["name"], crd["spec"]["group"], crd["spec"]["names"]["plural"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", f"--timeout={timeout:.0f}s")
        for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served")):
            _wait_listable(api, f"/apis/{group}/{version}/{plural}", deadline=start + timeout)
        names.append(name)
    if log:
        log(f"== CRDs Established and served after {time.monotonic() - start:.1f}s: {', '.join(names)}")
    policies = REPO / "crds" / "policies"
    if policies.is_dir():
        cluster.kubectl("apply", "--server-side", "-f", str(policies))
        if log:
            log(f"== admission policies applied: {', '.join(p.name for p in sorted(policies.glob('*.yaml')))}")
    return names


def _wait_listable(api: rest.Api, path: str, *, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        try:
            status, text = api.request("GET", path)
        except rest.ApiError as err:
            status, text = 0, str(err)
        if status == 200:
            return
        last = f"HTTP {status}: {text.strip()[:200]}"
        time.sleep(0.2)
    raise TimeoutError(f"GET {path} did not answer 200 in time (last: {last})")


def prepare_namespace(cluster, namespace: str, *, log: Callable[[str], None]) -> None:
    """Create ``namespace`` and its ``model-store`` PV and PVC (:func:`model_store`), one log line each.

    An existing namespace is kept. Raises ToolFailed when kubectl fails otherwise.
    """
    res = cluster.kubectl("create", "namespace", namespace, check=False)
    if res.returncode != 0 and "AlreadyExists" not in res.stderr:
        raise ToolFailed(res)
    log(f"== namespace {namespace}: {'created' if res.returncode == 0 else 'exists already'}")
    for obj in model_store(namespace):
        out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj)).stdout.split()
        verb = out[-1] if out else "applied"  # kubectl: "persistentvolume/<name> created"
        meta, spec = obj["metadata"], obj["spec"]
        if obj["kind"] == "PersistentVolume":
            log(f"== PersistentVolume {meta['name']} ({spec['capacity']['storage']}, hostPath "
                f"{spec['hostPath']['path']}, reserved for {namespace}/model-store): {verb}")
        else:
            log(f"== PersistentVolumeClaim {namespace}/{meta['name']} (bound to {spec['volumeName']}; "
                f"the examples read their weights from it): {verb}")


def loopback_endpoint_noise(event: dict) -> bool:
    """True for the endpoint slice controller's complaint that a pod IP is a loopback
    address: the dev cluster's pod IPs are loopback on purpose (docs/dev-cluster.md, Limits)."""
    return event.get("reason") == "FailedToUpdateEndpointSlices" and "loopback range" in (event.get("message") or "")


def not_ready_report(obj: dict | None, events: list[dict], *, limit: int = 10) -> list[str]:
    """Why a PDDeployment is not Ready, for a person: its conditions (type, status, reason,
    message) and the last ``limit`` of ``events`` (core/v1 Events, e.g. the namespace's
    Warnings), oldest first, leaving out the dev cluster's harmless loopback endpoint
    events (counted on one line). Pure.
    """
    noise = [e for e in events if loopback_endpoint_noise(e)]
    events = [e for e in events if not loopback_endpoint_noise(e)]
    if obj is None:
        lines = ["the PDDeployment does not exist"]
    else:
        meta = obj["metadata"]
        st = obj.get("status") or {}
        lines = [f"conditions of {meta.get('namespace')}/{meta['name']} (generation {meta.get('generation')}, "
                 f"observed {st.get('observedGeneration')}):"]
        conditions = st.get("conditions") or []
        if not conditions:
            lines.append("  (none: the operator has not written status yet)")
        for c in conditions:
            lines.append(f"  {c.get('type')}={c.get('status')}" + (f" {c['reason']}" if c.get("reason") else "")
                         + (f": {c['message']}" if c.get("message") else ""))
    recent = sorted(events, key=_event_time)[-limit:]
    lines.append(f"recent Warning events ({len(recent)} of {len(events)}):" if events else "no Warning events")
    if noise:
        lines.append(f"  ({len(noise)} FailedToUpdateEndpointSlices events about loopback pod IPs left out: "
                     f"harmless on the dev cluster)")
    for e in recent:
        involved = e.get("involvedObject") or {}
        count = e.get("count") or (e.get("series") or {}).get("count") or 1
        lines.append(f"  {_event_time(e)[11:19] or '--:--:--'} {involved.get('kind')}/{involved.get('name')} "
                     f"{e.get('reason')}: {e.get('message', '').strip()}" + (f" (x{count})" if count > 1 else ""))
    return lines


def _event_time(event: dict) -> str:
    """The latest RFC 3339 time an Event carries ('' when none)."""
    return (event.get("lastTimestamp") or (event.get("series") or {}).get("lastObservedTime")
            or event.get("eventTime") or event.get("metadata", {}).get("creationTimestamp") or "")


def _warning_events(cluster, namespace: str) -> list[dict]:
    res = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "type=Warning", "-o", "json", check=False)
    return json.loads(res.stdout).get("items", []) if res.returncode == 0 else []


def _pdd(cluster, namespace: str, name: str) -> dict | None:
    res = cluster.kubectl("get", "pdd", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _settled(cluster, namespace: str, name: str) -> dict | None:
    """The PDDeployment once its current generation is Ready or refused (Valid False), else None."""
    obj = _pdd(cluster, namespace, name)
    if obj is None:
        return None
    gen = obj["metadata"].get("generation")
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("observedGeneration") != gen:
            continue
        if (c["type"], c["status"]) in (("Ready", "True"), ("Valid", "False")):
            return obj
    return None


def _refused(obj: dict) -> bool:
    return any(c["type"] == "Valid" and c["status"] == "False" for c in (obj.get("status") or {}).get("conditions") or [])


def running_hints(cluster, *, namespace: str, operator_log: Path) -> list[str]:
    """What the demo prints once it is up: how to use the cluster from a second terminal."""
    examples = sorted((REPO / "examples").glob("*.yaml"))
    return [
        "== running until Ctrl-C (the cluster and the operator stay up). In a second terminal:",
        *(f"     {line}" for line in cluster.shell_exports()),
        "     kubectl get pdd -A",
        f"     kubectl apply --server-side -f {examples[0].parent}/<example>.yaml",
        f"   kubectl: {cluster.bin_dir / 'kubectl'} (this cluster's version; the PATH line puts it first)",
        f"   namespace {namespace} and its model-store PVC exist; examples: {', '.join(p.name for p in examples)}",
        f"   operator log: {operator_log}",
    ]


#: The Lease the demo's operator (``run`` with its defaults, the kubeconfig without a namespace) elects a leader on.
DEMO_LEASE = ("default", "sglang-pd-operator")


def _lease_holder(cluster) -> str | None:
    """The identity holding the demo's leader Lease, None when unknown."""
    namespace, name = DEMO_LEASE
    res = cluster.kubectl("get", "lease", name, "-n", namespace, "-o", "jsonpath={.spec.holderIdentity}", check=False)
    return (res.stdout.strip() or None) if res.returncode == 0 else None


def operator_exited_lines(*, pid: int, returncode: int | None, holder: str | None, log_path: Path) -> list[str]:
    """What the demo says when its operator exits while the demo waits for Ctrl-C. Pure."""
    if returncode is None:
        how = "exited"
    elif returncode < 0:
        how = f"was stopped by signal {signal.Signals(-returncode).name}" if -returncode in signal.valid_signals() \
            else f"exited (signal {-returncode})"
    else:
        how = f"exited with code {returncode}"
    namespace, name = DEMO_LEASE
    lease = (f"the Lease {namespace}/{name} is held by {holder}" if holder
             else f"nobody holds the Lease {namespace}/{name} now")
    return [
        f"== the demo's operator (pid {pid}) {how}; its log: {log_path}",
        "   The cluster stays up until Ctrl-C, with everything applied to it. This demo does not restart its",
        f"   operator: another `sglang-pd-operator run` on this cluster takes over once it holds the Lease ({lease};",
        f"   kubectl get lease {name} -n {namespace}). Without one, nothing reconciles your PDDeployments.",
    ]


def serve_until_interrupted(op, *, log: Callable[[str], None], lease_holder: Callable[[], str | None],
                            sleep: Callable[[float], None] = time.sleep) -> None:
    """The demo's foreground wait: returns only by KeyboardInterrupt (Ctrl-C, SIGTERM).

    The operator may exit meanwhile (a user stopping it to try the failover the README
    describes): the demo then says so (which pid, how it exited, who holds the Lease) and
    keeps the cluster up, so that another ``run`` can take over. It does not restart it.
    """
    while op.alive():
        sleep(1)
    proc = op.proc
    log("\n".join(operator_exited_lines(pid=proc.pid if proc else -1, returncode=proc.returncode if proc else None,
                                        holder=lease_holder(), log_path=op.log_path)))
    while True:
        sleep(1)


def run_demo(*, cluster, example: Path, log: Callable[[str], None], once: bool) -> int:
    """Drive the demo on a running ``cluster``; returns a process exit code."""
    doc = yaml.safe_load(example.read_text())
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    log("== installing the CRDs (server-side apply of crds/)")
    install_crds(cluster, log=log)
    prepare_namespace(cluster, namespace, log=log)

    log("== the resolved plan (sglang-pd-operator check)")
    check = subprocess.run([*operator_command(), "check", str(example)], capture_output=True, text=True, cwd="/")
    log(check.stdout.rstrip())

    if cluster.oracle_url:
        log(f"== SGLang oracle service ready ({cluster.oracle_url}, the dev cluster's, log "
            f"{cluster.run_dir / 'logs' / 'oracle.log'}); the operator asks it before any child exists")
    else:
        log("== no SGLang oracle service (see above why); Valid comes from the operator's rules alone")
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=cluster.run_dir / "operator.log", resync=5,
                         extra_args=["--oracle-url", cluster.oracle_url] if cluster.oracle_url else None).start()
    log(f"== operator running (pid {op.proc.pid}, log {op.log_path}, metrics http://127.0.0.1:{op.metrics_port}/metrics)")
    try:
        log(f"== kubectl apply -f {example.relative_to(REPO) if example.is_relative_to(REPO) else example}")
        log(cluster.kubectl("apply", "-f", str(example)).stdout.rstrip())
        start = time.monotonic()
        try:
            obj = _wait(lambda: _settled(cluster, namespace, name), READY_TIMEOUT_S, f"{namespace}/{name} Ready")
        except TimeoutError as e:
            report = not_ready_report(_pdd(cluster, namespace, name), _warning_events(cluster, namespace))
            log("\n".join([f"error: {e}", *report, f"--- operator log (last lines; all in {op.log_path}) ---",
                            op.log_tail(20)]))
            return 1
        if _refused(obj):  # the operator refused the spec: no point waiting for Ready
            report = not_ready_report(obj, _warning_events(cluster, namespace))
            log("\n".join([f"error: the operator refused {namespace}/{name} (Valid=False); nothing was created", *report]))
            return 1
        valid = next((c for c in obj["status"].get("conditions") or [] if c["type"] == "Valid"), {})
        log(f"== Ready after {time.monotonic() - start:.1f}s; Valid: {valid.get('reason')}: {valid.get('message')}")
        log(cluster.kubectl("get", "pdd", "-n", namespace).stdout.rstrip())
        log("== status")
        shown = ("conditions", "prefill", "decode", "gateway", "compatKey", "kvLayout")  # kvLayout: DeepSeek-V4 only
        log(yaml.safe_dump({k: obj["status"][k] for k in shown if k in obj["status"]}, sort_keys=False).rstrip())
        log("== child objects")
        sel = f"pd.sglang-operator.io/deployment={name}"
        kinds = "deployments,services,configmaps,serviceaccounts,roles,rolebindings"
        multi_node = bool(cluster.kubectl("get", "leaderworkersets", "-n", namespace, "-l", sel, "-o", "name",
                                          check=False).stdout.strip())
        if multi_node:  # a role spanning nodes is a LeaderWorkerSet, on GB200 / GB300 with one ComputeDomain per replica
            kinds += ",leaderworkersets" + (",computedomains" if cluster.kubectl(
                "get", "crd", "computedomains.resource.nvidia.com", check=False).returncode == 0 else "")
        log(cluster.kubectl("get", kinds, "-n", namespace, "-l", sel).stdout.rstrip())
        log(cluster.kubectl("get", "pods", "-n", namespace, "-l", sel, "-o", "wide").stdout.rstrip())
        # the ConfigMap is named after its content: read the name the decode pods mount (Deployment or LeaderWorkerSet)
        decode_name = f"{name}-{obj['status']['compatKey'][:6]}-decode"
        workload = cluster.kubectl("get", "deployment", decode_name, "-n", namespace, "-o", "json", check=False)
        if workload.returncode != 0:
            workload = cluster.kubectl("get", "leaderworkerset", decode_name, "-n", namespace, "-o", "json")
        decode = json.loads(workload.stdout)
        template = decode["spec"]["template"] if decode["kind"] == "Deployment" else \
            decode["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        cm = next(v["configMap"]["name"] for v in template["spec"]["volumes"] if "configMap" in v)
        log(f"== the decode role's SGLang config file (ConfigMap {cm})")
        log(json.loads(cluster.kubectl("get", "configmap", cm, "-n", namespace, "-o", "json").stdout)["data"]["config.yaml"].rstrip())
        if once:
            return 0
        log("\n".join(running_hints(cluster, namespace=namespace, operator_log=op.log_path)))
        serve_until_interrupted(op, log=log, lease_holder=lambda: _lease_holder(cluster))
        return 0  # not reached: Ctrl-C unwinds as KeyboardInterrupt
    finally:
        op.stop()
