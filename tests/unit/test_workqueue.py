"""The control loop's work queue: coalescing, one worker per key, delays, capped backoff (workqueue.py)."""

from __future__ import annotations

import threading
import time

import pytest

from sglang_pd_operator.runtime.workqueue import ShutDown, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_triggers_for_a_waiting_key_coalesce_and_order_is_first_in_first_out():
    q = WorkQueue()
    for key in ("a", "b", "a", "c", "b", "a"):
        q.add(key)
    assert q.depth() == 3
    assert [q.get(timeout=0), q.get(timeout=0), q.get(timeout=0)] == ["a", "b", "c"]
    assert q.get(timeout=0) is None


def test_a_key_triggered_while_processed_runs_once_more_after_done_never_twice_at_once():
    q = WorkQueue()
    q.add("a")
    held = q.get(timeout=0)
    q.add("a")
    q.add("a")
    assert q.get(timeout=0) is None  # not handed to a second worker while held
    assert q.pending("a")
    q.done(held)
    assert q.get(timeout=0) == "a"  # exactly one more run
    q.done("a")
    assert q.get(timeout=0) is None and not q.pending("a")


def test_add_after_waits_for_its_time_and_the_earliest_delay_wins():
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("a", 10)
    q.add_after("a", 5)
    q.add_after("a", 20)
    assert q.get(timeout=0) is None and q.stats().delayed == 1
    clock.t += 5
    assert q.get(timeout=0) == "a"
    q.done("a")
    clock.t += 30
    assert q.get(timeout=0) is None  # the later delays were superseded, not kept


def test_cancel_after_drops_a_delay_asked_before_the_reconcile_began_and_keeps_one_asked_meanwhile():
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("a", 600)  # a step an earlier reconcile asked for (t=1000)
    clock.t += 1
    began = clock.t  # a reconcile of "a" begins (t=1001) ...
    assert q.cancel_after("a", asked_before=began) and q.stats().delayed == 0 and not q.pending("a")
    clock.t += 600
    assert q.get(timeout=0) is None, "the dropped delay never runs"
    q.add_after("b", 30)
    began = clock.t
    clock.t += 1
    q.add_after("b", 10)  # asked while the reconcile ran (a status write put off): kept
    assert not q.cancel_after("b", asked_before=began) and q.stats().delayed == 1
    clock.t += 10
    assert q.get(timeout=0) == "b"
    assert not q.cancel_after("c", asked_before=clock.t), "nothing delayed: nothing dropped"


def test_retry_backs_off_exponentially_up_to_the_cap_and_forget_resets_it():
    clock = Clock()
    q = WorkQueue(clock=clock, retry_base_s=0.5, retry_cap_s=4.0)
    delays = []
    for _ in range(6):
        delays.append(q.retry("a"))
        clock.t += delays[-1]
        assert q.get(timeout=0) == "a"
        q.done("a")
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    q.forget("a")
    assert q.failures("a") == 0 and q.retry("a") == 0.5


def test_oldest_age_and_depth_measure_the_ready_keys():
    clock = Clock()
    q = WorkQueue(clock=clock)
    assert q.oldest_age() == 0.0
    q.add("a")
    clock.t += 3
    q.add("b")
    clock.t += 2
    q.add("a")  # absorbed: "a" keeps its place and its age
    assert q.oldest_age() == 5.0 and q.depth() == 2
    assert q.get(timeout=0) == "a"
    assert q.oldest_age() == 2.0


def test_workers_never_hold_one_key_at_the_same_time():
    q = WorkQueue()
    in_flight: dict[str, int] = {}
    overlap = []
    runs = []
    guard = threading.Lock()

    def worker():
        while True:
            try:
                key = q.get()
            except ShutDown:
                return
            with guard:
                in_flight[key] = in_flight.get(key, 0) + 1
                if in_flight[key] > 1:
                    overlap.append(key)
            time.sleep(0.002)
            with guard:
                in_flight[key] -= 1
                runs.append(key)
            q.done(key)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(400):
        q.add(f"k{i % 5}")
    deadline = time.monotonic() + 10
    while (q.depth() or q.stats().processing) and time.monotonic() < deadline:
        time.sleep(0.01)
    q.shutdown()
    for t in threads:
        t.join(5)
    assert overlap == []
    assert set(runs) == {f"k{i}" for i in range(5)}
    assert len(runs) < 400  # triggers coalesced


def test_shutdown_wakes_waiting_workers():
    q = WorkQueue()
    errors = []

    def wait():
        try:
            q.get()
        except ShutDown:
            errors.append("shutdown")

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    q.shutdown()
    t.join(5)
    assert errors == ["shutdown"]
    with pytest.raises(ShutDown):
        q.get(timeout=0)
