"""Benchmark: the control loop at scale (issue 15) -- N PDDeployments on the dev cluster, with and without unrelated pods.

Each case (N PDDeployments, U unrelated pods) runs on two fresh dev clusters, one after
the other (never both at once: memory), built from hack/cluster/node-pools.yaml plus the
benchmark-only pools of ``benchmarks/scale-node-pools.yaml`` (dense fake L40S nodes for the
engine pods, tainted nodes for the unrelated pods):

1. **Plain client** (the floor): the objects ``sglang-pd-operator render`` makes for the N
   PDDeployments are applied by ``--appliers`` concurrent ``kubectl apply --server-side``
   processes; the time until every rendered Deployment is available.
2. **Operator**: ``sglang-pd-operator run`` with its default flags (``--operator``: another
   checkout's command, e.g. the loop before issue 15), running as its own identity (a client
   certificate from the cluster's CSR API, bound to cluster-admin), so the API server's audit
   log attributes its requests. The N PDDeployments are applied the same way; printed:

   - time until every PDDeployment is Ready for its generation, and its ratio to the floor;
   - at rest (nothing changes in the cluster; ``--settle`` seconds after all Ready, then a
     ``--rest`` second window): the operator's reads and writes per PDDeployment per minute
     by verb and resource (audit log, its identity only; the Lease of leader election apart),
     beside the API server's own ``apiserver_request_total`` for the same window (every
     client); the operator's RSS and CPU seconds per minute; kube-apiserver's and etcd's RSS;
   - reaction: ``--edits`` edits (``spec.gateway.replicas``, each on another PDDeployment),
     the time from sending the patch until a watch sees ``status.observedGeneration`` reach
     the new generation; p50, p99 and max;
   - the resync pass: ``sglang_pd_operator_resync_pass_seconds`` (the last finished period)
     where the operator exports it; for an operator without it (the serial loop before issue
     15) N x the mean reconcile duration at rest, which is what its serial pass took.

Every phase prints the load average and how much CPU other processes on the machine used
(this machine is shared); compare ratios, not seconds, between noisy runs.

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_scale.py [--n 100 300 1000]
[--unrelated 0 10000] [--rest 300] [--settle 300] [--edits 20] [--operator CMD --crds DIR
--label before] [--json results.jsonl]``; e.g. the loop before issue 15:
``--operator /work/wt-before/.venv/bin/sglang-pd-operator --crds /work/wt-before/crds
--label before``. Not a test: no assertion on time (tests/e2e/test_bench_scale.py runs it
at N = 3 so it cannot rot).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sglang_pd_operator_dev.cluster import components, paths, state
from sglang_pd_operator_dev.cluster.cluster import Cluster, admin_api, start_cluster
from sglang_pd_operator_dev.cluster.demo import OperatorProcess, model_store, operator_command
from sglang_pd_operator_dev.cluster.kubeconfig import write_kubeconfig

REPO = Path(__file__).resolve().parents[1]
BENCH_POOLS = Path(__file__).resolve().parent / "scale-node-pools.yaml"
#: The example every PDDeployment is made from (decode replicas 1: one prefill, one decode, one gateway pod).
EXAMPLE = REPO / "examples" / "qwen3-30b-a3b-paged-experts.yaml"
#: The operator's identity (client certificate CN), by which the audit log attributes its requests.
OPERATOR_USER = "sglang-pd-operator-bench"
GROUP, VERSION, PLURAL = "pd.sglang-operator.io", "v1alpha1", "pddeployments"
UNRELATED_NS = "unrelated"
READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Policy of the audit log: the operator's identity only, one line per request (watches when they start).
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}


# --------------------------------------------------------------------------------------- the machine
@dataclass(frozen=True)
class ProcSample:
    """One reading of a process from /proc: ``cpu_s`` user + system CPU seconds so far,
    ``rss_mb`` resident set now, ``hwm_mb`` its peak so far (VmHWM)."""

    cpu_s: float
    rss_mb: float
    hwm_mb: float


def proc_sample(pid: int) -> ProcSample | None:
    """/proc of ``pid`` (None when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kb = {line.split(":")[0]: float(line.split()[1]) for line in status.splitlines()
          if line.startswith(("VmRSS:", "VmHWM:"))}
    return ProcSample(cpu_s=(int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"),
                      rss_mb=kb.get("VmRSS", 0) / 1024, hwm_mb=kb.get("VmHWM", 0) / 1024)


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """The machine's load over a phase: load average, and CPU used by processes other than ``ours()`` (pids)."""

    def __init__(self, ours: Callable[[], list[int]]) -> None:
        self.ours = ours
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_s()
        self.ours0 = self._ours_cpu()

    def _ours_cpu(self) -> float:
        return sum(s.cpu_s for s in (proc_sample(p) for p in self.ours()) if s is not None)

    def report(self) -> dict[str, float]:
        """{"load1": 1-minute load average now, "others_cores": cores used by other processes
        over the phase, "ours_cores": cores used by the cluster, the operator and this process}."""
        dt = max(1e-6, time.monotonic() - self.t0)
        busy = machine_busy_s() - self.busy0
        ours = self._ours_cpu() - self.ours0
        return {"load1": float(Path("/proc/loadavg").read_text().split()[0]),
                "others_cores": round(max(0.0, busy - ours) / dt, 2), "ours_cores": round(ours / dt, 2)}


def load_text(load: dict[str, float]) -> str:
    """How loaded the machine was, for a printed line."""
    return (f"load average {load['load1']:.1f}; other processes used {load['others_cores']:.2f} of 2 cores, "
            f"this benchmark's {load['ours_cores']:.2f}")


# --------------------------------------------------------------------------------------- the cluster
#: Engine and gateway pods per PDDeployment of the benchmark (one prefill, one decode, one gateway).
PODS_PER_DEPLOYMENT = 3


def node_pools_file(work: Path, n: int) -> Path:
    """hack/cluster/node-pools.yaml with the benchmark's pools added (a new file in ``work``).

    The engine pool (``bench-l40s``) gets enough nodes for N PDDeployments' pods, a tenth more
    than their pods over each node's pod capacity (at least its count in the file): 20 nodes
    of 240 pods hold N = 1,000 (3,000 pods) but not N = 3,000 (9,000 pods; a first run at
    3,000 left 1,283 pods Pending)."""
    bench = yaml.safe_load(BENCH_POOLS.read_text())["pools"]
    for pool in bench:
        if pool["name"] == "bench-l40s":
            per_node = int(pool["capacity"]["pods"])
            pool["count"] = max(int(pool["count"]), -(-PODS_PER_DEPLOYMENT * n * 11 // (10 * per_node)))
    pools = yaml.safe_load(paths.node_pools_file().read_text())["pools"] + bench
    path = work / "node-pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}, sort_keys=False))
    return path


def start_bench_cluster(work: Path, name: str, log: Callable[[str], None], n: int,
                        profiling: bool = False) -> tuple[Cluster, Path]:
    """A fresh dev cluster with the benchmark's node pools for ``n`` PDDeployments and an audit log of the
    operator's identity; ``profiling``: kube-apiserver serves ``/debug/pprof`` (:func:`profile_apiserver`).

    Returns the cluster and the audit log's path.
    """
    run_dir = work / name
    run_dir.mkdir(parents=True)
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_log = run_dir / "audit.log"
    args = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}", "--audit-log-maxsize=100000"]
    if profiling:
        args.append("--profiling=true")  # the last of a repeated flag wins (the dev cluster's default is false)
    cluster = start_cluster(run_dir=run_dir, log=lambda m: None, node_pools=node_pools_file(work, n),
                            apiserver_args=args)
    log(f"  cluster {name}: nodes Ready {cluster.timings['ready']:.1f}s after start")
    return cluster, audit_log


def profile_apiserver(cluster: Cluster, seconds: float, out: Path | None) -> threading.Thread | None:
    """Start a ``seconds``-long CPU profile of kube-apiserver (Go's ``/debug/pprof/profile``) into ``out``, in a
    thread (join it to wait); None when ``seconds`` is 0 or there is nowhere to keep it. Read it with
    ``go tool pprof -top <out>`` (the profile carries its symbols)."""
    if not seconds or out is None:
        return None

    def fetch() -> None:
        with out.open("wb") as f:
            subprocess.run([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get", "--raw",
                            f"/debug/pprof/profile?seconds={int(seconds)}", f"--request-timeout={int(seconds) + 60}s"],
                           stdout=f, stderr=subprocess.DEVNULL, check=False)

    thread = threading.Thread(target=fetch, name="apiserver-profile", daemon=True)
    thread.start()
    return thread


def cluster_pids(cluster: Cluster) -> dict[str, int]:
    """Component name -> pid of the cluster's processes."""
    st = state.load(cluster.run_dir)
    return {p.name: p.pid for p in (st.processes if st else ())}


def apiserver_request_totals(cluster: Cluster, sample: str = "apiserver_request_total") -> Counter:
    """A counter of kube-apiserver's /metrics summed by (verb, resource): ``apiserver_request_total`` (requests), or
    ``apiserver_request_duration_seconds_sum`` (seconds spent serving them; watches excluded by the API server)."""
    from prometheus_client.parser import text_string_to_metric_families

    api = admin_api(components.Layout(run_dir=cluster.run_dir), cluster.server)
    status, text = api.request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics of kube-apiserver answered {status}")
    family = sample.removesuffix("_sum").removesuffix("_total")
    out: Counter = Counter()
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            for s in fam.samples:
                if s.name == sample:
                    out[(s.labels.get("verb", "").lower(), s.labels.get("resource", ""))] += s.value
    return out


def busiest_requests(cluster: Cluster, before: tuple[Counter, Counter], top: int = 6) -> list[tuple[str, int, float]]:
    """(verb resource, requests, mean seconds) of the requests kube-apiserver spent most time on since ``before``
    (a pair of :func:`apiserver_request_totals` of requests and of seconds), every client; longest total first."""
    count = apiserver_request_totals(cluster) - before[0]
    seconds = apiserver_request_totals(cluster, "apiserver_request_duration_seconds_sum") - before[1]
    ranked = sorted(((k, count[k], seconds[k]) for k in count if count[k] and k[0] != "watch"), key=lambda r: -r[2])
    return [(f"{v} {r}", int(n), s / n) for (v, r), n, s in ranked[:top]]


def request_snapshot(cluster: Cluster) -> tuple[Counter, Counter]:
    """The counters :func:`busiest_requests` subtracts: (requests, seconds) by (verb, resource)."""
    return apiserver_request_totals(cluster), apiserver_request_totals(cluster, "apiserver_request_duration_seconds_sum")


def busiest_text(rows: list[tuple[str, int, float]]) -> str:
    """The busiest requests, for a printed line."""
    return ", ".join(f"{k} {n} x {1000 * s:.0f} ms" for k, n, s in rows)


def cpu_by_component(cluster: Cluster, extra: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each cluster component and each of ``extra`` (name -> pid), and
    "kubectl": this process' finished children (the kubectl processes it waited for)."""
    import resource

    out = {name: s.cpu_s for name, s in ((n, proc_sample(p)) for n, p in [*cluster_pids(cluster).items(),
                                                                           *extra.items()]) if s is not None}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["kubectl"] = children.ru_utime + children.ru_stime
    return out


def cpu_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process used between two :func:`cpu_by_component` readings."""
    return {k: round(after[k] - before[k], 1) for k in after if k in before}


def cpu_text(cpu: dict[str, float]) -> str:
    """CPU seconds by process, most first, for a printed line."""
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]))


def namespaces_for(n: int, per_namespace: int) -> list[str]:
    """The namespaces N PDDeployments are spread over (``per_namespace`` in each)."""
    return [f"bench-{i:02d}" for i in range((n + per_namespace - 1) // per_namespace)]


def prepare_namespaces(cluster: Cluster, namespaces: list[str]) -> None:
    """Each namespace and its ``model-store`` PV and PVC (the rendered pods mount it)."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces]
    for ns in namespaces:
        docs += model_store(ns)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), timeout=300)


def add_unrelated_pods(cluster: Cluster, count: int, log: Callable[[str], None], appliers: int) -> None:
    """``count`` pods without the operator's label, bound to the bench-other nodes, and wait until all run."""
    if not count:
        return
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", "pd.sglang-operator.io/node-pool=bench-other",
                                       "-o", "json").stdout)["items"]
    names = [n["metadata"]["name"] for n in nodes]
    cluster.kubectl("create", "namespace", UNRELATED_NS)
    started = time.monotonic()
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"unrelated-{i:05d}", "namespace": UNRELATED_NS, "labels": {"app": "unrelated"}},
             "spec": {"nodeName": names[i % len(names)],
                      "tolerations": [{"key": "bench.sglang-operator.io/unrelated", "operator": "Exists"}],
                      "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}
            for i in range(count)]
    run_parallel(cluster, [pods[i::appliers] for i in range(appliers)], verb="create")
    deadline = time.monotonic() + 600 + count / 10
    while True:
        out = cluster.kubectl("get", "pods", "-n", UNRELATED_NS, "--field-selector=status.phase!=Running",
                              "-o", "name", timeout=300).stdout.split()
        if not out:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(out)} unrelated pods not Running")
        time.sleep(5)
    log(f"  {count} unrelated pods Running after {time.monotonic() - started:.0f}s")


def run_parallel(cluster: Cluster, chunks: list[list[dict]], *, verb: str = "apply") -> float:
    """``kubectl apply --server-side`` (or ``create``) of each chunk, all chunks at once; returns seconds.

    Raises RuntimeError with kubectl's stderr when one fails.
    """
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    procs = []
    for i, chunk in enumerate(c for c in chunks if c):
        path = work / f"chunk-{i}.yaml"
        path.write_text(yaml.safe_dump_all(chunk, sort_keys=False))
        args = ["apply", "--server-side", "--field-manager=bench"] if verb == "apply" else ["create"]
        procs.append(subprocess.Popen([str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}",
                                       *args, "-f", str(path)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs if p.wait() != 0]
    if errors:
        raise RuntimeError(f"kubectl {verb} failed: {errors[0][-2000:]}")
    return time.monotonic() - started


# --------------------------------------------------------------------------------------- the objects
def pddeployments(n: int, per_namespace: int) -> list[dict]:
    """N PDDeployments made from :data:`EXAMPLE` (one prefill, one decode, one gateway pod each)."""
    base = yaml.safe_load(EXAMPLE.read_text())
    base["spec"]["decode"]["replicas"] = 1
    docs = []
    for i in range(n):
        doc = json.loads(json.dumps(base))
        doc["metadata"] = {"name": f"pd-{i:04d}", "namespace": f"bench-{i // per_namespace:02d}"}
        docs.append(doc)
    return docs


def rendered(docs: list[dict], command: list[str], work: Path) -> list[list[dict]]:
    """The objects ``<command> render`` makes for each PDDeployment, grouped per PDDeployment (in order)."""
    path = work / "pddeployments.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    out = subprocess.run([*command, "render", str(path), "-o", "json"], capture_output=True, text=True, cwd="/",
                         check=True)
    groups: dict[tuple[str, str], list[dict]] = {}
    for obj in json.loads(out.stdout)["items"]:
        meta = obj["metadata"]
        owner = meta.get("labels", {}).get("pd.sglang-operator.io/deployment")
        groups.setdefault((meta.get("namespace", ""), owner), []).append(obj)
    return [groups[(d["metadata"]["namespace"], d["metadata"]["name"])] for d in docs]


# --------------------------------------------------------------------------------------- watching
class Tracker:
    """A watch of one resource across namespaces, in a thread: the newest object of each
    (namespace, name) and the monotonic time it first met ``done``.

    ``path``: the collection's API path (``/apis/apps/v1/deployments``); ``done(obj)``: the
    state waited for. Events are parsed as plain JSON (no model classes: this process must
    stay light beside the system it measures).
    """

    def __init__(self, api_client, path: str, done: Callable[[dict], bool]) -> None:
        self.api = api_client
        self.path = path
        self.done = done
        self.objects: dict[tuple[str, str], dict] = {}
        self.done_at: dict[tuple[str, str], float] = {}
        self.cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")
        self._thread.start()

    def _call(self, query: dict[str, Any]):
        return self.api.call_api(*self.api.param_serialize("GET", self.path, query_params=list(query.items()),
                                                             auth_settings=["BearerToken"]),
                                 _request_timeout=(10, 150))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                resp = self._call({})
                data = json.loads(resp.read())
                for obj in data["items"]:
                    self._seen(obj)
                rv = data["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    resp = self._call({"watch": "true", "resourceVersion": rv, "allowWatchBookmarks": "true",
                                       "timeoutSeconds": "120"})
                    for line in _lines(resp):
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            raise _Gone()
                        rv = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._seen(event["object"])
            except _Gone:
                continue
            except Exception:  # noqa: BLE001 - a broken watch is listed again
                if not self._stop.is_set():
                    time.sleep(1)

    def _seen(self, obj: dict) -> None:
        now = time.monotonic()
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        with self.cond:
            self.objects[key] = obj
            if key not in self.done_at and self.done(obj):
                self.done_at[key] = now
            self.cond.notify_all()

    def wait(self, predicate: Callable[[], Any], timeout: float) -> Any:
        """Wait until ``predicate()`` (called under the lock after each event) is truthy; its value, or None on timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = predicate()
                if got or time.monotonic() >= deadline:
                    return got
                self.cond.wait(min(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Stop watching (the thread ends with its current watch request)."""
        self._stop.set()


class _Gone(Exception):
    pass


def _lines(resp) -> Iterator[bytes]:
    """The newline-separated watch events of a streaming urllib3 response."""
    buf = b""
    for chunk in resp.response.stream(64 * 1024):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    resp.response.release_conn()


def pdd_ready(obj: dict) -> bool:
    """Ready=True for the object's generation (the condition's and status' observedGeneration, where written)."""
    gen = obj["metadata"].get("generation")
    status = obj.get("status") or {}
    if status.get("observedGeneration", gen) != gen:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" and c.get("observedGeneration", gen) == gen
               for c in status.get("conditions") or [])


def deployment_available(obj: dict) -> bool:
    """Every replica of the Deployment's current generation updated and available."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 1)
    return (status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
            and status.get("updatedReplicas", 0) == want and status.get("availableReplicas", 0) == want)


def wait_all(tracker: Tracker, keys: set[tuple[str, str]], timeout: float, started: float,
             op: OperatorProcess | None = None) -> tuple[float | None, int]:
    """(seconds from ``started`` until every key was done, or None on timeout; keys done).

    Raises RuntimeError (with its log's tail) when ``op`` exits meanwhile.
    """
    tracker.wait(lambda: keys <= tracker.done_at.keys() or (op is not None and not op.alive()), timeout)
    if op is not None and not op.alive():
        raise RuntimeError(f"the operator exited:\n{op.log_tail(30)}")
    with tracker.cond:
        done = [tracker.done_at[k] for k in keys if k in tracker.done_at]
    if len(done) < len(keys):
        return None, len(done)
    return max(done) - started, len(done)


# --------------------------------------------------------------------------------------- the operator
def operator_kubeconfig(cluster: Cluster, work: Path) -> Path:
    """A kubeconfig of the identity :data:`OPERATOR_USER`: a key made here, its certificate signed by the
    cluster's own signer (CertificateSigningRequest, signer kubernetes.io/kube-apiserver-client), bound to
    cluster-admin."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, OPERATOR_USER)])).sign(key, hashes.SHA256())
    pem = csr.public_bytes(serialization.Encoding.PEM)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
         "metadata": {"name": OPERATOR_USER},
         "spec": {"request": base64.b64encode(pem).decode(), "signerName": "kubernetes.io/kube-apiserver-client",
                  "usages": ["client auth"]}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": OPERATOR_USER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}]}]))
    cluster.kubectl("certificate", "approve", OPERATOR_USER)
    deadline = time.monotonic() + 60
    while not (cert := cluster.kubectl("get", "csr", OPERATOR_USER, "-o", "jsonpath={.status.certificate}").stdout):
        if time.monotonic() > deadline:
            raise TimeoutError("the CSR of the operator's identity was not signed within 60 s")
        time.sleep(0.5)
    (work / "operator.crt").write_bytes(base64.b64decode(cert))
    (work / "operator.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return write_kubeconfig(work / "operator.kubeconfig", server=cluster.server,
                            ca_cert=components.Layout(run_dir=cluster.run_dir).pki.ca_cert,
                            client_cert=work / "operator.crt", client_key=work / "operator.key", user=OPERATOR_USER)


class AuditLog:
    """The operator's requests from the API server's audit log (one JSON event per line).

    A request counts once: non-watch requests at stage ResponseComplete, watches at
    ResponseStarted, timed by ``requestReceivedTimestamp`` (Unix seconds).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read(self) -> list[tuple[float, str, str]]:
        """(time, verb, resource) of each request logged since the last read; a server dry run's verb is
        prefixed ``dry-run`` (``dryRun=All`` in its URI), a subresource follows its resource (``pddeployments/status``)."""
        from datetime import datetime

        out = []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return out
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            e = json.loads(line)
            watch = e.get("verb") == "watch"
            if e.get("stage") != ("ResponseStarted" if watch else "ResponseComplete"):
                continue
            ref = e.get("objectRef") or {}
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            at = datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            verb = e.get("verb", "")
            if "dryRun=All" in e.get("requestURI", ""):
                verb = f"dry-run {verb}"  # a server dry run: admission and validation, nothing stored
            out.append((at, verb, resource))
        return out


def operator_metrics(port: int) -> dict[str, float]:
    """The operator's /metrics samples of interest, name{labels} -> value (empty when it does not answer)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(("sglang_pd_operator_resync_pass", "sglang_pd_operator_resync_lag",
                                  "sglang_pd_operator_queue_depth",
                                  "sglang_pd_operator_reconcile_duration_seconds_sum",
                                  "sglang_pd_operator_reconcile_duration_seconds_count")):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


# --------------------------------------------------------------------------------------- one case
@dataclass
class CaseResult:
    """Figures of one case; seconds, MB, per-minute rates (see the module docstring)."""

    label: str
    n: int
    unrelated: int
    plain_s: float | None = None
    operator_s: float | None = None
    ready_count: int = 0
    converge_requests: dict[str, int] = field(default_factory=dict)
    #: (verb resource, requests, mean seconds) kube-apiserver spent most time on, every client (busiest_requests)
    plain_busiest: list[tuple[str, int, float]] = field(default_factory=list)
    converge_busiest: list[tuple[str, int, float]] = field(default_factory=list)
    #: CPU seconds each process used while each side converged (cpu_by_component)
    plain_cpu_s: dict[str, float] = field(default_factory=dict)
    converge_cpu_s: dict[str, float] = field(default_factory=dict)
    rest_s: float = 0.0
    rest_reads_per_min: dict[str, float] = field(default_factory=dict)
    rest_writes_per_min: dict[str, float] = field(default_factory=dict)
    rest_lease_per_min: dict[str, float] = field(default_factory=dict)
    apiserver_per_min: dict[str, float] = field(default_factory=dict)
    operator_rss_mb: float = 0.0
    operator_peak_rss_mb: float = 0.0
    operator_cpu_s_per_min: float = 0.0
    apiserver_rss_mb: float = 0.0
    etcd_rss_mb: float = 0.0
    reactions_s: list[float] = field(default_factory=list)
    edits_missed: int = 0
    resync_pass_s: float | None = None
    resync_pass_source: str = ""
    resync_lag_s: float | None = None
    reconciles_per_min: float | None = None
    mean_reconcile_s: float | None = None
    load: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """Operator time to all Ready over the plain client's."""
        return self.operator_s / self.plain_s if self.operator_s and self.plain_s else None


def plain_phase(res: CaseResult, a: argparse.Namespace, work: Path, log: Callable[[str], None]) -> None:
    """The floor: the rendered objects applied by kubectl on a fresh cluster, until every Deployment is available."""
    docs = pddeployments(res.n, a.per_namespace)
    groups = rendered(docs, a.operator_command, work)
    cluster, _ = start_bench_cluster(work, "plain", log, res.n, profiling=bool(a.apiserver_profile))
    try:
        prepare_namespaces(cluster, namespaces_for(res.n, a.per_namespace))
        add_unrelated_pods(cluster, res.unrelated, log, a.appliers)
        api = cluster.api_client()
        tracker = Tracker(api, "/apis/apps/v1/deployments", deployment_available)
        wanted = {(o["metadata"]["namespace"], o["metadata"]["name"]) for g in groups for o in g
                  if o["kind"] == "Deployment"}
        meter = LoadMeter(lambda: [*cluster_pids(cluster).values(), os.getpid()])
        requests0 = request_snapshot(cluster)
        cpu0 = cpu_by_component(cluster, extra={})
        profile = profile_apiserver(cluster, a.apiserver_profile, _kept(a, f"apiserver-plain-{res.n}.pprof"))
        started = time.monotonic()
        apply_s = run_parallel(cluster, [sum(groups[i::a.appliers], []) for i in range(a.appliers)])
        res.plain_s, done = wait_all(tracker, wanted, a.ready_timeout, started)
        tracker.stop()
        res.load["plain"] = meter.report()
        res.plain_busiest = busiest_requests(cluster, requests0)
        res.plain_cpu_s = cpu_since(cpu0, cpu_by_component(cluster, extra={}))
        if profile is not None:
            profile.join()
        pids = cluster_pids(cluster)
        log(f"  plain client: {len(wanted)} Deployments available after "
            + (f"{res.plain_s:.1f}s" if res.plain_s else f"TIMEOUT ({done}/{len(wanted)})")
            + f" (its {a.appliers} kubectl applies took {apply_s:.1f}s); kube-apiserver RSS "
            f"{_rss(pids.get('kube-apiserver')):.0f} MB, etcd {_rss(pids.get('etcd')):.0f} MB; "
            + load_text(res.load["plain"]))
        log(f"    kube-apiserver's busiest requests meanwhile (count x mean latency): {busiest_text(res.plain_busiest)}")
        log(f"    CPU seconds meanwhile: {cpu_text(res.plain_cpu_s)}")
    finally:
        cluster.stop(log=lambda m: None)


def _kept(a: argparse.Namespace, name: str) -> Path | None:
    """Where a file the run keeps goes: ``--keep-logs``'s folder, None without it."""
    if a.keep_logs is None:
        return None
    a.keep_logs.mkdir(parents=True, exist_ok=True)
    return a.keep_logs / name


def _rss(pid: int | None) -> float:
    s = proc_sample(pid) if pid else None
    return s.rss_mb if s else 0.0


def operator_phase(res: CaseResult, a: argparse.Namespace, work: Path, log: Callable[[str], None]) -> None:
    """The operator on a fresh cluster: convergence, rest, edits, resync pass (module docstring)."""
    docs = pddeployments(res.n, a.per_namespace)
    cluster, audit_path = start_bench_cluster(work, "operator", log, res.n, profiling=bool(a.apiserver_profile))
    op = None
    tracker = None
    try:
        prepare_namespaces(cluster, namespaces_for(res.n, a.per_namespace))
        add_unrelated_pods(cluster, res.unrelated, log, a.appliers)
        cluster.kubectl("apply", "--server-side", "-f", str(a.crds))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        kubeconfig = operator_kubeconfig(cluster, work)
        audit = AuditLog(audit_path)
        op = OperatorProcess(kubeconfig=kubeconfig, log_path=work / "operator.log", resync=None,
                             command=a.operator_command, extra_args=a.operator_args.split()).start()
        early: list[tuple[float, str, str]] = []
        wait_until(lambda: early.extend(audit.read()) or any(v == "watch" and r == "pddeployments"
                                                             for _, v, r in early),
                   180, "the operator's watch of PDDeployments", op)
        api = cluster.api_client()
        tracker = Tracker(api, f"/apis/{GROUP}/{VERSION}/{PLURAL}", pdd_ready)
        pids = cluster_pids(cluster)
        op_pid = op.proc.pid
        meter = LoadMeter(lambda: [*pids.values(), op_pid, os.getpid()])
        requests0 = request_snapshot(cluster)
        cpu0 = cpu_by_component(cluster, extra={"operator": op_pid})
        profile = profile_apiserver(cluster, a.apiserver_profile, _kept(a, f"apiserver-operator-{res.n}.pprof"))
        started = time.monotonic()
        apply_s = run_parallel(cluster, [docs[i::a.appliers] for i in range(a.appliers)])
        keys = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs}
        res.operator_s, res.ready_count = wait_all(tracker, keys, a.ready_timeout, started, op)
        res.load["converge"] = meter.report()
        res.converge_busiest = busiest_requests(cluster, requests0)
        converge = audit.read()
        res.converge_requests = dict(Counter(v for _, v, _ in converge))
        peak = proc_sample(op_pid)
        res.operator_peak_rss_mb = peak.hwm_mb if peak else 0.0
        res.converge_cpu_s = cpu_since(cpu0, cpu_by_component(cluster, extra={"operator": op_pid}))
        if profile is not None:
            profile.join()
        log(f"  operator: {res.ready_count}/{res.n} PDDeployments Ready after "
            + (f"{res.operator_s:.1f}s" if res.operator_s else f"TIMEOUT ({a.ready_timeout:.0f}s)")
            + f" (its {a.appliers} kubectl applies took {apply_s:.1f}s); "
            f"{len(converge)} requests by the operator meanwhile ({_counts(res.converge_requests)}); "
            f"peak RSS {res.operator_peak_rss_mb:.0f} MB; " + load_text(res.load["converge"]))
        by_resource = Counter(f"{v} {r}" for _, v, r in converge)
        log("    the operator's requests meanwhile by verb and resource: "
            + ", ".join(f"{k} {v}" for k, v in by_resource.most_common(16)))
        log(f"    kube-apiserver's busiest requests meanwhile (count x mean latency): {busiest_text(res.converge_busiest)}")
        log(f"    CPU seconds meanwhile: {cpu_text(res.converge_cpu_s)}")

        # -- rest
        time.sleep(a.settle)
        wait_until(lambda: operator_metrics(op.metrics_port).get("sglang_pd_operator_queue_depth", 0) == 0,
                   max(60.0, a.settle), "the work queue drains", op, required=False)
        audit.read()
        meter = LoadMeter(lambda: [*pids.values(), op_pid, os.getpid()])
        api0, cpu0, m0, t0w = apiserver_request_totals(cluster), proc_sample(op_pid), \
            operator_metrics(op.metrics_port), time.time()
        time.sleep(a.rest)
        api1, cpu1, m1, t1w = apiserver_request_totals(cluster), proc_sample(op_pid), \
            operator_metrics(op.metrics_port), time.time()
        res.load["rest"] = meter.report()
        minutes = (t1w - t0w) / 60
        res.rest_s = t1w - t0w
        rest = [(t, v, r) for t, v, r in audit.read() if t0w <= t < t1w]
        for _, verb, resource in rest:
            target = res.rest_lease_per_min if resource == "leases" else \
                res.rest_reads_per_min if verb in READ_VERBS else res.rest_writes_per_min
            k = f"{verb} {resource}"
            target[k] = target.get(k, 0.0) + 1 / minutes
        res.apiserver_per_min = {f"{v} {r}": round((api1[(v, r)] - api0[(v, r)]) / minutes, 1)
                                 for (v, r) in api1 if api1[(v, r)] - api0[(v, r)] > 0}
        res.operator_rss_mb = cpu1.rss_mb
        res.operator_peak_rss_mb = cpu1.hwm_mb
        res.operator_cpu_s_per_min = (cpu1.cpu_s - cpu0.cpu_s) / minutes
        pids_now = cluster_pids(cluster)
        res.apiserver_rss_mb, res.etcd_rss_mb = _rss(pids_now.get("kube-apiserver")), _rss(pids_now.get("etcd"))
        count = m1.get("sglang_pd_operator_reconcile_duration_seconds_count", 0) - \
            m0.get("sglang_pd_operator_reconcile_duration_seconds_count", 0)
        total = m1.get("sglang_pd_operator_reconcile_duration_seconds_sum", 0) - \
            m0.get("sglang_pd_operator_reconcile_duration_seconds_sum", 0)
        res.reconciles_per_min = count / minutes
        res.mean_reconcile_s = total / count if count else None
        if "sglang_pd_operator_resync_pass_seconds" in m1:  # 0 until a period finished
            if m1["sglang_pd_operator_resync_pass_seconds"] > 0:
                res.resync_pass_s = m1["sglang_pd_operator_resync_pass_seconds"]
                res.resync_pass_source = "sglang_pd_operator_resync_pass_seconds, the last finished period"
                res.resync_lag_s = m1.get("sglang_pd_operator_resync_lag_seconds")
        elif res.mean_reconcile_s is not None:
            res.resync_pass_s, res.resync_pass_source = res.n * res.mean_reconcile_s, "N x mean reconcile"

        # -- reactions
        for i in range(a.edits):
            d = docs[(i * len(docs)) // a.edits]
            took = react(api, tracker, d["metadata"]["namespace"], d["metadata"]["name"], replicas=2,
                         timeout=a.edit_timeout)
            if took is None:
                res.edits_missed += 1
            else:
                res.reactions_s.append(took)
            time.sleep(a.edit_gap)
        print_case(res, log)
    finally:
        if tracker is not None:
            tracker.stop()
        if op is not None:
            if not op.alive():
                log(f"  the operator exited; its log's last lines:\n{op.log_tail(30)}")
            op.stop()
        cluster.stop(log=lambda m: None)


def react(api, tracker: Tracker, ns: str, name: str, *, replicas: int, timeout: float) -> float | None:
    """Seconds from sending a merge patch of ``spec.gateway.replicas`` until the watch sees status speak for the
    new generation (None when it does not within ``timeout``)."""
    from kubernetes import client

    started = time.monotonic()
    patched = client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"gateway": {"replicas": replicas}}}, _request_timeout=(10, 30))
    gen = patched["metadata"]["generation"]

    def caught_up() -> float | None:
        obj = tracker.objects.get((ns, name)) or {}
        if (obj.get("status") or {}).get("observedGeneration", 0) >= gen:
            return time.monotonic()
        return None

    seen = tracker.wait(caught_up, timeout)
    return (seen - started) if seen else None


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, op: OperatorProcess | None,
               *, required: bool = True) -> bool:
    """Poll ``predicate`` every second; raise TimeoutError naming ``what`` (unless not ``required``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if op is not None and not op.alive():
            raise RuntimeError(f"the operator exited while waiting for {what}:\n{op.log_tail(30)}")
        time.sleep(1)
    if required:
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
    return False


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _per_min(rates: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1])) or "none"


def print_case(res: CaseResult, log: Callable[[str], None]) -> None:
    """The case's figures, as lines."""
    n = res.n
    reads, writes = sum(res.rest_reads_per_min.values()), sum(res.rest_writes_per_min.values())
    lease = sum(res.rest_lease_per_min.values())
    log(f"  at rest ({res.rest_s:.0f}s window): {reads / n:.2f} reads and {writes / n:.2f} writes per PDDeployment "
        f"per minute ({reads:.1f} reads, {writes:.1f} writes per minute in all; leader-election Lease apart: "
        f"{lease:.1f} requests per minute); " + load_text(res.load["rest"]))
    log(f"    reads per minute by the operator: {_per_min(res.rest_reads_per_min)}")
    log(f"    writes per minute by the operator: {_per_min(res.rest_writes_per_min)}")
    log(f"    apiserver_request_total per minute, every client: {_per_min(res.apiserver_per_min)}")
    log(f"    operator RSS {res.operator_rss_mb:.0f} MB (peak {res.operator_peak_rss_mb:.0f} MB), CPU "
        f"{res.operator_cpu_s_per_min:.1f} s per minute ({res.operator_cpu_s_per_min / 60:.0%} of a core); "
        f"kube-apiserver RSS {res.apiserver_rss_mb:.0f} MB, etcd {res.etcd_rss_mb:.0f} MB; "
        f"{res.reconciles_per_min:.1f} reconciles per minute"
        + (f", {1000 * res.mean_reconcile_s:.0f} ms each on average" if res.mean_reconcile_s else ""))
    if res.resync_pass_s is not None:
        log(f"    resync pass {res.resync_pass_s:.1f}s ({res.resync_pass_source})"
            + (f", lag {res.resync_lag_s:.2f}s (the longest a key waited past its due time)"
               if res.resync_lag_s is not None else ""))
    if res.reactions_s:
        r = res.reactions_s
        log(f"  reaction to an edit ({len(r)} edits): p50 {percentile(r, 0.5):.2f}s, p99 {percentile(r, 0.99):.2f}s, "
            f"max {max(r):.2f}s" + (f"; {res.edits_missed} more never reached status" if res.edits_missed else ""))
    if res.ratio is not None:
        log(f"  => time to all Ready {res.operator_s:.1f}s vs plain client {res.plain_s:.1f}s: ratio {res.ratio:.2f}")


def run_case(n: int, unrelated: int, a: argparse.Namespace, log: Callable[[str], None]) -> CaseResult:
    """One case: the plain client's floor, then the operator (each on its own fresh cluster)."""
    res = CaseResult(label=a.label, n=n, unrelated=unrelated)
    log(f"\n== {a.label}: N = {n} PDDeployments, {unrelated} unrelated pods")
    with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-") as tmp:
        work = Path(tmp)
        if not a.skip_plain:
            (work / "plain-work").mkdir()
            plain_phase(res, a, work / "plain-work", log)
        (work / "operator-work").mkdir()
        operator_phase(res, a, work / "operator-work", log)
        if a.keep_logs:
            a.keep_logs.mkdir(parents=True, exist_ok=True)
            log_file = work / "operator-work" / "operator.log"
            if log_file.exists():
                (a.keep_logs / f"operator-{a.label}-{n}-{unrelated}.log").write_bytes(log_file.read_bytes())
    return res


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> list[CaseResult]:
    """Run every case of the command line; print the figures; return them."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[100, 300, 1000], help="PDDeployments per case")
    p.add_argument("--unrelated", type=int, nargs="+", default=[0, 10000], help="unrelated pods per case")
    p.add_argument("--per-namespace", type=int, default=100, help="PDDeployments per namespace")
    p.add_argument("--rest", type=float, default=300.0, help="seconds of the at-rest window (default: one resync period)")
    p.add_argument("--settle", type=float, default=300.0,
                   help="seconds after all Ready before the rest window (default: one resync period, so the period "
                        "whose pass is printed began after all were Ready)")
    p.add_argument("--edits", type=int, default=20, help="edits for the reaction time")
    p.add_argument("--edit-gap", type=float, default=1.0, help="seconds between two edits")
    p.add_argument("--edit-timeout", type=float, default=120.0, help="seconds an edit may take to reach status")
    p.add_argument("--ready-timeout", type=float, default=3600.0, help="seconds to wait for all Ready")
    p.add_argument("--appliers", type=int, default=4, help="concurrent kubectl processes applying")
    p.add_argument("--operator", default=None, help="the operator's command line (default: this checkout's)")
    p.add_argument("--operator-args", default="", help="more flags of its run command (default: none, its defaults)")
    p.add_argument("--crds", type=Path, default=REPO / "crds", help="the CRDs of that operator")
    p.add_argument("--label", default="after", help="name of this operator in the figures")
    p.add_argument("--skip-plain", action="store_true", help="no plain-client run (no ratio)")
    p.add_argument("--json", type=Path, default=None, help="append each case's figures as a JSON line")
    p.add_argument("--keep-logs", type=Path, default=None, help="copy each case's operator log into this folder")
    p.add_argument("--apiserver-profile", type=float, default=0.0, metavar="SECONDS",
                   help="a CPU profile of kube-apiserver over the first SECONDS of each convergence, kept in "
                        "--keep-logs as apiserver-<phase>-<n>.pprof (go tool pprof -top); 0: none")
    a = p.parse_args(argv)
    a.operator_command = a.operator.split() if a.operator else operator_command()
    results = []
    for unrelated in a.unrelated:
        for n in a.n:
            res = run_case(n, unrelated, a, log)
            results.append(res)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps({**asdict(res), "ratio": res.ratio}) + "\n")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)
