"""The Helm chart renders, lints, refuses wrong values, and stays in step with the repository.

``helm`` is the dev cluster's helm v3.21.4 (built once into a cache, see
docs/dev-cluster.md); no cluster is started here. The values files under
``charts/sglang-pd-operator/ci/`` are the variants every test renders: defaults,
namespaced, monitoring + CRDs applied by the operator, single replica.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, load_script

CHART = ROOT / "charts" / "sglang-pd-operator"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


cc = load_script(ROOT / "hack" / "chart_check.py", "chart_check")


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def operator_args(objs: list[dict]) -> list[str]:
    return one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    """Each ci/ values file -> the rendered objects."""
    return {p.stem: cc.helm_template(values=[p]) for p in CI_VALUES}


def test_chart_is_in_step_with_the_repository():
    """CRD copy == crds/, Chart version == appVersion == package version, CHANGELOG section."""
    assert cc.problems() == []
    version, app = cc.chart_versions()
    from sglang_pd_operator import __version__

    assert version == app == __version__ == cc.package_version()


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_helm_lint_strict(values: Path):
    res = cc.helm("lint", "{chart}", "--strict", "-f", str(values), check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_defaults_two_replicas_with_leader_election_pdb_and_hardened_pod(rendered):
    objs = rendered["default-values"]
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "Recreate"}  # never two operator versions at once
    args = operator_args(objs)
    assert args[0] == "run" and "--leader-elect" in args and "--crds=check" in args
    assert "--leader-elect-lease=pd-sglang-pd-operator" in args and "--leader-elect-timing=15,10,2" in args
    assert not [a for a in args if a.startswith("--namespace")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pd-sglang-pd-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    c = pod["containers"][0]
    assert c["image"] == f"ghcr.io/sglang-pd-operator/sglang-pd-operator:{cc.package_version()}"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e for e in c["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= set(env)
    assert env["SGLANG_PD_OPERATOR_IMAGE"]["value"] == c["image"]  # KernelBuild's init container
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}  # fails on a stuck loop
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = one(objs, "Service")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert not by_kind(objs, "ServiceMonitor")


def test_crds_are_the_repository_crds_kept_on_uninstall(rendered):
    """The chart's CRDs are crds/*.yaml (one source) plus Helm labels and the keep policy."""
    objs = rendered["default-values"]
    crds = {c["metadata"]["name"]: c for c in by_kind(objs, "CustomResourceDefinition")}
    sources = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        sources[doc["metadata"]["name"]] = doc
    assert set(crds) == set(sources)
    for name, crd in crds.items():
        assert crd["spec"] == sources[name]["spec"], name
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert not by_kind(rendered["namespaced-values"], "CustomResourceDefinition")  # crds.install=false
    mon = {c["metadata"]["name"]: c for c in by_kind(rendered["monitoring-values"], "CustomResourceDefinition")}
    assert all(c["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] for c in mon.values())


def test_the_imex_admission_policy_is_the_operators_named_after_the_release(rendered):
    """The chart installs api/computedomain.py's admission policy and binding (crds/policies/), named after the
    release so that two releases in one cluster each own theirs (both set the same template on a pod);
    imex.channelPerReplicaPolicy=false installs neither."""
    from sglang_pd_operator.api import computedomain as cd

    objs = rendered["default-values"]
    (policy,) = by_kind(objs, cd.POLICY_KIND)
    (binding,) = by_kind(objs, cd.BINDING_KIND)
    source_policy, source_binding = cd.admission_policy()
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == binding["spec"]["policyName"] == \
        "pd-sglang-pd-operator-imex-channel-per-replica"
    assert policy["spec"] == source_policy["spec"]
    assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == "imex-channel-per-replica"
    assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    off = cc.helm_template(sets=["imex.channelPerReplicaPolicy=false"])
    assert not by_kind(off, cd.POLICY_KIND) and not by_kind(off, cd.BINDING_KIND)
    assert source_binding["spec"]["policyName"] == cd.POLICY_NAME  # crds/policies/ for kubectl users


def test_watch_namespaces_gives_roles_per_namespace_and_flags(rendered):
    objs = rendered["namespaced-values"]
    args = operator_args(objs)
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objs, "Role")}
    assert roles == {("team-a", "pd-sglang-pd-operator"), ("team-b", "pd-sglang-pd-operator"),
                     ("sglang-system", "pd-sglang-pd-operator-self")}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(objs, "RoleBinding")}
    assert bindings == roles
    # cluster-wide: only the read of our own CRDs, by name
    (cluster_role,) = by_kind(objs, "ClusterRole")
    assert cluster_role["metadata"]["name"] == "pd-sglang-pd-operator-crds"
    assert cluster_role["rules"] == [{
        "apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
        "resourceNames": sorted(yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "crds").glob("*.yaml")),
        "verbs": ["get"],
    }]


def test_monitoring_values_service_monitor_dashboard_catalog_and_digest(rendered):
    objs = rendered["monitoring-values"]
    sm = one(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["interval"] == "15s"
    svc = one(objs, "Service")
    assert all(svc["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["sglang-system"]
    cms = {c["metadata"]["name"]: c for c in by_kind(objs, "ConfigMap")}
    dash = cms["pd-sglang-pd-operator-dashboard-sglang-pd-slo"]
    assert dash["metadata"]["namespace"] == "monitoring"
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["annotations"] == {"grafana_folder": "SGLang"}
    source = (CHART / "dashboards" / "sglang-pd-slo.json").read_text()
    assert json.loads(dash["data"]["sglang-pd-slo.json"]) == json.loads(source)
    catalog = cms["sglang-pd-operator-catalog"]
    assert catalog["metadata"]["namespace"] == "sglang-system" and set(catalog["data"]) == {"accelerators.yaml"}
    c = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    assert c["args"][:2] == ["--verbose", "run"] and "--crds=apply" in c["args"]


def test_single_replica_values(rendered):
    objs = rendered["single-replica-values"]
    assert one(objs, "Deployment")["spec"]["replicas"] == 1
    args = operator_args(objs)
    assert "--no-leader-elect" in args and "--leader-elect" not in args and "--crds=skip" in args
    assert not by_kind(objs, "PodDisruptionBudget") and not by_kind(objs, "Service")
    assert not [c for c in by_kind(objs, "ConfigMap") if "dashboard" in c["metadata"]["name"]]
    self_role = one(objs, "Role")  # the Lease is only read (the refusal to start beside a leader)
    assert [r["verbs"] for r in self_role["rules"] if "leases" in r["resources"]] == [["get"]]
    assert [r["metadata"]["name"] for r in by_kind(objs, "ClusterRole")] == ["pd-sglang-pd-operator"]


def test_slo_source_values_become_flags_the_cli_accepts_and_a_mounted_secret(rendered):
    from sglang_pd_operator.cli import main

    assert {"--slo-source=scrape", "--slo-interval=15"} <= set(operator_args(rendered["default-values"]))
    objs = rendered["prometheus-source-values"]
    args = operator_args(objs)
    creds = "/etc/sglang-pd-operator/prometheus"
    assert {"--slo-source=prometheus", "--slo-interval=30", "--prometheus-url=https://prometheus-operated.monitoring:9090",
            f"--prometheus-bearer-token-file={creds}/token", f"--prometheus-ca-file={creds}/ca.crt"} <= set(args)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "prometheus-credentials", "mountPath": creds, "readOnly": True} in pod["containers"][0]["volumeMounts"]
    assert {"name": "prometheus-credentials", "secret": {"secretName": "prometheus-reader"}} in pod["volumes"]
    # the CLI parses every rendered flag (files replaced by real ones: click checks they exist)
    run = main.commands["run"]
    ctx = run.make_context("run", [a.replace(f"{creds}/ca.crt", str(ROOT / "README.md"))
                                   for a in args[args.index("run") + 1:]])
    assert ctx.params["slo_source"] == "prometheus" and ctx.params["prometheus_url"].startswith("https://")


def test_the_default_queue_value_becomes_the_flag_the_cli_accepts(rendered):
    """scheduling.defaultQueueName -> run --default-queue-name (the queue of PDDeployments that name none)."""
    from sglang_pd_operator.cli import main

    for objs in rendered.values():  # empty by default: no flag, nothing queued by the operator
        assert not [a for a in operator_args(objs) if a.startswith("--default-queue-name")]
    args = operator_args(cc.helm_template(sets=["scheduling.defaultQueueName=gb300"]))
    assert "--default-queue-name=gb300" in args
    ctx = main.commands["run"].make_context("run", args[args.index("run") + 1:])
    assert ctx.params["default_queue"] == "gb300"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replicaCount=two"], "/replicaCount"),
        (["operator.crd=apply"], "'crd' not allowed"),
        (["operator.crds=always"], "/operator/crds"),
        (["watchNamespaces={Team_A}"], "/watchNamespaces/0"),
        (["leaderElection.enabled=false"], "replicaCount"),
        (["leaderElection.renewDeadline=20"], "leaseDuration > renewDeadline"),
        (["image.digest=latest"], "/image/digest"),
        (["catalog.gpus\\.yaml=x"], "'gpus.yaml' not allowed"),
        (["serviceMonitor.interval=often"], "/serviceMonitor/interval"),
        (["metrics.port=0"], "/metrics/port"),
        (["serviceMonitor.enabled=true", "metrics.service.enabled=false"], "needs metrics.service.enabled"),
        (["slo.source=prom"], "/slo/source"),
        (["slo.source=prometheus"], "/slo/prometheus/url"),
        (["slo.prometheus.url=prometheus:9090"], "/slo/prometheus/url"),
        (["scheduling.defaultQueueName=Team_A"], "/scheduling/defaultQueueName"),
    ],
)
def test_wrong_values_fail_at_render_naming_the_value(sets, message):
    args = ["template", "pd", "{chart}"]
    for s in sets:
        args += ["--set", s]
    res = cc.helm(*args, check=False)
    assert res.returncode != 0, f"{sets} rendered"
    assert message in res.stderr, res.stderr


def test_chart_package_contains_crds_and_dashboard_but_not_ci(tmp_path):
    """`helm package` carries files/crds and dashboards (what .Files reads), not ci/."""
    import tarfile

    cc.helm("package", "{chart}", "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("sglang-pd-operator-*.tgz")
    assert tgz.name == f"sglang-pd-operator-{cc.package_version()}.tgz"
    names = set(tarfile.open(tgz).getnames())
    for p in (ROOT / "crds").glob("*.yaml"):
        assert f"sglang-pd-operator/files/crds/{p.name}" in names
    assert "sglang-pd-operator/dashboards/sglang-pd-slo.json" in names
    assert "sglang-pd-operator/values.schema.json" in names
    assert not [n for n in names if "/ci/" in n]
