"""Benchmark: the operator's cost per SLO interval with each SLO source, at N engine pods.

``--source scrape`` (the operator scrapes every pod) and ``--source prometheus`` (it asks
the cluster's Prometheus, docs/slo.md section 9); ``both`` by default.

**Prometheus source.** A real Prometheus 3.16 server (hack/promtool/build_prometheus.py)
serves a TSDB that the real promtool backfilled (``tsdb create-blocks-from openmetrics``)
with N pods' series as the PodMonitor labels them: decode pods' TTFT and ITL histograms
with the buckets the operator renders for the spec and finished requests, prefill pods'
(TP2) KV transfer latency and failure counters, ``up`` of every pod; 7 minutes of samples
every 30 s. ``PrometheusSource.query_once`` runs over the deployments at the data's last
instant. Printed per case (``--prometheus-cases PODS:PODS_PER_DEPLOYMENT``; 3000:3 is
1,000 PDDeployments): queries per interval, the operator's CPU for the pass (process
time: HTTP, JSON, every deployment's Health) and its share of one core at a 15 s
interval, Prometheus' CPU (/proc) and wall time for the whole batch (median of
``--passes``, after one warm-up pass).

**Scrape source.**

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

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_slo.py [--source both] [--pods 100 1000 5000]
[--intervals 5] [--spec all example] [--tp 4] [--dp 4] [--priority] [--requests 400]
[--prometheus-cases 100:10 1000:10 5000:10 3000:3] [--passes 5]``.
The scrape source needs the contract extras (sglang==0.5.23, fastapi, uvicorn:
requirements/contract.txt); HTTP is not included in its CPU figures (the pages are fetched
once, before measuring). The Prometheus source needs Go (or $PROMTOOL and $PROMETHEUS).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.slo import SLOEvaluator

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


def traffic(engine, rng: random.Random, requests: int, tp: int, seed: int) -> None:
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


def snapshot(engine, specs: dict[str, SLOSpec]) -> dict[str, str]:
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


# ---------------------------------------------------------------------------------------------
# --slo-source prometheus: a real Prometheus 3.16 (hack/promtool/build_prometheus.py) holding
# N pods' series, backfilled with the real promtool (tsdb create-blocks-from openmetrics)
PROM_SCRAPE_S = 30.0     # the backfilled series' sample spacing
PROM_HISTORY_S = 420.0   # 7 minutes of samples before the evaluation instant (window 5m)


def _prefill_pods(pods_per_deployment: int) -> int:
    """Prefill pods of a deployment of ``pods_per_deployment`` (a fifth, at least one); the rest decode."""
    return max(1, pods_per_deployment // 5)


def _cumulative(bounds: list[float], median: float, sigma: float) -> list[float]:
    """Fraction of a lognormal(median, sigma) at or below each bound (the bucket shape)."""
    return [0.5 * (1 + math.erf((math.log(b) - math.log(median)) / (sigma * math.sqrt(2)))) for b in bounds]


def openmetrics(n_pods: int, pods_per_deployment: int, spec: SLOSpec, end: float) -> Iterator[str]:
    """OpenMetrics text of ``n_pods`` pods' series as the PodMonitor labels them, ending at Unix
    time ``end``: the families the Prometheus source's queries read (decode: TTFT and ITL
    histograms with the rendered buckets, finished requests; prefill: KV transfer latency,
    transfer / bootstrap failure counters; every pod: ``up``). Each pod finishes ~40 requests
    per sample interval; prefill pods are TP2 (two ``tp_rank`` series)."""
    from sglang_pd_operator.planning import buckets as B

    rendered = B.slo_buckets(spec)
    ttft_b = list(rendered.get(B.TTFT_FLAG, ex.SGLANG_BUCKETS[ex.TTFT]))
    itl_b = list(rendered.get(B.ITL_FLAG, ex.SGLANG_BUCKETS[ex.ITL]))
    kv_b = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    times = [end - PROM_HISTORY_S + PROM_SCRAPE_S * i for i in range(int(PROM_HISTORY_S / PROM_SCRAPE_S) + 1)]
    pods = []
    for i in range(n_pods):
        dep, k = divmod(i, pods_per_deployment)
        role = "prefill" if k < _prefill_pods(pods_per_deployment) else "decode"
        labels = (f'namespace="bench",deployment="dep-{dep}",role="{role}",pod="dep-{dep}-{role}-{k}",'
                  f'compat_key="key-{dep}"')
        pods.append((role, labels, 1.0 + (i % 7) / 10))

    def hist(name: str, role: str, bounds: list[float], median: float, sigma: float, extras=("",)):
        yield f"# TYPE {name} histogram"
        for r, labels, speed in pods:
            if r != role:
                continue
            shape = _cumulative(bounds, median * speed, sigma)
            for extra in extras:
                for le, frac in [*zip([f"{b:g}" for b in bounds], shape), ("+Inf", 1.0)]:
                    for n, t in enumerate(times):
                        yield f'{name}_bucket{{{labels}{extra},le="{le}"}} {int(40 * n * frac)} {t:.0f}'
                for n, t in enumerate(times):
                    yield f"{name}_count{{{labels}{extra}}} {40 * n} {t:.0f}"

    def counter(name: str, role: str | None, per_step: float, extras=("",)):
        yield f"# TYPE {name} counter"
        for r, labels, _ in pods:
            if role is not None and r != role:
                continue
            for extra in extras:
                for n, t in enumerate(times):
                    yield f"{name}_total{{{labels}{extra}}} {per_step * n:g} {t:.0f}"

    ranks = (',tp_rank="0"', ',tp_rank="1"')
    yield from hist(ex.TTFT, "decode", ttft_b, 0.4, 0.5)
    yield from hist(ex.ITL, "decode", itl_b, 0.02, 0.3)
    yield from counter(ex.REQUESTS.removesuffix("_total"), "decode", 40)
    yield from hist(ex.KV_TRANSFER_LATENCY_MS, "prefill", kv_b, 30, 0.6, ranks)
    for name in (ex.TRANSFER_FAILED, ex.BOOTSTRAP_FAILED):
        yield from counter(name.removesuffix("_total"), "prefill", 0.1, ranks)
    # what each deployment's PrometheusRule records (the Prometheus source reads these, not the raw
    # histograms: promql.recorded_slo); values as a rule evaluated every sample interval would write
    from sglang_pd_operator.api.v1alpha1 import parse_duration
    from sglang_pd_operator.metrics import promql
    from sglang_pd_operator.metrics.slo import PERCENTILES, burn_windows

    window_s = parse_duration(spec.window)
    records = [promql.recorded_name(m, p) for m in promql.RECORDED_METRICS if (t := getattr(spec, m)) is not None
               for p in PERCENTILES if getattr(t, p) is not None]
    records += [promql.ATTAINMENT_RECORD, *(promql.burn_rate_record(bw.seconds) for bw in burn_windows(window_s))]
    for name in records:
        yield f"# TYPE {name} gauge"
        for dep in range(n_pods // pods_per_deployment):
            for t in times:
                yield f'{name}{{namespace="bench",deployment="dep-{dep}"}} 0.5 {t:.0f}'
    yield "# TYPE up gauge"
    for _, labels, _ in pods:
        for t in times:
            yield f"up{{{labels}}} 1 {t:.0f}"
    yield "# EOF"


def _bodies(n_deployments: int, spec: SLOSpec) -> list[dict]:
    """PDDeployment bodies as the Prometheus source lists them (serving group ``key-<i>``: _serving_key)."""
    return [{"metadata": {"name": f"dep-{i}", "namespace": "bench"}, "spec": {"slo": spec.model_dump(exclude_none=True)}}
            for i in range(n_deployments)]


def _serving_key(namespace: str, name: str) -> str:
    """The compat key dep-<i>'s Service selects (what the operator reads from its cache)."""
    return "key-" + name.removeprefix("dep-")


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_prometheus(n_pods: int, pods_per_deployment: int, spec: SLOSpec, passes: int, work: Path) -> dict:
    """Operator CPU, queries and Prometheus' query time of one pass over ``n_pods`` pods' series."""
    import asyncio
    import subprocess

    from sglang_pd_operator.metrics.prometheus_source import PrometheusSettings, PrometheusSource

    hack = Path(__file__).resolve().parents[1] / "hack" / "promtool"
    sys.path.insert(0, str(hack))
    from build_prometheus import ensure_prometheus
    from build_promtool import ensure_promtool

    end = float(int(time.time()) // 60 * 60)
    data = work / f"tsdb-{n_pods}-{pods_per_deployment}"
    om = work / f"series-{n_pods}.om"
    t0 = time.monotonic()
    with open(om, "w") as f:
        for line in openmetrics(n_pods, pods_per_deployment, spec, end):
            f.write(line + "\n")
    series = sum(1 for line in open(om) if not line.startswith("#")) // (int(PROM_HISTORY_S / PROM_SCRAPE_S) + 1)
    subprocess.run([str(ensure_promtool()), "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                   check=True, capture_output=True)
    om.unlink()
    backfill_s = time.monotonic() - t0
    port = _free_port()
    prom = subprocess.Popen([str(ensure_prometheus()), f"--storage.tsdb.path={data}", "--log.level=warn",
                             f"--web.listen-address=127.0.0.1:{port}", f"--config.file={_empty_config(work)}",
                             "--storage.tsdb.retention.time=30d"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        n_dep = n_pods // pods_per_deployment
        bodies = _bodies(n_dep, spec)
        source = PrometheusSource(list_deployments=lambda: bodies, serving_key_of=_serving_key,
                                  list_pods=lambda ns: [], prometheus=PrometheusSettings(url=url),
                                  interval=INTERVAL_S, timeout=60, clock=lambda: end)
        cpu, wall, prom_cpu = [], [], []
        healths = []
        for _ in range(passes + 1):  # the first pass warms Prometheus' page cache
            p0, c0 = time.process_time(), _proc_cpu(prom.pid)
            healths = asyncio.run(source.query_once())
            cpu.append(time.process_time() - p0)
            prom_cpu.append(_proc_cpu(prom.pid) - c0)
            wall.append(source.last_query_seconds)
        assert len(healths) == n_dep and all(h.problem is None and h.slo.met is not None for h in healths), \
            healths[0].problem
        med = lambda xs: sorted(xs[1:])[len(xs[1:]) // 2]  # noqa: E731
        return {"pods": n_pods, "deployments": n_dep, "series": series, "queries": source.last_queries,
                "cpu": med(cpu), "query_wall": med(wall), "prometheus_cpu": med(prom_cpu), "backfill_s": backfill_s}
    finally:
        prom.terminate()
        prom.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _empty_config(work: Path) -> Path:
    path = work / "prometheus.yml"
    path.write_text("global:\n  scrape_interval: 15s\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, nargs="+", default=[100, 1000, 5000])
    p.add_argument("--intervals", type=int, default=5, help="timed intervals after the window is full (median)")
    p.add_argument("--spec", nargs="+", choices=sorted(SPECS), default=["all", "example"])
    p.add_argument("--tp", type=int, default=4, help="--tp-size of the decode engine (one scheduler per rank)")
    p.add_argument("--dp", type=int, default=4, help="--attn-dp-size (DP attention ranks; 1: none)")
    p.add_argument("--priority", action="store_true", help="--enable-priority-scheduling (priority labels)")
    p.add_argument("--requests", type=int, default=400, help="requests recorded before each snapshot")
    p.add_argument("--source", choices=["scrape", "prometheus", "both"], default="both")
    p.add_argument("--prometheus-cases", nargs="+", default=["100:10", "1000:10", "5000:10", "3000:3"],
                   metavar="PODS:PODS_PER_DEPLOYMENT",
                   help="--slo-source prometheus cases; 3000:3 is 1,000 PDDeployments")
    p.add_argument("--passes", type=int, default=5, help="timed Prometheus-source passes per case (median)")
    a = p.parse_args(argv)
    specs = {name: SPECS[name] for name in a.spec}
    if a.source in ("scrape", "both"):
        scrape_source(a, specs)
    if a.source in ("prometheus", "both"):
        prometheus_source(a, specs)
    return 0


def prometheus_source(a: argparse.Namespace, specs: dict[str, SLOSpec]) -> None:
    """Print the Prometheus source's figures for every case and spec."""
    with tempfile.TemporaryDirectory(prefix="bench-slo-prom-") as tmp:
        for name, spec in specs.items():
            print(f"\n--slo-source prometheus, spec '{name}' (window {spec.window}, interval {INTERVAL_S:g} s; "
                  f"Prometheus 3.16 holding {PROM_HISTORY_S / 60:g} min of samples every {PROM_SCRAPE_S:g} s):")
            for case in a.prometheus_cases:
                n_pods, per = (int(x) for x in case.split(":"))
                r = measure_prometheus(n_pods, per, spec, a.passes, Path(tmp))
                print(f"  {r['pods']:5d} pods, {r['deployments']:4d} PDDeployments ({r['series']} series): "
                      f"{r['queries']} queries per interval; operator CPU {1000 * r['cpu']:.1f} ms per interval "
                      f"({100 * r['cpu'] / INTERVAL_S:.2f}% of one core); Prometheus answers all in "
                      f"{1000 * r['query_wall']:.0f} ms wall, {1000 * r['prometheus_cpu']:.0f} ms of its CPU "
                      f"(backfill {r['backfill_s']:.0f} s)")


def scrape_source(a: argparse.Namespace, specs: dict[str, SLOSpec]) -> None:
    """Print the scrape source's figures (real SGLang pages) for every pod count and spec."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import sglang_metrics_engine as sme

    rng = random.Random(1)
    argv_engine = sme.engine_argv(sme.tiny_model_dir(), role="decode", tp=a.tp, attn_dp=a.dp, priority=a.priority)
    with sme.MetricsEngine(argv_engine, timeout=600) as engine:  # a loaded machine starts it slowly
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


if __name__ == "__main__":
    sys.exit(main())
