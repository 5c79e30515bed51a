"""Gang admission through Kueue (issue 27, items 3-4) without a cluster.

Render (the queue label on each LeaderWorkerSet, Kueue's topology annotations on its pod
templates), the CRD field, what observe reads of Kueue's Workloads while a group's pods are
gated and the Ready condition it turns into; the dev cluster's Kueue pieces (build inputs
kept apart from the core binaries, the controller's configuration, its webhook
configurations scoped to LWS, the queue objects). The e2e (tests/e2e/test_kueue.py) runs
the real Kueue.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from helpers import EXAMPLES, ROOT, MemoryKube, load_example

from sglang_pd_operator.api import kueue, lws
from sglang_pd_operator.api.crd import all_crds
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.planning.rollout import RolloutDecision
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.reconcilers.observe import admission_waits, observe, scheduling_gated
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render import render_all
from sglang_pd_operator_dev.cluster import build
from sglang_pd_operator_dev.cluster import kueue as dev_kueue

WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"


def _doc(**spec) -> dict:
    doc = load_example(WIDE_EP)
    doc["spec"].update(spec)
    return doc


def _objects(catalog, doc) -> dict[tuple[str, str], dict]:
    plan = build_plan(parse_pddeployment(doc), catalog)
    assert plan.valid, [p.line() for p in plan.problems]
    return {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[-1]): o for o in render_all(plan)}


def _templates(obj: dict) -> list[dict]:
    t = obj["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"], t["workerTemplate"]]


# --- render ------------------------------------------------------------------------------


def test_a_queue_name_labels_each_leaderworkerset_and_asks_kueue_for_one_clique_per_group(catalog):
    objs = _objects(catalog, _doc(scheduling={"queueName": "gb300-racks"}))
    decode = objs[(lws.KIND, "decode")]
    assert decode["metadata"]["labels"][kueue.QUEUE_LABEL] == "gb300-racks"
    for template in _templates(decode):  # leader and workers: one podset group, one clique for both
        notes = template["metadata"]["annotations"]
        assert notes[kueue.REQUIRED_TOPOLOGY] == "nvidia.com/gpu.clique"
        assert notes[kueue.PODSET_GROUP_NAME] == kueue.REPLICA_PODSET_GROUP
        assert kueue.PREFERRED_TOPOLOGY not in notes
        # the kube-scheduler's own clique affinity stays (what holds without Kueue)
        assert template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # single-node roles and the gateway are Deployments: Kueue's LWS integration does not see them
    for (kind, _), obj in objs.items():
        if kind == "Deployment":
            assert kueue.QUEUE_LABEL not in obj["metadata"]["labels"]
            assert kueue.REQUIRED_TOPOLOGY not in (obj["spec"]["template"]["metadata"].get("annotations") or {})


def test_preferred_placement_asks_kueue_to_prefer_and_none_asks_for_quota_only(catalog):
    preferred = _objects(catalog, _doc(scheduling={"queueName": "q"}, placement={"nvlinkDomain": "preferred"}))
    for template in _templates(preferred[(lws.KIND, "decode")]):
        notes = template["metadata"]["annotations"]
        assert notes[kueue.PREFERRED_TOPOLOGY] == "nvidia.com/gpu.clique" and kueue.REQUIRED_TOPOLOGY not in notes
    none = _objects(catalog, _doc(scheduling={"queueName": "q"}, placement={"nvlinkDomain": "none"}))
    decode = none[(lws.KIND, "decode")]
    assert decode["metadata"]["labels"][kueue.QUEUE_LABEL] == "q"  # still admitted whole, by quota
    for template in _templates(decode):
        notes = template["metadata"]["annotations"]
        assert not {kueue.REQUIRED_TOPOLOGY, kueue.PREFERRED_TOPOLOGY, kueue.PODSET_GROUP_NAME} & set(notes)


def test_without_a_queue_nothing_of_kueue_is_rendered(catalog):
    objs = _objects(catalog, _doc())
    decode = objs[(lws.KIND, "decode")]
    assert kueue.QUEUE_LABEL not in decode["metadata"]["labels"]
    for template in _templates(decode):
        assert not any(k.startswith("kueue.x-k8s.io/") for k in template["metadata"]["annotations"])


def test_the_crd_takes_a_queue_name_that_is_a_label_value():
    schema = all_crds()["pddeployments.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["scheduling"]["properties"]["queueName"]
    assert field["maxLength"] == 63 and field["pattern"].startswith("^[a-z0-9]")
    with pytest.raises(ValueError):
        parse_pddeployment(_doc(scheduling={"queueName": "Not_A_Label"}))
    with pytest.raises(ValueError):
        parse_pddeployment(_doc(scheduling={"queue": "x"}))  # unknown fields are refused


# --- observe and status ------------------------------------------------------------------


def _gated_pod(name: str, labels: dict, group: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {**labels, lws.LABEL_GROUP_INDEX: group}}, "spec": {},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                 "message": "Scheduling is blocked due to non-empty scheduling gates"}]}}


def _workload(uid: str, group: str, *, admitted: bool, message: str = "") -> dict:
    conditions = ([{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}] if admitted
                  else [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}])
    return {"apiVersion": kueue.API_VERSION, "kind": "Workload",
            "metadata": {"name": f"leaderworkerset-x-{group}-abc", "labels": {kueue.JOB_UID_LABEL: uid},
                         "annotations": {"kueue.x-k8s.io/component-workload-index": group}},
            "status": {"conditions": conditions}}


FULL = ("couldn't assign flavors to pod set worker: topology \"gb300\" doesn't allow to fit any of 15 pod(s). "
        "Total nodes: 40; excluded: resource \"nvidia.com/gpu\": 24")


def _observed(catalog, *, queued: bool, workloads: list[dict], gated: bool = True):
    plan = build_plan(parse_pddeployment(_doc(scheduling={"queueName": "q"})), catalog)
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan)}
    name = L.group_object_name(plan.name, plan.compat_key, "decode")
    group = copy.deepcopy(objs[(lws.KIND, name)])
    group["metadata"].update(uid="lws-uid", generation=1)
    group["status"] = {"observedGeneration": 1, "replicas": 1}
    if not queued:
        del group["metadata"]["labels"][kueue.QUEUE_LABEL]
    labels = group["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    pods = [_gated_pod(f"d-{i}", labels, "0") for i in range(16)] if gated else []
    kube = MemoryKube([group, *pods, *workloads])
    return plan, observe(kube, name=plan.name, namespace=plan.namespace, lws_served=True, cd_served=True)


def test_a_gated_group_is_reported_with_kueues_reason_until_admitted(catalog):
    plan, seen = _observed(catalog, queued=True, workloads=[_workload("lws-uid", "0", admitted=False, message=FULL)])
    group = seen.groups[plan.compat_key]
    assert group.awaiting_admission == (f"decode group 0: {FULL}",)
    ready = S.admission_condition(group)
    assert (ready.status, ready.reason) == ("False", "WaitingForCapacity")
    assert "doesn't allow to fit any of 15 pod(s)" in ready.message and "decode group 0" in ready.message
    # admitted (its pods about to be ungated): nothing to report
    _, seen = _observed(catalog, queued=True, workloads=[_workload("lws-uid", "0", admitted=True)])
    assert seen.groups[plan.compat_key].awaiting_admission == ()
    # another LeaderWorkerSet's Workload is not ours (selected by the job-uid label)
    _, seen = _observed(catalog, queued=True, workloads=[_workload("other", "0", admitted=True)])
    assert seen.groups[plan.compat_key].awaiting_admission == ("decode group 0: no Kueue Workload yet",)


def test_gates_on_a_leaderworkerset_without_a_queue_are_not_kueues(catalog):
    plan, seen = _observed(catalog, queued=False, workloads=[_workload("lws-uid", "0", admitted=False, message=FULL)])
    assert seen.groups[plan.compat_key].awaiting_admission == ()
    plan, seen = _observed(catalog, queued=True, gated=False,
                           workloads=[_workload("lws-uid", "0", admitted=False, message=FULL)])
    assert seen.groups[plan.compat_key].awaiting_admission == ()


def test_ready_says_waiting_for_capacity_in_the_full_status(catalog):
    plan, seen = _observed(catalog, queued=True, workloads=[_workload("lws-uid", "0", admitted=False, message=FULL)])
    decision = RolloutDecision(serving_key=plan.compat_key, apply_target=True, target_to_zero=False, delete_keys=(),
                               phase="Surging", phase_started=0.0, draining_key=None, drain_started=None,
                               message="group starts")
    status = S.valid_status(previous={}, generation=1, problems=[], observed=seen, decision=decision,
                            target_key=plan.compat_key, kv_layouts={}, attention_backends={}, endpoint="e", now=1.0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "WaitingForCapacity" and FULL in ready["message"]


def test_kueues_reason_is_the_quota_reserved_message_on_one_line():
    wl = _workload("u", "3", admitted=False, message="line one\n  line two")
    assert kueue.waiting_reason(wl) == "line one line two"
    assert kueue.group_index(wl) == "3"
    assert not kueue.admitted(wl)
    assert kueue.waiting_reason({"status": {}}) == "Kueue has not evaluated the Workload yet"
    assert admission_waits("decode", [], {"1", "0", "10"}) == [
        "decode group 0: no Kueue Workload yet", "decode group 1: no Kueue Workload yet",
        "decode group 10: no Kueue Workload yet"]
    assert scheduling_gated(_gated_pod("p", {}, "0"))
    assert not scheduling_gated({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                            "reason": "Unschedulable"}]}})


def test_a_waiting_event_fires_once_per_transition():
    from sglang_pd_operator.reconcilers import pddeployment as P

    waiting = {"conditions": [{"type": "Ready", "status": "False", "reason": "WaitingForCapacity", "message": "m"}]}
    kube = MemoryKube([])
    outcome = P.Outcome(valid=True)
    P._event_waiting_for_capacity(kube, {"metadata": {"name": "x", "namespace": "n"}}, {}, waiting, outcome)
    P._event_waiting_for_capacity(kube, {"metadata": {"name": "x", "namespace": "n"}}, waiting, waiting, outcome)
    assert kube.events == [("WaitingForCapacity", "m")]


# --- the dev cluster's Kueue ----------------------------------------------------------


def test_the_kueue_module_is_apart_and_its_hash_leaves_the_core_cache_alone(tmp_path):
    source = tmp_path / "cluster"
    shutil.copytree(ROOT / "hack/cluster", source, ignore=shutil.ignore_patterns("kwok"))
    assert build.module_versions((source / "kueue/go.mod").read_text())[build.KUEUE_MODULE] == "v0.17.0"
    assert build.KUEUE_MODULE not in build.module_versions((source / "go.mod").read_text())
    assert "sigs.k8s.io/kueue/cmd/kueue" in (source / "kueue/tools.go").read_text()
    core, own = build.module_hash(source), build.kueue_module_hash(source)
    (source / "kueue/go.mod").write_text((source / "kueue/go.mod").read_text() + "\n// changed\n")
    assert build.module_hash(source) == core, "a Kueue change must not rebuild the eight core binaries"
    assert build.kueue_module_hash(source) != own
    assert build.kueue_ldflags(version="v0.17.0") == ["-X sigs.k8s.io/kueue/pkg/version.GitVersion=v0.17.0"]


def test_missing_kueue_names_the_controller_and_its_manifests(tmp_path):
    assert build.missing_kueue(tmp_path) == ["kueue-controller", build.KUEUE_CONFIG_DIR]


def test_the_controller_config_serves_on_loopback_with_the_lws_integration_only(tmp_path):
    config = dev_kueue.controller_config(webhook_port=41001, health_port=41002, cert_dir=tmp_path)
    assert config["webhook"] == {"host": "127.0.0.1", "port": 41001, "certDir": str(tmp_path)}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["integrations"]["frameworks"] == ["leaderworkerset.x-k8s.io/leaderworkerset"]
    assert config["manageJobsWithoutQueueName"] is False
    argv = dev_kueue.controller_argv(binary=Path("/b/kueue-controller"), kubeconfig=Path("/k"), config_file=Path("/c"),
                                     etc_upper=Path("/r/up"), etc_work=Path("/r/work"), as_root=False)
    assert "--feature-gates=VisibilityOnDemand=false" in argv
    # its own mount namespace: /etc overlaid from the run dir, then exec (the same pid) of the controller
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--map-root-user"]
    assert argv[argv.index("/b/kueue-controller") - 2:argv.index("/b/kueue-controller")] == ["/r/up", "/r/work"]
    root = dev_kueue.controller_argv(binary=Path("/b/kueue-controller"), kubeconfig=Path("/k"), config_file=Path("/c"),
                                     etc_upper=Path("/r/up"), etc_work=Path("/r/work"), as_root=True)
    assert "--map-root-user" not in root


def test_queue_objects_name_the_clique_level_and_a_gpu_quota():
    topo, flavor, cq, lq = dev_kueue.queue_objects(name="racks", namespace="ns", node_labels={"a": "b"}, gpus=72)
    assert [lv["nodeLabel"] for lv in topo["spec"]["levels"]] == ["nvidia.com/gpu.clique", "kubernetes.io/hostname"]
    assert flavor["spec"] == {"nodeLabels": {"a": "b"}, "topologyName": "racks"}
    gpu = next(r for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"] if r["name"] == "nvidia.com/gpu")
    assert gpu["nominalQuota"] == 72
    assert lq["metadata"]["namespace"] == "ns" and lq["spec"]["clusterQueue"] == "racks"


def _built_kueue_config() -> Path:
    found = build.find_kueue()
    if found is None:
        pytest.skip("Kueue not built (sglang-pd-operator dev cluster build --kueue)")
    return found.config


def test_the_real_kueue_manifests_install_scoped_webhooks_crds_and_role():
    config_dir = _built_kueue_config()
    configs = dev_kueue.webhook_configurations(config_dir, port=40001, ca_cert=b"PEM")
    hooks = {w["name"]: w for c in configs for w in c["webhooks"]}
    assert {"mpod.kb.io", "vpod.kb.io", "mleaderworkerset.kb.io", "vleaderworkerset.kb.io",
            "mworkload.kb.io", "vworkload.kb.io", "vclusterqueue.kb.io"} <= set(hooks)
    assert not {"mjob.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io", "vdeployment.kb.io"} & set(hooks)
    for name in ("mpod.kb.io", "vpod.kb.io"):  # LWS pods only, and the module's namespace patch kept
        assert hooks[name]["objectSelector"] == {"matchExpressions": [
            {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
        assert hooks[name]["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    assert all(w["clientConfig"]["url"].startswith("https://127.0.0.1:40001/") for w in hooks.values())
    crds = {c["metadata"]["name"]: c for c in dev_kueue.crds(config_dir, port=40001, ca_cert=b"PEM")}
    workloads = crds["workloads.kueue.x-k8s.io"]
    assert {v["name"] for v in workloads["spec"]["versions"]} == {"v1beta1", "v1beta2"}
    conversion = workloads["spec"]["conversion"]
    assert conversion["webhook"]["clientConfig"]["url"] == "https://127.0.0.1:40001/convert"
    assert "topologies.kueue.x-k8s.io" in crds
    paths = dev_kueue.webhook_paths(configs, list(crds.values()))
    assert "/convert" in paths and "/mutate--v1-pod" in paths
    role, binding, secrets, secrets_binding = dev_kueue.rbac(config_dir, user="kueue-controller-manager")
    assert role["metadata"]["name"] == "kueue-manager-role" and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert any("workloads" in r.get("resources", []) for r in role["rules"])
    assert (secrets["kind"], secrets["metadata"]) == ("Role", {"name": "kueue-manager-secrets-role",
                                                               "namespace": "kueue-system"})
    assert secrets_binding["kind"] == "RoleBinding" and secrets_binding["metadata"]["namespace"] == "kueue-system"


def test_a_pod_webhook_left_unscoped_is_refused():
    hook = {"name": "mpod", "rules": [{"apiGroups": [""], "resources": ["pods"]}]}
    with pytest.raises(dev_kueue.KueueConfigError):
        dev_kueue.check_scoped([{"kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"}, "webhooks": [hook]}])
    job = {"name": "mjob", "rules": [{"apiGroups": ["batch"], "resources": ["jobs"]}]}
    with pytest.raises(dev_kueue.KueueConfigError):
        dev_kueue.check_scoped([{"kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"}, "webhooks": [job]}])
