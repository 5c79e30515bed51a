"""Benchmark: CPU time and memory to parse and evaluate N pods' SGLang metrics per interval.

Not a test (no assertion on time). Prints, for 100 and 1,000 pods:

- the size of one pod's scrape response (lines, KiB). The pod is a decode pod of SGLang
  0.5.23 with DP attention over 8 ranks: every scheduler gauge SGLang registers, per
  ``dp_rank``; the tokenizer histograms (TTFT, ITL, e2e, TPOT, prompt/generation length)
  with both ``is_streaming`` values; the PD KV transfer histograms per ``dp_rank``. The
  response is what the operator's scraper receives: only the samples it names with
  ``?name[]=`` (``exposition.sample_names(SLOEvaluator.families_for("decode", spec))``),
  produced by prometheus_client's ``restricted_registry`` exactly as SGLang's
  ``make_asgi_app`` endpoint does (``--unfiltered``: the whole page instead);
- CPU seconds (``time.process_time``) of one interval in steady state (the 5m window
  full: 20 intervals of 15 s already observed): ``SLOEvaluator.observe`` for every pod
  (parse + per-pod increase + time slot) and ``evaluate`` for every deployment (10 pods
  each: window sums, percentiles, burn rates);
- the implied share of one core at a 15 s interval;
- memory: the evaluator's state after the run and the tracemalloc peak (a second,
  untimed run under tracemalloc), and the process' max RSS.

Specs: ``all`` targets TTFT, ITL, e2e and per-user speed (all four histograms asked, the
worst case); ``example`` is the issue's GB300 example (TTFT p90 + ITL p90).

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_slo.py [--pods 100 1000]
[--intervals 3] [--spec all example] [--unfiltered]``. The texts are generated before
measuring (they are the scrape responses); HTTP is not included.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import resource
import sys
import time
import tracemalloc
from pathlib import Path

from prometheus_client import Gauge, generate_latest

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.slo import SLOEvaluator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from engine_simulator.metrics import EngineMetrics  # noqa: E402

# Scheduler gauges of sglang 0.5.23 SchedulerMetricsCollector not already in EngineMetrics.
EXTRA_GAUGES = """num_grammar_queue_reqs decode_sum_seq_lens full_token_usage swa_token_usage mamba_usage
num_used_tokens kv_available_tokens kv_evictable_tokens kv_used_tokens swa_available_tokens swa_evictable_tokens
swa_used_tokens mamba_available_tokens mamba_evictable_tokens mamba_used_tokens spec_accept_rate spec_cap_length
spec_block_accept_length spec_num_steps spec_num_draft_tokens num_retracted_reqs num_paused_reqs
num_decode_host_receive_queue_reqs num_decode_deferred_kv_release_reqs pending_prealloc_token_usage
prealloc_full_token_usage prealloc_swa_token_usage utilization fwd_occupancy new_token_ratio is_cuda_graph
num_unique_running_routing_keys max_total_num_tokens weight_memory_usage_gb kv_cache_memory_usage_gb
page_size""".split()

DP_SIZE = 8
PODS_PER_DEPLOYMENT = 10
SPECS = {
    "all": SLOSpec(ttft={"p50": "300ms", "p90": "800ms", "p99": "2s"}, itl={"p90": "40ms", "p99": "100ms"},
                   e2e={"p90": "30s"}, perUserSpeed={"p90": 20}, window="5m"),
    "example": SLOSpec(ttft={"p90": "800ms"}, itl={"p90": "15ms"}, window="5m"),
}


class SimPod:
    """One decode pod's metrics, advanced by ``traffic`` between scrapes."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.m = EngineMetrics(model_name="deepseek-ai/DeepSeek-V4.1-Flash", role="decode", dp_size=DP_SIZE)
        self.extra: list[Gauge] = [Gauge(f"sglang:{n}", n, list(self.m.sched(0)), registry=self.m.registry)
                                   for n in EXTRA_GAUGES]
        self.traffic(50)

    def traffic(self, requests: int) -> None:
        m, rng = self.m, self.rng
        for _ in range(requests):
            stream = rng.random() < 0.8
            sl = m.stream_labels(stream)
            dp = m.sched(rng.randrange(DP_SIZE))
            m.ttft.labels(**sl).observe(rng.lognormvariate(math.log(0.4), 0.6))
            m.e2e.labels(**sl).observe(rng.lognormvariate(math.log(8), 0.5))
            m.tpot.labels(**sl).observe(rng.lognormvariate(math.log(0.025), 0.3))
            for _ in range(8):
                m.itl.labels(**m.tok_labels).observe(rng.lognormvariate(math.log(0.025), 0.3))
            m.requests.labels(**sl).inc()
            m.generation_tokens.labels(**sl).inc(256)
            m.prompt_tokens_hist.labels(**m.tok_labels).observe(rng.randint(100, 20000))
            m.generation_tokens_hist.labels(**m.tok_labels).observe(rng.randint(10, 2000))
            m.kv_transfer_latency.labels(**dp).observe(rng.lognormvariate(math.log(20), 0.5))
            m.kv_transfer_speed.labels(**dp).observe(rng.uniform(5, 50))
            m.kv_transfer_bootstrap.labels(**dp).observe(rng.uniform(1, 20))
        for i in range(DP_SIZE):
            for g in self.extra:
                g.labels(**m.sched(i)).set(rng.random() * 1000)

    def text(self, names: tuple[str, ...] | None) -> str:
        """The scrape response: only ``names`` (as ``?name[]=`` makes SGLang answer), or everything."""
        registry = self.m.registry if names is None else self.m.registry.restricted_registry(names)
        return generate_latest(registry).decode()


def run_intervals(texts_a: list[str], texts_b: list[str], keys: list[str], intervals: int,
                  timed_last: int, spec: SLOSpec) -> tuple[SLOEvaluator, list[float]]:
    """Baseline scrape, then ``intervals`` intervals alternating the two snapshots.

    Alternating B, A, B, ... makes every other scrape a counter reset (A < B), so each
    interval adds a non-zero increase either through subtraction or through the reset
    path; both cost the same. Returns the evaluator and the CPU seconds of the last
    ``timed_last`` intervals (observe of every pod + evaluate of every deployment).
    """
    ev = SLOEvaluator()
    deployments = sorted(set(keys))
    for i, text in enumerate(texts_a):
        ev.observe(keys[i], "decode", f"pod-{i}", text, now=0.0)
    cpu = []
    for k in range(1, intervals + 1):
        texts = texts_b if k % 2 else texts_a
        now = 15.0 * k
        start = time.process_time()
        for i, text in enumerate(texts):
            ev.observe(keys[i], "decode", f"pod-{i}", text, now=now)
        for key in deployments:
            ev.evaluate(key, spec, now=now)
        if k > intervals - timed_last:
            cpu.append(time.process_time() - start)
    return ev, cpu


def measure(n_pods: int, timed: int, spec: SLOSpec, filtered: bool) -> dict:
    names = ex.sample_names(SLOEvaluator().families_for("decode", spec)) if filtered else None
    pods = [SimPod(seed=i) for i in range(n_pods)]
    keys = [f"bench/dep-{i // PODS_PER_DEPLOYMENT}" for i in range(n_pods)]
    texts_a = [p.text(names) for p in pods]
    for p in pods:
        p.traffic(20)
    texts_b = [p.text(names) for p in pods]
    del pods
    intervals = 20 + timed                      # 20 intervals of 15 s fill the 5m window
    gc.collect()
    _, cpu = run_intervals(texts_a, texts_b, keys, intervals, timed, spec)
    gc.collect()
    tracemalloc.start()                          # a second, untimed run for memory
    ev, _ = run_intervals(texts_a, texts_b, keys, intervals, 0, spec)
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del ev
    sample_lines = sum(1 for line in texts_b[0].splitlines() if line and not line.startswith("#"))
    parse_s = _parse_cost(texts_b[0])
    return {
        "pods": n_pods, "lines_per_pod": texts_a[0].count("\n"), "kib_per_pod": len(texts_a[0].encode()) / 1024,
        "sample_lines": sample_lines, "parse_ms": 1000 * parse_s,
        "cpu_s": sorted(cpu)[len(cpu) // 2], "cpu_all": cpu,
        "peak_mib": peak / 2**20, "retained_mib": current / 2**20,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _parse_cost(text: str, repeat: int = 50) -> float:
    """CPU seconds of prometheus_client's parser alone on one response (median of runs)."""
    from prometheus_client.parser import text_string_to_metric_families

    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeat):
            for fam in text_string_to_metric_families(text):
                fam.samples  # noqa: B018 - force the parse
        runs.append((time.process_time() - start) / repeat)
    return sorted(runs)[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--intervals", type=int, default=5,
                   help="timed intervals after the window is full (the median is reported)")
    p.add_argument("--spec", nargs="+", choices=sorted(SPECS), default=["all", "example"])
    p.add_argument("--unfiltered", action="store_true", help="parse the whole /metrics page (no name[] filter)")
    a = p.parse_args(argv)
    for spec_name in a.spec:
        spec = SPECS[spec_name]
        print(f"SLO evaluation cost per 15 s interval, spec '{spec_name}' ({PODS_PER_DEPLOYMENT} decode pods per "
              f"deployment, dp_size {DP_SIZE}, window {spec.window}, "
              f"{'whole page' if a.unfiltered else 'name[]-filtered response'}; python {sys.version.split()[0]})")
        for n in a.pods:
            r = measure(n, a.intervals, spec, not a.unfiltered)
            print(f"{r['pods']:5d} pods: response {r['lines_per_pod']} lines ({r['sample_lines']} samples) / "
                  f"{r['kib_per_pod']:.1f} KiB per pod; prometheus_client parser alone {r['parse_ms']:.2f} ms/pod; "
                  f"CPU {r['cpu_s']:.3f} s per interval (runs: {', '.join(f'{x:.3f}' for x in r['cpu_all'])}) "
                  f"= {100 * r['cpu_s'] / 15.0:.1f}% of one core at 15 s; "
                  f"{1000 * r['cpu_s'] / r['pods']:.2f} ms/pod; evaluator state {r['retained_mib']:.1f} MiB, "
                  f"tracemalloc peak {r['peak_mib']:.1f} MiB; process max RSS {r['max_rss_mib']:.0f} MiB "
                  "(includes the generated texts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
