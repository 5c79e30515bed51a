"""The Mooncake master in the running operator: applied with the shared objects, probed by the scraper.

No cluster: PDDeployment bodies and pods are plain dicts (what the API returns); the
master is a small aiohttp app answering ``/health`` and ``/metrics`` as mooncake_master
0.3.13.post1 does, bound to a loopback address like a kwok pod IP. The real binary is
exercised in tests/e2e/test_mooncake_master.py and tests/e2e/test_kvstore_operator.py.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from prometheus_client import generate_latest
from helpers import load_example

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.metrics.scraper import Scraper, master_target
from sglang_pd_operator.reconcilers import kvstore as K
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.reconcilers.runtime import HealthChange, Runtime
from sglang_pd_operator.render import render_shared

pytestmark = pytest.mark.timeout(60)
LBL = "pd.sglang-operator.io"
KEY = "abc123def456"
MOONCAKE = {"storage": {"backend": "mooncake"}}
HEALTH = '{"status":"ok","role":"leader","ha_state":"serving","service_ready":true}'
METRICS = """# TYPE master_key_count gauge
master_key_count 12
# TYPE master_total_capacity_bytes gauge
master_total_capacity_bytes 4294967296
# TYPE master_put_start_requests_total counter
master_put_start_requests_total 40
"""


def doc_with(hicache: dict | None) -> dict:
    doc = load_example()
    doc["spec"].pop("kernels", None)
    if hicache is not None:
        doc["spec"]["kvCache"] = {"hicache": hicache}
    return doc


def plan_of(doc: dict):
    return build_plan(parse_pddeployment(doc), builtin_catalog())


def pdd(*, mooncake: dict | None = None, name: str = "d") -> dict:
    spec = {"kvCache": {"hicache": {"storage": {"backend": "mooncake", **({"mooncake": mooncake} if mooncake else {})}}}}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def master_pod(ip: str | None, port: int = 9003, *, ready: bool = True, name: str = "d-mooncake-master-x",
               created: str = "2026-01-01T00:00:00Z") -> dict:
    status = {"phase": "Running" if ip else "Pending",
              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created,
                     "labels": {f"{LBL}/deployment": "d", f"{LBL}/role": "mooncake-master"}},
        "spec": {"containers": [{"name": "mooncake-master", "ports": [
            {"name": "rpc", "containerPort": 50051}, {"name": "metrics", "containerPort": port}]}]},
        "status": status,
    }


# --------------------------------------------------------------------------- render


def test_render_shared_includes_the_master_only_with_mooncake_storage():
    owner = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment", "name": "dsv41-flash",
             "uid": "u"}
    with_store = plan_of(doc_with(MOONCAKE))
    objs = render_shared(with_store, serving_key=with_store.compat_key, owner=owner)
    master = [(o["kind"], o["metadata"]["name"]) for o in objs if "mooncake" in o["metadata"]["name"]]
    assert master == [("Service", "dsv41-flash-mooncake-master"), ("Deployment", "dsv41-flash-mooncake-master")]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert f"{LBL}/compat-key" not in dep["metadata"]["labels"]   # shared by every group, never pruned with one
    without = plan_of(doc_with(None))
    assert not [o for o in render_shared(without, serving_key=without.compat_key) if "mooncake" in o["metadata"]["name"]]


# --------------------------------------------------------------------------- the master pod


def test_master_target_is_found_among_the_listed_pods():
    assert master_target({"metadata": {"name": "d"}, "spec": {}}, [master_pod("10.0.0.9")]) is None
    none = master_target(pdd(), [])
    assert none.url is None and not none.exists and "d-mooncake-master has no pod" in none.problem
    h = none.health_without_probe("http://d-mooncake-master.ns.svc:9003")
    assert K.kvstore_condition(h).reason == "MasterNotFound" and "has no pod" in K.kvstore_condition(h).message
    pending = master_target(pdd(), [master_pod(None)])
    assert pending.url is None and pending.exists and "Pending without an IP" in pending.problem
    assert K.kvstore_condition(pending.health_without_probe("u")).reason == "MasterUnavailable"
    # the port comes from the pod's "metrics" container port; a Ready pod wins over a newer one that is not
    t = master_target(pdd(mooncake={"master": {"metricsPort": 9100}}), [
        master_pod("10.0.0.8", 9100, name="old"), master_pod("10.0.0.9", 9100, ready=False, name="new",
                                                             created="2026-02-01T00:00:00Z")])
    assert (t.url, t.pod, t.pod_ready, t.problem) == ("http://10.0.0.8:9100", "old", True, None)
    other = master_pod("10.0.0.7")
    other["metadata"]["labels"][f"{LBL}/deployment"] = "e"             # another PDDeployment's master
    assert master_target(pdd(), [other]).url is None


# --------------------------------------------------------------------------- the scraper probes it


class FakeMaster:
    """``/health`` + ``/metrics`` of a serving mooncake_master on ``host``; ``stop()`` is a kill."""

    def __init__(self, host: str) -> None:
        self.host, self.port, self.runner = host, 0, None

    async def start(self, port: int = 0) -> "FakeMaster":
        async def health(_):
            return web.Response(text=HEALTH, content_type="application/json")

        async def metrics(_):
            return web.Response(text=METRICS)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, port or self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        await self.runner.cleanup()


def test_scraper_probes_the_master_pod_and_exports_its_figures():
    async def main():
        master = await FakeMaster("127.0.0.1").start()
        pods = [master_pod("127.0.0.1", master.port)]
        metrics = OperatorMetrics()
        got = []
        scraper = Scraper(list_deployments=lambda: [pdd()], serving_key_of=lambda ns, name: KEY, list_pods=lambda ns: list(pods), on_health=got.append,
                          metrics=metrics, interval=2.0, timeout=1.0)
        runtime = Runtime(kube=None)
        try:
            assert await scraper.scrape_once() == []       # first pass: baselines (the master is exported already)
            assert 'sglang_pd_kvstore_up{deployment="d",namespace="ns"} 1.0' in generate_latest(
                metrics.registry).decode()
            [h] = await scraper.scrape_once()
            assert h.kvstore.ready and h.kvstore.deployment_ready and h.kvstore.url == f"http://127.0.0.1:{master.port}"
            c = K.kvstore_condition(h.kvstore)
            assert (c.status, c.reason) == ("True", "MasterReady") and "12 keys" in c.message
            assert runtime.set_health(h) is HealthChange.CONDITIONS
            text = generate_latest(metrics.registry).decode()
            assert 'sglang_pd_kvstore_keys{deployment="d",namespace="ns"} 12.0' in text
            assert 'sglang_pd_kvstore_requests_total{deployment="d",namespace="ns",operation="put_start"} 40.0' in text
            assert runtime.set_health((await scraper.scrape_once())[0]) is HealthChange.NONE  # unchanged: no reconcile

            await master.stop()                              # killed
            [down] = await scraper.scrape_once()
            c = K.kvstore_condition(down.kvstore)
            assert (c.status, c.reason) == ("False", "MasterUnreachable") and "unreachable (" in c.message
            assert runtime.set_health(down) is HealthChange.CONDITIONS
            assert 'sglang_pd_kvstore_up{deployment="d",namespace="ns"} 0.0' in generate_latest(
                metrics.registry).decode()

            await master.start(master.port)                  # restarted on the same port
            pods[0] = master_pod("127.0.0.1", master.port, ready=False)
            [h] = await scraper.scrape_once()
            assert not h.kvstore.ready and K.kvstore_condition(h.kvstore).reason == "MasterUnavailable"
            assert "is not Ready" in K.kvstore_condition(h.kvstore).message
            pods[0] = master_pod("127.0.0.1", master.port)
            [h] = await scraper.scrape_once()
            assert K.kvstore_condition(h.kvstore).status == "True"
            pods.clear()                                     # the Deployment's pod is gone
            [h] = await scraper.scrape_once()
            assert K.kvstore_condition(h.kvstore).reason == "MasterNotFound"
        finally:
            await master.stop()
    asyncio.run(main())


def test_prefill_pods_are_asked_for_the_transfer_speed():
    scraper = Scraper(list_deployments=list, serving_key_of=lambda ns, name: KEY, list_pods=lambda ns: [], interval=2.0)
    assert "sglang:kv_transfer_speed_gb_s_bucket" in scraper.sample_names("prefill", None)
    assert "sglang:kv_transfer_speed_gb_s_bucket" not in scraper.sample_names("decode", None)


# --------------------------------------------------------------------------- status and events


def test_conditions_without_a_probe_keep_the_previous_or_say_not_probed():
    plan = plan_of(doc_with(MOONCAKE))
    [c] = K.kvstore_conditions(plan=plan, health=None, previous={})
    assert (c.status, c.reason) == ("False", "MasterNotProbed") and "dsv41-flash-mooncake-master" in c.message
    prev = {"conditions": [{"type": "KVStoreReady", "status": "True", "reason": "MasterReady", "message": "m"}]}
    assert K.kvstore_conditions(plan=plan, health=None, previous=prev) == [
        S.Cond("KVStoreReady", "True", "MasterReady", "m")]
    assert K.kvstore_conditions(plan=plan, health=None) == []            # the old call: nothing without health
    assert K.kvstore_conditions(plan=plan_of(doc_with(None)), health=None, previous=prev) == []


def test_events_on_transitions_only():
    def st(status: str | None, reason: str = "MasterReady") -> dict:
        return {"conditions": [] if status is None else [
            {"type": "KVStoreReady", "status": status, "reason": reason, "message": "Mooncake master at u: x"}]}

    assert K.kvstore_events(st(None), st("False", "MasterNotProbed")) == []    # first report
    assert K.kvstore_events(st("False", "MasterNotProbed"), st("False", "MasterNotFound")) == []
    assert K.kvstore_events(st("True"), st("True")) == []
    [(t, r, m)] = K.kvstore_events(st("True"), st("False", "MasterUnreachable"))
    assert (t, r) == ("Warning", "KVStoreNotReady") and m.startswith("MasterUnreachable: Mooncake master at u")
    assert [e[:2] for e in K.kvstore_events(st("False", "MasterUnreachable"), st("True"))] == [
        ("Normal", "KVStoreReady")]


def test_a_master_the_spec_no_longer_asks_for_is_deleted():
    class Kube:
        def __init__(self):
            self.deleted = []

        def delete(self, api_version, kind, name, namespace):
            self.deleted.append((kind, name, namespace))
            return True

    kube = Kube()
    with_store, without = plan_of(doc_with(MOONCAKE)), plan_of(doc_with(None))
    assert not K.prune_master(kube, with_store, ["dsv41-flash-mooncake-master"])
    assert not K.prune_master(kube, without, [])
    assert K.prune_master(kube, without, ["dsv41-flash-mooncake-master"])
    assert kube.deleted == [("Deployment", "dsv41-flash-mooncake-master", "inference"),
                            ("Service", "dsv41-flash-mooncake-master", "inference")]
