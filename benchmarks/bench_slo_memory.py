"""Benchmark: memory the SLO evaluator keeps for one PDDeployment in steady state, per window.

Not a test (nothing asserted). One PDDeployment with one prefill and two decode pods,
scraped every ``--interval`` seconds (15 s, the operator's default) and evaluated after
every scrape, with a spec that targets TTFT, ITL, e2e and per-user speed (four decode
histograms, the worst case) plus what the evaluator always reads (KV transfer latency
on prefill, the failure and request counters). Steady state is the state after 73
windows: the increases of the last window (``retention``) and the outcomes of the last
72 windows (the ticket burn window).

The 72 windows of outcome history are built without evaluating them one by one where
that would take hours: an evaluator without outcome bins (before issue 15) keeps one
``(time, outcome)`` per evaluation, so its history is appended directly, one entry per
interval; one with bins (``OUTCOME_BINS_PER_WINDOW``) is evaluated once per bin width,
which leaves the same bins as one evaluation per interval. The last window is always
scraped and evaluated for real. Memory is ``tracemalloc``'s count of the bytes still
allocated after a ``gc.collect()``, minus what was allocated before the evaluator was
made (the synthetic pod pages are made beforehand and not counted).

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_slo_memory.py [--windows 5m 1h]
[--interval 15] [--slo-module PATH]``; ``--slo-module`` loads the evaluator from another
copy of ``metrics/slo.py``, e.g. ``git show 468abb0:operator/metrics/slo.py > /tmp/slo_old.py``
for the figures before the bound.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import sys
import tracemalloc
from pathlib import Path

from sglang_pd_operator.api.v1alpha1 import SLOSpec, parse_duration
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import Histogram

KEY = "ns/bench"
PODS = (("prefill", "prefill-0"), ("decode", "decode-0"), ("decode", "decode-1"))


def load_slo(path: str | None):
    """The ``metrics/slo.py`` module: the installed one, or a copy at ``path``."""
    if path is None:
        from sglang_pd_operator.metrics import slo

        return slo
    spec = importlib.util.spec_from_file_location("slo_under_test", Path(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _histogram(bounds: tuple[float, ...], n: float, rng: random.Random) -> Histogram:
    full = tuple(bounds) + (float("inf"),)
    counts, c = [], 0.0
    for _ in full:
        c += rng.randint(0, 3) * n
        counts.append(c)
    return Histogram(bounds=full, counts=tuple(counts), sum=c * 0.1, count=c)


def pages(intervals: int, seed: int = 1) -> list[dict[str, ex.Scrape]]:
    """Cumulative scrapes of every pod for ``intervals`` + 1 scrapes (counts grow every interval)."""
    rng = random.Random(seed)
    b = ex.SGLANG_BUCKETS
    out = []
    for k in range(intervals + 1):
        by_pod = {}
        for role, pod in PODS:
            if role == "prefill":
                hists = {ex.KV_TRANSFER_LATENCY_MS: _histogram(b[ex.KV_TRANSFER_LATENCY_MS], k + 1, rng)}
                counters = {ex.TRANSFER_FAILED: 0.0, ex.BOOTSTRAP_FAILED: 0.0}
            else:
                hists = {f: _histogram(b[f], k + 1, rng) for f in (ex.TTFT, ex.ITL, ex.E2E, ex.TPOT)}
                counters = {ex.TRANSFER_FAILED: 0.0, ex.BOOTSTRAP_FAILED: 0.0, ex.REQUESTS: 40.0 * (k + 1)}
            by_pod[pod] = ex.Scrape(histograms=hists, counters=counters)
        out.append(by_pod)
    return out


def steady_state_bytes(slo, window: str, interval: float) -> tuple[int, int, int]:
    """(bytes kept, outcome entries, slots per decode role) after 73 windows of ``window``."""
    spec = SLOSpec(ttft={"p90": "800ms"}, itl={"p90": "40ms"}, e2e={"p90": "30s"}, perUserSpeed={"p90": 20},
                   window=window)
    window_s = parse_duration(window)
    last = int(window_s // interval) + 2
    scrapes = pages(last)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    ev = slo.SLOEvaluator()
    history_end = 72 * window_s
    ev.evaluate(KEY, spec, now=0.0)
    bins = getattr(slo, "OUTCOME_BINS_PER_WINDOW", None)
    dep = ev._deployments[KEY]
    if bins is None:  # one (t, outcome) per evaluation
        t = interval
        while t < history_end:
            dep.outcomes.append((t, True))
            t += interval
    else:
        step = max(interval, window_s / bins)
        t = step
        while t < history_end:
            ev.evaluate(KEY, spec, now=t)
            t += step
    for k, by_pod in enumerate(scrapes):
        now = history_end + k * interval
        for role, pod in PODS:
            ev.observe_scrape(KEY, role, pod, by_pod[pod], now)
        if k:
            ev.evaluate(KEY, spec, now=now)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return kept, len(dep.outcomes), len(dep.roles["decode"].slots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", nargs="+", default=["5m", "1h"])
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--slo-module", default=None, help="path of another metrics/slo.py to measure")
    args = parser.parse_args()
    slo = load_slo(args.slo_module)
    print(f"evaluator: {args.slo_module or 'installed sglang_pd_operator.metrics.slo'}; interval {args.interval:g}s; "
          "1 prefill + 2 decode pods; TTFT, ITL, e2e, per-user speed targets")
    print(f"{'window':>7} {'kept MB':>9} {'outcome entries':>16} {'decode slots':>13}")
    for window in args.windows:
        kept, outcomes, slots = steady_state_bytes(slo, window, args.interval)
        print(f"{window:>7} {kept / 1e6:>9.2f} {outcomes:>16} {slots:>13}")


if __name__ == "__main__":
    main()
