"""Release to release: v0.1.0 with a deployment Ready, then this release installed by its chart: nothing restarts.

The previous release is this repository's own commit b180e07 (CHANGELOG.md records each
release's commit), taken with ``git archive`` into a temporary folder and run from there
(its source folder linked as ``sglang_pd_operator`` on PYTHONPATH, ahead of this checkout's
editable install; the dependencies are this venv's, which v0.1.0's pins allow). A
dedicated dev cluster (not the session's: the CRDs go from v0.1.0's to this release's),
with an audit log of every write the chart's ServiceAccount makes.

Both releases are installed the way their README and chart say, CRDs, then the operator:
``kubectl apply --server-side -f crds/`` (docs/upgrades.md, "How to upgrade", step 1), then
``helm install`` of v0.1.0's chart (``b180e07:charts/``: its RBAC, a Deployment of two
replicas with leader election on a Lease, ``RollingUpdate``) and later ``helm upgrade`` to
this chart (its Deployment is ``strategy: Recreate``). Values: ``crds.install=false`` (the
CRDs are installed apart, as the README says to), ``operator.resyncSeconds=2`` (the test's
resync), the chart's defaults otherwise (leader election on, lease duration 15 s). kwok runs
no container, so :class:`ChartOperatorPods` plays the kubelet for the chart's operator pods:
for every pod that runs it starts ``sglang-pd-operator`` with the pod's rendered arguments
and env (``POD_NAME``: the Lease identity), v0.1.0's code for an image tagged 0.1.0, this
checkout's otherwise, as the chart's ServiceAccount (a TokenRequest token of its own per
process, whose JTI the audit log names); for a deleted pod it sends SIGTERM and holds the
pod with a finalizer until the process exited, as a kubelet holds a terminating pod.

1. v0.1.0's CRDs and chart, its GB300 example: Ready.
2. This release's CRDs (v0.1.0 still running, as in any upgrade), then the Lease across
   versions: this release's operator (the arguments this chart renders) is started beside
   v0.1.0's while v0.1.0's leader holds the Lease (what v0.1.0's ``RollingUpdate``, or a
   second install, would do). For longer than a lease duration it reconciles nothing (its
   own metrics) and the Lease stays v0.1.0's.
3. ``helm upgrade`` to this chart: the live Deployment is ``Recreate``; the Deployment
   controller deletes both v0.1.0 pods and creates this release's only once they are gone
   (no look of the stand-in sees pods of both versions, the last v0.1.0 process exited
   before the first new pod ran). v0.1.0's leader releases the Lease on SIGTERM; a process
   of this release takes it. The audit log shows it: every write this release made came
   after the last write v0.1.0 made, and each of its processes wrote first the Lease it
   took. Two versions never reconciled at the same time.
4. The new operator holds the group: ``UpgradePending`` says what an opt-in would change;
   sampled every 0.25 s from step 2 on, Ready never leaves True; every engine pod and every
   gateway pod has the UID it had (0 recreated), no pod template changed, no ReplicaSet or
   group was added. The process of step 2 is stopped: a pod of the chart takes the Lease and
   reconciles the group three times, still nothing restarts.
5. Opt-in (``spec.rollout.operatorChanges: apply``): a paired rollout to the new key,
   Complete, the old group deleted, Ready True at the new generation.

All of it under bounded load (issue 25, item 5; ``loadkit``): from v0.1.0's deployment Ready
until the opt-in's rollout is done, 3 requests per second enter through the gateway Service
(``ServiceProxyStandIn``: kube-proxy cannot route loopback pods here), reach the REAL smg of
each gateway pod (v0.1.0's rendered arguments, then this release's) and an engine simulator
per engine pod (``KubeletStandIn``, which also runs each deleted pod's preStop: v0.1.0's pods
have none, this release's drain). Failed requests must be 0 in both steps: the upgrade, and
the opt-in's paired rollout (v0.1.0's old group gets no new request after the cutover and is
deleted only after ``drainGracePeriod``).

The engine and gateway pod UIDs before and after, the time each step took and the table
of requests sent / failed per step are printed (``-s``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from loadkit import ChangeTable, KubeletStandIn, Load, ServiceProxyStandIn, print_table, smg_registered
from opkit import (OperatorProcess, condition, kapply, kget, looked, model_store, operator_metrics, pods, ready_now,
                   wait_for)
from simkit import Prober, probe_policy
from test_helm import sa_kubeconfig

from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster.demo import install_crds

pytestmark = pytest.mark.e2e

PREVIOUS = "b180e07"  # v0.1.0
PREVIOUS_TAG = "0.1.0"  # the image tag of its chart's operator pods
NS = "upgrade"
NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
SIM = ["--ttft-median", "0.05", "--itl-median", "0.05", "--itl-sigma", "0.05", "--prefill-median", "0.05"]
CHART = ROOT / "charts" / "sglang-pd-operator"
RELEASE, OPNS = "pd", "sglang-system"
SA = LEASE = "pd-sglang-pd-operator"  # the chart's full name for release "pd": its ServiceAccount and its Lease
#: The test's resync, and the CRDs installed apart (README: "CRDs, then the operator"); else the chart's defaults.
VALUES = ["--set", "operator.resyncSeconds=2", "--set", "crds.install=false"]
OPERATOR_PODS = "app.kubernetes.io/component=operator"
#: The chart's default leaderElection.leaseDuration (both releases'), seconds.
LEASE_DURATION = 15
#: v0.1.0's ``sglang-pd-operator`` from its source folder (``previous["py"]`` on PYTHONPATH).
V0_1_0_COMMAND = [sys.executable, "-c", "import sys; sys.argv[0] = 'sglang-pd-operator'; "
                  "from sglang_pd_operator.cli import main; main()"]
WRITES = ["create", "update", "patch", "delete", "deletecollection"]


@pytest.fixture(scope="module")
def upc(tmp_path_factory, cluster_log):
    """A dev cluster for this module only (the CRDs change release), auditing the chart's
    ServiceAccount's writes to ``<run dir>/audit.log``."""
    policy = tmp_path_factory.mktemp("audit") / "policy.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [{"level": "Metadata", "users": [f"system:serviceaccount:{OPNS}:{SA}"], "verbs": WRITES},
                  {"level": "None"}]}))
    run_dir = tmp_path_factory.mktemp("upgrade-cluster")
    running = devcluster.start_cluster(run_dir=run_dir, log=cluster_log, apiserver_args=[
        f"--audit-policy-file={policy}", f"--audit-log-path={run_dir / 'audit.log'}", "--audit-log-maxsize=100000"])
    try:
        yield running
    finally:
        running.stop(log=cluster_log)


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> dict[str, Path]:
    """v0.1.0's tree (``src``) and a PYTHONPATH folder (``py``) whose ``sglang_pd_operator`` is its source."""
    base = tmp_path_factory.mktemp("v0.1.0")
    src, py = base / "src", base / "py"
    src.mkdir()
    py.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=False)
    assert archive.returncode == 0, (f"git archive {PREVIOUS} failed (the release test needs this repository's "
                                     f"history): {archive.stderr.decode()[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    (py / "sglang_pd_operator").symlink_to(src / "operator")
    return {"src": src, "py": py}


def _jti(kubeconfig: Path) -> str:
    """The JTI of the token in ``kubeconfig`` (the audit log's ``credential-id``)."""
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def operator_process(version: str, previous: dict[str, Path], *, args: list[str], env: dict[str, str],
                     kubeconfig: Path, log_path: Path) -> OperatorProcess:
    """``sglang-pd-operator`` of ``version`` (:data:`PREVIOUS_TAG`: v0.1.0's code, else this checkout's) with a pod's rendered container
    ``args`` and ``env`` (its own metrics port: the processes share one network namespace)."""
    assert args[0] == "run", args
    run_args = [a for a in args[1:] if not a.startswith(("--metrics-port", "--liveness-port"))]
    if version == PREVIOUS_TAG:
        return OperatorProcess(kubeconfig=kubeconfig, log_path=log_path, resync=None, extra_args=run_args,
                               command=V0_1_0_COMMAND, env={**env, "PYTHONPATH": str(previous["py"])})
    return OperatorProcess(kubeconfig=kubeconfig, log_path=log_path, resync=None, extra_args=run_args, env=env)


def _container_env(pod_spec: dict, pod_name: str) -> dict[str, str]:
    """The operator container's env as the kubelet resolves it (the chart's fieldRefs: POD_NAME, POD_NAMESPACE)."""
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "operator"]
    fields = {"metadata.name": pod_name, "metadata.namespace": OPNS}
    return {e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container.get("env") or []}


class _Background:
    """A context whose ``_loop`` runs in a thread while it is open (``_stop`` ends it)."""

    def _loop(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._stop = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(timeout=10)


class ChartOperatorPods(_Background):
    """The kubelet's part for the chart's operator pods (see the module docstring). ``processes``: pod
    name -> (version, process); ``jtis``: token JTI -> "version pod"; ``events``: (monotonic time,
    "start" | "exit", pod, version); ``mixed``: looks that saw live pods of both versions."""

    FINALIZER = "e2e.sglang-operator.io/operator-pod-stand-in"

    def __init__(self, cluster, previous: dict[str, Path], logs: Path) -> None:
        self.cluster, self.previous, self.logs = cluster, previous, logs
        self.processes: dict[str, tuple[str, OperatorProcess]] = {}
        self.jtis: dict[str, str] = {}
        self.events: list[tuple[float, str, str, str]] = []
        self.mixed: list[list[str]] = []
        self.stopping: set[str] = set()
        self._lock = threading.Lock()

    @staticmethod
    def version(pod: dict) -> str:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "operator"]
        return container["image"].rsplit(":", 1)[1]

    def identity(self, label: str) -> Path:
        """A kubeconfig with a token of its own of the chart's ServiceAccount; its JTI is recorded as ``label``."""
        path = self.logs / f"{label.replace(' ', '-')}.kubeconfig"
        sa_kubeconfig(self.cluster, path, namespace=OPNS, sa=SA)
        self.jtis[_jti(path)] = label
        return path

    def _hold(self, name: str, on: bool) -> None:
        patch = {"metadata": {"finalizers": [self.FINALIZER] if on else None}}
        self.cluster.kubectl("patch", "pod", name, "-n", OPNS, "--type", "merge", "-p", json.dumps(patch), check=False)

    def _start(self, pod: dict) -> None:
        name, version = pod["metadata"]["name"], self.version(pod)
        self._hold(name, True)
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "operator"]
        proc = operator_process(version, self.previous, args=container["args"],
                                env=_container_env(pod["spec"], name),
                                kubeconfig=self.identity(f"{version} {name}"), log_path=self.logs / f"{name}.log")
        with self._lock:
            self.processes[name] = (version, proc.start())
            self.events.append((time.monotonic(), "start", name, version))

    def _terminate(self, name: str) -> None:
        version, proc = self.processes[name]
        proc.stop()  # SIGTERM, then the process's own graceful stop
        with self._lock:
            self.events.append((time.monotonic(), "exit", name, version))
        self._hold(name, False)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                now = (kget(self.cluster, "pods", "-n", OPNS, "-l", OPERATOR_PODS) or {"items": []})["items"]
            except Exception:  # noqa: BLE001 - the next look retries
                now = []
            live = {p["metadata"]["name"]: p for p in now}
            if len({self.version(p) for p in now}) > 1:
                self.mixed.append(sorted(f"{self.version(p)} {n}" for n, p in live.items()))
            for name, p in live.items():
                if (name not in self.processes and not p["metadata"].get("deletionTimestamp")
                        and p["status"].get("phase") == "Running"):
                    self._start(p)
            for name in list(self.processes):
                p = live.get(name)
                if name not in self.stopping and (p is None or p["metadata"].get("deletionTimestamp")):
                    self.stopping.add(name)  # every terminating pod at once, as each node's kubelet does
                    threading.Thread(target=self._terminate, args=(name,), daemon=True).start()
            self._stop.wait(0.2)

    def live(self, *, previous: bool) -> list[str]:
        """Pods of v0.1.0 (``previous``) or of this release whose process runs."""
        with self._lock:
            return sorted(n for n, (v, p) in self.processes.items() if (v == PREVIOUS_TAG) == previous and p.alive())

    def process(self, pod: str) -> OperatorProcess | None:
        with self._lock:
            got = self.processes.get(pod)
        return got[1] if got else None

    def this_release_logs(self) -> str:
        """The logs of this release's operator processes."""
        with self._lock:
            mine = [p.log_path for v, p in self.processes.values() if v != PREVIOUS_TAG]
        return "\n".join(p.read_text(errors="replace") for p in [*mine, self.logs / "beside.log"] if p.exists())

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        for name, (_, proc) in list(self.processes.items()):
            proc.stop()
            self._hold(name, False)


class ReadySampler(_Background):
    """The PDDeployment's Ready condition every 0.25 s while open: ``samples`` (seconds since start, status)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, str]] = []
        self.not_ready: list[tuple[float, str, dict | None]] = []  # (seconds, wall clock, the condition)

    def _loop(self) -> None:
        while not self._stop.is_set():
            ready = condition(_pdd(self.cluster), "Ready")
            self.samples.append((time.monotonic() - self.t0, (ready or {}).get("status", "absent")))
            if (ready or {}).get("status") != "True":
                self.not_ready.append((round(time.monotonic() - self.t0, 2), time.strftime("%H:%M:%S"), ready))
            self._stop.wait(0.25)


def lease_holder(cluster) -> str | None:
    return ((kget(cluster, "lease", LEASE, "-n", OPNS) or {}).get("spec") or {}).get("holderIdentity")


def audited_writes(cluster, jtis: dict[str, str]) -> list[dict]:
    """Every successful write of the chart's ServiceAccount, in the API server's order: when the API
    server received it, which process sent it (``jtis``: token JTI -> "version pod"), verb, resource."""
    out = []
    for line in (cluster.run_dir / "audit.log").read_text().splitlines():
        event = json.loads(line)
        code = (event.get("responseStatus") or {}).get("code", 0)
        if event.get("stage") != "ResponseComplete" or not 200 <= code < 300:
            continue
        if (event.get("objectRef") or {}).get("resource") == "selfsubjectreviews":
            continue  # the test's own `kubectl auth whoami` with the process's token (sa_kubeconfig)
        credential = (((event.get("user") or {}).get("extra") or {})
                      .get("authentication.kubernetes.io/credential-id") or ["?"])[0]
        ref = event.get("objectRef") or {}
        out.append({"at": datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")),
                    "who": jtis.get(credential.removeprefix("JTI="), f"unknown credential {credential}"),
                    "verb": event["verb"], "resource": ref.get("resource"),
                    "object": f"{ref.get('namespace', '')}/{ref.get('name', '')}"})
    return sorted(out, key=lambda w: w["at"])


def _pdd(upc):
    return kget(upc, "pdd", NAME, "-n", NS)


def _pods(upc, roles: str) -> dict[str, str]:
    """name -> uid of every pod of ``roles`` (e.g. "prefill,decode")."""
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in pods(upc, NS, f"{LBL}/deployment={NAME},{LBL}/role in ({roles})")}


def _engine_pods(upc) -> dict[str, str]:
    """name -> uid of every prefill and decode pod."""
    return _pods(upc, "prefill,decode")


def _deployments(upc) -> dict[str, str]:
    """name -> its pod template (JSON) of every Deployment of the PDDeployment. (Not the generation:
    a Deployment's generation also moves when its annotations change, as the adoption's record does.)"""
    got = kget(upc, "deployments", "-n", NS, "-l", f"{LBL}/deployment={NAME}") or {"items": []}
    return {d["metadata"]["name"]: json.dumps(d["spec"]["template"], sort_keys=True) for d in got["items"]}


def _replica_sets(upc) -> set[str]:
    got = kget(upc, "replicasets", "-n", NS, "-l", f"{LBL}/deployment={NAME}") or {"items": []}
    return {r["metadata"]["name"] for r in got["items"]}


def _apply_crd_dir(upc, folder: Path) -> None:
    upc.kubectl("apply", "--server-side", "-f", str(folder))
    for path in sorted(folder.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        upc.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    wait_for(lambda: upc.kubectl("get", "pdd", "-A", check=False).returncode == 0, timeout=60,
             what="PDDeployments listable")


def _rendered_operator(upc, chart: Path) -> dict:
    """The operator Deployment ``helm template`` renders from ``chart`` (release ``pd``, the test's values)."""
    out = upc.helm("template", RELEASE, str(chart), "--namespace", OPNS, *VALUES).stdout
    (dep,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    return dep


def test_v0_1_0_to_this_release_restarts_no_engine_then_the_opt_in_rolls_out(upc, previous, procs, tmp_path,
                                                                          cluster_log):
    figures: dict[str, object] = {}
    rows: list[dict] = []
    upc.kubectl("create", "namespace", NS)
    kapply(upc, model_store(NS))
    kapply(upc, probe_policy(NS, role=("prefill", "decode", "gateway")))  # Ready once the rendered probes pass
    time.sleep(2)  # the API server's admission chain picks up a new policy within about a second
    doc = yaml.safe_load((previous["src"] / "examples" / "dsv41-flash-gb300-low-latency.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"].setdefault("rollout", {})["drainGracePeriod"] = "5s"
    spec = doc["spec"]
    counts = {"gateways": spec["gateway"]["replicas"], "prefill": spec["prefill"]["replicas"],
              "decode": spec["decode"]["replicas"]}
    logs = tmp_path / "operators"
    logs.mkdir()
    ops = ChartOperatorPods(upc, previous, logs)
    try:
        with (Prober(upc.api_client(), NS),
              KubeletStandIn(upc, procs, NS, NAME, model=spec["model"], sim_extra=SIM) as kubelet,
              ops):
            # 1. v0.1.0 as its README and chart install it: its CRDs, then its chart
            _apply_crd_dir(upc, previous["src"] / "crds")
            res = upc.helm("install", RELEASE, str(previous["src"] / "charts" / "sglang-pd-operator"),
                           "--namespace", OPNS, "--create-namespace", *VALUES)
            cluster_log("== v0.1.0 helm install: " + " ".join(res.stdout.split())[:200])
            wait_for(lambda: len(ops.live(previous=True)) == 2 and lease_holder(upc) in ops.live(previous=True),
                     timeout=120,
                     what="v0.1.0's two operator pods running, one holding the Lease")
            kapply(upc, doc)
            t0 = time.monotonic()
            old_key = wait_for(lambda: ready_now(_pdd(upc)), timeout=180,
                               what="v0.1.0's deployment Ready")["status"]["compatKey"]
            figures["v0.1.0 Ready after"] = f"{time.monotonic() - t0:.1f}s"
            early = audited_writes(upc, ops.jtis)  # the audit log names each process (its token's JTI)
            assert early and not [w for w in early if w["who"].startswith("unknown")], early[:3]
            wait_for(lambda: smg_registered(upc, NS, NAME, old_key, **counts), timeout=90,
                     what="v0.1.0's gateways' smg registered every engine pod")
            with (ServiceProxyStandIn(upc.api_client(), NS, NAME) as svc,
                  Load(svc.url, spec["model"]["servedModelName"]) as load):
                time.sleep(3)  # a baseline under load
                baseline = list(load.results)
                table = ChangeTable(load, kubelet, rows)
                with table.window("operator upgrade v0.1.0 -> this release (helm upgrade: CRDs, then the operator)"):
                    _upgrade(upc, ops, previous, figures, old_key, cluster_log)
                with table.window("opt-in (operatorChanges: apply): paired rollout to the new key"):
                    new_key = _opt_in(upc, figures, old_key)
                    wait_for(lambda: {p for p, _, _ in svc.endpoints} == {
                        p["metadata"]["name"] for p in pods(upc, NS, f"{LBL}/compat-key={new_key},{LBL}/role=gateway")},
                        timeout=60, what="the Service's endpoints are the new group's gateways")
        assert "Traceback" not in ops.this_release_logs()
    finally:
        for k, v in figures.items():
            cluster_log(f"== release upgrade: {k}: {json.dumps(v) if not isinstance(v, str) else v}")
        print_table(rows, cluster_log, "release upgrade under load")
        out = os.environ.get("SGLANG_PD_UPGRADE_FIGURES")
        if out:
            Path(out).write_text(json.dumps({**figures, "load": rows}, indent=1, default=str))
    assert baseline and all(r[2] for r in sorted(baseline)[:5]), "the load did not go through before the upgrade"
    assert len(rows) == 2
    assert not table.failed_outside(), table.failed_outside()  # no failure ended between the rows
    for row in rows:
        assert row["sent"] >= 3 and row["failed"] == 0, row
    upgrade_row, opt_in_row = rows
    assert upgrade_row["drain_s"] == {}, upgrade_row  # the upgrade stopped no pod
    # every pod of v0.1.0's group went away in the opt-in; v0.1.0 rendered no preStop
    assert len(opt_in_row["drain_s"]) == sum(counts.values()), opt_in_row
    assert set(opt_in_row["drain_s"].values()) == {"no preStop"}, opt_in_row


def _uid_table(log, title: str, before: dict[str, str], after: dict[str, str]) -> None:
    log(f"== release upgrade: {title} (pod: UID before -> UID after)")
    for name in sorted(set(before) | set(after)):
        b, a = before.get(name, "-"), after.get(name, "-")
        log(f"==   {name}: {b} -> {'same' if a == b else a}")


def _upgrade(upc, ops: ChartOperatorPods, previous, figures: dict, old_key: str, log) -> None:
    """Steps 2 to 4: this release beside v0.1.0's leader, helm upgrade, the hold (see the module docstring)."""
    engines_before, gateways_before = _engine_pods(upc), _pods(upc, "gateway")
    deployments_before = _deployments(upc)
    replica_sets_before = _replica_sets(upc)
    assert engines_before and all(p.startswith(f"{NAME}-{old_key[:6]}-") for p in engines_before), engines_before
    assert len(gateways_before) == 2, gateways_before
    rendered = _rendered_operator(upc, CHART)
    assert rendered["spec"]["strategy"] == {"type": "Recreate"}, rendered["spec"]["strategy"]
    (container,) = [c for c in rendered["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    with ReadySampler(upc) as ready:
        # 2. this release's CRDs and RBAC (v0.1.0 still running: what an upgrade applies before the
        # operator's pods change), then this release beside v0.1.0's leader
        install_crds(upc)
        upc.kubectl("apply", "-f", "-", input=upc.helm("template", RELEASE, str(CHART), "--namespace", OPNS, *VALUES,
                                                       "--show-only", "templates/rbac.yaml").stdout)
        old_leader = lease_holder(upc)
        assert old_leader in ops.live(previous=True), old_leader
        beside = operator_process(
            "this", previous, args=container["args"], env=_container_env(rendered["spec"]["template"]["spec"], "beside"),
            kubeconfig=ops.identity("this beside"), log_path=ops.logs / "beside.log").start()
        try:
            wait_for(lambda: "follows and takes over" in (ops.logs / "beside.log").read_text(errors="replace"),
                     timeout=60, what="this release's operator beside v0.1.0's waits for the Lease")
            t_beside = time.monotonic()
            while time.monotonic() - t_beside < LEASE_DURATION + 2:  # longer than a lease duration
                assert lease_holder(upc) == old_leader
                held = operator_metrics(beside)
                assert not any(v for (m, _), v in held.items()
                               if m in ("sglang_pd_operator_reconciles_total", "sglang_pd_operator_api_writes_total")), (
                    "this release's operator reconciled while v0.1.0 held the Lease")
                time.sleep(1)
            figures["this release beside v0.1.0's leader: waited, reconciling nothing"] = (
                f"{time.monotonic() - t_beside:.1f}s (lease duration {LEASE_DURATION} s)")

            # 3. helm upgrade to this chart
            t_upgrade = time.monotonic()
            upc.helm("upgrade", RELEASE, str(CHART), "--namespace", OPNS, *VALUES)
            live = kget(upc, "deployment", SA, "-n", OPNS)["spec"]["strategy"]
            assert live == {"type": "Recreate"}, live  # rollingUpdate removed by Helm's three-way merge
            holder = wait_for(lambda: (h := lease_holder(upc)) and (h == "beside" or h in ops.live(previous=False))
                              and h, timeout=60, what="this release took the Lease")
            figures["helm upgrade: Lease taken by this release after"] = (
                f"{time.monotonic() - t_upgrade:.1f}s (by {holder})")
            wait_for(lambda: not ops.live(previous=True) and len(ops.live(previous=False)) == 2, timeout=120,
                     what="v0.1.0's operator pods gone, this release's two running")
            exits = [t for t, what, _, v in ops.events if what == "exit" and v == PREVIOUS_TAG]
            starts = [t for t, what, _, v in ops.events if what == "start" and v != PREVIOUS_TAG]
            assert len(exits) == 2 and starts and max(exits) < min(starts), ops.events
            assert not ops.mixed, ops.mixed[:3]  # never pods of both versions at once
            figures["Recreate: last v0.1.0 operator process exited before the first new pod ran"] = (
                f"{min(starts) - max(exits):.1f}s")

            # 4. held
            pending = wait_for(lambda: (up := condition(_pdd(upc), "UpgradePending")) and up["status"] == "True" and up,
                               timeout=120, interval=0.25, what="UpgradePending on the v0.1.0 group")
            figures["UpgradePending after helm upgrade"] = f"{time.monotonic() - t_upgrade:.1f}s"
            # until the operator has demonstrably reconciled the held group three more times (its own counter)
            looked(beside if holder == "beside" else ops.process(holder), "PDDeployment", NS, NAME, more=3,
                   timeout=120)
        finally:
            beside.stop()  # graceful: releases the Lease when it holds it
        chart_pods = ops.live(previous=False)
        leader = wait_for(lambda: (h := lease_holder(upc)) in chart_pods and h, timeout=30,
                          what="a pod of this chart holds the Lease")
        looked(ops.process(leader), "PDDeployment", NS, NAME, more=3, timeout=120)
    writes = audited_writes(upc, ops.jtis)
    (ops.logs / "writes.txt").write_text("\n".join(f"{w['at'].time()} {w['who']}: {w['verb']} {w['resource']} "
                                                  f"{w['object']}" for w in writes))
    assert {s for _, s in ready.samples} == {"True"}, ready.not_ready[:5]
    figures["Ready samples (0.25 s apart), all True"] = len(ready.samples)

    engines_after, gateways_after = _engine_pods(upc), _pods(upc, "gateway")
    figures["engine pod UIDs before"], figures["engine pod UIDs after"] = engines_before, engines_after
    figures["gateway pod UIDs before"], figures["gateway pod UIDs after"] = gateways_before, gateways_after
    _uid_table(log, "engine pods", engines_before, engines_after)
    _uid_table(log, "gateway pods", gateways_before, gateways_after)
    for kind, before, after in (("engine", engines_before, engines_after), ("gateway", gateways_before, gateways_after)):
        recreated = {n for n in before if after.get(n) != before[n]} | (set(after) - set(before))
        assert not recreated, f"{kind} pods recreated by the upgrade: {sorted(recreated)}"
    assert _deployments(upc) == deployments_before  # no template written, no group added
    assert _replica_sets(upc) == replica_sets_before  # no rollout started
    obj = _pdd(upc)
    assert obj["status"]["compatKey"] == old_key and obj["status"]["rollout"]["phase"] == "Complete"
    message = pending["message"]
    assert f"group {old_key[:6]} was rendered by operator unrecorded" in message
    assert "Would change: compat key" in message and "operatorChanges: apply" in message
    assert "readinessProbe /health -> /readiness" in message and "preStop" in message
    figures["UpgradePending"] = message

    # the API server's record: the two versions never wrote side by side
    assert writes and not [w for w in writes if w["who"].startswith("unknown")], writes[:3]
    old = [w for w in writes if w["who"].startswith(f"{PREVIOUS_TAG} ")]
    new = [w for w in writes if not w["who"].startswith(f"{PREVIOUS_TAG} ")]
    old_work = [w for w in old if w["resource"] != "leases"]
    new_work = [w for w in new if w["resource"] != "leases"]
    assert old_work and new_work, (len(old_work), len(new_work))
    assert old_work[-1]["at"] < new_work[0]["at"], (old_work[-1], new_work[0])
    firsts = {}
    for w in new:  # each process of this release wrote first the Lease it took, after v0.1.0's last write
        firsts.setdefault(w["who"], w)
    assert all(w["resource"] == "leases" and w["at"] > old[-1]["at"] for w in firsts.values()), (firsts, old[-1])
    figures["audit: writes by v0.1.0 / by this release (the chart's ServiceAccount)"] = f"{len(old)} / {len(new)}"
    figures["audit: v0.1.0's last write"] = f"{old[-1]['at'].time()} {old[-1]['verb']} {old[-1]['resource']} ({old[-1]['who']})"
    figures["audit: first write of each process of this release"] = {
        who: f"{w['at'].time()} {w['verb']} {w['resource']}" for who, w in firsts.items()}
    figures["audit: this release's first reconcile write"] = (
        f"{new_work[0]['at'].time()} {new_work[0]['verb']} {new_work[0]['resource']} ({new_work[0]['who']}), "
        f"{(new_work[0]['at'] - old_work[-1]['at']).total_seconds():.1f}s after v0.1.0's last")


def _opt_in(upc, figures: dict, old_key: str) -> str:
    """Step 5: the opt-in rolls it out: a paired rollout to the new key, the old group deleted. Returns the new key."""
    t1 = time.monotonic()
    upc.kubectl("patch", "pdd", NAME, "-n", NS, "--type", "merge",
                "-p", json.dumps({"spec": {"rollout": {"operatorChanges": "apply"}}}))

    def rolled_out():
        o = _pdd(upc)
        if not ready_now(o) or o["status"]["compatKey"] == old_key or condition(o, "UpgradePending"):
            return None
        if o["status"]["rollout"]["phase"] != "Complete":
            return None
        if any(n.startswith(f"{NAME}-{old_key[:6]}-") for n in _deployments(upc)):
            return None
        return o

    done = wait_for(rolled_out, timeout=240, what="the opt-in's paired rollout Complete, the old group gone")
    figures["opt-in rolled out after"] = f"{time.monotonic() - t1:.1f}s"
    new_key = done["status"]["compatKey"]
    wait_for(lambda: not pods(upc, NS, f"{LBL}/compat-key={old_key}"), timeout=60, what="v0.1.0's pods gone")
    rolled = _engine_pods(upc)
    assert rolled and all(n.startswith(f"{NAME}-{new_key[:6]}-") for n in rolled), rolled
    figures["engine pod UIDs after the opt-in"] = rolled
    return new_key
