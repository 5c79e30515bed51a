"""Benchmark: CPU time and bytes to read N decode pods' real SGLang metrics per interval.

Not a test (no assertion on time). The scraped page is **real SGLang's**: a decode engine
shaped like a TP4 / DP-attention-4 pod (``--tp 4 --dp 4``), run by
tools/sglang_metrics_engine.py: SGLang 0.5.23's own ``TokenizerMetricsCollector`` and
``SchedulerMetricsCollector`` in their processes (one tokenizer/HTTP process, one
scheduler per TP rank) in prometheus_client multiprocess mode, served by SGLang's
``add_prometheus_middleware``. Traffic fills it as a busy engine would: finished requests
(TTFT, ITL, TPOT, e2e, token histograms, both ``is_streaming`` values), every
``SchedulerStats`` field on every rank, queue-time and per-stage histograms, CUDA-graph and
forward-time counters. Two snapshots (A, then B after more traffic) are taken; every
benchmark pod answers with them alternately (the evaluator's work does not depend on which
pod sent a text).

Printed, per spec and pod count:

- bytes and sample lines per scrape: the whole page (what real SGLang sends, ``?name[]=``
  or not) and the ``name[]``-filtered answer a filter-honouring target would send (the same
  families restricted with prometheus_client's ``_restricted_metric``, read from the
  engine's multiprocess directory), and their ratio;
- CPU per pod of one interval in steady state (the 5m window full: 20 intervals of 15 s
  already observed): parse (``exposition.parse_exposition``: line selection + the
  prometheus_client parser) + ``SLOEvaluator.observe_scrape`` for every pod, then
  ``evaluate`` of every deployment (10 pods each), for the whole page and for the
  filtered answer, and their ratio; prometheus_client's parser alone on the whole page
  (what parsing it without the line selection would cost) for comparison;
- the implied share of one core at a 15 s interval.

Specs: ``all`` targets TTFT, ITL, e2e and per-user speed (four histograms, the worst
case); ``example`` is the GB300 example's TTFT p90 + ITL p90.

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_slo.py [--pods 100 1000]
[--intervals 5] [--spec all example] [--tp 4] [--dp 4] [--priority] [--requests 400]``.
Needs the contract extras (sglang==0.5.23, fastapi, uvicorn: requirements/contract.txt).
HTTP is not included in the CPU figures (the pages are fetched once, before measuring).
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.slo import SLOEvaluator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import sglang_metrics_engine as sme  # noqa: E402

PODS_PER_DEPLOYMENT = 10
INTERVAL_S = 15.0
SPECS = {
    "all": SLOSpec(ttft={"p50": "300ms", "p90": "800ms", "p99": "2s"}, itl={"p90": "40ms", "p99": "100ms"},
                   e2e={"p90": "30s"}, perUserSpeed={"p90": 20}, window="5m"),
    "example": SLOSpec(ttft={"p90": "800ms"}, itl={"p90": "15ms"}, window="5m"),
}
STAGES = ("prefill_waiting", "decode_prepare", "decode_transferred", "decode_waiting")


class _Restricted:
    """What a ``name[]``-honouring endpoint would answer: the multiprocess metrics, each
    restricted to the asked sample names (prometheus_client's ``_restricted_metric``)."""

    def __init__(self, path: str, names: set[str]) -> None:
        self.collector = MultiProcessCollector(None, path=path)
        self.names = names

    def collect(self):
        for metric in self.collector.collect():
            m = metric._restricted_metric(self.names)
            if m:
                yield m


def traffic(engine: sme.MetricsEngine, rng: random.Random, requests: int, tp: int, seed: int) -> None:
    """One interval's worth of a busy decode engine, through SGLang's collector methods."""
    reqs = []
    for i in range(requests):
        reqs.append({"ttft": rng.lognormvariate(math.log(0.4), 0.6),
                     "itl": [rng.lognormvariate(math.log(0.025), 0.3) for _ in range(8)],
                     "stream": rng.random() < 0.8, "prompt_tokens": rng.randint(100, 20000),
                     "priority": (i % 3) if engine.tokenizer_labels.get("priority") is not None else None})
    engine.requests(reqs)
    engine.log_stats(_fill_seed=seed)
    for rank in range(tp):
        for _ in range(3):
            engine.call(rank, "observe_queue_time", rng.random())
            for stage in STAGES:
                engine.call(rank, "observe_per_stage_req_latency", stage, rng.random() / 10)
        engine.call(rank, "increment_decode_cuda_graph_pass", True)
        engine.call(rank, "increment_decode_cuda_graph_pass", False)
        engine.call(rank, "increment_forward_execution_seconds", "decode", rng.random())
        engine.call(rank, "increment_scheduler_idle_seconds", rng.random())
        engine.call(rank, "increment_scheduler_process_cpu_seconds", rng.random())
        engine.call(rank, "increment_realtime_tokens", None, decode_tokens=rng.randint(1, 5000))


def snapshot(engine: sme.MetricsEngine, specs: dict[str, SLOSpec]) -> dict[str, str]:
    """The whole page (HTTP, as SGLang serves it) and, per spec, the filtered answer."""
    with urllib.request.urlopen(engine.url, timeout=30) as resp:
        out = {"whole": resp.read().decode()}
    for name, spec in specs.items():
        names = set(ex.sample_names(SLOEvaluator().families_for("decode", spec)))
        registry = CollectorRegistry()
        registry.register(_Restricted(engine.multiproc_dir, names))
        out[name] = generate_latest(registry).decode()
    return out


def run_intervals(texts_a: list[str], texts_b: list[str], keys: list[str], intervals: int, timed_last: int,
                  spec: SLOSpec) -> list[float]:
    """Baseline scrape, then ``intervals`` intervals alternating B, A, ... (every other one
    a counter reset, which costs the same as a subtraction). CPU seconds of the last
    ``timed_last`` intervals: parse + observe of every pod, evaluate of every deployment."""
    ev = SLOEvaluator()
    families = ev.families_for("decode", spec)
    deployments = sorted(set(keys))
    for i, text in enumerate(texts_a):
        ev.observe_scrape(keys[i], "decode", f"pod-{i}", ex.parse_exposition(text, families=families), now=0.0)
    cpu = []
    for k in range(1, intervals + 1):
        texts = texts_b if k % 2 else texts_a
        now = INTERVAL_S * k
        start = time.process_time()
        for i, text in enumerate(texts):
            ev.observe_scrape(keys[i], "decode", f"pod-{i}", ex.parse_exposition(text, families=families), now=now)
        for key in deployments:
            ev.evaluate(key, spec, now=now)
        if k > intervals - timed_last:
            cpu.append(time.process_time() - start)
    return cpu


def _parser_alone(text: str, repeat: int = 20) -> float:
    """CPU seconds of prometheus_client's parser alone on ``text`` (median of 5 runs)."""
    from prometheus_client.parser import text_string_to_metric_families

    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeat):
            for fam in text_string_to_metric_families(text):
                fam.samples  # noqa: B018 - force the parse
        runs.append((time.process_time() - start) / repeat)
    return sorted(runs)[len(runs) // 2]


def _samples(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def measure(n_pods: int, timed: int, spec: SLOSpec, text_a: str, text_b: str) -> float:
    """Median CPU seconds of one steady-state interval for ``n_pods`` pods sending these texts."""
    keys = [f"bench/dep-{i // PODS_PER_DEPLOYMENT}" for i in range(n_pods)]
    gc.collect()
    cpu = run_intervals([text_a] * n_pods, [text_b] * n_pods, keys, 20 + timed, timed, spec)
    return sorted(cpu)[len(cpu) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--intervals", type=int, default=5, help="timed intervals after the window is full (median)")
    p.add_argument("--spec", nargs="+", choices=sorted(SPECS), default=["all", "example"])
    p.add_argument("--tp", type=int, default=4, help="--tp-size of the decode engine (one scheduler per rank)")
    p.add_argument("--dp", type=int, default=4, help="--attn-dp-size (DP attention ranks; 1: none)")
    p.add_argument("--priority", action="store_true", help="--enable-priority-scheduling (priority labels)")
    p.add_argument("--requests", type=int, default=400, help="requests recorded before each snapshot")
    a = p.parse_args(argv)
    specs = {name: SPECS[name] for name in a.spec}
    rng = random.Random(1)
    argv_engine = sme.engine_argv(sme.tiny_model_dir(), role="decode", tp=a.tp, attn_dp=a.dp, priority=a.priority)
    with sme.MetricsEngine(argv_engine) as engine:
        traffic(engine, rng, a.requests, a.tp, seed=1)
        snap_a = snapshot(engine, specs)
        traffic(engine, rng, a.requests // 2, a.tp, seed=2)
        snap_b = snapshot(engine, specs)
    whole = snap_b["whole"]
    parser_alone = _parser_alone(whole)
    print(f"real SGLang 0.5.23 decode page: --tp-size {a.tp} --attn-dp-size {a.dp}"
          f"{' --enable-priority-scheduling' if a.priority else ''}; {len(whole.encode()) / 1024:.1f} KiB, "
          f"{whole.count(chr(10))} lines, {_samples(whole)} samples; prometheus_client parser alone on it: "
          f"{1000 * parser_alone:.2f} ms (python {sys.version.split()[0]})")
    for name, spec in specs.items():
        filtered = snap_b[name]
        print(f"\nspec '{name}' ({PODS_PER_DEPLOYMENT} decode pods per deployment, window {spec.window}, "
              f"interval {INTERVAL_S:g} s):")
        print(f"  bytes per scrape: whole page {len(whole.encode())} ({_samples(whole)} samples), name[]-filtered "
              f"{len(filtered.encode())} ({_samples(filtered)} samples): whole / filtered = "
              f"{len(whole.encode()) / max(1, len(filtered.encode())):.1f}x")
        for n in a.pods:
            w = measure(n, a.intervals, spec, snap_a["whole"], whole)
            f = measure(n, a.intervals, spec, snap_a[name], filtered)
            print(f"  {n:5d} pods: whole page {1000 * w / n:.2f} ms/pod = {w:.3f} s per interval "
                  f"({100 * w / INTERVAL_S:.1f}% of one core); filtered {1000 * f / n:.2f} ms/pod = {f:.3f} s "
                  f"({100 * f / INTERVAL_S:.1f}%); whole / filtered = {w / f:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
