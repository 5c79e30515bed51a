"""The Prometheus SLO source (metrics/prometheus_source.py, metrics/promql.py) without a Prometheus server.

What a real Prometheus answers is checked end to end in tests/e2e/test_slo_prometheus.py
(a Prometheus 3.16 server scraping the simulators, compared with the scrape source). Here:
the rule and the operator's queries come from one builder; the number of queries per pass
does not grow with deployments or pods; and every way of not having figures (no answer,
a PromQL error, no series, old series) gives a Health with a problem, never an SLO result,
which the status turns into ``SLOMet`` Unknown with that reason.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import promql
from sglang_pd_operator.metrics.monitoring import prometheus_rule_spec
from sglang_pd_operator.metrics.prometheus_source import (
    NO_SERIES,
    STALE_SERIES,
    UNAVAILABLE,
    PrometheusSettings,
    PrometheusSource,
)
from sglang_pd_operator.planning.rollout import RolloutDecision
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.reconcilers.observe import Observed, ObservedGroup, WorkloadState

KEY = "abc123def456"
SLO = {"ttft": {"p90": "800ms"}, "itl": {"p90": "40ms", "p99": "100ms"}, "window": "1m"}


def body(name: str, namespace: str = "ns", slo: dict | None = SLO) -> dict:
    spec = {"slo": slo} if slo else {}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec,
            "status": {"rollout": {"servingKey": KEY, "groups": [
                {"key": KEY, "prefill": "1/1", "decode": "2/2", "gateway": "1/1"}]}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_rule_and_the_operator_use_the_same_expressions():
    spec = SLOSpec.model_validate(SLO)
    rules = prometheus_rule_spec(name="d", namespace="ns", slo_spec=spec)["groups"][0]["rules"]
    recorded = {r["record"]: r["expr"] for r in rules}
    one = promql.selector(namespace="ns", deployment="d")
    assert recorded["sglang_pd:ttft_seconds:p90"] == promql.target_quantile("ttft", 0.9, 60, one)
    assert recorded["sglang_pd:itl_seconds:p99"] == promql.target_quantile("itl", 0.99, 60, one)
    assert recorded["sglang_pd:kv_transfer_failures:increase1m"] == promql.kv_failures(60, one)
    assert recorded["sglang_pd:kv_transfer_latency_seconds:p90"] == promql.kv_latency(0.9, 60, one)
    # the operator's batched query is the same expression over every deployment
    source = PrometheusSource(list_deployments=lambda: [], prometheus=PrometheusSettings(url="http://127.0.0.1:1"))
    asked = source.queries([_dep(body("d"))])
    assert asked[(60.0, "quantile:ttft:0.9")] == promql.target_quantile("ttft", 0.9, 60, "")
    assert asked[(60.0, "quantile:ttft:0.9")] == recorded["sglang_pd:ttft_seconds:p90"].replace(
        'namespace="ns",deployment="d",', "")


def _dep(b: dict):
    from sglang_pd_operator.api.v1alpha1 import parse_duration
    from sglang_pd_operator.metrics import prometheus_source as P
    from sglang_pd_operator.metrics.scraper import slo_spec_of

    spec = slo_spec_of(b)
    return P._Deployment(namespace=b["metadata"]["namespace"], name=b["metadata"]["name"], serving_key=KEY,
                         slo_spec=spec, window_s=parse_duration((spec or SLOSpec()).window),
                         ready=P.serving_ready(b, KEY), body=b)


def test_queries_per_pass_grow_with_windows_and_targets_not_with_deployments():
    source = PrometheusSource(list_deployments=lambda: [], prometheus=PrometheusSettings(url="http://127.0.0.1:1"),
                              namespaces=["team-a", "team.b"])
    one = source.queries([_dep(body("d0"))])
    thousand = source.queries([_dep(body(f"d{i}")) for i in range(1000)])
    assert one == thousand and len(one) == 13  # 3 quantiles, 2 observations, 3 KV latency, failures,
    # transfers, requests + up and newest sample
    assert all('namespace=~"team-a|team\\\\.b"' in q for q in one.values())
    other_window = body("w", slo={**SLO, "window": "5m"})
    assert len(source.queries([_dep(body("d0")), _dep(other_window)])) == 2 * len(one) - 2


def _status(health, previous=None):
    key = KEY
    ws = {c: WorkloadState(name=c, desired=1, ready=1, updated=1, available=1, settled=True)
          for c in ("prefill", "decode", "gateway")}
    observed = Observed(groups={key: ObservedGroup(key=key, workloads=ws)}, serving_key=key, service_exists=True)
    decision = RolloutDecision(serving_key=key, apply_target=True, target_to_zero=False, delete_keys=(),
                               phase="Complete", phase_started=0.0, draining_key=None, drain_started=None,
                               message="ok")
    return S.valid_status(previous=previous or {}, generation=1, problems=[], observed=observed, decision=decision,
                          target_key=key, kv_layouts={}, attention_backends={}, endpoint="http://x", now=2000.0,
                          health=health, slo_enabled=True)


def _cond(st, type_):
    return next(c for c in st["conditions"] if c["type"] == type_)


def test_unreachable_prometheus_gives_unknown_never_a_figure():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    source = PrometheusSource(list_deployments=lambda: [body("a"), body("b", slo=None)],
                              prometheus=PrometheusSettings(url=url), interval=2)
    healths = asyncio.run(source.query_once())
    assert [h.problem[0] for h in healths] == [UNAVAILABLE, UNAVAILABLE]
    assert all(h.slo is None and h.source == "prometheus" and url in h.problem[1] for h in healths)
    # a previous True with figures: the new status says Unknown with the reason and drops the figures
    before = {"slo": {"met": True}, "conditions": [{"type": "SLOMet", "status": "True", "reason": "TargetsMet"}],
              "scrape": {"source": "prometheus", "prefill": "1/1"}}
    st = _status(healths[0], before)
    assert _cond(st, "SLOMet")["status"] == "Unknown" and _cond(st, "SLOMet")["reason"] == UNAVAILABLE
    assert st["slo"] is None and st["scrape"]["problem"] == UNAVAILABLE and "prefill" not in st["scrape"]
    assert _cond(st, "Degraded")["status"] == "False"


class FakeAnswers:
    """Canned answers of Prometheus' query API (the real one is exercised by the e2e)."""

    def __init__(self, *, up: list[dict], newest: float | None, error: str | None = None) -> None:
        self.up, self.newest, self.error, self.asked = up, newest, error, []

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        q, at = form["query"], float(form["time"])
        self.asked.append(q)
        if self.error:
            return web.json_response({"status": "error", "errorType": "bad_data", "error": self.error}, status=400)
        result: list[dict] = []
        if q.startswith("sum by (namespace, deployment, compat_key, role) (up"):
            result = [{"metric": m, "value": [at, "1"]} for m in self.up]
        elif q.startswith("max by (namespace, deployment) (timestamp(up") and self.newest is not None:
            result = [{"metric": {"namespace": "ns", "deployment": "a"}, "value": [at, str(at - self.newest)]}]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})


def _run_against(answers: FakeAnswers, bodies: list[dict]):
    async def go():
        app = web.Application()
        app.router.add_post("/prom/api/v1/query", answers.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        try:
            source = PrometheusSource(list_deployments=lambda: bodies, interval=15,
                                      prometheus=PrometheusSettings(url=f"http://127.0.0.1:{port}/prom"))
            return await source.query_once()
        finally:
            await runner.cleanup()

    return asyncio.run(go())


UP = [{"namespace": "ns", "deployment": "a", "compat_key": KEY, "role": r} for r in ("prefill", "decode", "gateway")]


def test_no_series_of_the_serving_group_and_old_series_are_unknown():
    old_group = [{**m, "compat_key": "0ldk3y"} for m in UP]
    (h,) = _run_against(FakeAnswers(up=old_group, newest=1.0), [body("a")])
    assert h.problem[0] == NO_SERIES and h.slo is None and "PodMonitor" in h.problem[1]
    (h,) = _run_against(FakeAnswers(up=UP, newest=600.0), [body("a")])  # newest sample 10 minutes old
    assert h.problem[0] == STALE_SERIES and h.slo is None and "10m" in h.problem[1]
    (h,) = _run_against(FakeAnswers(up=UP, newest=1.0), [body("a")])    # fresh, but no request yet
    assert h.problem is None and h.reachable == {"prefill": 1, "decode": 1, "gateway": 1}
    assert h.ready == {"prefill": 1, "decode": 2, "gateway": 1}
    assert h.slo.met is None and h.slo.no_traffic and S.slo_condition(h.slo)["reason"] == "NoTraffic"


def test_a_promql_error_names_itself():
    answers = FakeAnswers(up=UP, newest=1.0, error="parse error: unexpected end of input")
    (h,) = _run_against(answers, [body("a")])
    assert h.problem[0] == UNAVAILABLE and "parse error" in h.problem[1] and "HTTP 400" in h.problem[1]


def test_bearer_token_is_read_from_its_file_each_time(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    settings = PrometheusSettings(url="https://p:9090", bearer_token_file=str(token))
    assert settings.headers() == {"Authorization": "Bearer first"}
    token.write_text("rotated")
    assert settings.headers() == {"Authorization": "Bearer rotated"}
    assert PrometheusSettings(url="https://p", insecure_skip_verify=True).ssl_context() is False
    for bad in ({"url": "p:9090"}, {"url": "http://p", "key_file": "k"}):
        try:
            PrometheusSettings(**bad)
        except ValueError as e:
            assert "Prometheus" in str(e)
        else:
            raise AssertionError(bad)


def test_the_mooncake_master_is_still_probed_with_the_pods_it_is_given():
    port = free_port()  # nothing listens: the probe finds the master unreachable and says so
    b = body("a")
    b["spec"]["kvCache"] = {"hicache": {"storage": {"backend": "mooncake"}}}
    master = {"metadata": {"name": "a-mooncake-master-0", "namespace": "ns",
                           "labels": {"pd.sglang-operator.io/deployment": "a",
                                      "pd.sglang-operator.io/role": "mooncake-master"}},
              "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": port}]}]},
              "status": {"phase": "Running", "podIP": "127.0.0.1",
                         "conditions": [{"type": "Ready", "status": "True"}]}}
    asked: list[str] = []

    async def go():
        app = web.Application()
        answers = FakeAnswers(up=UP, newest=1.0)
        app.router.add_post("/api/v1/query", answers.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        prom_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", prom_port).start()
        try:
            source = PrometheusSource(list_deployments=lambda: [b, body("plain")], interval=15,
                                      prometheus=PrometheusSettings(url=f"http://127.0.0.1:{prom_port}"),
                                      list_pods=lambda ns: asked.append(ns) or [master])
            return await source.query_once()
        finally:
            await runner.cleanup()

    with_mooncake, plain = asyncio.run(go())
    assert asked == ["ns"]  # one list for the namespace of the deployment that uses Mooncake
    assert with_mooncake.kvstore is not None and with_mooncake.kvstore.reachable is False
    assert with_mooncake.kvstore.url == f"http://127.0.0.1:{port}"
    assert plain.kvstore is None


# --------------------------------------------------------------------------- the planner's load gauges
def test_the_planners_load_gauges_come_from_the_rules_expressions_only_with_autoscaling():
    spec = SLOSpec.model_validate(SLO)
    one = promql.selector(namespace="ns", deployment="d")
    plain = {r["record"] for r in prometheus_rule_spec(name="d", namespace="ns", slo_spec=spec)["groups"][0]["rules"]}
    assert not any(r.startswith("sglang_pd:role_") for r in plain)
    rules = prometheus_rule_spec(name="d", namespace="ns", slo_spec=spec, load=True)["groups"][0]["rules"]
    recorded = {r["record"]: r["expr"] for r in rules}
    assert recorded["sglang_pd:role_num_queue_reqs"] == promql.role_load("sglang:num_queue_reqs", one)
    assert recorded["sglang_pd:role_token_usage"].startswith("avg by (namespace, deployment, compat_key, role)")
    assert 'priority=""' in recorded["sglang_pd:role_num_decode_prealloc_queue_reqs"]
    assert "max without (pp_rank, tp_rank, moe_ep_rank)" in recorded["sglang_pd:role_num_running_reqs"]
    source = PrometheusSource(list_deployments=lambda: [], prometheus=PrometheusSettings(url="http://127.0.0.1:1"))
    without = source.queries([_dep(body("d"))])
    auto = body("d")
    auto["spec"]["autoscaling"] = {"decode": {"maxReplicas": 3}}
    from sglang_pd_operator.metrics import prometheus_source as P

    asked = source.queries([P._Deployment(**{**_dep(auto).__dict__, "load": True})])
    assert len(asked) == len(without) + len(promql.LOAD_GAUGES)   # once per pass, whatever the deployments
    assert asked[(None, "load:sglang:num_queue_reqs")] == recorded["sglang_pd:role_num_queue_reqs"].replace(
        'namespace="ns",deployment="d",', "")


class LoadAnswers(FakeAnswers):
    """Prometheus answers with the load gauges of the serving group (and of an older group, ignored)."""

    VALUES = {"sglang:num_queue_reqs": {"prefill": 6, "decode": 0}, "sglang:num_running_reqs": {"prefill": 1, "decode": 9},
              "sglang:num_decode_transfer_queue_reqs": {"decode": 4}, "sglang:token_usage": {"decode": 0.25}}

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        q, at = form["query"], float(form["time"])
        for gauge, per_role in self.VALUES.items():
            if q.startswith(("sum by", "avg by")) and f"({gauge}{{" in q:
                result = [{"metric": {"namespace": "ns", "deployment": "a", "compat_key": k, "role": r},
                           "value": [at, str(v * (1 if k == KEY else 100))]}
                          for r, v in per_role.items() for k in (KEY, "0ldk3y")]
                return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})
        return await super().handle(request)


def test_load_gauges_reach_the_planner_like_the_scrapers():
    from sglang_pd_operator.reconcilers.scaling import signals_from_health

    auto = body("a")
    auto["spec"]["autoscaling"] = {"prefill": {"maxReplicas": 3}}
    (h,) = _run_against(LoadAnswers(up=UP, newest=1.0), [auto])
    assert h.problem is None
    assert h.slo.roles["prefill"].queues == {"num_queue_reqs": 6.0, "num_running_reqs": 1.0}
    assert h.slo.roles["decode"].token_usage == 0.25 and h.slo.roles["decode"].pods == 1
    s = signals_from_health(h)
    assert s.role("prefill").waiting == 6.0 and s.role("decode").transfer == 4.0 and s.role("decode").running == 9.0
    (plain,) = _run_against(LoadAnswers(up=UP, newest=1.0), [body("a")])
    assert plain.slo.roles == {}   # not asked without spec.autoscaling
