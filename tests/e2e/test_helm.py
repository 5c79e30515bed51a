"""The Helm chart end to end: install, run the operator as the chart's ServiceAccount, upgrade, GitOps.

A dedicated dev cluster (not the session's ``cluster``): these tests own cluster-scoped
objects, the CRDs (installed, upgraded and downgraded by Helm) and the Prometheus
Operator's CRDs, which would change what other tests' operators do.

The chart's operator pods run on kwok nodes, where no container runs; the operator
itself runs here as ``sglang-pd-operator run`` with the chart's identity: a kubeconfig
holding a token of the chart's ServiceAccount from the TokenRequest API (what the pod
would mount). Not ``as:`` impersonation: the official Python client and kopf ignore
``as:`` in a kubeconfig, so the operator would silently run as the admin. The identity
is checked with ``kubectl auth whoami``. Everything the main scenario does therefore
passes through the chart's RBAC: a missing verb fails the scenario (and shows up as 403
in the operator's log, which is checked too).

Steps (module-ordered, sharing the installed release):

1. ``helm install`` 0.1.0 (the chart as it is) with the ServiceMonitor, two operator
   processes with leader election: only the Lease holder reconciles; the GB300 example
   converges, re-applying it is a no-op and a server-side ``kubectl diff`` is empty; scale,
   a KV-layout roll (prunes the old group), delete.
   Kernels: the GB300 example with ``kernels.cache: auto`` in another namespace; the
   operator (with the chart's ``SGLANG_PD_OPERATOR_IMAGE``) creates a KernelBuild per
   role, their cache PVCs, requests and build Jobs, follows the build pods and writes the
   builds' status, all without a 403; deleting the builds collects their children.
2. Failover: kill -9 the leader, the standby takes over; a stolen Lease makes the leader
   exit with code 3; a graceful stop releases the Lease.
3. Replicas left to an autoscaler: omitted ``replicas`` are never reset by the operator
   nor by a GitOps re-apply.
4. ``watchNamespaces``: a second release scoped to one namespace serves it with Roles only.
5. ``helm upgrade`` to 0.2.0, whose CRD adds an optional field: existing PDDeployments
   stay served, their pods untouched; the new field is accepted.
6. An older CRD (a chart whose CRD lacks ``spec.slo``): the operator refuses to start,
   naming the field; with ``operator.crds=apply`` it upgrades the CRD itself and runs.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import GB300_EXAMPLE, ROOT, load_example
from opkit import OperatorProcess, cache_pv, condition, kapply, kget, looked, model_store, pods, rbac_denials, wait_for

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator.kernelbuild.inputs import kernel_build_inputs
from sglang_pd_operator.planning.plan import build_plan

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "sglang-pd-operator"
RELEASE, NS = "pd", "sglang-system"
SA = LEASE = "pd-sglang-pd-operator"
APP_NS = "inference"
KERNELS_NS = "kernels"
NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
TIMING = "6,4,1"  # lease, renew deadline, retry period: fast failover for the test
GITOPS = "argocd-controller"  # the field manager Argo CD's server-side apply uses


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def kc(tmp_path_factory, cluster_log):
    """A dev cluster for this module only, with the Prometheus Operator's CRDs."""
    running = devcluster.start_cluster(run_dir=tmp_path_factory.mktemp("helm-cluster"), log=cluster_log)
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("kschemas", ROOT / "hack" / "kubeconform" / "schemas.py")
        schemas = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(schemas)
        running.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(schemas.prometheus_operator_crds()))
        yield running
    finally:
        running.stop(log=cluster_log)


def _package(kc, src: Path, dest: Path, version: str) -> Path:
    kc.helm("package", str(src), "--version", version, "--app-version", version, "--destination", str(dest))
    return dest / f"sglang-pd-operator-{version}.tgz"


def _chart_with_crd(tmp: Path, edit) -> Path:
    src = tmp / "src"
    shutil.copytree(CHART, src)
    path = src / "files" / "crds" / "pddeployments.yaml"
    crd = yaml.safe_load(path.read_text())
    edit(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return src


def _before_slo(spec: dict) -> None:
    """The spec schema of a CRD from before spec.slo: without it and without what came later and refers
    to it (spec.autoscaling and its CEL rules, which the API server would not compile without spec.slo)."""
    spec["properties"].pop("slo")
    spec["properties"].pop("autoscaling", None)
    spec["x-kubernetes-validations"] = [r for r in spec.get("x-kubernetes-validations", [])
                                        if "slo" not in r["rule"] and "autoscaling" not in r["rule"]]


@pytest.fixture(scope="module")
def charts(kc, tmp_path_factory) -> dict[str, Path]:
    """0.1.0: the chart as it is; 0.2.0: its CRD adds spec.notes; 0.0.9: its CRD lacks spec.slo."""
    out = tmp_path_factory.mktemp("charts")
    notes = {"type": "string", "description": "Free text for the humans (added in 0.2.0)."}
    return {
        "0.1.0": _package(kc, CHART, out, "0.1.0"),
        "0.2.0": _package(kc, _chart_with_crd(tmp_path_factory.mktemp("c2"), lambda s: s["properties"].update(notes=notes)),
                          out, "0.2.0"),
        "0.0.9": _package(kc, _chart_with_crd(tmp_path_factory.mktemp("c0"), _before_slo), out, "0.0.9"),
    }


def sa_kubeconfig(kc, path: Path, *, namespace: str, sa: str) -> Path:
    """A kubeconfig whose user is a TokenRequest token of ``namespace/sa`` (the pod's identity)."""
    admin = yaml.safe_load(kc.kubeconfig.read_text())
    token = kc.kubectl("create", "token", sa, "-n", namespace, "--duration=2h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "dev", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "dev", "user": sa, "namespace": namespace}}],
        "current-context": sa,
    }))
    whoami = json.loads(subprocess.run([str(kc.bin_dir / "kubectl"), "--kubeconfig", str(path), "auth", "whoami",
                                        "-o", "json"], capture_output=True, text=True, check=True).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:{sa}", whoami
    return path


def chart_env(kc, namespace: str = NS, deployment: str = SA) -> dict[str, str]:
    """The literal ``env`` values of the installed chart's operator container (e.g. SGLANG_PD_OPERATOR_IMAGE)."""
    dep = kget(kc, "deployment", deployment, "-n", namespace)
    (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


class ChartOperator(OperatorProcess):
    """``sglang-pd-operator run`` with the flags the chart's Deployment passes, as ``identity``."""

    def __init__(self, *, kubeconfig: Path, log_path: Path, identity: str, namespace: str = NS,
                 lease: str = LEASE, extra: tuple[str, ...] = (), env: dict[str, str] | None = None):
        super().__init__(kubeconfig=kubeconfig, log_path=log_path, resync=2.0, extra_args=[
            "--leader-elect", f"--leader-elect-lease={lease}", f"--leader-elect-timing={TIMING}", *extra],
            # as the chart's pod: POD_NAME (the Lease identity) and POD_NAMESPACE (Lease, catalog),
            # plus the chart's literal env (``env``, from chart_env)
            env={**(env or {}), "POD_NAME": identity, "POD_NAMESPACE": namespace})
        self.identity, self.namespace = identity, namespace

    def exit_code(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def metric(self, name: str) -> float:
        """Sum of one family on the process's /metrics (0 when absent)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def lease_holder(kc, namespace: str = NS, lease: str = LEASE) -> str | None:
    obj = kget(kc, "lease", lease, "-n", namespace)
    return ((obj or {}).get("spec") or {}).get("holderIdentity")


def ready(kc, namespace: str, name: str = NAME):
    obj = kget(kc, "pddeployment", name, "-n", namespace)
    c = condition(obj, "Ready")
    gen = (obj or {}).get("metadata", {}).get("generation")
    if c and c["status"] == "True" and c.get("observedGeneration") == gen and obj["status"].get("observedGeneration") == gen:
        return obj
    return None


def example(namespace: str, **spec_changes) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = namespace
    doc["spec"].update(spec_changes)
    return doc


def gitops_apply(kc, doc: dict) -> None:
    """What Argo CD / Flux do: server-side apply with their own field manager."""
    kc.kubectl("apply", "--server-side", f"--field-manager={GITOPS}", "-f", "-", input=yaml.safe_dump(doc))


def deployments(kc, namespace: str, name: str = NAME) -> dict[str, dict]:
    got = kget(kc, "deployments", "-n", namespace, "-l", f"{LBL}/deployment={name}") or {"items": []}
    return {d["metadata"]["name"]: d for d in got["items"]}


def assert_no_forbidden(*ops: ChartOperator) -> None:
    for op in ops:
        bad = rbac_denials(op.log())
        assert not bad, f"{op.identity} hit RBAC denials:\n" + "\n".join(bad[:10])


@pytest.fixture(scope="module")
def release(kc, charts, tmp_path_factory, cluster_log):
    """helm install 0.1.0 (ServiceMonitor on), the SA kubeconfig; the install output is logged."""
    kc.kubectl("create", "namespace", NS)
    res = kc.helm("install", RELEASE, str(charts["0.1.0"]), "--namespace", NS, "--set", "serviceMonitor.enabled=true",
                  "--wait", "--timeout", "120s")
    cluster_log("helm install output:\n" + res.stdout)
    kubeconfig = sa_kubeconfig(kc, tmp_path_factory.mktemp("sa") / "kubeconfig", namespace=NS, sa=SA)
    return {"install": res.stdout, "kubeconfig": kubeconfig, "logs": tmp_path_factory.mktemp("operator-logs")}


@pytest.fixture(scope="module")
def app_ns(kc):
    kc.kubectl("create", "namespace", APP_NS)
    kapply(kc, model_store(APP_NS))
    return APP_NS


# ---------------------------------------------------------------- 1. install + main scenario


def test_install_output_and_objects(kc, release):
    out = release["install"]
    assert "STATUS: deployed" in out and "REVISION: 1" in out
    assert "kubectl apply --server-side -f examples/dsv41-flash-gb300-low-latency.yaml" in out  # NOTES.txt
    crd = kget(kc, "crd", "pddeployments.pd.sglang-operator.io")
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    dep = kget(kc, "deployment", SA, "-n", NS)
    assert dep["status"].get("readyReplicas") == 2  # kwok runs the (fake) pods
    wait_for(lambda: (kget(kc, "pdb", SA, "-n", NS) or {}).get("status", {}).get("expectedPods") == 2, timeout=30,
             what="PDB sees both operator pods")
    assert kget(kc, "servicemonitor", SA, "-n", NS)["spec"]["endpoints"][0]["port"] == "metrics"
    assert kget(kc, "configmap", f"{SA}-dashboard-sglang-pd-slo", "-n", NS)["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_operator_as_chart_sa_runs_the_main_scenario_with_one_leader(kc, release, app_ns, cluster_log):
    env = chart_env(kc)
    assert env["SGLANG_PD_OPERATOR_IMAGE"] == kget(kc, "deployment", SA, "-n", NS)["spec"]["template"]["spec"][
        "containers"][0]["image"]  # KernelBuild Jobs' builder init container: the operator's own image
    a = ChartOperator(kubeconfig=release["kubeconfig"], log_path=release["logs"] / "a.log", identity="op-a",
                      env=env).start()
    wait_for(lambda: lease_holder(kc) == "op-a", timeout=30, what="op-a holds the Lease")
    b = ChartOperator(kubeconfig=release["kubeconfig"], log_path=release["logs"] / "b.log", identity="op-b",
                      env=env).start()
    release["ops"] = [a, b]
    wait_for(lambda: "waiting for the leader lease" in b.log(), timeout=30, what="op-b waiting as follower")

    # a GitOps tool applies the example (server-side, its own field manager)
    start = time.monotonic()
    kc.kubectl("apply", "--server-side", f"--field-manager={GITOPS}", "-f", str(GB300_EXAMPLE))
    obj = wait_for(lambda: ready(kc, app_ns), timeout=90, what="Ready=True")
    cluster_log(f"GB300 example Ready after {time.monotonic() - start:.1f}s (operator as {SA})")
    printed = kc.kubectl("get", "pdd", "-n", app_ns).stdout
    cluster_log("kubectl get pdd:\n" + printed)
    assert re.search(rf"{NAME}\s+True\s+Valid\s+1/1\s+2/2\s+3/3\s+v41,c1:v41_fp4,c2:v41_fp4", printed), printed  # PODS 3/3
    key = obj["status"]["compatKey"]
    assert set(deployments(kc, app_ns)) == {f"{NAME}-{key[:6]}-{r}" for r in ("prefill", "decode", "gateway")}
    # with the Prometheus Operator's CRDs the operator applies a PodMonitor and a PrometheusRule too
    # (once the runtime passes monitoring= to the reconciler; the RBAC for them is granted already)
    from sglang_pd_operator.reconcilers.runtime import Runtime

    if "monitoring=" in inspect.getsource(Runtime.reconcile_body):
        wait_for(lambda: kget(kc, "podmonitor", NAME, "-n", app_ns) and kget(kc, "prometheusrule", NAME, "-n", app_ns),
                 timeout=30, what="PodMonitor and PrometheusRule")

    # GitOps: no drift after defaulting, a re-apply writes nothing
    diff = kc.kubectl("diff", "--server-side", f"--field-manager={GITOPS}", "-f", str(GB300_EXAMPLE), check=False)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout + diff.stderr

    def gitops_entry():
        live = kget(kc, "pdd", NAME, "-n", app_ns, "--show-managed-fields")
        (entry,) = [m for m in live["metadata"]["managedFields"] if m["manager"] == GITOPS]
        return live["metadata"]["generation"], entry

    before = gitops_entry()
    time.sleep(1.2)  # managedFields times have second precision: a real write would show
    kc.kubectl("apply", "--server-side", f"--field-manager={GITOPS}", "-f", str(GB300_EXAMPLE))
    assert gitops_entry() == before  # the API server found nothing to change: no write
    live = kget(kc, "pdd", NAME, "-n", app_ns, "--show-managed-fields")
    assert "annotations" not in live["metadata"] and "finalizers" not in live["metadata"]  # no operator bookkeeping
    others = [m for m in live["metadata"]["managedFields"] if m["manager"] != GITOPS]
    assert others and all(m.get("subresource") == "status" for m in others), others  # the operator: status only

    # only the leader reconciled
    looked(a, "PDDeployment", app_ns, NAME, more=2)
    assert a.metric("sglang_pd_operator_api_writes_total") > 0
    assert b.metric("sglang_pd_operator_api_writes_total") == 0
    assert b.metric("sglang_pd_operator_reconcile_duration_seconds_count") == 0

    # scale decode 2 -> 3: the same group, prefill untouched
    prefill = {p["metadata"]["uid"] for p in pods(kc, app_ns, f"{LBL}/role=prefill")}
    kc.kubectl("patch", "pdd", NAME, "-n", app_ns, "--type=merge", "-p", '{"spec":{"decode":{"replicas":3}}}')
    wait_for(lambda: (o := ready(kc, app_ns)) and o["status"]["decode"]["replicas"] == "3/3", timeout=60, what="3/3")
    assert {p["metadata"]["uid"] for p in pods(kc, app_ns, f"{LBL}/role=prefill")} == prefill
    kc.kubectl("patch", "pdd", NAME, "-n", app_ns, "--type=merge", "-p", '{"spec":{"decode":{"replicas":1}}}')
    wait_for(lambda: (o := ready(kc, app_ns)) and o["status"]["decode"]["replicas"] == "1/1", timeout=60, what="1/1")

    # a KV-layout change rolls both roles into a new group and prunes the old one (delete verbs)
    kc.kubectl("patch", "pdd", NAME, "-n", app_ns, "--type=merge", "-p",
               '{"spec":{"kvLayout":{"attentionBackend":"flashmla","layout":"v4"}}}')
    obj = wait_for(lambda: (o := ready(kc, app_ns)) and o["status"]["compatKey"] != key and o, timeout=120,
                   what="new group Ready")
    new_key = obj["status"]["compatKey"]
    wait_for(lambda: set(deployments(kc, app_ns)) == {f"{NAME}-{new_key[:6]}-{r}" for r in ("prefill", "decode", "gateway")},
             timeout=120, what="old group pruned")

    # delete: owner references collect every child
    kc.kubectl("delete", "pdd", NAME, "-n", app_ns)
    wait_for(lambda: not deployments(kc, app_ns) and not pods(kc, app_ns, f"{LBL}/deployment={NAME}"), timeout=90,
             what="children garbage-collected")
    assert b.metric("sglang_pd_operator_api_writes_total") == 0
    assert_no_forbidden(a, b)


def test_kernels_cache_auto_as_chart_sa_creates_kernelbuilds_and_their_jobs(kc, release, cluster_log):
    """KernelBuilds through the chart's identity: created by kernels.cache auto, reconciled, their children made."""
    a, b = release["ops"]
    assert lease_holder(kc) == "op-a"
    kc.kubectl("create", "namespace", KERNELS_NS)
    kapply(kc, model_store(KERNELS_NS))
    doc = example(KERNELS_NS)
    doc["spec"]["kernels"] = {**doc["spec"]["kernels"], "cache": "auto"}
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    builds = {role: kernel_build_inputs(plan, role) for role in ("prefill", "decode")}
    assert len({kb.name for kb in builds.values()}) == 2
    for kb in builds.values():  # bind the cache PVCs the operator will create, so kwok runs the build pods
        kapply(kc, cache_pv(KERNELS_NS, f"{kb.name}-cache"))
    image = chart_env(kc)["SGLANG_PD_OPERATOR_IMAGE"]

    start = time.monotonic()
    gitops_apply(kc, doc)
    try:
        for kb in builds.values():
            # ensure_kernelbuild (create), then the KernelBuild reconcile: PVC, request, Job (create), status (patch)
            obj = wait_for(lambda kb=kb: (o := kget(kc, "kernelbuild", kb.name, "-n", KERNELS_NS)) and
                           (c := condition(o, "Building")) and c["reason"] == "AwaitingResult" and o,
                           timeout=90, what=f"KernelBuild {kb.name} built by kwok, awaiting the builder's result")
            assert obj["metadata"]["labels"][f"{LBL}/kernel-inputs"] == kb.input_hash
            assert obj["status"]["phase"] == "Building" and obj["status"]["attempts"] == 1
            owner = {"apiVersion": f"{LBL}/v1alpha1", "kind": "KernelBuild", "name": kb.name,
                     "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
            (job,) = kget(kc, "jobs", "-n", KERNELS_NS, "-l", f"{LBL}/kernelbuild={kb.name}")["items"]
            assert job["metadata"]["name"] == f"{kb.name}-{kb.input_hash[:6]}-1"
            assert job["metadata"]["ownerReferences"] == [owner]
            pod = job["spec"]["template"]["spec"]
            assert pod["initContainers"][0]["image"] == image  # the chart's SGLANG_PD_OPERATOR_IMAGE
            assert pod["containers"][0]["image"] == kb.spec.runtime.image
            pvc = kget(kc, "pvc", f"{kb.name}-cache", "-n", KERNELS_NS)
            assert pvc["metadata"]["ownerReferences"] == [owner] and pvc["status"]["phase"] == "Bound"
            request = kget(kc, "configmap", f"{kb.name}-{kb.input_hash[:6]}-request", "-n", KERNELS_NS)
            assert request["metadata"]["ownerReferences"] == [owner]
            (build_pod,) = pods(kc, KERNELS_NS, f"{LBL}/kernelbuild={kb.name}")
            assert build_pod["status"]["phase"] == "Succeeded"
    except AssertionError:
        assert_no_forbidden(a)  # a denial explains a timeout best
        raise
    cluster_log(f"kernels.cache auto: both KernelBuilds awaiting results {time.monotonic() - start:.1f}s after apply "
                f"(operator as {SA})")
    # the PDDeployment waits for its kernels: engine Deployments held at zero
    pdd = wait_for(lambda: (o := kget(kc, "pddeployment", NAME, "-n", KERNELS_NS)) and
                   (c := condition(o, "KernelsReady")) and c["reason"] == "WaitingForKernels" and o,
                   timeout=30, what="KernelsReady=False WaitingForKernels")
    assert all(kb.name in condition(pdd, "KernelsReady")["message"] for kb in builds.values())
    engines = [d for d in deployments(kc, KERNELS_NS).values() if d["metadata"]["labels"].get(f"{LBL}/role")
               in ("prefill", "decode")]
    assert engines and all(d["spec"]["replicas"] == 0 for d in engines)

    # deleting the PDDeployment and the builds: owner references collect the Jobs, requests and PVCs
    kc.kubectl("delete", "pdd", NAME, "-n", KERNELS_NS)
    kc.kubectl("delete", "kernelbuilds", "--all", "-n", KERNELS_NS)
    sel = f"{LBL}/kernelbuild"
    wait_for(lambda: not kget(kc, "jobs,configmaps", "-n", KERNELS_NS, "-l", sel)["items"], timeout=60,
             what="build Jobs and requests garbage-collected")
    assert not (kget(kc, "kernelbuilds", "-n", KERNELS_NS) or {"items": []})["items"]
    assert b.metric("sglang_pd_operator_api_writes_total") == 0
    assert_no_forbidden(a, b)


# ---------------------------------------------------------------- 2. failover


def test_failover_lost_lease_and_graceful_release(kc, release, app_ns):
    a, b = release["ops"]
    assert lease_holder(kc) == "op-a"
    a.kill(signal.SIGKILL)  # a crash: the Lease is not released, op-b waits for it to expire
    wait_for(lambda: lease_holder(kc) == "op-b", timeout=30, what="op-b takes the Lease")
    gitops_apply(kc, example(app_ns, decode={"replicas": 1, "parallelism": {"tp": 4}}))
    wait_for(lambda: ready(kc, app_ns), timeout=90, what="Ready under op-b")
    assert b.metric("sglang_pd_operator_api_writes_total") > 0

    # someone else holds the Lease now: op-b stops renewing and exits with code 3
    patch = {"spec": {"holderIdentity": "thief", "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}}
    kc.kubectl("patch", "lease", LEASE, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    assert b.exit_code(timeout=30) == 3, b.log_tail()
    assert "lost the leader lease" in b.log()

    # a graceful stop releases the Lease: the next replica takes it at once
    c = ChartOperator(kubeconfig=release["kubeconfig"], log_path=release["logs"] / "c.log", identity="op-c").start()
    wait_for(lambda: lease_holder(kc) == "op-c", timeout=30, what="op-c takes the Lease after the thief's expired")
    c.stop()
    assert "released the leader lease" in c.log()
    assert not lease_holder(kc)
    d = ChartOperator(kubeconfig=release["kubeconfig"], log_path=release["logs"] / "d.log", identity="op-d").start()
    started = time.monotonic()
    wait_for(lambda: lease_holder(kc) == "op-d", timeout=30, what="op-d takes the released Lease")
    assert time.monotonic() - started < 6 + 5  # well within a lease duration + start-up
    release["ops"] = [d]
    assert_no_forbidden(a, b, c, d)


# ---------------------------------------------------------------- 3. autoscaled replicas


def test_replicas_left_to_an_autoscaler_are_not_reset(kc, release, app_ns):
    """decode.replicas omitted in Git: an autoscaler (here: a /scale patch as field manager hpa) owns it
    through the role's PDRoleScale, which the operator (as the chart's ServiceAccount) created."""
    doc = example(app_ns, decode={"parallelism": {"tp": 4}})
    gitops_apply(kc, doc)
    obj = wait_for(lambda: (o := ready(kc, app_ns)) and "replicas" not in o["spec"]["decode"] and o, timeout=60,
                   what="Ready with decode.replicas omitted")
    decode = f"{NAME}-{obj['status']['compatKey'][:6]}-decode"
    assert kget(kc, "pdrs", f"{NAME}-decode", "-n", app_ns)["spec"]["replicas"] == 1
    kc.kubectl("patch", "pdrs", f"{NAME}-decode", "-n", app_ns, "--subresource=scale", "--field-manager=hpa",
               "--type=merge", "-p", '{"spec":{"replicas":2}}')
    wait_for(lambda: (o := ready(kc, app_ns)) and o["status"]["decode"]["replicas"] == "2/2", timeout=60, what="2/2")
    gitops_apply(kc, doc)  # a sync
    (leader,) = [op for op in release["ops"] if op.identity == lease_holder(kc)]
    looked(leader, "PDDeployment", app_ns, NAME, more=3)  # three more reconciles (resync 2 s): the count stays
    assert kget(kc, "deployment", decode, "-n", app_ns)["spec"]["replicas"] == 2
    assert kget(kc, "pdrs", f"{NAME}-decode", "-n", app_ns)["status"]["replicas"] == 2
    diff = kc.kubectl("diff", "--server-side", f"--field-manager={GITOPS}", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert diff.returncode == 0, diff.stdout


# ---------------------------------------------------------------- 4. watchNamespaces


def test_watch_namespaces_release_serves_its_namespace_with_roles_only(kc, release, charts, tmp_path):
    for op in release["ops"]:  # the cluster-wide release's operator would serve every namespace
        op.stop()
    release["ops"] = []
    ops_ns, team, other = "team-ops", "team-a", "team-b"
    for ns in (ops_ns, team, other):
        kc.kubectl("create", "namespace", ns)
    for ns in (team, other):
        kapply(kc, model_store(ns))
    kc.helm("install", "scoped", str(charts["0.1.0"]), "--namespace", ops_ns, "--set", f"watchNamespaces={{{team}}}",
            "--set", "crds.install=false", "--set", "dashboards.enabled=false")
    sa = "scoped-sglang-pd-operator"
    assert not kget(kc, "clusterrole", sa)
    assert kget(kc, "role", sa, "-n", team) and not kget(kc, "role", sa, "-n", other)
    kubeconfig = sa_kubeconfig(kc, tmp_path / "kubeconfig", namespace=ops_ns, sa=sa)
    op = ChartOperator(kubeconfig=kubeconfig, log_path=tmp_path / "scoped.log", identity="scoped-0", namespace=ops_ns,
                       lease=sa, extra=(f"--namespace={team}",)).start()
    try:
        kapply(kc, [example(team, decode={"replicas": 1, "parallelism": {"tp": 4}}),
                    example(other, decode={"replicas": 1, "parallelism": {"tp": 4}})])
        wait_for(lambda: ready(kc, team), timeout=90, what=f"Ready in {team}")
        looked(op, "PDDeployment", team, NAME, more=2)
        assert not (kget(kc, "pdd", NAME, "-n", other) or {}).get("status"), "the scoped operator touched team-b"
        assert not deployments(kc, other)
        denied = kc.kubectl("--kubeconfig", str(kubeconfig), "get", "pdd", "-n", other, check=False)
        assert denied.returncode != 0 and "forbidden" in denied.stderr
        assert_no_forbidden(op)
    finally:
        op.stop()
        for ns in (team, other):
            kc.kubectl("delete", "pdd", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)


# ---------------------------------------------------------------- 5. helm upgrade with a new CRD field


def test_helm_upgrade_adds_crd_field_and_keeps_pddeployments_served(kc, release, charts, app_ns, cluster_log):
    before = ready(kc, app_ns)
    assert before, "a Ready PDDeployment from the autoscaler step"
    uids = sorted(p["metadata"]["uid"] for p in pods(kc, app_ns, f"{LBL}/deployment={NAME}"))
    res = kc.helm("upgrade", RELEASE, str(charts["0.2.0"]), "--namespace", NS, "--reuse-values", "--wait",
                  "--timeout", "120s")
    cluster_log("helm upgrade output:\n" + res.stdout)
    assert "REVISION: 2" in res.stdout
    crd = kget(kc, "crd", "pddeployments.pd.sglang-operator.io")
    spec_props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "notes" in spec_props and "slo" in spec_props
    # still served, same object, same pods, still Ready
    after = wait_for(lambda: ready(kc, app_ns), timeout=30, what="Ready after upgrade")
    assert after["metadata"]["uid"] == before["metadata"]["uid"] and after["spec"] == before["spec"]
    assert sorted(p["metadata"]["uid"] for p in pods(kc, app_ns, f"{LBL}/deployment={NAME}")) == uids
    # the new field is accepted by the API server (not pruned, not refused)
    doc = example(app_ns, notes="owned by the inference team")
    res = kc.kubectl("apply", "--server-side", "--dry-run=server", f"--field-manager={GITOPS}", "-f", "-",
                     "-o", "json", input=yaml.safe_dump(doc))
    assert json.loads(res.stdout)["spec"]["notes"] == "owned by the inference team"
    # the operator (built for 0.1.0's CRD) starts fine on the newer CRD, with a warning
    op2 = ChartOperator(kubeconfig=release["kubeconfig"], log_path=release["logs"] / "e.log", identity="op-e").start()
    release["ops"] = [op2]
    wait_for(lambda: "newer than this operator" in op2.log(), timeout=30, what="newer-CRD warning")
    assert "v1alpha1: spec.notes" in op2.log()
    wait_for(lambda: lease_holder(kc) == "op-e", timeout=30, what="op-e leads")
    assert op2.alive()


# ---------------------------------------------------------------- 6. an older CRD


def test_older_crd_is_refused_then_applied_by_the_operator(kc, release, charts, app_ns, tmp_path):
    (op,) = release["ops"]
    op.stop()
    kc.helm("upgrade", RELEASE, str(charts["0.0.9"]), "--namespace", NS, "--reuse-values", "--set", "operator.crds=apply")
    crd = kget(kc, "crd", "pddeployments.pd.sglang-operator.io")
    assert "slo" not in crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    kubeconfig = sa_kubeconfig(kc, tmp_path / "kubeconfig", namespace=NS, sa=SA)
    refused = ChartOperator(kubeconfig=kubeconfig, log_path=tmp_path / "refused.log", identity="op-f",
                            extra=("--crds=check",)).start()
    assert refused.exit_code(timeout=60) == 1
    assert re.search(r"the installed CRD pddeployments\.pd\.sglang-operator\.io is older than this operator: "
                     r"it lacks (v1alpha1: spec\.autoscaling; )?v1alpha1: spec\.slo", refused.log()), refused.log_tail()
    assert lease_holder(kc) != "op-f"  # refused before taking part in the election

    applier = ChartOperator(kubeconfig=kubeconfig, log_path=tmp_path / "apply.log", identity="op-g",
                            extra=("--crds=apply",)).start()
    try:
        wait_for(lambda: "matches this operator's schema" in applier.log() or not applier.alive(), timeout=60,
                 what="CRD applied by the operator")
        assert applier.alive(), applier.log_tail()
        crd = kget(kc, "crd", "pddeployments.pd.sglang-operator.io", "--show-managed-fields")
        assert "slo" in crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert "sglang-pd-operator" in {m["manager"] for m in crd["metadata"]["managedFields"]}
        wait_for(lambda: lease_holder(kc) == "op-g", timeout=30, what="op-g leads")
        wait_for(lambda: ready(kc, app_ns), timeout=60, what="still Ready")
        assert_no_forbidden(applier)
    finally:
        applier.stop()
