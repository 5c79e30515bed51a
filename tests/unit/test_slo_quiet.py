"""A pass over deployments whose inputs did not change (issue 29 item 6: CPU at rest).

Three shortcuts, each held to the full computation it stands for:
- ``SLOEvaluator.evaluate`` of a deployment that holds no data hands back its last result
  at the new time; it must equal ``SLOEvaluator._evaluate`` (the full reading) at every time;
- the scraper does not evaluate again a deployment with the same targets and no page this
  pass or the last; its health must say what a full evaluation says;
- ``HealthStore.set`` of a health that says the same at a later time makes no views.
"""

from __future__ import annotations

import asyncio
import copy
import itertools

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
from sglang_pd_operator.metrics.scraper import Scraper
from sglang_pd_operator.metrics.slo import SLOEvaluator
from sglang_pd_operator.reconcilers import process_state
from sglang_pd_operator.reconcilers.process_state import HealthChange, HealthStore

SPECS = [
    SLOSpec(ttft={"p90": "800ms"}, window="5m"),
    SLOSpec(ttft={"p50": "200ms", "p99": "2s"}, itl={"p90": "40ms"}, e2e={"p90": "10s"},
            perUserSpeed={"p50": 30}, window="1h", objective=0.95),
]


def _without_time(result):
    return {k: v for k, v in vars(result).items() if k != "evaluated_at"}


@pytest.mark.parametrize("spec", SPECS, ids=["ttft", "all-metrics"])
def test_a_deployment_without_data_evaluates_as_the_full_reading_does(spec, monkeypatch):
    """Evaluator A takes the shortcut, B reads every window: equal at each time, and A's full
    reading runs once while there is no data, again as soon as a pod's page arrives."""
    a, b = SLOEvaluator(resolution_s=5.0), SLOEvaluator(resolution_s=5.0)
    full = []
    real = SLOEvaluator._evaluate
    monkeypatch.setattr(a, "_evaluate", lambda *args: full.append(args[-1]) or real(a, *args))
    for t in range(15, 1200, 15):
        got, want = a.evaluate("ns/d", spec, float(t)), b._evaluate("ns/d", spec, float(t))
        assert got.evaluated_at == t and _without_time(got) == _without_time(want)
    assert full == [15.0]
    assert not a.holds_data("ns/d") and len(a._deployments["ns/d"].outcomes) == 0  # no bin for "not counted"
    # a page arrives: the shortcut ends and both read the same window
    registry = CollectorRegistry()
    ttft = Histogram(ex.TTFT, "t", buckets=ex.SGLANG_BUCKETS[ex.TTFT], registry=registry)
    itl = Histogram(ex.ITL, "i", buckets=ex.SGLANG_BUCKETS[ex.ITL], registry=registry)
    for t in (1200.0, 1215.0, 1230.0):
        for _ in range(5):
            ttft.observe(0.1)
            itl.observe(0.01)
        page = generate_latest(registry).decode()
        for ev in (a, b):
            ev.observe("ns/d", "decode", "d0", page, t)
        got, want = a.evaluate("ns/d", spec, t), b._evaluate("ns/d", spec, t)
        assert _without_time(got) == _without_time(want)
    assert full[-1] == 1230.0 and a.holds_data("ns/d") and got.met is True
    # and another spec object is read in full, even without data
    c = SLOEvaluator(resolution_s=5.0)
    c.evaluate("ns/e", spec, 15.0)
    other = SLOSpec(ttft={"p90": "1ms"}, window="1m")
    assert c.evaluate("ns/e", other, 30.0).window_seconds == 60.0


def test_not_counted_intervals_add_no_bin_and_still_replace_the_same_instant():
    ev = SLOEvaluator(resolution_s=5.0)
    for t in range(15, 600, 15):
        ev.record_interval("ns/d", 300.0, 0.9, None, float(t))
    assert len(ev._deployments["ns/d"].outcomes) == 0
    ev.record_interval("ns/d", 300.0, 0.9, False, 600.0)
    attainment, burn = ev.record_interval("ns/d", 300.0, 0.9, None, 600.0)  # 600 s again: not counted now
    assert attainment is None and all(b.intervals == 0 for b in burn)
    attainment, _ = ev.record_interval("ns/d", 300.0, 0.9, True, 600.0)
    assert attainment == 1.0


def test_a_deployment_whose_inputs_did_not_change_is_not_evaluated_again(monkeypatch):
    """Two pods nobody answers for: the second pass evaluates (the first is a baseline), later
    passes hand on that health at their own time; its content is what a full evaluation
    gives. A new pod (another targets object) is evaluated in full at once."""
    lbl = "pd.sglang-operator.io"

    def pod(name, role, ip, uid):
        return {"metadata": {"name": name, "uid": uid, "labels": {f"{lbl}/deployment": "d", f"{lbl}/role": role,
                                                                    f"{lbl}/compat-key": "k"}},
                "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}

    pods = [pod("p0", "prefill", "127.0.0.61", "u-p0"), pod("d0", "decode", "127.0.0.62", "u-d0")]
    body = {"metadata": {"name": "d", "namespace": "ns"}, "status": {},
            "spec": {"slo": {"ttft": {"p90": "800ms"}, "itl": {"p90": "40ms"}, "window": "1m"}}}
    clock = itertools.count(1000, 15)
    metrics = OperatorMetrics()
    scraper = Scraper(serving_key_of=lambda ns, n: "k", list_deployments=lambda: [body], list_pods=lambda ns: pods,
                      interval=15.0, timeout=0.5, metrics=metrics, clock=lambda: float(next(clock)))

    async def refused(url):
        return False

    async def get_refused(session, url, names):
        return False, None

    monkeypatch.setattr(scraper, "_knock", refused)
    monkeypatch.setattr(scraper, "_get", get_refused)
    evaluated = []
    real = scraper.evaluator.evaluate
    monkeypatch.setattr(scraper.evaluator, "evaluate", lambda key, spec, now: evaluated.append(now) or real(key, spec, now))

    async def passes(n):
        return [await scraper.scrape_once() for _ in range(n)]

    out = asyncio.run(passes(6))
    assert out[0] == [] and evaluated == [1000.0, 1015.0]   # a baseline, one evaluation, then none
    first = out[1][0]
    for later, at in zip((o[0] for o in out[2:]), (1030.0, 1045.0, 1060.0, 1075.0)):
        assert later.evaluated_at == at and later.slo.evaluated_at == at
        assert later.same_but_time(first) and later.reachable == {"prefill": 0, "decode": 0, "gateway": 0}
    fresh = SLOEvaluator(resolution_s=7.5)
    full = fresh.evaluate("ns/d", scraper._targets.targets(body, (), serving_key="k", ports={}).slo_spec, 1075.0)
    assert _without_time(out[-1][0].slo) == _without_time(full)
    # a restarted decode pod: other targets, evaluated in full
    pods[1] = pod("d0", "decode", "127.0.0.62", "u-d0-new")
    asyncio.run(passes(1))
    assert evaluated[-1] == 1090.0


def test_a_health_that_says_the_same_later_changes_nothing_and_makes_no_views(monkeypatch):
    from sglang_pd_operator.metrics.health import Health
    from sglang_pd_operator.metrics.slo import KVTransferResult

    views = []
    real = process_state.S.health_views
    monkeypatch.setattr(process_state.S, "health_views", lambda h: views.append(h.evaluated_at) or real(h))
    ev = SLOEvaluator()
    slo = ev.evaluate("ns/d", SPECS[0], 100.0)
    kv = KVTransferResult(latency_seconds={}, transfers=0.0, transfer_failures=0.0, bootstrap_failures=0.0,
                          failures_per_second=0.0, failure_ratio=None)
    h = Health(namespace="ns", name="d", serving_key="k", evaluated_at=100.0, ready={"decode": 1},
               reachable={"decode": 0}, slo=slo, kv_transfer=kv)
    store = HealthStore(max_age_s=60, started_at=0.0)
    assert store.set(h) is HealthChange.CONDITIONS and views == [100.0]
    later = h.restamped(160.0)
    assert later.slo.evaluated_at == 160.0 and h.slo.evaluated_at == 100.0    # the kept one is not changed
    assert store.set(later) is HealthChange.NONE and views == [100.0]
    assert store._health[("ns", "d")][0] is later                              # its age counts from 160 s
    answered = copy.copy(later)
    object.__setattr__(answered, "reachable", {"decode": 1})
    assert not answered.same_but_time(later)
    assert store.set(answered) is HealthChange.CONDITIONS and views == [100.0, 160.0]
