"""The dev cluster's LeaderWorkerSet pieces without a cluster: build inputs, PKI, the
controller's configuration, its webhook configurations (scoping), pod DNS names, node pools."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import shutil
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from helpers import ROOT

from sglang_pd_operator_dev.cluster import build, lws, nodes, pki, poddns

LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"


# --- build ------------------------------------------------------------------------------


def test_the_lws_module_pins_lws_and_keeps_the_control_plane_module_apart():
    source = ROOT / "hack/cluster"
    lws_versions = build.module_versions((source / "lws/go.mod").read_text())
    cluster_versions = build.module_versions((source / "go.mod").read_text())
    assert lws_versions[build.LWS_MODULE].startswith("v0.")
    assert build.LWS_MODULE not in cluster_versions, "joined, MVS would move the API server's dependencies"
    # the API server's server-side apply engine stays at the version Kubernetes pins
    assert cluster_versions["sigs.k8s.io/structured-merge-diff/v6"] == "v6.3.3"
    assert "sigs.k8s.io/lws/cmd" in (source / "lws/tools.go").read_text()


def test_module_hash_covers_the_lws_module(tmp_path):
    source = tmp_path / "cluster"
    shutil.copytree(ROOT / "hack/cluster", source, ignore=shutil.ignore_patterns("kwok"))
    before = build.module_hash(source)
    (source / "lws/go.mod").write_text((source / "lws/go.mod").read_text() + "\n// changed\n")
    assert build.module_hash(source) != before


def test_lws_version_is_stamped_like_lws_makefile():
    assert build.lws_ldflags(version="v0.9.0") == ["-X sigs.k8s.io/lws/pkg/version.GitVersion=v0.9.0"]


def test_missing_binaries_names_the_lws_controller_and_its_manifests(tmp_path):
    for name in build.TARGETS:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert build.missing_binaries(tmp_path) == ["lws-controller", build.LWS_CONFIG_DIR]
    (tmp_path / "lws-controller").write_text("#!/bin/sh\n")
    (tmp_path / "lws-controller").chmod(0o755)
    (tmp_path / build.LWS_CONFIG_DIR / "webhook").mkdir(parents=True)
    (tmp_path / build.LWS_CONFIG_DIR / "webhook" / "manifests.yaml").write_text("{}")
    assert build.missing_binaries(tmp_path) == []


# --- PKI --------------------------------------------------------------------------------


def test_webhook_serving_certificate_is_for_loopback_and_signed_by_the_cluster_ca(tmp_path):
    files = pki.write_pki(tmp_path, service_ip="10.96.0.1")
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    folder = files.webhook_cert_dir("lws")
    cert = x509.load_pem_x509_certificate((folder / "tls.crt").read_bytes())
    assert (folder / "tls.key").stat().st_mode & 0o777 == 0o600
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_after_utc > dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=300)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    client = x509.load_pem_x509_certificate(files.client_cert("lws-controller").read_bytes())
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "lws-controller-manager"
    assert not client.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME), "no group: RBAC by LWS's own role"


# --- the controller's configuration ------------------------------------------------------


def test_controller_config_serves_on_loopback_with_our_certificate_and_no_cert_management(tmp_path):
    config = lws.controller_config(webhook_port=9443, health_port=8081, cert_dir=tmp_path)
    assert config["apiVersion"] == "config.lws.x-k8s.io/v1alpha1" and config["kind"] == "Configuration"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path)}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["metrics"] == {"bindAddress": "0"}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    argv = lws.controller_argv(binary=Path("/b/lws-controller"), kubeconfig=Path("/k"), config_file=Path("/c"))
    assert argv[:3] == ["/b/lws-controller", "--kubeconfig=/k", "--config=/c"] and "--leader-elect=false" in argv


def _module(tmp_path: Path, *, pod_selector: bool = True, extra_rule: dict | None = None) -> Path:
    """A config dir laid out like the LWS module's (webhook/ with a kustomize patch)."""
    webhook = tmp_path / "webhook"
    webhook.mkdir(parents=True)
    pod_rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    lws_rule = {"apiGroups": ["leaderworkerset.x-k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["leaderworkersets"]}
    hooks = [{"name": "mlws", "clientConfig": {"service": {"name": "webhook-service", "path": "/mutate-lws"}},
              "rules": [lws_rule], "failurePolicy": "Fail", "sideEffects": "None"},
             {"name": "mpod", "clientConfig": {"service": {"name": "webhook-service", "path": "/mutate--v1-pod"}},
              "rules": [pod_rule], "failurePolicy": "Fail", "sideEffects": "None"}]
    if extra_rule:
        hooks.append({"name": "mother", "clientConfig": {"service": {"path": "/other"}}, "rules": [extra_rule]})
    (webhook / "manifests.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"}, "webhooks": hooks}))
    patch = [{"op": "replace", "path": "/webhooks/1", "value": {
        **hooks[1], **({"objectSelector": {"matchExpressions": [{"key": LWS_LABEL, "operator": "Exists"}]}}
                       if pod_selector else {})}}]
    (webhook / "mutating-patch.yaml").write_text(yaml.safe_dump(patch))
    (webhook / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["manifests.yaml"],
        "patches": [{"path": "mutating-patch.yaml", "target": {
            "kind": "MutatingWebhookConfiguration", "name": "mutating-webhook-configuration"}}]}))
    return tmp_path


def test_webhook_configurations_point_at_loopback_and_keep_the_module_patch(tmp_path):
    (config,) = lws.webhook_configurations(_module(tmp_path), port=41000, ca_cert=b"PEM")
    assert config["metadata"] == {"name": "lws-mutating-webhook-configuration"}
    by_name = {w["name"]: w for w in config["webhooks"]}
    assert by_name["mpod"]["clientConfig"] == {"url": "https://127.0.0.1:41000/mutate--v1-pod",
                                               "caBundle": base64.b64encode(b"PEM").decode()}
    assert by_name["mpod"]["objectSelector"]["matchExpressions"][0]["key"] == LWS_LABEL
    assert by_name["mlws"]["failurePolicy"] == "Fail"
    assert lws.webhook_paths([config]) == ["/mutate--v1-pod", "/mutate-lws"]


def test_a_pod_webhook_without_the_lws_selector_is_refused(tmp_path):
    with pytest.raises(lws.LwsConfigError, match="mpod.*objectSelector"):
        lws.webhook_configurations(_module(tmp_path, pod_selector=False), port=1, ca_cert=b"x")


def test_a_webhook_on_another_api_group_is_refused(tmp_path):
    rule = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["deployments"]}
    with pytest.raises(lws.LwsConfigError, match="mother.*apps"):
        lws.webhook_configurations(_module(tmp_path, extra_rule=rule), port=1, ca_cert=b"x")


def _built_lws_config() -> Path:
    found = build.find_binaries()
    if found is None:
        pytest.skip("dev cluster binaries not built (sglang-pd-operator dev cluster build)")
    return found.lws_config


def test_the_real_lws_manifests_install_scoped_webhooks_crds_and_role():
    config_dir = _built_lws_config()
    configs = lws.webhook_configurations(config_dir, port=40000, ca_cert=b"PEM")
    hooks = {w["name"]: w for c in configs for w in c["webhooks"]}
    assert {"mpod.kb.io", "vpod.kb.io", "mleaderworkerset.kb.io", "vleaderworkerset.kb.io"} <= set(hooks)
    for name in ("mpod.kb.io", "vpod.kb.io"):  # the pod webhooks see LWS pods only
        assert hooks[name]["objectSelector"] == {"matchExpressions": [{"key": LWS_LABEL, "operator": "Exists"}]}
    assert {w["failurePolicy"] for w in hooks.values()} == {"Fail"}
    assert all(w["clientConfig"]["url"].startswith("https://127.0.0.1:40000/") for w in hooks.values())
    crds = {c["metadata"]["name"]: c for c in lws.crds(config_dir)}
    lws_crd = crds["leaderworkersets.leaderworkerset.x-k8s.io"]
    assert [v["name"] for v in lws_crd["spec"]["versions"]] == ["v1"]
    assert "conversion" not in lws_crd["spec"], "one version: no conversion webhook needed"
    role, binding = lws.rbac(config_dir, user="lws-controller-manager")
    assert role["metadata"]["name"] == "lws-manager-role" and binding["roleRef"]["name"] == "lws-manager-role"
    assert any("leaderworkersets" in r["resources"] for r in role["rules"])


# --- pod DNS names ---------------------------------------------------------------------


def _pod(name, *, ns="t1", hostname=None, subdomain=None, ip="127.100.1.1", ready=True, labels=None):
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {LWS_LABEL: "demo"}},
            "spec": {"hostname": hostname, "subdomain": subdomain},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _service(name="demo", *, ns="t1", headless=True, publish_not_ready=True, selector=None):
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": "None" if headless else "10.96.0.9", "selector": selector or {LWS_LABEL: "demo"},
                     "publishNotReadyAddresses": publish_not_ready}}


def test_a_leader_address_resolves_like_cluster_dns():
    pods = [_pod("demo-0", hostname="demo-0", subdomain="demo", ip="127.100.1.1"),
            _pod("demo-0-1", hostname="demo-0-1", subdomain="demo", ip="127.100.2.1", ready=False)]
    records = poddns.hostname_records(pods=pods, services=[_service()])
    assert records == {"demo-0.demo.t1.svc.cluster.local": "127.100.1.1",
                       "demo-0-1.demo.t1.svc.cluster.local": "127.100.2.1"}  # publishNotReadyAddresses
    # LWS_LEADER_ADDRESS has no .svc suffix: the pod's search list completes it
    assert poddns.lookup("demo-0.demo.t1", namespace="t1", records=records) == "127.100.1.1"
    assert poddns.lookup("demo-0.demo.t1", namespace="other", records=records) == "127.100.1.1"
    assert poddns.lookup("demo-0.demo.t1.svc.cluster.local.", namespace="x", records=records) == "127.100.1.1"
    assert poddns.lookup("demo-9.demo.t1", namespace="t1", records=records) is None


@pytest.mark.parametrize("pods, services", [
    ([_pod("a", hostname="a", subdomain="demo", ready=False)], [_service(publish_not_ready=False)]),  # not ready
    ([_pod("a", hostname="a", subdomain="demo")], [_service(headless=False)]),                   # not headless
    ([_pod("a", hostname="a", subdomain="other")], [_service()]),                                 # subdomain != Service
    ([_pod("a", hostname="a", subdomain="demo", labels={"app": "x"})], [_service()]),             # not selected
    ([_pod("a", hostname="a", subdomain="demo", ns="t2")], [_service()]),                          # other namespace
    ([_pod("a", subdomain="demo")], [_service()]),                                                 # no hostname
    ([_pod("a", hostname="a", subdomain="demo", ip=None)], [_service()]),                          # no IP yet
])
def test_no_record_where_cluster_dns_has_none(pods, services):
    assert poddns.hostname_records(pods=pods, services=services) == {}


def test_search_list_order_follows_ndots():
    assert poddns.candidates("a.b.c", namespace="ns") == [
        "a.b.c.ns.svc.cluster.local", "a.b.c.svc.cluster.local", "a.b.c.cluster.local", "a.b.c"]
    assert poddns.candidates("a.b.c.svc.cluster.local", namespace="ns")[0] == "a.b.c.svc.cluster.local"


# --- node pools --------------------------------------------------------------------------


def test_gb300_pool_holds_the_wide_ep_shape_twice_over():
    """DEP64 decode over 16 four-GPU trays plus a DEP4 prefill tray, old and new groups side
    by side during a paired rollout, next to the single-node GB300 examples."""
    pools = {p.name: p for p in nodes.load_pools(ROOT / "hack/cluster/node-pools.yaml")}
    gb300 = pools["gb300"]
    assert gb300.capacity["nvidia.com/gpu"] == "4"
    assert gb300.count >= 2 * (16 + 1) + 3
