"""The SLO scraper against engine simulators over real HTTP on loopback (no cluster).

PDDeployment bodies and pods are plain dicts (what the API returns); the simulators
(tools/engine_simulator, each its own process) serve ``/metrics`` as SGLang does: from a
MultiProcessCollector, so ``?name[]=...`` answers with an empty page. Each simulator binds
its own loopback address, like a kwok pod IP. A plain prometheus_client target that does
honour ``name[]`` stands for other exporters.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
from sglang_pd_operator.metrics.scraper import (
    FILTER_IGNORED,
    FILTER_UNKNOWN,
    FILTER_WORKS,
    Scraper,
    TargetsMemo,
    deployment_targets,
    deployment_view,
    pod_view,
)

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from engine_simulator import LogNormal, SimConfig, start_process  # noqa: E402
from helpers import load_example  # noqa: E402

from sglang_pd_operator.api.load import parse_pddeployment  # noqa: E402
from sglang_pd_operator.catalog import builtin_catalog  # noqa: E402
from sglang_pd_operator.planning.plan import build_plan  # noqa: E402
from sglang_pd_operator.render import render_all  # noqa: E402
from sglang_pd_operator.runtime.cache import trim  # noqa: E402

pytestmark = pytest.mark.timeout(60)
LBL = "pd.sglang-operator.io"
KEY = "abc123def456"


def pdd(name: str = "d", *, slo: dict | None = None) -> dict:
    body = {"metadata": {"name": name, "namespace": "ns"}, "spec": {}, "status": {}}
    if slo:
        body["spec"]["slo"] = slo
    return body


def SERVING(namespace: str, name: str) -> str:
    """Every test deployment's user-facing Service selects KEY (the operator reads it from its cache)."""
    return KEY


def pod(name: str, role: str, ip: str, *, deployment: str = "d", key: str = KEY, ready: bool = True) -> dict:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}",
                     "labels": {f"{LBL}/deployment": deployment, f"{LBL}/role": role, f"{LBL}/compat-key": key}},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_targets_are_the_serving_groups_ready_pods():
    pods = [
        pod("p0", "prefill", "127.100.0.1"), pod("d0", "decode", "127.100.0.2"), pod("g0", "gateway", "127.100.0.3"),
        pod("d1", "decode", "127.100.0.4", ready=False),             # not ready
        pod("d2", "decode", "127.100.0.5", key="other"),             # another compat group
        pod("x0", "decode", "127.100.0.6", deployment="other"),      # another PDDeployment
    ]
    t = deployment_targets(pdd(slo={"ttft": {"p90": "1s"}}), pods, serving_key=KEY)
    assert t.key == "ns/d" and t.serving_key == KEY and t.slo_spec.ttft.p90 == "1s"
    assert [(p.role, p.name, p.url) for p in t.pods] == [
        ("decode", "d0", "http://127.100.0.2:30000/metrics"),
        ("gateway", "g0", "http://127.100.0.3:29000/metrics"),
        ("prefill", "p0", "http://127.100.0.1:30000/metrics"),
    ]
    assert t.ready == {"prefill": 1, "decode": 1, "gateway": 1}
    assert deployment_targets(pdd(), pods, serving_key=None).pods == ()  # no Service yet: nothing to scrape
    assert deployment_targets(pdd(slo={"window": "5 minutes"}), pods, serving_key=KEY).slo_spec is None  # invalid: no SLO


def _pods_of(objs: list[dict], serving_key: str) -> list[dict]:
    """A pod per rendered Deployment, as the API server and kubelet make it (template, node, status),
    then trimmed as the operator's cache stores it; one engine pod not Ready."""
    pods = []
    for i, dep in enumerate(o for o in objs if o["kind"] == "Deployment"):
        template = copy.deepcopy(dep["spec"]["template"])
        ready = i != 1
        containers = template["spec"]["containers"]
        pods.append(trim({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {**template["metadata"], "name": f"{dep['metadata']['name']}-7d9f-x{i}", "namespace": "ns",
                         "uid": f"uid-{i}", "resourceVersion": str(100 + i), "creationTimestamp": f"2026-12-0{i + 1}T00:00:00Z",
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}], "managedFields": [{"manager": "kubelet"}]},
            "spec": {**template["spec"], "nodeName": "node-a"},
            "status": {"phase": "Running", "podIP": f"10.1.0.{i + 2}", "hostIP": "10.0.0.1", "qosClass": "Guaranteed",
                       "conditions": [{"type": t, "status": "True" if ready or t == "PodScheduled" else "False"}
                                      for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
                       "containerStatuses": [{"name": c["name"], "ready": ready, "restartCount": 0, "image": c["image"],
                                              "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}
                                             for c in containers]},
        }))
    assert len(pods) >= 4 and {p["metadata"]["labels"].get(f"{LBL}/compat-key") for p in pods} >= {serving_key}
    return pods


def test_the_cache_projections_give_the_same_targets_as_the_whole_objects():
    """The SLO pass reads projections of the PDDeployments and pods (``deployment_view``, ``pod_view``, kept
    by the cache per object version): from the real renderer's objects, with an SLO, autoscaling and a
    Mooncake master, they give the targets the whole objects give."""
    doc = load_example()
    doc["spec"].pop("kernels", None)
    doc["spec"]["kvCache"] = {"hicache": {"storage": {"backend": "mooncake", "mooncake": {"master": {"metricsPort": 9100}}}}}
    doc["spec"]["autoscaling"] = {"decode": {"minReplicas": 1, "maxReplicas": 4}}
    doc["metadata"].update(namespace="ns", uid="u", resourceVersion="7", generation=3,
                           annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"})
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    objs = render_all(plan, owner={"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
                                   "name": doc["metadata"]["name"], "uid": "u"})
    body = {**doc, "status": {"observedGeneration": 3, "conditions": [{"type": "Ready", "status": "True"}]}}
    pods = _pods_of(objs, plan.compat_key)
    whole = deployment_targets(body, pods, serving_key=plan.compat_key)
    assert whole.slo_spec is not None and whole.load and whole.master.pod_ready and whole.master.url.endswith(":9100")
    assert whole.pods and sum(whole.ready.values()) == len(whole.pods) < len(pods)
    assert deployment_targets(deployment_view(body), [pod_view(p) for p in pods], serving_key=plan.compat_key) == whole
    assert deployment_targets(deployment_view(body), [pod_view(p) for p in pods], serving_key=None) == \
        deployment_targets(body, pods, serving_key=None)


def test_a_deployments_targets_are_computed_again_only_when_an_input_object_changed():
    memo = TargetsMemo()
    body, pods = pdd(slo={"ttft": {"p90": "1s"}}), [pod("p0", "prefill", "127.100.0.1"), pod("d0", "decode", "127.100.0.2")]
    first = memo.targets(body, pods, serving_key=KEY)
    assert memo.targets(body, list(pods), serving_key=KEY) is first            # the same objects: reused
    moved = [pods[0], pod("d0", "decode", "127.100.0.9")]                         # a pod's new version
    again = memo.targets(body, moved, serving_key=KEY)
    assert again is not first and again.pods[0].url == "http://127.100.0.9:30000/metrics"
    assert memo.targets(body, moved, serving_key="other").pods == ()             # the Service moved
    assert memo.targets(pdd(slo={"ttft": {"p90": "2s"}}), moved, serving_key=KEY).slo_spec.ttft.p90 == "2s"
    assert memo.targets(body, moved[:1], serving_key=KEY).ready["decode"] == 0  # a pod went
    memo.retain(set())
    assert memo.targets(body, moved[:1], serving_key=KEY) is not memo.targets(pdd(), moved[:1], serving_key=KEY)


def test_simulator_answers_name_filter_like_sglang():
    async def main():
        sim = await start_process(SimConfig(role="decode", host="127.0.0.1", port=0, model="m",
                                            ttft=LogNormal(0.01), itl=LogNormal(0.001)))
        try:
            async with aiohttp.ClientSession() as s:
                await (await s.post(sim.url + "/generate", json={"text": "x"})).read()
                full = await (await s.get(sim.url + "/metrics")).text()
                names = [("name[]", f"{ex.TTFT}_bucket"), ("name[]", ex.QUEUE_REQS)]
                resp = await s.get(sim.url + "/metrics", params=names)
                assert resp.status == 200 and resp.headers.get("Content-Encoding") == "gzip"  # aiohttp asked
                part = await resp.text()
        finally:
            await sim.close()
        assert part == "", "SGLang's MultiProcessCollector registry answers name[] with an empty page"
        samples = {s.name for f in text_string_to_metric_families(full) for s in f.samples}
        assert {f"{ex.TTFT}_bucket", ex.QUEUE_REQS} <= samples
    asyncio.run(main())


async def plain_target(host: str) -> tuple[web.AppRunner, int, list[bool]]:
    """An exporter on a plain CollectorRegistry, which honours ``name[]`` (restricted_registry).

    Returns its runner, port and, per GET, whether it carried ``name[]``."""
    registry = CollectorRegistry()
    failed = Counter(ex.TRANSFER_FAILED.removesuffix("_total"), "failed", ["tp_rank"], registry=registry)
    failed.labels(tp_rank="0").inc(2)
    Gauge("sglang:token_usage", "other", registry=registry).set(0.5)
    asked: list[bool] = []

    async def metrics(request: web.Request) -> web.Response:
        names = request.query.getall("name[]", [])
        asked.append(bool(names))
        body = generate_latest(registry.restricted_registry(names) if names else registry)
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], asked


def test_name_filter_only_where_it_provably_returns_the_series():
    """A pod is asked with name[]; an answer without any asked series (SGLang's empty page)
    is followed by a whole-page GET, and a pod proven to ignore the filter is asked unfiltered
    from then on; a pod whose filtered answer carries the series keeps being asked filtered.
    A new pod UID starts over."""
    async def main():
        decode = await start_process(SimConfig(role="decode", host="127.0.0.1", port=0, model="m"))
        runner, plain_port, asked = await plain_target("127.0.0.2")
        body = pdd(slo={"ttft": {"p90": "800ms"}, "window": "1m"})
        pods = [pod("p0", "prefill", "127.0.0.2"), pod("d0", "decode", "127.0.0.1")]
        scraper = Scraper(serving_key_of=SERVING, list_deployments=lambda: copy.deepcopy([body]), list_pods=lambda ns: copy.deepcopy(pods), interval=2.0, timeout=2.0,
                          ports={"prefill": plain_port, "decode": decode.config.port, "gateway": 1})
        try:
            async with aiohttp.ClientSession() as s:
                async def metrics_gets() -> int:
                    state = await (await s.get(decode.url + "/simulator/state")).json()
                    return state["requests"].get("GET /metrics", 0)

                targets = deployment_targets(body, pods, serving_key=KEY, ports=scraper.ports)
                d0 = next(p for p in targets.pods if p.name == "d0")
                p0 = next(p for p in targets.pods if p.name == "p0")
                assert scraper.filter_mode("ns/d", d0) == FILTER_UNKNOWN
                await scraper.scrape_once()
                first = await metrics_gets()
                await scraper.scrape_once()
                second = await metrics_gets() - first
                modes = scraper.filter_mode("ns/d", d0), scraper.filter_mode("ns/d", p0)
                pods[1]["metadata"]["uid"] = "uid-d0-restarted"          # same pod name, new pod
                d0_new = next(p for p in deployment_targets(body, pods, serving_key=KEY, ports=scraper.ports).pods if p.name == "d0")
                restarted = scraper.filter_mode("ns/d", d0_new)
                (h,) = await scraper.scrape_once()
        finally:
            await decode.close()
            await runner.cleanup()
        assert (first, second) == (2, 1), "filtered + whole page once, then the whole page only"
        assert modes == (FILTER_IGNORED, FILTER_WORKS)
        assert restarted == FILTER_UNKNOWN
        assert asked == [True, True, True], "the exporter that honours name[] is always asked filtered"
        assert h.reachable == {"prefill": 1, "decode": 1, "gateway": 0}
    asyncio.run(main())


def test_scrape_evaluate_publish_and_count_unreachable_pods():
    async def main():
        prefill = await start_process(SimConfig(role="prefill", host="127.0.0.1", port=0, bootstrap_port=-1, model="m"))
        port = prefill.config.port
        decode = await start_process(SimConfig(role="decode", host="127.0.0.2", port=port, model="m",
                                       ttft=LogNormal(0.15), itl=LogNormal(0.012)))
        body = pdd(slo={"ttft": {"p90": "800ms"}, "itl": {"p90": "10ms"}, "window": "1m"})
        pods = [pod("p0", "prefill", "127.0.0.1"), pod("d0", "decode", "127.0.0.2"),
                pod("d1", "decode", "127.0.0.3")]            # nothing listens on 127.0.0.3
        got, forgotten = [], []
        metrics = OperatorMetrics()
        deployments = [body]
        scraper = Scraper(serving_key_of=SERVING, list_deployments=lambda: copy.deepcopy(deployments), list_pods=lambda ns: copy.deepcopy(pods),
                          on_health=got.append, on_forget=forgotten.append, metrics=metrics, interval=2.0,
                          timeout=1.0, ports={"prefill": port, "decode": port, "gateway": 1})
        try:
            assert await scraper.scrape_once() == []          # first pass: baselines only
            async with aiohttp.ClientSession() as s:
                for _ in range(5):
                    r = await s.post(decode.url + "/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                        "stream": True})
                    await r.read()
            healths = await scraper.scrape_once()
        finally:
            await prefill.close()
            await decode.close()
        assert [h.key for h in healths] == ["ns/d"] and got == healths
        h = healths[0]
        assert h.ready == {"prefill": 1, "decode": 2, "gateway": 0}
        assert h.reachable == {"prefill": 1, "decode": 1, "gateway": 0}
        targets = {t.metric: t for t in h.slo.targets}
        assert targets["ttft"].measured == pytest.approx(0.1 + 0.1 * 0.5, abs=0.1)   # 150 ms in (0.1, 0.2]
        assert targets["ttft"].met is True and targets["itl"].met is False           # 12 ms > 10 ms
        assert h.slo.met is False and targets["itl"].observations == 15
        exported = generate_latest(metrics.registry).decode()
        assert 'sglang_pd_operator_slo_measured_seconds{deployment="d",namespace="ns",percentile="p90",' \
               'role="decode",target="ttft"}' in exported
        assert 'sglang_pd_operator_scrape_errors_total{role="decode"} 2.0' in exported   # d1, both passes
        # the deployment is deleted: its state, metrics and health go
        deployments.clear()
        assert await scraper.scrape_once() == []
        assert forgotten == ["ns/d"] and "ns/d" not in scraper.evaluator.deployments()
        assert "sglang_pd_operator_slo_measured_seconds{" not in generate_latest(metrics.registry).decode()
    asyncio.run(main())


def test_changing_the_spec_rebaselines_instead_of_counting_history():
    async def main():
        decode = await start_process(SimConfig(role="decode", host="127.0.0.1", port=0, model="m",
                                       ttft=LogNormal(0.01), itl=LogNormal(0.001)))
        port = decode.config.port
        body = pdd(slo={"ttft": {"p90": "800ms"}, "window": "1m"})
        pods = [pod("p0", "prefill", "127.0.0.9"), pod("d0", "decode", "127.0.0.1")]
        scraper = Scraper(serving_key_of=SERVING, list_deployments=lambda: copy.deepcopy([body]), list_pods=lambda ns: copy.deepcopy(pods), interval=2.0, timeout=1.0,
                          ports={"prefill": port, "decode": port, "gateway": 1})
        try:
            async with aiohttp.ClientSession() as s:
                body_ = {"text": "x", "sampling_params": {"max_new_tokens": 3}}
                for _ in range(4):       # history from before the operator looked: never counted
                    await (await s.post(decode.url + "/generate", json=body_)).read()
            await scraper.scrape_once()
            (h,) = await scraper.scrape_once()
            assert {t.metric for t in h.slo.targets} == {"ttft"} and h.slo.no_traffic
            body["spec"]["slo"]["e2e"] = {"p90": "1s"}      # a new family is asked from now on
            (h,) = await scraper.scrape_once()
        finally:
            await decode.close()
        e2e = next(t for t in h.slo.targets if t.metric == "e2e")
        assert e2e.observations == 0 and h.slo.no_traffic    # not the 4 old requests
        assert h.reachable["prefill"] == 0 and h.reachable["decode"] == 1
    asyncio.run(main())


def test_a_pod_that_answers_nothing_is_asked_again_after_1_2_4_then_8_passes(monkeypatch):
    """At rest a pod that refuses every connection (a wedged engine, a stand-in without /metrics) costs
    a connection every pass no more: it is asked again after 1, 2, 4, then at most SILENT_MAX_PASSES
    passes, counting as unreachable (and as a scrape error only when asked) meanwhile; an answer, or a
    new pod UID, brings it back to every pass at once."""
    from sglang_pd_operator.metrics.scraper import SILENT_MAX_PASSES

    asked: list[tuple[int, str]] = []
    alive = {"d0": False, "p0": True, "g0": True}
    pods = [pod("p0", "prefill", "127.0.0.1"), pod("d0", "decode", "127.0.0.2"), pod("g0", "gateway", "127.0.0.3")]

    gets: list[str] = []

    def name_of(url):
        return next(p["metadata"]["name"] for p in pods if p["status"]["podIP"] in url)

    async def fake_get(session, url, names):
        asked.append((scraper._pass_no, name_of(url)))
        gets.append(name_of(url))
        if not alive[name_of(url)]:
            return False, None  # refused
        return True, "# EOF\n"

    async def fake_knock(url):  # a TCP connect (tested against real sockets below)
        asked.append((scraper._pass_no, name_of(url)))
        return alive[name_of(url)]

    metrics = OperatorMetrics()
    scraper = Scraper(serving_key_of=SERVING, list_deployments=lambda: [pdd()], list_pods=lambda ns: copy.deepcopy(pods),
                      interval=2.0, metrics=metrics)
    monkeypatch.setattr(scraper, "_get", fake_get)
    monkeypatch.setattr(scraper, "_knock", fake_knock)

    async def passes(n):
        out = []
        for _ in range(n):
            out.append(await scraper.scrape_once())
        return out

    healths = asyncio.run(passes(24))
    d0 = [n for n, name in asked if name == "d0"]
    assert d0 == [1, 2, 4, 8, 16, 24] and SILENT_MAX_PASSES == 8
    assert gets.count("d0") == 1  # after its first silence it is knocked on (TCP), never asked over HTTP
    assert {n for n, name in asked if name == "p0"} == set(range(1, 25))  # answering pods: every pass
    assert all(h[0].reachable["decode"] == 0 for h in healths[1:])
    errors = sum(v for (n, _), v in _samples(metrics).items() if n == "sglang_pd_operator_scrape_errors_total")
    assert errors == len(d0)  # one error per attempt, none for a pass it was not asked in
    # it answers again: found at its next attempt, then asked every pass
    alive["d0"] = True
    healths = asyncio.run(passes(9))
    assert sorted({n for n, name in asked if name == "d0"})[-2:] == [32, 33]  # (filtered, then whole page)
    assert healths[-1][0].reachable["decode"] == 1
    # a restarted pod (new UID) is asked at once even while silenced
    alive["d0"] = False
    asyncio.run(passes(3))
    pods[1] = pod("d0", "decode", "127.0.0.2") | {"metadata": {**pods[1]["metadata"], "uid": "uid-d0-new"}}
    before = gets.count("d0")
    asyncio.run(passes(1))
    assert asked[-1][0] == 37 and [n for n, name in asked if name == "d0"][-1] == 37
    assert gets.count("d0") == before + 1  # over HTTP, no knock first


def test_a_knock_is_a_tcp_connect_that_tells_a_listening_port_from_a_closed_one():
    """The knock on a silent pod before an HTTP request (``Scraper._knock``), against real sockets."""
    async def main():
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
        closed.close()
        scraper = Scraper(serving_key_of=SERVING, list_deployments=list, list_pods=lambda ns: [], interval=2.0, timeout=1.0)
        try:
            return (await scraper._knock(f"http://127.0.0.1:{port}/metrics"),
                    await scraper._knock(f"http://127.0.0.1:{free}/metrics"))
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) == (True, False)


def _samples(metrics) -> dict:
    from prometheus_client import generate_latest

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()) for s in fam.samples}
