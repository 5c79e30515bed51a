"""SLOEvaluator: attainment, burn rates, Unknown on no traffic, speed, KV transfer, exports."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.monitoring import render_monitoring
from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
from sglang_pd_operator.metrics.slo import SLOEvaluator, burn_windows, format_duration, slo_condition

KEY = "team-a/dsv41"


class Pod:
    """Decode or prefill metrics in SGLang 0.5.23's names (buckets from exposition.SGLANG_BUCKETS)."""

    def __init__(self, role: str = "decode") -> None:
        self.r = CollectorRegistry()
        tok = ["model_name", "engine_type"]
        self.labels = {"model_name": "m", "engine_type": role}
        b = ex.SGLANG_BUCKETS
        self.ttft = Histogram(ex.TTFT, "", tok + ["is_streaming"], buckets=b[ex.TTFT], registry=self.r)
        self.tpot = Histogram(ex.TPOT, "", tok + ["is_streaming"], buckets=b[ex.TPOT], registry=self.r)
        self.kv = Histogram(ex.KV_TRANSFER_LATENCY_MS, "", tok, buckets=b[ex.KV_TRANSFER_LATENCY_MS],
                            registry=self.r)
        self.requests = Counter(ex.REQUESTS, "", tok + ["is_streaming"], registry=self.r)
        self.transfer_failed = Counter(ex.TRANSFER_FAILED, "", tok, registry=self.r)
        self.bootstrap_failed = Counter(ex.BOOTSTRAP_FAILED, "", tok, registry=self.r)

    def requests_done(self, n: int, *, ttft: float, tpot: float = 0.02) -> None:
        for _ in range(n):
            self.ttft.labels(**self.labels, is_streaming="true").observe(ttft)
            self.tpot.labels(**self.labels, is_streaming="true").observe(tpot)
            self.requests.labels(**self.labels, is_streaming="true").inc()

    def text(self) -> str:
        return generate_latest(self.r).decode()


def run_intervals(ev: SLOEvaluator, pod: Pod, spec: SLOSpec, plan: list[float], *, start: float = 0.0,
                  step: float = 15.0, per_interval: int = 10):
    """Observe the pod before the first interval, then one interval per TTFT in ``plan``."""
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=start)
    result = None
    for i, ttft in enumerate(plan, start=1):
        now = start + i * step
        pod.requests_done(per_interval, ttft=ttft)
        ev.observe(KEY, "decode", "decode-0", pod.text(), now=now)
        result = ev.evaluate(KEY, spec, now=now)
    return result


def test_burn_windows_scale_with_the_spec_window():
    names = {w.name: (format_duration(w.seconds), w.threshold) for w in burn_windows(300)}
    assert names == {"page_short": ("5m", 14.4), "page_long": ("1h", 14.4),
                     "ticket_short": ("30m", 6.0), "ticket_long": ("6h", 6.0)}


def test_attainment_and_burn_rates_after_a_slow_spell():
    # window 60 s = 4 intervals of 15 s. 20 fast intervals (TTFT 150 ms), then 4 slow ones
    # (3 s): from the first slow interval on, >10% of the window's requests are slow, so
    # p90 > 800 ms and every one of the 4 intervals is bad.
    ev = SLOEvaluator()
    spec = SLOSpec(ttft={"p90": "800ms"}, window="1m", objective=0.9)
    result = run_intervals(ev, Pod(), spec, [0.15] * 20 + [3.0] * 4)
    assert result.met is False and not result.no_traffic
    assert result.attainment == 0.0                          # the 4 intervals of the last minute are bad
    assert result.burn_rate("page_short") == pytest.approx(1.0 / 0.1)       # 4/4 bad / budget 0.1
    assert result.burn_rate("page_long") == pytest.approx((4 / 24) / 0.1)   # 12 min: all 24 intervals
    assert result.burn_rate("ticket_short") == pytest.approx((4 / 24) / 0.1)
    assert not result.alert_firing("page")                   # long window 1.67 < 14.4
    strict = ev.evaluate(KEY, spec.model_copy(update={"objective": 0.99}), now=24 * 15.0)
    assert strict.burn_rate_short == pytest.approx(100.0)
    assert strict.burn_rate_long == pytest.approx(4 / 24 / 0.01)
    assert strict.alert_firing("page") and strict.alert_firing("ticket")
    cond = slo_condition(result)
    assert cond["status"] == "False" and cond["reason"] == "TargetMissed"
    assert "ttft p90" in cond["message"] and "> target 800ms by" in cond["message"]


def test_partial_attainment():
    ev = SLOEvaluator()
    spec = SLOSpec(ttft={"p90": "800ms"}, window="2m", objective=0.95)   # 8 intervals
    # 6 fast intervals (good), then 2 slow ones: 10 of 70 requests slow is already more
    # than 10% (p90 rank 63 > 60 fast ones), so both are bad.
    result = run_intervals(ev, Pod(), spec, [0.15] * 6 + [3.0, 3.0])
    assert result.attainment == pytest.approx(6 / 8)
    assert result.burn_rate_short == pytest.approx((2 / 8) / 0.05)


def test_no_traffic_is_unknown_and_not_counted():
    ev = SLOEvaluator()
    pod = Pod()
    spec = SLOSpec(ttft={"p90": "800ms"}, window="1m")
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=0.0)
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=15.0)
    idle = ev.evaluate(KEY, spec, now=15.0)
    assert idle.met is None and idle.no_traffic and idle.attainment is None
    assert idle.burn_rate_short is None
    assert slo_condition(idle)["status"] == "Unknown" and slo_condition(idle)["reason"] == "NoTraffic"
    assert idle.targets[0].measured is None
    never_seen = ev.evaluate("other/dep", spec, now=15.0)
    assert never_seen.no_traffic and never_seen.targets[0].source_role is None
    pod.requests_done(5, ttft=0.15)
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=30.0)
    busy = ev.evaluate(KEY, spec, now=30.0)
    assert busy.met is True and busy.attainment == 1.0      # the idle interval was not counted
    assert slo_condition(busy)["status"] == "True"


def test_traffic_leaves_the_window():
    ev = SLOEvaluator()
    pod = Pod()
    spec = SLOSpec(ttft={"p90": "800ms"}, window="1m")
    run_intervals(ev, pod, spec, [0.15])
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=90.0)
    later = ev.evaluate(KEY, spec, now=90.0)                 # last requests at t=15: out of (30, 90]
    assert later.no_traffic and later.met is None


def test_per_user_speed_is_the_reciprocal_of_tpot():
    ev = SLOEvaluator()
    spec = SLOSpec(perUserSpeed={"p90": 40}, window="1m")
    pod = Pod()
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=0.0)
    pod.requests_done(50, ttft=0.1, tpot=0.018)            # 55.6 tokens/s
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=15.0)
    fast = ev.evaluate(KEY, spec, now=15.0).targets[0]
    assert fast.unit == "tokens_per_second" and fast.met is True
    assert 1 / 0.020 <= fast.measured <= 1 / 0.015          # inside the TPOT bucket (15 ms, 20 ms]
    assert fast.resolution == pytest.approx(1 / 0.015 - 1 / 0.020)
    pod.requests_done(50, ttft=0.1, tpot=0.09)             # 11 tokens/s
    ev.observe(KEY, "decode", "decode-0", pod.text(), now=30.0)
    slow = ev.evaluate(KEY, spec, now=30.0).targets[0]
    assert slow.met is False and slow.margin < 0
    assert 1 / 0.1 <= slow.measured <= 1 / 0.08


def test_kv_transfer_and_roles():
    ev = SLOEvaluator()
    spec = SLOSpec(ttft={"p90": "2s"}, window="1m")
    prefill, decode = Pod("prefill"), Pod("decode")
    ev.observe(KEY, "prefill", "prefill-0", prefill.text(), now=0.0)
    ev.observe(KEY, "decode", "decode-0", decode.text(), now=0.0)
    for _ in range(40):
        prefill.kv.labels(**prefill.labels).observe(30.0)          # ms, bucket (25, 50]
    prefill.transfer_failed.labels(**prefill.labels).inc(2)
    decode.bootstrap_failed.labels(**decode.labels).inc(1)
    decode.requests_done(40, ttft=0.3)
    ev.observe(KEY, "prefill", "prefill-0", prefill.text(), now=30.0)
    ev.observe(KEY, "decode", "decode-0", decode.text(), now=30.0)
    r = ev.evaluate(KEY, spec, now=30.0)
    kv = r.kv_transfer
    assert 0.025 <= kv.latency_seconds["p90"] <= 0.050
    assert kv.transfers == 40 and kv.failures == 3
    assert kv.failure_ratio == pytest.approx(3 / 40)
    assert kv.failures_per_second == pytest.approx(3 / 30)   # observed for 30 s of the 60 s window
    assert r.targets[0].source_role == "decode"
    assert set(r.roles) == {"prefill", "decode"} and r.roles["decode"].pods == 1
    status = r.to_status()
    assert status["kvTransferFailures"] == 3 and status["targets"][0]["target"] == "2s"


def test_aggregated_deployment_reads_its_own_role():
    ev = SLOEvaluator()
    pod = Pod("unified")
    ev.observe(KEY, "aggregated", "engine-0", pod.text(), now=0.0)
    pod.requests_done(10, ttft=0.15)
    ev.observe(KEY, "aggregated", "engine-0", pod.text(), now=15.0)
    r = ev.evaluate(KEY, SLOSpec(ttft={"p50": "500ms"}, window="1m"), now=15.0)
    assert r.targets[0].source_role == "aggregated" and r.met is True
    with pytest.raises(ValueError):
        ev.observe(KEY, "router", "x", pod.text(), now=16.0)


def test_pod_uid_change_counts_the_new_process_whole():
    ev = SLOEvaluator()
    old, new = Pod(), Pod()
    old.requests_done(100, ttft=0.15)
    ev.observe(KEY, "decode", "decode-0", old.text(), now=0.0, pod_uid="a")
    new.requests_done(150, ttft=0.15)          # more than before: counts did not go down
    ev.observe(KEY, "decode", "decode-0", new.text(), now=15.0, pod_uid="b")
    assert ev.window_histogram(KEY, "decode", ex.TTFT, now=15.0, window_s=60).total == 150


def parse(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_operator_metrics_export():
    ev = SLOEvaluator()
    spec = SLOSpec(ttft={"p90": "800ms"}, perUserSpeed={"p90": 20}, window="1m", objective=0.9)
    result = run_intervals(ev, Pod(), spec, [0.15] * 3)
    m = OperatorMetrics()
    m.publish(result)
    with m.time_reconcile("PDDeployment"):
        pass
    with pytest.raises(RuntimeError), m.time_reconcile("PDDeployment"):
        raise RuntimeError("boom")
    m.queue_depth.set(4)
    samples = parse(generate_latest(m.registry).decode())
    tl = (("deployment", "dsv41"), ("namespace", "team-a"), ("percentile", "p90"), ("role", "decode"))
    measured = samples[("sglang_pd_operator_slo_measured_seconds", tuple(sorted(tl + (("target", "ttft"),))))]
    assert measured == pytest.approx(result.targets[0].measured)
    assert samples[("sglang_pd_operator_slo_target_seconds", tuple(sorted(tl + (("target", "ttft"),))))] == 0.8
    assert samples[("sglang_pd_operator_slo_target_tokens_per_second",
                    tuple(sorted(tl + (("target", "perUserSpeed"),))))] == 20
    d = (("deployment", "dsv41"), ("namespace", "team-a"))
    assert samples[("sglang_pd_operator_slo_attainment_ratio", d)] == 1.0
    assert samples[("sglang_pd_operator_slo_met", d)] == 1.0
    assert samples[("sglang_pd_operator_slo_error_budget_burn_rate",
                    tuple(sorted(d + (("alert", "page"), ("duration", "1m"), ("window", "short")))))] == 0.0
    assert samples[("sglang_pd_operator_reconcile_duration_seconds_count", (("kind", "PDDeployment"),))] == 2
    assert samples[("sglang_pd_operator_reconcile_errors_total",
                    (("kind", "PDDeployment"), ("reason", "RuntimeError")))] == 1
    assert samples[("sglang_pd_operator_queue_depth", ())] == 4
    m.remove(KEY)
    assert not any(k[0].startswith("sglang_pd_operator_slo_") for k in parse(generate_latest(m.registry).decode()))


def test_render_monitoring_objects():
    spec = SLOSpec(ttft={"p90": "800ms"}, itl={"p99": "50ms"}, perUserSpeed={"p90": 20}, window="5m")
    objs = render_monitoring(name="dsv41", namespace="team-a", slo_spec=spec,
                             pod_selector={"app.kubernetes.io/instance": "dsv41"},
                             role_label="pd.sglang-operator.io/role", labels={"release": "prom"})
    pm, rule = objs
    assert pm["kind"] == "PodMonitor" and rule["kind"] == "PrometheusRule"
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/instance": "dsv41"}
    relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_pd_sglang_operator_io_role"],
            "targetLabel": "role"} in relabel
    rules = {r.get("record") or r.get("alert"): r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["sglang_pd:ttft_seconds:p90"]["expr"].startswith("histogram_quantile(0.9, sum by (namespace")
    assert 'role="decode"' in rules["sglang_pd:ttft_seconds:p90"]["expr"]
    assert rules["sglang_pd:per_user_speed_tokens_per_second:p90"]["expr"].startswith("1 / histogram_quantile(0.9")
    assert {"sglang_pd:slo_error_budget_burn_rate:5m", "sglang_pd:slo_error_budget_burn_rate:1h",
            "sglang_pd:slo_error_budget_burn_rate:30m", "sglang_pd:slo_error_budget_burn_rate:6h"} <= set(rules)
    assert "> 14.4" in rules["SGLangPDErrorBudgetBurnFast"]["expr"]
    assert render_monitoring(name="x", namespace="y", slo_spec=None, pod_selector={}, role_label="r")[0]["kind"] \
        == "PodMonitor"
    assert len(render_monitoring(name="x", namespace="y", slo_spec=None, pod_selector={}, role_label="r")) == 1


def test_kv_transfer_counts_a_request_once_per_attention_tp_group():
    """A TP4 prefill and a TP4 decode without DP attention: each failed or transferred request
    is recorded by all four schedulers (one series per tp_rank); the window counts it once."""
    from sglang_pd_operator.metrics.kvstore import transfer_summary

    def engine(role: str):
        r = CollectorRegistry()
        names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
        ranks = [{"model_name": "m", "engine_type": role, "tp_rank": str(t), "pp_rank": "0", "moe_ep_rank": "0"}
                 for t in range(4)]
        failed = Counter(ex.TRANSFER_FAILED, "", names, registry=r)
        bootstrap = Counter(ex.BOOTSTRAP_FAILED, "", names, registry=r)
        kv = Histogram(ex.KV_TRANSFER_LATENCY_MS, "", names, buckets=ex.SGLANG_BUCKETS[ex.KV_TRANSFER_LATENCY_MS],
                       registry=r)
        return r, ranks, failed, bootstrap, kv

    ev = SLOEvaluator()
    spec = SLOSpec(window="1m")
    pre_r, pre_ranks, pre_failed, _, pre_kv = engine("prefill")
    dec_r, dec_ranks, dec_failed, dec_bootstrap, _ = engine("decode")
    for r in pre_ranks:
        pre_kv.labels(**r).observe(30.0)   # before the baseline: not counted
    ev.observe(KEY, "prefill", "prefill-0", generate_latest(pre_r).decode(), now=0.0)
    ev.observe(KEY, "decode", "decode-0", generate_latest(dec_r).decode(), now=0.0)
    for r in pre_ranks:
        for _ in range(10):
            pre_kv.labels(**r).observe(30.0)
        pre_failed.labels(**r).inc(2)
    for r in dec_ranks:
        dec_failed.labels(**r).inc(1)
        dec_bootstrap.labels(**r).inc(3)
    ev.observe(KEY, "prefill", "prefill-0", generate_latest(pre_r).decode(), now=30.0)
    ev.observe(KEY, "decode", "decode-0", generate_latest(dec_r).decode(), now=30.0)
    kv = ev.evaluate(KEY, spec, now=30.0).kv_transfer
    assert (kv.transfers, kv.transfer_failures, kv.bootstrap_failures) == (10, 2 + 1, 3)
    summary = transfer_summary(ev, KEY, now=30.0, window_s=60.0)
    assert (summary.transfers, summary.transfer_failures, summary.bootstrap_failures) == (10, 3, 3)


def test_no_traffic_does_not_claim_a_whole_window_of_a_young_deployment_and_never_changes_its_words():
    # a fresh user's finding: a two-minute-old deployment said "no request finished in the last 5m";
    # words that changed once a window had passed would cost a status write per deployment then
    ev = SLOEvaluator()
    spec = SLOSpec(ttft={"p90": "800ms"}, window="5m")
    young = slo_condition(ev.evaluate(KEY, spec, now=1120.0))
    old = slo_condition(ev.evaluate(KEY, spec, now=9000.0))
    assert young == old and young["reason"] == "NoTraffic"
    assert young["message"] == ("no request finished in the last 5m (or since measuring began, if later); "
                                "nothing to measure")
