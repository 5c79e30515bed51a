"""The SLO machinery's bounds (issue 15): ``spec.slo.window`` has a maximum in the CRD, and
the evaluator's state stays bounded whatever the window and the scrape interval."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sglang_pd_operator.api.cel import violations
from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics import slo as slo_mod
from sglang_pd_operator.metrics.slo import SLOEvaluator


@pytest.mark.parametrize("window,ok", [("5m", True), ("1h", True), ("60m", True), ("61m", False), ("24h", False)])
def test_slo_window_has_a_maximum_in_the_schema(window, ok):
    doc = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
           "metadata": {"name": "d", "namespace": "ns"}, "spec": {"slo": {"ttft": {"p90": "1s"}, "window": window}}}
    bad = [v for v in violations(doc) if v.field == "spec.slo.window"]
    assert (not bad) == ok, bad
    if not ok:
        assert "at most 1h" in bad[0].message and "set a window of 1h or less" in bad[0].message


def test_the_evaluator_keeps_bounded_state_whatever_the_window_and_interval():
    """An evaluation every 30 s for 73 hours of a 1h window: slots and outcome bins stay bounded."""
    ev = SLOEvaluator(resolution_s=1.0)
    spec = SLOSpec(ttft={"p90": "800ms"}, window="1h")
    registry = CollectorRegistry()
    ttft = Histogram(ex.TTFT, "t", buckets=ex.SGLANG_BUCKETS[ex.TTFT], registry=registry)
    t, step = 0.0, 30.0
    ev.observe("ns/d", "decode", "d0", generate_latest(registry).decode(), t)
    while t < 73 * 3600:
        t += step
        ttft.observe(0.1)
        ev.observe("ns/d", "decode", "d0", generate_latest(registry).decode(), t)
        ev.evaluate("ns/d", spec, t)
    dep = ev._deployments["ns/d"]
    assert len(dep.roles["decode"].slots) <= slo_mod.SLOTS_PER_WINDOW + 2
    assert len(dep.outcomes) <= 72 * slo_mod.OUTCOME_BINS_PER_WINDOW + 2
    result = ev.evaluate("ns/d", spec, t)
    assert result.met is True and result.attainment == 1.0
    # the window still holds one hour of requests (edges exact to one slot: 30 s)
    assert abs(result.targets[0].observations - 3600 / step) <= 1


def test_outcome_bins_count_every_burn_window_as_per_interval_counting_would():
    """Outcomes of 80 windows at a 15 s interval with a 5m window: the attainment window and the
    burn windows up to 12 W count exactly what one entry per interval would; the 72 W window to
    one window's intervals (its old bins are one window wide); at most 12 x 60 fine bins + 73 coarse."""
    import random

    ev = SLOEvaluator(resolution_s=5.0)
    rng = random.Random(7)
    window, step = 300.0, 15.0
    history: list[tuple[float, bool | None]] = []
    t = 0.0
    while t < 80 * window:
        t += step
        met = rng.choice([True, True, True, False, None])
        history.append((t, met))
        attainment, burn = ev.record_interval("ns/d", window, 0.99, met, t)

    def naive(span: float) -> tuple[int, int]:
        inside = [m for at, m in history if t - span < at <= t and m is not None]
        return sum(inside), len(inside)

    good, counted = naive(window)
    assert attainment == good / counted
    by_name = {b.window.name: b for b in burn}
    for name in ("page_short", "page_long", "ticket_short"):
        assert by_name[name].intervals == naive(by_name[name].window.seconds)[1], name
    long_window = by_name["ticket_long"].window.seconds
    assert abs(by_name["ticket_long"].intervals - naive(long_window)[1]) <= window / step
    bins = ev._deployments["ns/d"].outcomes
    assert len(bins) <= slo_mod.FINE_OUTCOME_WINDOWS * slo_mod.OUTCOME_BINS_PER_WINDOW + 73
    assert bins.coarse <= 73 and len(bins) - bins.coarse <= 12 * window / step + 1


def test_the_same_instant_again_replaces_its_outcome():
    ev = SLOEvaluator(resolution_s=5.0)
    ev.record_interval("ns/d", 300.0, 0.9, True, 15.0)
    ev.record_interval("ns/d", 300.0, 0.9, False, 30.0)
    attainment, _ = ev.record_interval("ns/d", 300.0, 0.9, True, 30.0)  # 30 s again: replaces False
    assert attainment == 1.0
    attainment, _ = ev.record_interval("ns/d", 300.0, 0.9, None, 30.0)  # not counted any more
    assert attainment == 1.0 and ev._deployments["ns/d"].outcomes.count(30.0, 300.0) == (1, 1)
