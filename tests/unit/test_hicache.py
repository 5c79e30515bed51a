"""HiCache with a shared storage tier: flags per role, the store config, its key namespace, the master.

The namespace property: two specs that differ only in KV layout render different
``extra_backend_tag`` values (their pages never mix in one store); replicas of one spec,
and changes that keep the compat key (replica counts), render the same tag. The real
SGLang code that turns the tag into the key prefix is exercised in
tests/contract/test_mooncake_contract.py.
"""

from __future__ import annotations

import copy
import json

import pytest
from helpers import load_example

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.metrics import kvstore as M
from sglang_pd_operator.reconcilers import kvstore as K
from sglang_pd_operator.render import render_all
from sglang_pd_operator.render.mooncake import master_args, render_mooncake_master, store_config

CATALOG = builtin_catalog()


def doc_with(hicache: dict | None, **spec_changes) -> dict:
    doc = load_example()
    doc["spec"].pop("kernels", None)  # the plugin's KV-offload warning is tested on its own
    if hicache is not None:
        doc["spec"]["kvCache"] = {"hicache": hicache}
    doc["spec"].update(spec_changes)
    return doc


def plan_of(doc):
    return build_plan(parse_pddeployment(doc), CATALOG)


def args(role_plan) -> list[str]:
    return list(role_plan.command.args)


def value(role_plan, flag: str) -> str | None:
    a = args(role_plan)
    return a[a.index(flag) + 1] if flag in a else None


MOONCAKE = {"hostRatio": 2, "storage": {"backend": "mooncake", "mooncake": {"globalSegmentSize": "32Gi"}}}


def test_prefill_gets_hicache_and_the_mooncake_store_config():
    plan = plan_of(doc_with(MOONCAKE))
    assert plan.valid, [p.line() for p in plan.problems]
    a = args(plan.prefill)
    assert "--enable-hierarchical-cache" in a
    assert value(plan.prefill, "--hicache-ratio") == "2"
    assert value(plan.prefill, "--hicache-storage-backend") == "mooncake"
    cfg = json.loads(value(plan.prefill, "--hicache-storage-backend-extra-config"))
    assert cfg == {
        "master_server_address": "dsv41-flash-mooncake-master.inference.svc:50051",
        "master_metrics_port": 9003,
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "rdma",
        "device_name": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
        "global_segment_size": 32 << 30,
        "extra_backend_tag": f"sglpd-{plan.compat_key}",
    }
    assert store_config(plan, plan.prefill) == cfg
    # decode turns its radix cache off under PD: no HiCache there unless it offloads
    assert not [t for t in args(plan.decode) if "hicache" in t or "offload" in t]
    assert "kv_offload" in plan.prefill.features and "kv_offload" not in plan.decode.features


def test_decode_offload_writes_to_the_same_namespace():
    plan = plan_of(doc_with({**MOONCAKE, "decodeOffload": True}))
    assert plan.valid
    assert "--disaggregation-decode-enable-offload-kvcache" in args(plan.decode)
    assert "--enable-hierarchical-cache" not in args(plan.decode)
    assert store_config(plan, plan.decode) == store_config(plan, plan.prefill)
    assert "kv_offload" in plan.decode.features


def test_decode_offload_with_a_plugin_is_kv_offload_for_the_plugin_check():
    doc = load_example()
    doc["spec"]["kvCache"] = {"hicache": {**MOONCAKE, "decodeOffload": True}}
    plan = plan_of(doc)
    assert any("KV offload" in p.message and p.field == "spec.kernels.plugin" for p in plan.problems)


def test_tag_differs_between_kv_layouts_and_matches_across_replicas():
    v41 = plan_of(doc_with(MOONCAKE))
    v4 = copy.deepcopy(doc_with(MOONCAKE))
    v4["spec"]["kvLayout"] = {**v4["spec"]["kvLayout"], "attentionBackend": "flashmla", "layout": "v4"}
    v4p = plan_of(v4)
    assert v4p.valid and v4p.prefill.kv_layout_string != v41.prefill.kv_layout_string
    tag = lambda p: store_config(p, p.prefill)["extra_backend_tag"]  # noqa: E731
    assert tag(v41) != tag(v4p)
    scaled = doc_with(MOONCAKE)
    scaled["spec"]["prefill"]["replicas"] = 5
    assert tag(plan_of(scaled)) == tag(v41)
    # every pod of the role renders one config: the Deployment template is the only source
    objs = render_all(v41)
    cms = [o for o in objs if o["kind"] == "ConfigMap" and "-prefill-config-" in o["metadata"]["name"]]
    assert len(cms) == 1 and tag(v41) in cms[0]["data"]["config.yaml"]


def test_file_backend_is_a_directory_per_group_on_a_volume():
    plan = plan_of(doc_with({"storage": {"backend": "file", "file": {"claimName": "hicache"}}}))
    cfg = json.loads(value(plan.prefill, "--hicache-storage-backend-extra-config"))
    assert cfg == {"file_storage_path": f"/var/cache/sglang-hicache/sglpd-{plan.compat_key}"}
    dep = next(o for o in render_all(plan) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("prefill"))
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "hicache", "persistentVolumeClaim": {"claimName": "hicache"}} in pod["volumes"]
    assert {"name": "hicache", "mountPath": "/var/cache/sglang-hicache"} in pod["containers"][0]["volumeMounts"]
    assert render_mooncake_master(plan) == []


def test_host_memory_only_renders_no_storage_and_no_master():
    plan = plan_of(doc_with({"writePolicy": "write_back"}))
    assert value(plan.prefill, "--hicache-write-policy") == "write_back"
    assert "--hicache-storage-backend" not in args(plan.prefill)
    assert render_mooncake_master(plan) == []


def test_pods_advertise_their_ip_and_lend_the_segment_from_their_memory():
    base = plan_of(doc_with(None))
    plan = plan_of(doc_with(MOONCAKE))
    assert plan.prefill.memory.host_bytes - base.prefill.memory.host_bytes == 32 << 30
    assert plan.decode.memory.host_bytes == base.decode.memory.host_bytes
    dep = next(o for o in render_all(plan) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("prefill"))
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in env


def test_store_protocol_follows_the_transfer():
    plan = plan_of(doc_with(MOONCAKE, transfer={"backend": "mooncake", "forceTCP": True}))
    cfg = store_config(plan, plan.prefill)
    assert cfg["protocol"] == "tcp" and cfg["device_name"] == ""


def test_master_deployment_and_service():
    plan = plan_of(doc_with(MOONCAKE))
    owner = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment", "name": "dsv41-flash", "uid": "u"}
    svc, dep = render_mooncake_master(plan, owner=owner)
    assert svc["kind"] == "Service" and svc["metadata"]["name"] == "dsv41-flash-mooncake-master"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"rpc": 50051, "metrics": 9003}
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["mooncake_master"] and c["image"] == plan.spec.runtime.image
    assert "--rpc_port=50051" in c["args"] and "--metrics_port=9003" in c["args"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert "pd.sglang-operator.io/compat-key" not in dep["metadata"]["labels"]  # shared by every group
    assert master_args(plan.spec.kvCache.hicache.storage.mooncake)[0] == "--rpc_port=50051"


def test_prefill_complete_refuses_hicache_storage():
    doc = doc_with(MOONCAKE)
    doc["spec"]["model"]["name"] = "Qwen/Qwen3-30B-A3B"
    doc["spec"].pop("speculative"), doc["spec"].pop("engram")
    doc["spec"]["disaggregation"] = {"decodeAllocationPolicy": "prefill_complete"}
    plan = plan_of(doc)
    assert [p.field for p in plan.problems if p.rule == "hicache_allocation_policy"] == ["spec.kvCache.hicache"]


def test_hicache_flags_are_managed():
    doc = doc_with(MOONCAKE)
    doc["spec"]["prefill"]["extraArgs"] = ["--hicache-storage-backend", "file"]
    plan = plan_of(doc)
    assert any(p.rule == "extra_args_not_managed" for p in plan.problems)


# --------------------------------------------------------------------------- kvstore (no process)
HEALTH = '{"status":"ok","role":"leader","ha_state":"serving","service_ready":true}'
METRICS = """# TYPE master_key_count gauge
master_key_count 12
# TYPE master_allocated_bytes gauge
master_allocated_bytes 1073741824
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes 4294967296
# TYPE master_active_clients gauge
master_active_clients 2
# TYPE master_put_start_requests_total counter
master_put_start_requests_total 40
# TYPE master_put_start_failures_total counter
master_put_start_failures_total 1
"""


def fake_get(routes):
    def get(url, timeout):
        for suffix, answer in routes.items():
            if url.endswith(suffix):
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return 404, "404 Not Found"

    return get


def test_probe_reads_health_and_metrics_into_a_true_condition():
    h = M.probe_master("http://m:9003", get=fake_get({"/health": (200, HEALTH), "/metrics": (200, METRICS)}))
    assert h.ready and h.keys == 12 and h.metrics["master_put_start_failures_total"] == 1
    c = K.kvstore_condition(h)
    assert (c.type, c.status, c.reason) == ("KVStoreReady", "True", "MasterReady")
    assert "12 keys" in c.message and "2 clients" in c.message


def test_unreachable_and_not_ready_masters_are_false():
    down = M.probe_master("http://m:9003", get=fake_get({"/health": OSError("connection refused")}))
    c = K.kvstore_condition(down)
    assert (c.status, c.reason) == ("False", "MasterUnreachable") and "connection refused" in c.message
    standby = '{"status":"ok","role":"follower","service_ready":false}'
    nr = M.probe_master("http://m:9003", get=fake_get({"/health": (200, standby)}))
    assert (K.kvstore_condition(nr).status, K.kvstore_condition(nr).reason) == ("False", "MasterNotReady")


def test_observe_kvstore_needs_the_master_deployment():
    plan = plan_of(doc_with(MOONCAKE))

    class Kube:
        def __init__(self, dep):
            self.dep = dep

        def get(self, api_version, kind, name, namespace):
            assert (kind, name, namespace) == ("Deployment", "dsv41-flash-mooncake-master", "inference")
            return self.dep

    ok = fake_get({"/health": (200, HEALTH), "/metrics": (200, METRICS)})
    missing = K.observe_kvstore(kube=Kube(None), plan=plan, get=ok)
    assert not missing.ready and "does not exist" in missing.error
    unavailable = K.observe_kvstore(kube=Kube({"status": {}}), plan=plan, get=ok)
    assert K.kvstore_condition(unavailable).reason == "MasterUnavailable"
    ready = K.observe_kvstore(kube=Kube({"status": {"availableReplicas": 1}}), plan=plan, get=ok)
    assert ready.ready and ready.url == "http://dsv41-flash-mooncake-master.inference.svc:9003"
    assert [c.type for c in K.kvstore_conditions(plan=plan, health=ready)] == ["KVStoreReady"]
    no_store = plan_of(doc_with(None))
    assert K.observe_kvstore(kube=Kube(None), plan=no_store) is None
    assert K.kvstore_conditions(plan=no_store, health=None) == []


def test_collector_exports_master_and_transfer_figures():
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    col = M.KVStoreCollector()
    reg.register(col)
    h = M.probe_master("http://m:9003", get=fake_get({"/health": (200, HEALTH), "/metrics": (200, METRICS)}))
    t = M.TransferSummary(latency_seconds={"p90": 0.02}, speed_gb_s={"p50": 24.0, "p90": None},
                          transfers=3, transfer_failures=0, bootstrap_failures=0)  # fmt: skip
    col.publish("inference/dsv41-flash", h, t)
    text = generate_latest(reg).decode()
    assert 'sglang_pd_kvstore_up{deployment="dsv41-flash",namespace="inference"} 1.0' in text
    assert 'sglang_pd_kvstore_keys{deployment="dsv41-flash",namespace="inference"} 12.0' in text
    assert 'sglang_pd_kvstore_failures_total{deployment="dsv41-flash",namespace="inference",operation="put_start"} 1.0' in text
    assert 'sglang_pd_kv_transfer_speed_gb_s{deployment="dsv41-flash",namespace="inference",percentile="p50"} 24.0' in text
    col.remove("inference/dsv41-flash")
    assert "dsv41-flash" not in generate_latest(reg).decode()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_transfer_families_parse_sglang_exposition(role):
    text = (
        "# TYPE sglang:kv_transfer_speed_gb_s histogram\n"
        'sglang:kv_transfer_speed_gb_s_bucket{le="10.0",tp_rank="0"} 1.0\n'
        'sglang:kv_transfer_speed_gb_s_bucket{le="25.0",tp_rank="0"} 3.0\n'
        'sglang:kv_transfer_speed_gb_s_bucket{le="+Inf",tp_rank="0"} 3.0\n'
        'sglang:kv_transfer_speed_gb_s_count{tp_rank="0"} 3.0\n'
        'sglang:kv_transfer_speed_gb_s_sum{tp_rank="0"} 50.0\n'
        "# TYPE sglang:num_transfer_failed_reqs_total counter\n"
        'sglang:num_transfer_failed_reqs_total{tp_rank="0"} 2.0\n'
    )
    scrape = M.scrape_transfer(text, role)
    assert scrape.counters["sglang:num_transfer_failed_reqs_total"] == 2.0
    if role == "prefill":
        assert scrape.histograms["sglang:kv_transfer_speed_gb_s"].total == 3.0
