"""The Prometheus SLO source (metrics/prometheus_source.py, metrics/promql.py) without a Prometheus server.

What a real Prometheus answers is checked end to end in tests/e2e/test_slo_prometheus.py
(a Prometheus 3.16 server scraping the simulators, compared with the scrape source). Here:
the rule and the operator's queries come from one builder; the number of queries per pass
does not grow with deployments or pods; and every way of not having figures (no answer,
a PromQL error, no series, old series, requests without recorded figures) gives a Health
with a problem, never an SLO result, which the status turns into ``SLOMet`` Unknown with
that reason. The SLO figures are the PrometheusRule's records (nothing recounted in
memory); the serving group and its ready pods come from the operator's cache (here: the
callables handed in), never from status.
"""

from __future__ import annotations

import asyncio
import math
import re
import socket

from aiohttp import web

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import promql
from sglang_pd_operator.metrics.monitoring import prometheus_rule_spec
from sglang_pd_operator.metrics.prometheus_source import (
    NO_RECORDS,
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
    # a status that lies (another group, other counts): neither source may read it
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec,
            "status": {"rollout": {"servingKey": "0ldk3y", "groups": [
                {"key": "0ldk3y", "prefill": "7/7", "decode": "7/7", "gateway": "7/7"}]}}}


def pod(name: str, role: str, *, key: str = KEY, ready: bool = True, deployment: str = "a") -> dict:
    return {"metadata": {"name": name, "labels": {"pd.sglang-operator.io/deployment": deployment,
                                                  "pd.sglang-operator.io/role": role,
                                                  "pd.sglang-operator.io/compat-key": key}},
            "status": {"phase": "Running", "podIP": "127.0.0.9",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


#: the operator's cached pods of namespace ns: deployment a's serving group has 1 prefill, 2 decode and
#: 1 gateway pod ready (a third decode is not), an older group still has a pod
PODS = [pod("p0", "prefill"), pod("d0", "decode"), pod("d1", "decode"), pod("d2", "decode", ready=False),
        pod("g0", "gateway"), pod("old-d0", "decode", key="0ldk3y")]


def make_source(**kw) -> PrometheusSource:
    """A source whose deployments all serve KEY (their Service's selector, in the cache) with PODS."""
    kw.setdefault("list_deployments", lambda: [])
    kw.setdefault("prometheus", PrometheusSettings(url="http://127.0.0.1:1"))
    return PrometheusSource(serving_key_of=lambda ns, name: KEY, list_pods=kw.pop("list_pods", lambda ns: PODS), **kw)


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
    # the operator reads the SLO figures the rule records, in one query: every percentile, the
    # attainment and the burn rates match its name pattern, and nothing else it records
    source = make_source()
    asked = source.queries([_dep(body("d"))])
    assert not any(name.startswith("quantile:") for _, name in asked)  # no percentile of its own
    pattern = re.search(r'__name__=~"([^"]+)"', asked[(None, "recorded")]).group(1)
    slo_records = {r for r in recorded if r.startswith(("sglang_pd:ttft", "sglang_pd:itl", "sglang_pd:slo_attainment",
                                                        "sglang_pd:slo_error_budget_burn_rate"))}
    assert {r for r in recorded if re.fullmatch(pattern, r)} == slo_records
    assert len(slo_records) == 3 + 1 + 4  # 3 targets, attainment, 4 burn windows
    # what it still asks itself (nothing records it for a deployment without spec.slo) is the rule's text
    assert asked[(60.0, "kv_failures")] == recorded["sglang_pd:kv_transfer_failures:increase1m"].replace(
        'namespace="ns",deployment="d"', "")


def _dep(b: dict):
    return make_source(list_deployments=lambda: [b]).deployments()[0]


def test_queries_per_pass_grow_with_windows_and_targets_not_with_deployments():
    source = make_source(namespaces=["team-a", "team.b"])
    one = source.queries([_dep(body("d0"))])
    thousand = source.queries([_dep(body(f"d{i}")) for i in range(1000)])
    assert one == thousand and len(one) == 11  # 2 observations, 3 KV latency, failures, transfers,
    # requests + the recorded figures, up and newest sample
    assert all('namespace=~"team-a|team\\\\.b"' in q for q in one.values())
    other_window = body("w", slo={**SLO, "window": "5m"})
    assert len(source.queries([_dep(body("d0")), _dep(other_window)])) == 2 * len(one) - 3


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
    source = make_source(list_deployments=lambda: [body("a"), body("b", slo=None)],
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

    def __init__(self, *, up: list[dict], newest: float | None, error: str | None = None,
                 records: dict[str, float] | None = None, observations: float = 0.0) -> None:
        self.up, self.newest, self.error, self.asked = up, newest, error, []
        self.records, self.observations = records or {}, observations

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
        elif q.startswith('{__name__=~"'):
            pattern = re.search(r'__name__=~"([^"]+)"', q).group(1)
            result = [{"metric": {"__name__": n, "namespace": "ns", "deployment": "a"}, "value": [at, str(v)]}
                      for n, v in self.records.items() if re.fullmatch(pattern, n)]
        elif q.startswith("sum by (namespace, deployment) (increase(sglang:") and "_count{" in q and self.observations:
            result = [{"metric": {"namespace": "ns", "deployment": "a"}, "value": [at, str(self.observations)]}]
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
            source = make_source(list_deployments=lambda: bodies, interval=15,
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
    assert h.ready == {"prefill": 1, "decode": 2, "gateway": 1}  # the cache's ready pods, not status' 7/7
    assert h.serving_key == KEY  # the Service's key, not status' 0ldk3y
    assert h.slo.met is None and h.slo.no_traffic and S.slo_condition(h.slo)["reason"] == "NoTraffic"


RECORDS = {"sglang_pd:ttft_seconds:p90": 0.5, "sglang_pd:itl_seconds:p90": 0.05, "sglang_pd:itl_seconds:p99": math.nan,
           "sglang_pd:slo_attainment_ratio": 0.75, "sglang_pd:slo_error_budget_burn_rate:1m": 25.0,
           "sglang_pd:slo_error_budget_burn_rate:12m": 2.5, "sglang_pd:slo_error_budget_burn_rate:6m": 1.5,
           "sglang_pd:slo_error_budget_burn_rate:72m": 0.5}


def test_the_slo_figures_are_the_rules_records():
    """Percentiles, attainment and every burn rate are what Prometheus recorded (a NaN percentile: no
    figure); the verdicts follow from them; nothing is recounted in memory."""
    (h,) = _run_against(FakeAnswers(up=UP, newest=1.0, records=RECORDS, observations=40), [body("a")])
    assert h.problem is None and not h.slo.no_traffic
    got = {(t.metric, t.percentile): (t.measured, t.met) for t in h.slo.targets}
    assert got == {("ttft", "p90"): (0.5, True), ("itl", "p90"): (0.05, False), ("itl", "p99"): (None, None)}
    assert h.slo.met is False and S.slo_condition(h.slo)["reason"] == "TargetMissed"
    assert h.slo.attainment == 0.75
    assert {b.window.name: b.value for b in h.slo.burn_rates} == {
        "page_short": 25.0, "page_long": 2.5, "ticket_short": 1.5, "ticket_long": 0.5}
    # the same answers twice give the same figures: no per-interval memory of its own
    (again,) = _run_against(FakeAnswers(up=UP, newest=1.0, records=RECORDS, observations=40), [body("a")])
    assert again.slo.attainment == h.slo.attainment and again.slo.burn_rates == h.slo.burn_rates


def test_requests_without_recorded_figures_are_unknown_and_say_why():
    (h,) = _run_against(FakeAnswers(up=UP, newest=1.0, records={}, observations=40), [body("a")])
    assert h.problem[0] == NO_RECORDS and h.slo is None
    assert "sglang_pd:ttft_seconds:p90" in h.problem[1] and "ruleSelector" in h.problem[1]
    st = _status(h)
    assert (_cond(st, "SLOMet")["status"], _cond(st, "SLOMet")["reason"]) == ("Unknown", NO_RECORDS)


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
            source = make_source(list_deployments=lambda: [b, body("plain")], interval=15,
                                 prometheus=PrometheusSettings(url=f"http://127.0.0.1:{prom_port}"),
                                 list_pods=lambda ns: asked.append(ns) or [master])
            return await source.query_once()
        finally:
            await runner.cleanup()

    with_mooncake, plain = asyncio.run(go())
    assert asked == ["ns"]  # one list of the namespace's pods (the cache), the master found among them
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
    source = make_source()
    without = source.queries([_dep(body("d"))])
    auto = body("d")
    auto["spec"]["autoscaling"] = {"decode": {"maxReplicas": 3}}
    asked = source.queries([_dep(auto)])
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
