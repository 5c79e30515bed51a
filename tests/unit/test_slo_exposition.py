"""Percentiles from real exposition text in SGLang 0.5.23's names, labels and buckets.

The text is produced by prometheus_client (the library SGLang itself exposes metrics
with) using SGLang's exact bucket boundaries and label names, or written by hand where a
real exposition cannot produce the case (missing buckets). Every percentile is compared
with the exact order statistic of the raw samples: a histogram estimate is off by at most
the width of the bucket the rank falls in, because the true sample lies in that bucket.
"""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import bucket_width_at
from sglang_pd_operator.metrics.slo import SLOEvaluator

# Literal copies of sglang 0.5.23 metrics_collector.py defaults (TokenizerMetricsCollector).
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
               0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]


class FakeSGLangPod:
    """The tokenizer and scheduler metrics of one SGLang decode server, as SGLang registers them."""

    def __init__(self, *, dp_size: int = 2, model: str = "deepseek-ai/DeepSeek-V4.1-Flash") -> None:
        self.registry = CollectorRegistry()
        tok = ["model_name", "engine_type"]
        self.tok = {"model_name": model, "engine_type": "decode"}
        self.ttft = Histogram(ex.TTFT, "ttft", tok + ["is_streaming"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram(ex.ITL, "itl", tok, buckets=ITL_BUCKETS, registry=self.registry)
        self.tpot = Histogram(ex.TPOT, "tpot", tok + ["is_streaming"], buckets=ITL_BUCKETS, registry=self.registry)
        self.requests = Counter(ex.REQUESTS, "requests", tok + ["is_streaming"], registry=self.registry)
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
        self.sched = [dict(model_name=model, engine_type="decode", tp_rank="0", pp_rank="0", moe_ep_rank="0",
                           dp_rank=str(d)) for d in range(dp_size)]
        self.queue = Gauge(ex.QUEUE_REQS, "queue", sched, registry=self.registry)
        self.accept = Gauge(ex.SPEC_ACCEPT_LENGTH, "accept", sched, registry=self.registry)
        self.transfer_failed = Counter(ex.TRANSFER_FAILED, "failed", sched, registry=self.registry)
        for i, labels in enumerate(self.sched):
            self.queue.labels(**labels).set(3 + i)
            self.accept.labels(**labels).set(2.0 + i)

    def observe_ttft(self, values, *, stream: bool) -> None:
        for v in values:
            self.ttft.labels(**self.tok, is_streaming="true" if stream else "false").observe(v)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def exact_quantile(values: list[float], q: float) -> float:
    """The order statistic at rank ceil(q * n): what histogram_quantile estimates."""
    xs = sorted(values)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def assert_within_one_bucket(measured: float, values: list[float], q: float, buckets) -> None:
    exact = exact_quantile(values, q)
    width = bucket_width_at(exact, list(buckets) + [math.inf])
    assert abs(measured - exact) <= width + 1e-12, (measured, exact, width)


def lognormal(rng: random.Random, median: float, sigma: float, n: int) -> list[float]:
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def test_parse_sums_extra_labels_and_reads_gauges():
    pod = FakeSGLangPod(dp_size=4)
    rng = random.Random(7)
    a, b = lognormal(rng, 0.5, 0.6, 300), lognormal(rng, 1.5, 0.4, 200)
    pod.observe_ttft(a, stream=True)
    pod.observe_ttft(b, stream=False)
    scrape = ex.parse_exposition(pod.text())
    h = scrape.histograms[ex.TTFT]
    assert h.bounds[:-1] == tuple(float(x) for x in TTFT_BUCKETS) and math.isinf(h.bounds[-1])
    assert h.total == 500 and h.count == 500      # _sum is not read (nothing uses it)
    for q in (0.5, 0.9, 0.99):
        assert_within_one_bucket(h.quantile(q), a + b, q, TTFT_BUCKETS)
    assert scrape.gauges[ex.QUEUE_REQS].sum == 3 + 4 + 5 + 6
    assert scrape.gauges[ex.SPEC_ACCEPT_LENGTH].mean == pytest.approx(3.5)
    assert ex.ITL not in scrape.histograms          # registered but never observed: no samples


def test_label_filter_selects_one_model():
    pod = FakeSGLangPod(model="m1")
    pod.observe_ttft([0.15] * 10, stream=True)
    text = pod.text() + other_model_sample_lines()
    all_models = ex.parse_exposition(text).histograms[ex.TTFT]
    only_m1 = ex.parse_exposition(text, label_filter=lambda labels: labels.get("model_name") == "m1")
    only_m1 = only_m1.histograms[ex.TTFT]
    assert all_models.total == 15 and only_m1.total == 10


def other_model_sample_lines() -> str:
    other = FakeSGLangPod(model="m2")
    other.observe_ttft([3.0] * 5, stream=True)
    # keep only sample lines: a second HELP/TYPE block of the same name would be invalid
    return "".join(line + "\n" for line in other.text().splitlines() if line.startswith(ex.TTFT + "_"))


def test_missing_buckets_in_one_label_set_handwritten():
    # dp_rank 1's exposition lost its le="0.4" and le="+Inf" lines (e.g. truncated by a proxy).
    text = """\
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="0.1"} 2
sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="0.2"} 6
sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="0.4"} 10
sglang:time_to_first_token_seconds_bucket{dp_rank="0",le="+Inf"} 10
sglang:time_to_first_token_seconds_count{dp_rank="0"} 10
sglang:time_to_first_token_seconds_sum{dp_rank="0"} 2.0
sglang:time_to_first_token_seconds_bucket{dp_rank="1",le="0.1"} 1
sglang:time_to_first_token_seconds_bucket{dp_rank="1",le="0.2"} 4
sglang:time_to_first_token_seconds_count{dp_rank="1"} 5
sglang:time_to_first_token_seconds_sum{dp_rank="1"} 1.0
"""
    h = ex.parse_exposition(text).histograms[ex.TTFT]
    # dp 1: le=0.4 filled from le=0.2 (4), +Inf from _count (5)
    assert h.counts == (3, 10, 14, 15)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.1 * (7.5 - 3) / 7)


def test_unparsable_text_raises():
    with pytest.raises(ex.ExpositionError):
        ex.parse_exposition('sglang:num_queue_reqs{dp_rank="0" 3\n')


def test_window_percentiles_with_counter_reset_match_raw_samples():
    """Three scrapes of one pod; it restarts between the 2nd and 3rd. The window (2nd->3rd
    scrape plus the increase up to the 2nd) must hold exactly the samples seen since the 1st."""
    rng = random.Random(11)
    spec = SLOSpec(ttft={"p50": "1s", "p90": "1s", "p99": "1s"}, window="5m")
    ev = SLOEvaluator()
    pod = FakeSGLangPod()
    before = lognormal(rng, 5.0, 0.3, 400)               # before the first scrape: baseline only
    pod.observe_ttft(before, stream=True)
    ev.observe("ns/dep", "decode", "decode-0", pod.text(), now=1000.0)
    s1 = lognormal(rng, 0.3, 0.5, 250)
    pod.observe_ttft(s1, stream=True)
    ev.observe("ns/dep", "decode", "decode-0", pod.text(), now=1015.0)
    restarted = FakeSGLangPod()                          # new process: counters start at 0
    s2 = lognormal(rng, 0.6, 0.5, 150)
    restarted.observe_ttft(s2, stream=False)
    ev.observe("ns/dep", "decode", "decode-0", restarted.text(), now=1030.0)
    h = ev.window_histogram("ns/dep", "decode", ex.TTFT, now=1030.0, window_s=300)
    assert h.total == 400                                # 250 + 150; the 400 "before" excluded
    result = ev.evaluate("ns/dep", spec, now=1030.0)
    measured = {t.percentile: t.measured for t in result.targets}
    for pname, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert_within_one_bucket(measured[pname], s1 + s2, q, TTFT_BUCKETS)
    # had the 400 slow pre-baseline samples (median 5 s) leaked in, p50 would be > 1 s
    assert measured["p50"] < 1.0


def test_many_pods_with_dp_labels_sum_to_the_union():
    rng = random.Random(3)
    ev = SLOEvaluator()
    all_samples: list[float] = []
    pods = [FakeSGLangPod(dp_size=8) for _ in range(5)]
    for i, pod in enumerate(pods):
        ev.observe("ns/dep", "decode", f"decode-{i}", pod.text(), now=0.0)
    for i, pod in enumerate(pods):
        xs = lognormal(rng, 0.2 * (i + 1), 0.4, 120)
        pod.observe_ttft(xs, stream=bool(i % 2))
        all_samples += xs
        ev.observe("ns/dep", "decode", f"decode-{i}", pod.text(), now=15.0 + i * 0.1)
    h = ev.window_histogram("ns/dep", "decode", ex.TTFT, now=16.0, window_s=60)
    assert h.total == len(all_samples)
    for q in (0.5, 0.9, 0.99):
        assert_within_one_bucket(h.quantile(q), all_samples, q, TTFT_BUCKETS)


def test_created_timestamp_counts_a_series_born_inside_the_window():
    from prometheus_client import enable_created_metrics
    enable_created_metrics()
    pod = FakeSGLangPod()
    pod.observe_ttft([0.15] * 20, stream=True)
    text = pod.text()
    created = ex.parse_exposition(text).created[ex.TTFT]
    ev = SLOEvaluator(default_retention_s=300)
    ev.observe("ns/dep", "decode", "decode-0", text, now=created + 10)   # first scrape, 10 s after start
    h = ev.window_histogram("ns/dep", "decode", ex.TTFT, now=created + 10, window_s=300)
    assert h is not None and h.total == 20
    ev2 = SLOEvaluator(default_retention_s=300)                          # started long before: baseline
    ev2.observe("ns/dep", "decode", "decode-0", text, now=created + 3600)
    assert ev2.window_histogram("ns/dep", "decode", ex.TTFT, now=created + 3600, window_s=300) is None


# ------------------------------------------------------------ name[] filter (what the scraper asks)
def test_sample_names_restricted_registry_gives_the_same_scrape():
    """SGLang's /metrics (prometheus_client make_asgi_app) answers ?name[]=... with only those
    samples; parsing that answer gives what parsing the whole page gives for the same families."""
    from sglang_pd_operator.metrics.slo import SLOEvaluator

    pod = FakeSGLangPod(dp_size=4)
    rng = random.Random(5)
    pod.observe_ttft(lognormal(rng, 0.4, 0.7, 200), stream=True)
    pod.observe_ttft(lognormal(rng, 0.9, 0.7, 50), stream=False)
    for _ in range(30):
        pod.itl.labels(**pod.tok).observe(rng.random() / 10)
    pod.transfer_failed.labels(**pod.sched[2]).inc(3)
    spec = SLOSpec(ttft={"p90": "800ms"}, window="5m")
    families = SLOEvaluator().families_for("decode", spec)
    assert ex.TTFT in families and ex.ITL not in families and ex.KV_TRANSFER_LATENCY_MS not in families
    names = ex.sample_names(families)
    assert f"{ex.TTFT}_bucket" in names and f"{ex.TTFT}_sum" not in names and ex.TRANSFER_FAILED in names
    full = pod.text()
    restricted = generate_latest(pod.registry.restricted_registry(names)).decode()
    assert len(restricted) < len(full) and ex.ITL not in restricted and f"{ex.TTFT}_sum" not in restricted
    a, b = ex.parse_exposition(full, families=families), ex.parse_exposition(restricted, families=families)
    assert a.histograms.keys() == b.histograms.keys() == {ex.TTFT}
    assert a.histograms[ex.TTFT] == b.histograms[ex.TTFT]
    assert a.counters == b.counters and a.counters[ex.TRANSFER_FAILED] == 3
    assert a.gauges == b.gauges
    assert ex.QUEUE_REQS not in restricted, "queue gauges are left to Prometheus (PodMonitor)"


def test_escaped_label_values_and_odd_lines_parse():
    text = (
        'sglang:num_queue_reqs{dp_rank="0",} 2 1700000000000\n'
        "sglang:num_queue_reqs 5\n"
        'sglang:num_queue_reqs{path="a\\"b\\\\c"} 1\n'
        'sglang:time_to_first_token_seconds_bucket{le="0.1",x="a"} 1\n'
        'sglang:time_to_first_token_seconds_bucket{x="a",le="+Inf"} 3\n'
        'sglang:time_to_first_token_seconds_count{x="a"} 3\n'
        'sglang:num_queue_reqs_other{dp_rank="0"} 99\n'
    )
    scrape = ex.parse_exposition(text)
    assert scrape.gauges[ex.QUEUE_REQS].sum == 8 and scrape.gauges[ex.QUEUE_REQS].series == 3
    assert scrape.histograms[ex.TTFT].counts == (1.0, 3.0)


def test_priority_queue_gauges_count_the_total_series_once():
    """With --enable-priority-scheduling SGLang 0.5.23 writes each queue gauge as a total
    (priority="") plus one series per priority (metrics_collector.py _log_gauge_queue_count);
    the total is read, not total + breakdown. A label set with no total sums its priorities."""
    registry = CollectorRegistry()
    labels = ["model_name", "tp_rank", "dp_rank", "priority"]
    queue = Gauge(ex.QUEUE_REQS, "queue", labels, registry=registry)
    accept = Gauge(ex.SPEC_ACCEPT_LENGTH, "accept", labels, registry=registry)
    for dp in range(4):
        base = {"model_name": "m", "tp_rank": str(dp), "dp_rank": str(dp)}
        queue.labels(**base, priority="").set(3 + dp)
        queue.labels(**base, priority="0").set(1)
        queue.labels(**base, priority="1").set(2 + dp)
        accept.labels(**base, priority="").set(2.0 + dp)
    # an exporter that writes only the breakdown for one rank
    queue.labels(model_name="m", tp_rank="9", dp_rank="9", priority="5").set(7)
    queue.labels(model_name="m", tp_rank="9", dp_rank="9", priority="6").set(1)
    scrape = ex.parse_exposition(generate_latest(registry).decode())
    assert scrape.gauges[ex.QUEUE_REQS] == ex.GaugeValue(sum=(3 + 4 + 5 + 6) + (7 + 1), series=5)
    assert scrape.gauges[ex.SPEC_ACCEPT_LENGTH].mean == pytest.approx(3.5)


def test_whole_page_is_narrowed_to_the_wanted_families_before_parsing():
    pod = FakeSGLangPod(dp_size=4)
    pod.observe_ttft([0.3, 0.5, 0.9], stream=True)
    page = pod.text()
    families = {ex.TTFT: ex.Kind.HISTOGRAM, ex.QUEUE_REQS: ex.Kind.GAUGE}
    kept = ex.select_families(page, families)
    names = {s.name for f in text_string_to_metric_families(kept) for s in f.samples}
    assert names == {f"{ex.TTFT}_bucket", f"{ex.TTFT}_count", f"{ex.TTFT}_created", ex.QUEUE_REQS}  # no _sum
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in kept
    assert ex.parse_exposition(page, families=families) == ex.parse_exposition(kept, families=families)
    assert ex.has_samples(page, families) and not ex.has_samples("", families)
    assert not ex.has_samples("# HELP sglang:num_queue_reqs x\n# TYPE sglang:num_queue_reqs gauge\n", families)
    assert ex.select_families(page, {}) == ""


def test_text_that_is_no_exposition_raises():
    for text in ("<html><body>502 Bad Gateway</body></html>\n", '{"error": "not found"}\n'):
        with pytest.raises(ex.ExpositionError):
            ex.parse_exposition(text)
        assert not ex.has_samples(text, ex.FAMILIES)
    assert ex.parse_exposition("\n   \n# comment\n").histograms == {}


# ------------------------------------------------------------ one count per DP shard
SCHED_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]


def scheduler_ranks(*, tp: int, attn_dp: int = 1, pp: int = 1, ep: int = 1) -> list[dict[str, str]]:
    """The label sets of an engine's schedulers as SGLang 0.5.23 writes them
    (SchedulerMetricsCollector.init_new): tp_rank, pp_rank, moe_ep_rank (tp_rank // (tp // ep),
    data_parallel_controller.py), dp_rank = tp_rank // attn_tp with DP attention
    (runtime_context.py derive_attention_ranks) and absent without it."""
    attn_tp = tp // attn_dp
    out = []
    for p in range(pp):
        for t in range(tp):
            labels = {"model_name": "m", "engine_type": "prefill", "tp_rank": str(t), "pp_rank": str(p),
                      "moe_ep_rank": str(t // (tp // ep))}
            if attn_dp > 1:
                labels["dp_rank"] = str(t // attn_tp)
            out.append(labels)
    return out


class SchedulerPage:
    """One counter, KV transfer histogram and queue gauge per scheduler rank, in one registry."""

    def __init__(self, ranks: list[dict[str, str]]) -> None:
        self.registry = CollectorRegistry()
        names = [n for n in SCHED_LABELS if n in ranks[0]]
        self.ranks = ranks
        self.failed = Counter(ex.TRANSFER_FAILED, "failed", names, registry=self.registry)
        self.bootstrap = Counter(ex.BOOTSTRAP_FAILED, "bootstrap", names, registry=self.registry)
        self.latency = Histogram(ex.KV_TRANSFER_LATENCY_MS, "latency", names,
                                 buckets=ex.SGLANG_BUCKETS[ex.KV_TRANSFER_LATENCY_MS], registry=self.registry)
        self.queue = Gauge(ex.QUEUE_REQS, "queue", names, registry=self.registry)

    def shard(self, dp_rank: int | None) -> list[dict[str, str]]:
        """Every rank that runs the requests of DP shard ``dp_rank`` (None: the whole engine)."""
        return [r for r in self.ranks if r.get("dp_rank") == (None if dp_rank is None else str(dp_rank))]

    def fail(self, n: int, dp_rank: int | None = None) -> None:
        """``n`` failed requests, counted by every rank of the shard as prefill.py/decode.py do."""
        for labels in self.shard(dp_rank):
            self.failed.labels(**labels).inc(n)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_tp4_without_dp_attention_counts_a_failed_request_once():
    page = SchedulerPage(scheduler_ranks(tp=4, ep=2))   # moe_ep_rank 0, 0, 1, 1: still one shard
    page.fail(3)
    text = page.text()
    assert text.count(f'{ex.TRANSFER_FAILED}{{') == 4, "SGLang writes one series per rank"
    assert ex.parse_exposition(text).counters[ex.TRANSFER_FAILED] == 3


def test_dp_attention_with_attention_tp_1_sums_the_dp_ranks():
    page = SchedulerPage(scheduler_ranks(tp=4, attn_dp=4))
    for dp in range(4):
        page.fail(dp + 1, dp_rank=dp)
    assert ex.parse_exposition(page.text()).counters[ex.TRANSFER_FAILED] == 1 + 2 + 3 + 4


def test_dp_attention_with_attention_tp_2_counts_each_dp_rank_once():
    page = SchedulerPage(scheduler_ranks(tp=8, attn_dp=2, ep=8))   # dp 0: tp 0-3, dp 1: tp 4-7
    page.fail(2, dp_rank=0)
    page.fail(5, dp_rank=1)
    assert ex.parse_exposition(page.text()).counters[ex.TRANSFER_FAILED] == 2 + 5


def test_pipeline_stages_of_one_shard_count_once():
    """Decode's PP consensus (poll_and_all_reduce_pp) makes every stage conclude Failed too."""
    page = SchedulerPage(scheduler_ranks(tp=2, pp=2))
    page.fail(4)
    assert ex.parse_exposition(page.text()).counters[ex.TRANSFER_FAILED] == 4


def test_a_rank_ahead_of_its_shard_gives_the_shard_its_count():
    """Ranks conclude a request in their own scheduler loops: a scrape can fall between two
    ranks' increments. The shard's largest value counts (and a later scrape sees the rest)."""
    page = SchedulerPage(scheduler_ranks(tp=4))
    page.fail(3)
    page.failed.labels(**page.ranks[2]).inc()
    assert ex.parse_exposition(page.text()).counters[ex.TRANSFER_FAILED] == 4
    for labels in page.ranks:
        if labels is not page.ranks[2]:
            page.failed.labels(**labels).inc()
    assert ex.parse_exposition(page.text()).counters[ex.TRANSFER_FAILED] == 4


def test_kv_transfer_histogram_keeps_each_shards_lowest_rank():
    """Every rank observes its own part of a request's transfer (prefill.py
    process_disagg_prefill_inflight_queue): one shard's observations are one rank's."""
    page = SchedulerPage(scheduler_ranks(tp=4, attn_dp=2))    # dp 0: tp 0, 1; dp 1: tp 2, 3
    per_rank = {"0": [12.0, 30.0, 40.0], "1": [14.0, 33.0, 45.0], "2": [18.0], "3": [20.0]}
    for labels in page.ranks:
        for v in per_rank[labels["tp_rank"]]:
            page.latency.labels(**labels).observe(v)
    h = ex.parse_exposition(page.text()).histograms[ex.KV_TRANSFER_LATENCY_MS]
    assert h.total == 4, "one observation per transferred request"
    ref = SchedulerPage(scheduler_ranks(tp=4, attn_dp=2))
    for v in per_rank["0"] + per_rank["2"]:
        ref.latency.labels(**ref.ranks[0]).observe(v)
    assert h == ex.parse_exposition(ref.text()).histograms[ex.KV_TRANSFER_LATENCY_MS]


def test_queue_gauges_logged_by_every_rank_count_once():
    """--enable-metrics-for-all-schedulers: every rank of a shard logs the shard's queues."""
    page = SchedulerPage(scheduler_ranks(tp=4, attn_dp=2))
    for labels in page.ranks:
        page.queue.labels(**labels).set(5 if labels["dp_rank"] == "0" else 7)
    assert ex.parse_exposition(page.text()).gauges[ex.QUEUE_REQS] == ex.GaugeValue(sum=5 + 7, series=2)


def test_group_by_shard_orders_ranks_by_number_and_leaves_other_series_alone():
    def key(**labels):
        return tuple(sorted(labels.items()))

    series = {key(tp_rank="10", pp_rank="0", m="a"): "tp10", key(tp_rank="2", pp_rank="0", m="a"): "tp2",
              key(tp_rank="0", pp_rank="1", m="a"): "pp1", key(tp_rank="3", pp_rank="0", m="b"): "b",
              key(m="a", is_streaming="true"): "tok-true", key(m="a", is_streaming="false"): "tok-false"}
    groups = ex.group_by_shard(series)
    assert groups[key(m="a")] == ["tp2", "tp10", "pp1"]       # pp_rank first, then tp_rank by value
    assert groups[key(m="b")] == ["b"]
    assert groups[key(m="a", is_streaming="true")] == ["tok-true"]
    assert groups[key(m="a", is_streaming="false")] == ["tok-false"]
    assert ex.shard_of(key(m="a", tp_rank="x")) == (key(m="a"), ((0, 0, ""), (2, 0, "x"), (0, 0, "")))


def test_tokenizer_families_without_rank_labels_are_summed_as_before():
    pod = FakeSGLangPod(dp_size=4)
    pod.observe_ttft([0.15] * 7, stream=True)
    pod.observe_ttft([0.3] * 5, stream=False)
    for labels in pod.sched:
        pod.transfer_failed.labels(**labels).inc()
    scrape = ex.parse_exposition(pod.text())
    assert scrape.histograms[ex.TTFT].total == 12
    assert scrape.counters[ex.TRANSFER_FAILED] == 4, "DP attention 4 x attention TP 1: four shards"
