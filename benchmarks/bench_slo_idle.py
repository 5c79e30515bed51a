"""Benchmark: the operator's SLO pass over idle deployments (issue 29 item 6, docs/scale.md section 5c).

N PDDeployments with an SLO, 3 pods each (prefill, decode, gateway) at loopback addresses
where nothing listens (a connection is refused at once; kwok's pod addresses on the dev
cluster time out instead, which costs a waiting task rather than CPU), handed to the real
``Scraper`` with the real ``SLOEvaluator``, ``OperatorMetrics`` and ``HealthStore``, one
pass after the other in this process. After warm-up passes (the silent pods' back-off in
place), prints the process CPU per pass and what that is per minute at the 15 s interval,
twice: with the shortcuts for deployments whose inputs did not change, and with the
scraper's and the evaluator's disabled (``holds_data`` made to answer True, so every
deployment is evaluated in full; ``HealthStore.set``'s shortcut and the empty outcome bins
stay in both figures). Not a test: no assertion on time.

    python benchmarks/bench_slo_idle.py --deployments 1000 --passes 16
"""

from __future__ import annotations

import argparse
import asyncio
import time

from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
from sglang_pd_operator.metrics.scraper import Scraper
from sglang_pd_operator.reconcilers.process_state import HealthStore

LBL = "pd.sglang-operator.io"
SLO = {"ttft": {"p90": "800ms"}, "itl": {"p90": "50ms"}, "window": "5m"}
INTERVAL_S = 15.0


def cluster(n: int) -> tuple[list[dict], dict[str, list[dict]]]:
    """``n`` PDDeployment bodies and their pods by namespace (100 per namespace)."""
    bodies, pods = [], {}
    for i in range(n):
        ns, name = f"bench-{i // 100:02d}", f"pd-{i:04d}"
        bodies.append({"metadata": {"name": name, "namespace": ns, "uid": f"u{i}", "resourceVersion": "1"},
                       "spec": {"slo": SLO}, "status": {}})
        for j, role in enumerate(("prefill", "decode", "gateway")):
            pods.setdefault(ns, []).append({
                "metadata": {"name": f"{name}-{role}", "uid": f"u{i}-{role}", "resourceVersion": "1",
                             "labels": {f"{LBL}/deployment": name, f"{LBL}/role": role, f"{LBL}/compat-key": "k"}},
                "status": {"phase": "Running", "podIP": f"127.{1 + i // 250}.{i % 250}.{j + 1}",
                           "conditions": [{"type": "Ready", "status": "True"}]}})
    return bodies, pods


def cpu_per_pass(n: int, passes: int, warm: int, *, shortcuts: bool) -> float:
    """Process CPU seconds per pass over ``n`` idle deployments (the mean of ``passes`` after ``warm``)."""
    bodies, pods = cluster(n)
    store = HealthStore(max_age_s=60)
    scraper = Scraper(serving_key_of=lambda ns, name: "k", list_deployments=lambda: bodies,
                      list_pods=lambda ns: pods.get(ns, []), interval=INTERVAL_S, metrics=OperatorMetrics(),
                      on_health=store.set)
    if not shortcuts:  # the scraper's shortcut: every deployment holds data as far as it asks
        scraper.evaluator.holds_data = lambda key: True  # type: ignore[method-assign]

    async def run(k: int) -> None:
        for _ in range(k):
            await scraper.scrape_once()

    asyncio.run(run(warm))
    if not shortcuts:  # the evaluator's own shortcut: every deployment holds data as far as it knows
        for dep in scraper.evaluator._deployments.values():
            dep.holds_data = lambda: True  # type: ignore[method-assign]
    started = time.process_time()
    asyncio.run(run(passes))
    return (time.process_time() - started) / passes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deployments", type=int, nargs="+", default=[1000])
    p.add_argument("--passes", type=int, default=16)
    p.add_argument("--warm", type=int, default=10, help="passes before timing (silent pods' back-off in place)")
    a = p.parse_args(argv)
    for n in a.deployments:
        with_s = cpu_per_pass(n, a.passes, a.warm, shortcuts=True)
        without_s = cpu_per_pass(n, a.passes, a.warm, shortcuts=False)
        per_min = 60.0 / INTERVAL_S
        print(f"{n} idle deployments ({3 * n} silent pods): {with_s * 1000:.0f} ms CPU per pass with the shortcuts "
              f"({with_s * per_min:.2f} s a minute, {with_s * per_min / 60 * 100:.1f} % of a core), "
              f"{without_s * 1000:.0f} ms without ({without_s * per_min:.2f} s a minute): "
              f"{without_s / with_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
