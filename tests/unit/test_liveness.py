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


def _loop(clock: Clock):
    from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics
    from sglang_pd_operator.reconcilers.kube import Kube
    from sglang_pd_operator.reconcilers.runtime import KernelBuildRuntime, Runtime
    from sglang_pd_operator.runtime.cache import ObjectCache
    from sglang_pd_operator.runtime.controller import Controller, LoopSettings

    kube = Kube(api_client=None, cache=ObjectCache(clock=clock))  # type: ignore[arg-type]
    runtime = Runtime(kube=kube)
    kbs = KernelBuildRuntime(kube=kube, catalog=runtime.catalog, in_use=lambda ns: None)
    c = Controller(runtime=runtime, kernelbuilds=kbs, kube=kube, clock=clock, metrics=OperatorMetrics(),
                   heartbeats=Heartbeats(clock=clock), settings=LoopSettings(stuck_after_s=180, resync_s=3600))
    c.heartbeats.register("workqueue", max_age_s=180)  # as Controller.start does
    c.heartbeats.register("resync", max_age_s=180)
    runtime.catalog = lambda: None
    runtime.kinds_served = lambda api_version: frozenset()  # no API server behind: nothing optional served
    return c


def test_a_ten_minute_backlog_stays_healthy_while_workers_progress_and_a_hung_worker_turns_it_red(monkeypatch):
    """Liveness means stuck, not busy (issue 29, item 2). A catalog change queues every
    PDDeployment: 3,000 keys, one worker finishing one every second. After ten minutes the
    oldest key has waited 600 s (more than the 180 s bound the old check used) and /healthz
    is green at every tick. Then a reconcile hangs: red, naming it, while it is in flight."""
    clock = Clock()
    c = _loop(clock)
    reconciled = []
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: reconciled.append(name))
    for i in range(3000):
        c.queue.add(("PDDeployment", "ns", f"d{i:04d}"))
    previous = clock.t
    for _ in range(600):  # ten minutes: a key per second
        clock.t += 1.0
        assert c.work_one(timeout=0) is not None
        c.tick(previous, clock.t)
        previous = clock.t
        assert healthz(c.heartbeats)[0] == 200, healthz(c.heartbeats)
    stats = c.queue.stats()
    assert len(reconciled) == 600 and stats.depth == 2400 and stats.oldest_age_s >= 600
    assert c.metrics.queue_oldest_age._value.get() >= 600
    assert c.metrics.reconcile_longest_running._value.get() == 0

    seen = []

    def hang(ns, name):  # a worker stuck in one reconcile for 200 s (past the 180 s bound)
        for _ in range(200):
            clock.t += 1.0
            c.tick(clock.t - 1.0, clock.t)
        seen.append((healthz(c.heartbeats), c.metrics.reconcile_longest_running._value.get()))

    monkeypatch.setattr(c.runtime, "reconcile_key", hang)
    c.work_one(timeout=0)
    (code, body), longest = seen[0]
    assert code == 503 and "reconcile PDDeployment ns/d0600: in flight for 200s (bound 180s)" in body, body
    assert "workqueue: no heartbeat for 200s" in body  # keys wait and no worker moved
    assert longest == 200.0  # the gauge as of the last tick inside the hang
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: None)
    c.work_one(timeout=0)  # the worker came back and took the next key
    assert healthz(c.heartbeats)[0] == 200


def test_an_idle_loop_is_healthy_however_long_nothing_happens():
    clock = Clock()
    c = _loop(clock)
    for _ in range(10):
        clock.t += 100
        c.tick(clock.t - 100, clock.t)
    assert healthz(c.heartbeats)[0] == 200
