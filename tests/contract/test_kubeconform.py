"""The chart's manifests, the examples and the operator's rendered children, checked by the REAL kubeconform.

kubeconform v0.8.0 is built from its pinned Go module (hack/kubeconform/go.mod) by
hack/kubeconform/build_kubeconform.py into a cache keyed by go.mod + go.sum. It cannot
download its schemas here, so they are generated (hack/kubeconform/schemas.py):

- the Kubernetes schemas from the OpenAPI v3 (``/openapi/v3``) of the dev cluster's
  kube-apiserver v1.36.3, generated once into
  ``~/.cache/sglang-pd-operator/kube-schemas/<key>/`` (the key covers the cluster's
  binaries and the generator), starting a dev cluster for the purpose only on a cache miss;
- our CRD schemas from ``crds/`` (every run: they change with the API models), the
  Prometheus Operator's ServiceMonitor / PodMonitor / PrometheusRule CRDs and
  LeaderWorkerSet's CRD (the multi-node examples' workloads) from their pinned Go modules.

Every resource must be *valid* in strict mode (unknown fields refused): nothing skipped,
no missing schema. Negative cases prove the schemas bite.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, ROOT

KUBE_VERSION = "1.36.3"
CHART = ROOT / "charts" / "sglang-pd-operator"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


schemas = _load("kubeconform_schemas", ROOT / "hack" / "kubeconform" / "schemas.py")
build = _load("build_kubeconform", ROOT / "hack" / "kubeconform" / "build_kubeconform.py")
chart_check = _load("chart_check", ROOT / "hack" / "chart_check.py")


@pytest.fixture(scope="module")
def kubeconform() -> Path:
    if not os.environ.get(build.KUBECONFORM.env_override) and not shutil.which("go"):
        pytest.skip("neither KUBECONFORM nor a Go toolchain is available to build kubeconform")
    return build.ensure_kubeconform(log=lambda line: print(line, flush=True))


def _kube_schema_cache() -> Path:
    from sglang_pd_operator_dev.cluster import build as cluster_build
    from sglang_pd_operator_dev.cluster import paths

    digest = hashlib.sha256(cluster_build.module_hash(paths.source_dir()).encode())
    digest.update((ROOT / "hack" / "kubeconform" / "schemas.py").read_bytes())
    return paths.cache_root() / "kube-schemas" / f"v{KUBE_VERSION}-{digest.hexdigest()[:16]}"


@pytest.fixture(scope="module")
def schema_dir(tmp_path_factory) -> Path:
    """Kubernetes schemas (cached) + CRD schemas (fresh) in one folder."""
    cache = _kube_schema_cache()
    if not (cache / "complete").is_file():
        from sglang_pd_operator_dev.cluster.cluster import start_cluster

        run_dir = tmp_path_factory.mktemp("schema-cluster")
        cluster = start_cluster(run_dir=run_dir, log=lambda line: print(line, flush=True))
        try:
            version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
            assert version == f"v{KUBE_VERSION}", version
            tmp = cache.with_name(f".{cache.name}.tmp-{uuid.uuid4().hex[:6]}")
            count = schemas.kube_schemas(lambda p: json.loads(cluster.kubectl("get", "--raw", p).stdout), tmp,
                                         version=KUBE_VERSION)
            assert count > 100, count
            (tmp / "complete").write_text(f"{count} kinds from kube-apiserver {version}\n")
            shutil.rmtree(cache, ignore_errors=True)
            os.rename(tmp, cache)
        finally:
            cluster.stop(log=lambda line: None)
    out = tmp_path_factory.mktemp("schemas")
    os.symlink(cache / f"v{KUBE_VERSION}-standalone-strict", out / f"v{KUBE_VERSION}-standalone-strict")
    ours = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    # ComputeDomain (GB300 multi-node roles): the dev cluster's restatement of NVIDIA's CRD (its Go module is
    # not served here; devtools/sglang_pd_operator_dev/cluster/imex.py)
    from sglang_pd_operator_dev.cluster import imex

    schemas.crd_schemas(ours + schemas.prometheus_operator_crds() + schemas.lws_crds() + [imex.crd()], out)
    return out


def validate(kubeconform: Path, schema_dir: Path, manifests: str) -> dict:
    """Run kubeconform -strict on ``manifests`` (YAML text); the JSON report."""
    args = [str(kubeconform), "-strict", "-summary", "-output", "json", "-kubernetes-version", KUBE_VERSION]
    for location in schemas.schema_locations(schema_dir):
        args += ["-schema-location", location]
    proc = subprocess.run([*args, "-"], input=manifests, capture_output=True, text=True)
    report = json.loads(proc.stdout)
    report["returncode"] = proc.returncode
    return report


def assert_all_valid(report: dict, expected: int | None = None) -> None:
    bad = [r for r in report.get("resources") or [] if r["status"] != "statusValid"]
    assert not bad, json.dumps(bad, indent=2)
    s = report["summary"]
    assert s["invalid"] == s["errors"] == s["skipped"] == 0 and report["returncode"] == 0, report
    if expected is not None:
        assert s["valid"] == expected, report


@pytest.mark.parametrize("values", sorted((CHART / "ci").glob("*.yaml")), ids=lambda p: p.stem)
def test_chart_templates_are_valid_kubernetes_and_crd_objects(kubeconform, schema_dir, values):
    """helm lint, then helm template | kubeconform: Kubernetes kinds, our CRDs, the ServiceMonitor."""
    chart_check.helm("lint", "{chart}", "--strict", "-f", str(values))
    out = chart_check.helm("template", "pd", "{chart}", "--namespace", "sglang-system", "-f", str(values)).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(out) if d]
    report = validate(kubeconform, schema_dir, out)
    assert_all_valid(report, expected=len(kinds))
    if values.stem == "monitoring-values":
        assert "ServiceMonitor" in kinds


def test_examples_are_valid_pddeployments(kubeconform, schema_dir):
    docs = [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    assert_all_valid(validate(kubeconform, schema_dir, yaml.safe_dump_all(docs)), expected=len(docs))


def test_rendered_children_are_valid(kubeconform, schema_dir, catalog):
    """What the operator applies for every example (incl. PodMonitor/PrometheusRule), and for the first one
    with both roles scaled by the planner (its PDRoleScales), passes the schemas; so does the PDDeployment
    with spec.autoscaling and the HPA of docs/autoscaling.md pointed at a PDRoleScale."""
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.metrics.monitoring import render_monitoring
    from sglang_pd_operator.planning.plan import build_plan
    from sglang_pd_operator.render import labels as L
    from sglang_pd_operator.render import render_all

    objs = []
    docs = [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    scaled = copy.deepcopy(docs[0])  # both roles left to their PDRoleScales and the planner
    for role in ("prefill", "decode"):
        scaled["spec"][role].pop("replicas", None)
    scaled["spec"]["autoscaling"] = {"prefill": {"maxReplicas": 2}, "decode": {"minReplicas": 2, "maxReplicas": 4}}
    objs.append(scaled)
    for doc in [*docs, scaled]:
        plan = build_plan(parse_pddeployment(doc), catalog)
        assert plan.valid, doc["metadata"]["name"]
        owner = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
                 "name": plan.name, "uid": "00000000-0000-0000-0000-000000000000"}
        objs += render_all(plan, owner=owner)
        objs += render_monitoring(name=plan.name, namespace=plan.namespace, slo_spec=plan.spec.slo,
                                  pod_selector={L.LABEL_DEPLOYMENT: plan.name}, role_label=L.LABEL_ROLE,
                                  labels=L.common_labels(plan.name), owner_references=L.owner_reference(owner),
                                  load=plan.spec.autoscaling is not None)
    # the HPA of docs/autoscaling.md, pointed at a PDRoleScale
    text = (ROOT / "docs" / "autoscaling.md").read_text()
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in text.split("```yaml\n")[1:]]
    hpas = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "HorizontalPodAutoscaler"]
    assert hpas and hpas[0]["spec"]["scaleTargetRef"]["kind"] == "PDRoleScale"
    objs += hpas
    assert {"PodMonitor", "PrometheusRule", "Deployment", "LeaderWorkerSet", "PDRoleScale", "HorizontalPodAutoscaler",
            "ComputeDomain"} <= {
        o["kind"] for o in objs}
    assert_all_valid(validate(kubeconform, schema_dir, yaml.safe_dump_all(objs)), expected=len(objs))


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
          "spec": {"replicas": "two", "selector": {}, "template": {}}}, "replicas"),
        ({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}, "portz"),
        ({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"},
          "spec": {"maxUnavailable": 1.5}}, "maxUnavailable"),
        ({"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment", "metadata": {"name": "x"},
          "spec": {"decode": {"replica": 2}}}, "replica"),
        ({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"},
          "spec": {"endpoints": [{"port": "metrics", "intervall": "30s"}], "selector": {}}}, "intervall"),
        ({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "x"},
          "spec": {"startupPolicy": "LeaderStarted",
                   "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": []}}}}},
         "startupPolicy"),
    ],
    ids=["deployment-type", "service-unknown-field", "pdb-type", "pdd-unknown-field", "servicemonitor-unknown-field",
         "lws-enum"],
)
def test_schemas_refuse_wrong_objects(kubeconform, schema_dir, doc, needle):
    report = validate(kubeconform, schema_dir, yaml.safe_dump(doc))
    (res,) = report["resources"]
    assert res["status"] == "statusInvalid" and needle in res["msg"], res
