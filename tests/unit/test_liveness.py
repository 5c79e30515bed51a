"""Liveness: heartbeats with a bounded age, and /healthz on the metrics port.

The HTTP test talks to the real server ``OperatorMetrics.serve`` starts (the one the
chart's liveness probe reaches), not to the function behind it.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from sglang_pd_operator.runtime.liveness import Heartbeats, healthz
from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_beat_that_stops_for_longer_than_its_bound_is_named_and_a_new_beat_heals_it():
    clock = Clock()
    hb = Heartbeats(clock=clock)
    hb.register("resync", max_age_s=30)
    hb.register("slo-scraper", max_age_s=60)
    clock.t += 29
    assert hb.problems() == []
    clock.t += 2  # resync silent for 31 s
    assert hb.problems() == ["resync: no heartbeat for 31s (bound 30s)"]
    hb.beat("resync")
    assert hb.problems() == []
    hb.beat("never-registered")  # ignored, not an error
    assert hb.names() == ["resync", "slo-scraper"]
    hb.unregister("resync")
    clock.t += 100
    assert hb.problems() == ["slo-scraper: no heartbeat for 131s (bound 60s)"]


def test_a_call_in_flight_past_its_bound_is_stuck_until_it_returns():
    clock = Clock()
    hb = Heartbeats(clock=clock)
    with hb.busy("reconcile ns/a", max_s=10):
        with hb.busy("reconcile ns/b", max_s=100):
            clock.t += 11
            assert hb.problems() == ["reconcile ns/a: in flight for 11s (bound 10s)"]
        clock.t += 1
        assert hb.problems() == ["reconcile ns/a: in flight for 12s (bound 10s)"]
    assert hb.problems() == []
    with pytest.raises(ValueError):
        hb.register("x", max_age_s=0)


def test_healthz_is_200_before_any_loop_and_503_naming_what_is_stuck():
    clock = Clock()
    hb = Heartbeats(clock=clock)
    assert healthz(hb) == (200, "ok: no loops started (waiting for the leader lease)\n")
    hb.register("event-loop", max_age_s=5)
    assert healthz(hb) == (200, "ok: event-loop\n")
    clock.t += 6
    code, body = healthz(hb)
    assert code == 503 and "event-loop: no heartbeat for 6s" in body


def test_metrics_port_serves_metrics_and_healthz_that_fails_when_a_loop_is_stuck():
    clock = Clock()
    hb = Heartbeats(clock=clock)
    port = OperatorMetrics().serve(0, addr="127.0.0.1", heartbeats=hb)
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        assert resp.status == 200 and b"sglang_pd_operator_" in resp.read()
    hb.register("resync", max_age_s=10)
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
        assert resp.status == 200 and resp.read() == b"ok: resync\n"
    clock.t += 11
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{base}/healthz", timeout=5)
    assert err.value.code == 503 and b"resync: no heartbeat for 11s" in err.value.read()


def test_a_reconcile_is_in_flight_while_it_runs_and_stuck_past_the_bound(monkeypatch):
    """Runtime marks each reconcile busy in its heartbeats (what /healthz reads)."""
    from sglang_pd_operator.reconcilers import runtime as R

    clock = Clock()
    hb = Heartbeats(clock=clock)
    seen = []

    def slow_reconcile(**_):
        clock.t += 200  # a reconcile that took 200 s
        seen.append(hb.problems())
        return R.Outcome(valid=True)

    class NoKube:
        api_client = None
        cache = None

    monkeypatch.setattr(R, "reconcile", slow_reconcile)
    rt = R.Runtime(kube=NoKube(), heartbeats=hb, stuck_after_s=180)
    rt.monitoring_available = lambda: False
    rt.lws_available = lambda: False
    rt.compute_domains_available = lambda: False
    rt.catalog = lambda: None
    rt.reconcile_body({"metadata": {"namespace": "ns", "name": "d"}})
    assert seen == [["reconcile ns/d: in flight for 200s (bound 180s)"]]
    assert hb.problems() == []  # it returned
