"""The operator reads metrics the way REAL SGLang 0.5.23 serves them.

SGLang's ``/metrics`` is a CollectorRegistry holding a MultiProcessCollector over
``PROMETHEUS_MULTIPROC_DIR`` (``sglang/srt/utils/common.py``, ``add_prometheus_middleware``),
fed by the tokenizer process and every scheduler process. Here that is built from SGLang's
own code (tools/sglang_metrics_engine.py): a decode engine shaped TP4 with DP attention 4
(four scheduler processes labelled tp_rank/dp_rank 0..3 plus the tokenizer/HTTP process)
and a prefill engine shaped TP2 / DP attention 2, both with priority scheduling on, so the
queue gauges carry the total series (``priority=""``) beside one per priority exactly as
SGLang writes them. Observations go in through SGLang's collector methods; the operator's
real scraper (``Scraper.scrape_once``: aiohttp fetch, parse, ``SLOEvaluator``) reads them
over loopback HTTP and must find:

- TTFT and ITL p90 within one bucket of the exact order statistic of what was fed in;
- every KV transfer and bootstrap failure (``sglang:num_transfer_failed_reqs_total`` and
  ``sglang:num_bootstrap_failed_reqs_total``, SchedulerMetricsCollector, counted by the
  prefill and the decode schedulers);
- queue depths counted once (the total series, not total + per-priority).

A second pair of engines has attention-TP groups of more than one rank: a decode engine
shaped TP4 **without** DP attention (one group of four schedulers, ``tp_rank`` 0..3, no
``dp_rank``; ``--enable-metrics-for-all-schedulers`` so that every rank logs its queue
gauges) and a prefill engine shaped TP4 / DP attention 2 (two groups of two). SGLang runs
a request on every scheduler of its group and each of them counts its failure and
observes its KV transfer (``MetricsEngine.requests_*``: disaggregation/prefill.py and
decode.py after the all-reduced poll); the scraper must count each request once.

Also here: the engine simulator (tools/engine_simulator) answers the same ``?name[]=``
request as real SGLang and carries the same label names on the families the operator
reads (a drift check), and a third engine started with the operator's rendered
``--bucket-*`` flags (planning/buckets.py) exposes histograms whose boundaries include
every SLO target.

Skipped (a failure under SGLANG_PD_OPERATOR_STRICT=1) without sglang==0.5.23, fastapi and
uvicorn (requirements/contract.txt).
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import random
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402

from helpers import load_example  # noqa: E402
from sglang_pd_operator.api.load import parse_pddeployment  # noqa: E402
from sglang_pd_operator.catalog import builtin_catalog  # noqa: E402
from sglang_pd_operator.metrics import exposition as ex  # noqa: E402
from sglang_pd_operator.metrics.histogram import bucket_width_at  # noqa: E402
from sglang_pd_operator.metrics.kvstore import transfer_summary  # noqa: E402
from sglang_pd_operator.metrics.scraper import Scraper  # noqa: E402
from sglang_pd_operator.metrics.slo import SLOEvaluator  # noqa: E402
from sglang_pd_operator.planning import buckets as B  # noqa: E402
from sglang_pd_operator.planning.plan import build_plan  # noqa: E402

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

pytestmark = [pytest.mark.contract, pytest.mark.timeout(420)]

LBL = "pd.sglang-operator.io"
KEY = "k1"
SLO = {"ttft": {"p90": "800ms"}, "itl": {"p90": "40ms"}, "window": "5m"}
N_REQUESTS = 240
GAPS_PER_REQUEST = 12


def _engine_module():
    real._require_sglang()
    pytest.importorskip("fastapi", reason="fastapi is not installed (requirements/contract.txt)")
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (requirements/contract.txt)")
    import sglang_metrics_engine

    return sglang_metrics_engine


#: The SLO of the bucket contract: every target kind, several percentiles.
BUCKET_SLO = {"ttft": {"p50": "300ms", "p90": "800ms", "p99": "2s"}, "itl": {"p90": "15ms", "p99": "40ms"},
              "e2e": {"p99": "45s"}, "perUserSpeed": {"p90": 30}, "window": "5m"}


def rendered_decode_plan():
    """The GB300 example with :data:`BUCKET_SLO`, planned by the operator."""
    doc = copy.deepcopy(load_example())
    doc["spec"]["slo"] = BUCKET_SLO
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def rendered_bucket_flags() -> list[str]:
    """The ``--bucket-*`` flags (with their values) of the decode command the operator renders."""
    args = list(rendered_decode_plan().decode.command.args)
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in B.BUCKET_FLAGS:
            out.append(args[i])
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                out.append(args[i])
                i += 1
        else:
            i += 1
    assert out, "the operator renders bucket flags for a decode role with SLO targets"
    return out


@pytest.fixture(scope="module")
def group_engines():
    """Engines whose attention-TP groups hold several schedulers (see the module docstring)."""
    sme = _engine_module()
    model = sme.tiny_model_dir()
    decode = sme.MetricsEngine(sme.engine_argv(model, role="decode", tp=4, attn_dp=1, priority=True,
                                               extra=["--enable-metrics-for-all-schedulers"]))
    prefill = sme.MetricsEngine(sme.engine_argv(model, role="prefill", tp=4, attn_dp=2, priority=False))
    started = [decode, prefill]
    try:
        for engine in started:
            engine.launch()
        for engine in started:
            engine.wait_ready()
        yield {"decode": decode, "prefill": prefill}
    finally:
        for engine in started:
            engine.close()


@pytest.fixture(scope="module")
def engines():
    sme = _engine_module()
    model = sme.tiny_model_dir()
    decode = sme.MetricsEngine(sme.engine_argv(model, role="decode", tp=4, attn_dp=4, priority=True))
    prefill = sme.MetricsEngine(sme.engine_argv(model, role="prefill", tp=2, attn_dp=2, priority=True))
    bucketed = sme.MetricsEngine(sme.engine_argv(model, role="decode", tp=1, attn_dp=1, priority=False,
                                                 extra=rendered_bucket_flags()))
    started = [decode, prefill, bucketed]
    try:
        for engine in started:
            engine.launch()
        for engine in started:
            engine.wait_ready()
        yield {"decode": decode, "prefill": prefill, "bucketed": bucketed}
    finally:
        for engine in started:
            engine.close()


def pdd() -> dict:
    return {"metadata": {"name": "d", "namespace": "ns"}, "spec": {"slo": SLO}}


def pod(name: str, role: str) -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "labels": {f"{LBL}/deployment": "d", f"{LBL}/role": role, f"{LBL}/compat-key": KEY}},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def exact_quantile(values: list[float], q: float) -> float:
    """The order statistic at rank ceil(q * n): the sample histogram_quantile estimates."""
    xs = sorted(values)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def assert_within_one_bucket(measured: float | None, values: list[float], q: float, bounds) -> None:
    exact = exact_quantile(values, q)
    width = bucket_width_at(exact, bounds)
    assert measured is not None, "nothing measured"
    assert abs(measured - exact) <= width + 1e-9, (measured, exact, width)


def test_scraper_reads_real_sglang_multiprocess_metrics(engines):
    decode, prefill = engines["decode"], engines["prefill"]
    assert [s["tp_rank"] for s in decode.schedulers] == [0, 1, 2, 3]
    assert [s["dp_rank"] for s in decode.schedulers] == [0, 1, 2, 3]
    assert all(s["labels"]["priority"] == "" for s in decode.schedulers + prefill.schedulers)

    # SGLang gauges exist from the first log_stats on; the scraper's first pass is a baseline.
    decode.log_stats(num_queue_reqs=(0, {}), num_running_reqs=(0, {}))
    prefill.log_stats(num_prefill_bootstrap_queue_reqs=(0, {}), num_prefill_inflight_queue_reqs=(0, {}))

    evaluator = SLOEvaluator(resolution_s=1.0)
    evaluator.families["decode"].update({ex.QUEUE_REQS: ex.Kind.GAUGE, ex.RUNNING_REQS: ex.Kind.GAUGE})
    evaluator.families["prefill"].update({ex.PREFILL_BOOTSTRAP_QUEUE: ex.Kind.GAUGE})
    body, pods = pdd(), [pod("p0", "prefill"), pod("d0", "decode")]
    clock = iter([1000.0, 1015.0])
    scraper = Scraper(list_deployments=lambda: [body], serving_key_of=lambda ns, name: KEY, list_pods=lambda ns: pods, evaluator=evaluator,
                      interval=15.0, timeout=10.0, clock=lambda: next(clock),
                      ports={"prefill": prefill.port, "decode": decode.port, "gateway": 1})

    rng = random.Random(23)
    ttfts = [rng.lognormvariate(math.log(0.35), 0.5) for _ in range(N_REQUESTS)]
    gaps = [[rng.lognormvariate(math.log(0.018), 0.35) for _ in range(GAPS_PER_REQUEST)] for _ in ttfts]
    priorities = [None, 0, 1, 2]

    async def main():
        assert await scraper.scrape_once() == []          # baseline only
        decode.requests([{"ttft": t, "itl": g, "priority": priorities[i % 4], "stream": i % 5 != 0}
                         for i, (t, g) in enumerate(zip(ttfts, gaps))])
        # queues: rank r has 3 + r waiting requests, split over priorities 0 and 1
        for r in range(4):
            decode.log_stats(r, num_queue_reqs=(3 + r, {0: 1, 1: 2 + r}), num_running_reqs=(8, {0: 5, 1: 3}))
        for r in range(2):
            prefill.log_stats(r, num_prefill_bootstrap_queue_reqs=(2, {0: 2}), num_prefill_inflight_queue_reqs=(1, {1: 1}))
        prefill.transfer_failed(0, 2)
        prefill.transfer_failed(1, 1)
        prefill.bootstrap_failed(1, 2)
        decode.transfer_failed(3, 1)
        decode.bootstrap_failed(0, 1)
        prefill.kv_transfer(0, [12.0, 30.0, 40.0])
        prefill.kv_transfer(1, [18.0])
        return await scraper.scrape_once()

    healths = asyncio.run(main())
    assert len(healths) == 1, "one deployment evaluated on the second pass"
    (h,) = healths
    assert h.reachable == {"prefill": 1, "decode": 1, "gateway": 0}
    assert h.slo is not None and not h.slo.no_traffic, "the scraper read no request from real SGLang"
    targets = {t.metric: t for t in h.slo.targets}
    ttft, itl = targets["ttft"], targets["itl"]
    assert ttft.observations == N_REQUESTS
    assert itl.observations == N_REQUESTS * GAPS_PER_REQUEST
    ttft_bounds = evaluator.window_histogram("ns/d", "decode", ex.TTFT, 1015.0, 300.0).bounds
    itl_bounds = evaluator.window_histogram("ns/d", "decode", ex.ITL, 1015.0, 300.0).bounds
    assert_within_one_bucket(ttft.measured, ttfts, 0.9, ttft_bounds)
    assert_within_one_bucket(itl.measured, [g for gs in gaps for g in gs], 0.9, itl_bounds)

    kv = h.kv_transfer
    assert kv.transfer_failures == 2 + 1 + 1, "transfer failures counted on prefill and decode schedulers"
    assert kv.bootstrap_failures == 2 + 1, "bootstrap failures counted on prefill and decode schedulers"
    assert kv.transfers == 4
    assert kv.latency_seconds["p90"] is not None and 0.025 <= kv.latency_seconds["p90"] <= 0.050

    queues = h.slo.roles["decode"].queues
    assert queues["num_queue_reqs"] == sum(3 + r for r in range(4)), "priority series counted twice"
    assert queues["num_running_reqs"] == 4 * 8
    assert h.slo.roles["prefill"].queues["num_prefill_bootstrap_queue_reqs"] == 2 * 2


def _series(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of counter ``family`` on a page."""
    return [(dict(sample.labels), sample.value) for fam in text_string_to_metric_families(text)
            for sample in fam.samples if sample.name == family]


def test_a_request_failing_on_every_rank_of_its_attention_tp_group_counts_once(group_engines):
    decode, prefill = group_engines["decode"], group_engines["prefill"]
    # decode TP4 without DP attention: one attention-TP group of four, no dp_rank label
    assert [(s["tp_rank"], s["dp_rank"], s["attn_tp_rank"]) for s in decode.schedulers] == [
        (0, None, 0), (1, None, 1), (2, None, 2), (3, None, 3)]
    assert all("dp_rank" not in s["labels"] for s in decode.schedulers)
    assert all(s["logs_stats"] for s in decode.schedulers), "--enable-metrics-for-all-schedulers"
    # prefill TP4 / DP attention 2: groups {0, 1} (dp_rank 0) and {2, 3} (dp_rank 1)
    assert [(s["tp_rank"], s["dp_rank"], s["attn_tp_rank"]) for s in prefill.schedulers] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert [s["logs_stats"] for s in prefill.schedulers] == [True, False, True, False]

    decode.log_stats(num_queue_reqs=(0, {}), num_running_reqs=(0, {}))
    evaluator = SLOEvaluator(resolution_s=1.0)
    evaluator.families["decode"].update({ex.QUEUE_REQS: ex.Kind.GAUGE, ex.RUNNING_REQS: ex.Kind.GAUGE})
    body, pods = pdd(), [pod("p0", "prefill"), pod("d0", "decode")]
    clock = iter([2000.0, 2015.0])
    scraper = Scraper(list_deployments=lambda: [body], serving_key_of=lambda ns, name: KEY, list_pods=lambda ns: pods, evaluator=evaluator,
                      interval=15.0, timeout=10.0, clock=lambda: next(clock),
                      ports={"prefill": prefill.port, "decode": decode.port, "gateway": 1})
    n_decode_transfer, n_decode_bootstrap = 3, 2

    async def main():
        assert await scraper.scrape_once() == []          # baseline only
        decode.requests_transfer_failed(n_decode_transfer)
        decode.requests_bootstrap_failed(n_decode_bootstrap)
        prefill.requests_transfer_failed(2, dp_rank=0)
        prefill.requests_transfer_failed(1, dp_rank=1)
        prefill.requests_bootstrap_failed(1, dp_rank=1)
        prefill.requests_kv_transferred([12.0, 30.0, 40.0], dp_rank=0)
        prefill.requests_kv_transferred([18.0], dp_rank=1)
        # every rank logs the group's queues (the same requests)
        decode.log_stats(num_queue_reqs=(5, {0: 2, 1: 3}), num_running_reqs=(8, {0: 5, 1: 3}))
        return await scraper.scrape_once()

    (h,) = asyncio.run(main())
    assert h.reachable == {"prefill": 1, "decode": 1, "gateway": 0}

    # SGLang did record each failure on every rank of the group: one series per tp_rank
    _, _, page = _get(decode.url)
    failed = _series(page.decode(), ex.TRANSFER_FAILED)
    assert sorted((labels["tp_rank"], value) for labels, value in failed) == [
        (str(r), float(n_decode_transfer)) for r in range(4)]

    kv = h.kv_transfer
    assert kv.transfer_failures == n_decode_transfer + 2 + 1, "one count per failed request"
    assert kv.bootstrap_failures == n_decode_bootstrap + 1, "one count per failed request"
    assert kv.transfers == 4, "one KV transfer per request, not one per rank"
    assert kv.latency_seconds["p90"] is not None and 0.025 <= kv.latency_seconds["p90"] <= 0.050
    summary = transfer_summary(evaluator, "ns/d", now=2015.0, window_s=300.0)
    assert (summary.transfers, summary.transfer_failures, summary.bootstrap_failures) == (4, 6, 3)
    assert summary.speed_gb_s["p50"] is not None
    queues = h.slo.roles["decode"].queues
    assert queues["num_queue_reqs"] == 5 and queues["num_running_reqs"] == 8, "one group's queues, once"


def test_name_filter_on_real_sglang_returns_an_empty_page(engines):
    """The fact the scraper has to live with: prometheus_client's restricted_registry does not
    see the MultiProcessCollector, so ``?name[]=`` answers 200 with nothing."""
    decode = engines["decode"]
    decode.requests([{"ttft": 0.2, "itl": [0.01]}])
    with urllib.request.urlopen(decode.url + f"?name[]={ex.TTFT}_bucket", timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b""
    with urllib.request.urlopen(decode.url, timeout=10) as resp:
        assert f"{ex.TTFT}_bucket{{".encode() in resp.read()


def _get(url: str, params: list[tuple[str, str]] | None = None) -> tuple[int, str, bytes]:
    query = "&".join(f"{k}={v}" for k, v in params or [])
    with urllib.request.urlopen(url + ("?" + query if query else ""), timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), resp.read()


def _label_names(text: str, families) -> dict[str, set[str]]:
    """Family -> the label names of its samples (``le`` and ``priority`` left out)."""
    table = ex._sample_table(families)
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name in table:
                out.setdefault(table[sample.name][0], set()).update(set(sample.labels) - {"le", "priority"})
    return out


def test_simulator_matches_real_sglang_on_the_name_filter_and_labels(engines):
    """Drift check for tools/engine_simulator, which the e2e tests use in place of SGLang:
    the same ``?name[]=`` request gets the same answer (200, an empty page) from both, the
    unfiltered pages carry the families the operator reads under the same label names, and
    the default histogram boundaries are SGLang's."""
    from engine_simulator import LogNormal, SimConfig, start_process

    decode = engines["decode"]
    decode.requests([{"ttft": 0.25, "itl": [0.01, 0.012], "stream": True},
                     {"ttft": 0.5, "itl": [0.02], "stream": False}])
    decode.log_stats(num_queue_reqs=(1, {0: 1}), num_running_reqs=(2, {0: 2}), spec_accept_length=2.0)
    decode.transfer_failed(1)
    decode.bootstrap_failed(2)
    names = [("name[]", n) for n in (f"{ex.TTFT}_bucket", f"{ex.ITL}_count", ex.QUEUE_REQS, ex.TRANSFER_FAILED)]

    async def from_simulator():
        sim = await start_process(SimConfig(role="decode", host="127.0.0.1", port=0, model="sim/model",
                                            dp_size=4, ttft=LogNormal(0.01), itl=LogNormal(0.002)))
        try:
            async with aiohttp.ClientSession() as s:
                for stream in (True, False):
                    r = await s.post(sim.url + "/v1/completions", json={"model": "sim/model", "prompt": "x",
                                                                         "max_tokens": 3, "stream": stream})
                    await r.read()
                await s.post(sim.url + "/simulator/mode", json={"mode": "kv_fail"})
                await (await s.post(sim.url + "/generate", json={"text": "x"})).read()
            return (_get(sim.url + "/metrics", names), _get(sim.url + "/metrics"))
        finally:
            await sim.close()

    (sim_f_status, sim_f_type, sim_filtered), (_, _, sim_full) = asyncio.run(from_simulator())
    real_f_status, real_f_type, real_filtered = _get(decode.url, names)
    _, _, real_full = _get(decode.url)
    assert (sim_f_status, sim_filtered) == (real_f_status, real_filtered) == (200, b"")
    assert sim_f_type == real_f_type
    families = {**SLOEvaluator().families_for("decode", None), ex.TTFT: ex.Kind.HISTOGRAM,
                ex.ITL: ex.Kind.HISTOGRAM, ex.TPOT: ex.Kind.HISTOGRAM, ex.E2E: ex.Kind.HISTOGRAM,
                ex.QUEUE_REQS: ex.Kind.GAUGE, ex.RUNNING_REQS: ex.Kind.GAUGE}
    real_labels = _label_names(real_full.decode(), families)
    sim_labels = _label_names(sim_full.decode(), families)
    assert set(real_labels) == set(families), f"real SGLang lacks {set(families) - set(real_labels)}"
    assert sim_labels == real_labels
    real, sim = ex.parse_exposition(real_full.decode()), ex.parse_exposition(sim_full.decode())
    for family in (ex.TTFT, ex.ITL, ex.TPOT, ex.E2E):
        assert sim.histograms[family].bounds == real.histograms[family].bounds, family
    assert real.histograms[ex.TTFT].bounds[:-1] == tuple(float(b) for b in B.SGLANG_DEFAULTS[B.TTFT_FLAG])
    assert real.histograms[ex.ITL].bounds[:-1] == tuple(float(b) for b in B.SGLANG_DEFAULTS[B.ITL_FLAG])
    assert real.histograms[ex.E2E].bounds[:-1] == tuple(float(b) for b in B.SGLANG_DEFAULTS[B.E2E_FLAG])


def test_rendered_bucket_flags_make_every_target_a_boundary_of_sglangs_histograms(engines):
    """The decode command the operator renders for BUCKET_SLO, given to SGLang's real parser
    and its real TokenizerMetricsCollector: every target (a speed target S as the TPOT 1/S)
    is a boundary of the histogram that serves it, SGLang's defaults stay, and the scraper's
    parse reads those boundaries back."""
    plan = rendered_decode_plan()
    sa = real.parse_engine_args(list(plan.decode.command.args), plan.decode.command.env_dict())
    slo = plan.spec.slo
    ttft_t, itl_t, e2e_t = (B.target_boundaries(slo, f) for f in (B.TTFT_FLAG, B.ITL_FLAG, B.E2E_FLAG))
    assert 1 / 30 in itl_t and 0.8 in ttft_t and 45.0 in e2e_t
    for field, targets, flag in (("bucket_time_to_first_token", ttft_t, B.TTFT_FLAG),
                                 ("bucket_inter_token_latency", itl_t, B.ITL_FLAG),
                                 ("bucket_e2e_request_latency", e2e_t, B.E2E_FLAG)):
        parsed = getattr(sa, field)
        assert parsed == sorted(parsed) and set(targets) <= set(parsed), field
        assert set(B.SGLANG_DEFAULTS[flag]) <= set(parsed), field
    pre = real.parse_engine_args(list(plan.prefill.command.args), plan.prefill.command.env_dict())
    assert pre.bucket_time_to_first_token is None and pre.bucket_inter_token_latency is None

    engine = engines["bucketed"]
    engine.requests([{"ttft": 0.5, "itl": [0.01, 0.02, 0.03], "e2e": 12.0, "stream": True}])
    _, _, page = _get(engine.url)
    scrape = ex.parse_exposition(page.decode())
    for family, targets in ((ex.TTFT, ttft_t), (ex.ITL, itl_t), (ex.TPOT, itl_t), (ex.E2E, e2e_t)):
        bounds = scrape.histograms[family].bounds
        for t in targets:
            assert any(abs(b - t) <= 1e-12 * t for b in bounds), (family, t, bounds)
        assert bounds[:-1] == tuple(float(b) for b in getattr(sa, {
            ex.TTFT: "bucket_time_to_first_token", ex.ITL: "bucket_inter_token_latency",
            ex.TPOT: "bucket_inter_token_latency", ex.E2E: "bucket_e2e_request_latency"}[family]))


def test_the_simulators_load_model_exports_the_gauges_the_planner_reads_as_real_sglang_does(engines):
    """Drift check for the simulator's load model (tools/engine_simulator/load.py), which the autoscaling
    e2e test uses in place of SGLang under load: every gauge the planner reads per role
    (``slo.LOAD_FAMILIES``: running batch, waiting queue, KV pool fill, the PD bootstrap / inflight
    queues on prefill, the prealloc / transfer queues on decode) exists on real SGLang 0.5.23's
    prefill and decode engines (their SchedulerMetricsCollector after log_stats) and on the
    simulator's, with the same type and label names, and the scraper's parse reads them from both.
    Fails when SGLang renames one or the simulator drifts."""
    from engine_simulator import LogNormal, SimConfig, start_process

    from sglang_pd_operator.metrics.slo import LOAD_FAMILIES

    real_pages = {}
    for role in ("decode", "prefill"):
        engines[role].log_stats(_fill_seed=16)
        real_pages[role] = _get(engines[role].url)[2].decode()

    async def from_simulators():
        pre = await start_process(SimConfig(role="prefill", host="127.0.0.1", port=0, bootstrap_port=0, model="m",
                                            dp_size=2, load_model=True, prefill=LogNormal(0.01)))
        dec = await start_process(SimConfig(role="decode", host="127.0.0.1", port=0, model="m", dp_size=4,
                                            load_model=True, itl=LogNormal(0.002)))
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "m", "prompt": "x", "max_tokens": 3, "bootstrap_host": "127.0.0.1",
                        "bootstrap_port": pre.config.bootstrap_port, "bootstrap_room": 7}
                answers = await asyncio.gather(s.post(pre.url + "/v1/completions", json=body),
                                               s.post(dec.url + "/v1/completions", json=body))
                assert [r.status for r in answers] == [200, 200]
            return {"prefill": _get(pre.url + "/metrics")[2].decode(), "decode": _get(dec.url + "/metrics")[2].decode()}
        finally:
            await pre.close()
            await dec.close()

    sim_pages = asyncio.run(from_simulators())
    for role, families in LOAD_FAMILIES.items():
        real_labels, sim_labels = _label_names(real_pages[role], families), _label_names(sim_pages[role], families)
        assert set(real_labels) == set(families), f"real SGLang {role} lacks {set(families) - set(real_labels)}"
        assert sim_labels == real_labels, role
        for page in (real_pages[role], sim_pages[role]):
            types = {f.name: f.type for f in text_string_to_metric_families(page)}
            assert all(types[name] == "gauge" for name in families), (role, {n: types.get(n) for n in families})
            assert set(ex.parse_exposition(page, families=families).gauges) == set(families), role


def test_the_drain_hook_reads_gauges_real_sglang_serves_and_the_simulator_too(engines):
    """Every gauge the engines' preStop drain waits on (render/drain.py ``ENGINE_GAUGES``) is a gauge
    real SGLang 0.5.23 serves on a prefill or a decode engine (running and waiting requests on
    both, the bootstrap / inflight queues on prefill, the prealloc / transfer queues on decode),
    and the simulator, which the e2e tests drain, exports the same names. Fails when SGLang
    renames one: the hook would then wait on nothing and cut requests in flight."""
    from engine_simulator import SimConfig, start_process

    from sglang_pd_operator.render.drain import ENGINE_GAUGES

    def gauges(page: str) -> set[str]:
        return {f.name for f in text_string_to_metric_families(page) if f.type == "gauge"}

    real = set()
    for role in ("decode", "prefill"):
        engines[role].log_stats(_fill_seed=4)
        real |= gauges(_get(engines[role].url)[2].decode())
    assert set(ENGINE_GAUGES) <= real, f"real SGLang serves no gauge {set(ENGINE_GAUGES) - real}"

    async def from_simulators():
        pages = set()
        for role in ("prefill", "decode"):
            sim = await start_process(SimConfig(role=role, host="127.0.0.1", port=0, bootstrap_port=0, model="m",
                                                load_model=True))
            try:
                pages |= gauges(_get(sim.url + "/metrics")[2].decode())
            finally:
                await sim.close()
        return pages

    sim = asyncio.run(from_simulators())
    assert set(ENGINE_GAUGES) <= sim, f"the simulator lacks {set(ENGINE_GAUGES) - sim}"
