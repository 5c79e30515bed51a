"""Leader election: a leader that cannot renew stops before its Lease can pass to another.

The watchdog is timed from when the last successful renewal was *sent*; a follower takes
over only a lease duration after it saw that renewal. These tests drive the watchdog on
a fake clock; the e2e test (tests/e2e/test_resilience.py) runs two real processes.
"""

from __future__ import annotations

import threading
import time

from sglang_pd_operator.runtime.leader import LeaderSettings, RenewWatchdog, default_identity, default_lease_namespace


def test_watchdog_fires_once_when_no_renewal_was_sent_within_the_deadline():
    now, fired = {"t": 0.0}, []
    dog = RenewWatchdog(deadline=10, on_expired=lambda: fired.append(now["t"]), clock=lambda: now["t"])
    assert not dog.check() and dog.age() is None  # not leading yet: nothing to expire
    dog.renewed(0.0)
    now["t"] = 8.0
    dog.renewed(6.0)  # a renewal sent at 6 s answered at 8 s
    dog.renewed(2.0)  # an older answer arriving late does not move the clock back
    now["t"] = 16.0
    assert not dog.check()
    now["t"] = 16.5  # 10.5 s since the last successful renewal was sent
    assert dog.check() and fired == [16.5]
    now["t"] = 30.0
    assert dog.check() and fired == [16.5]  # once


def test_watchdog_thread_ends_leadership_while_renewals_hang_and_not_after_a_stop():
    """The thread on a fake clock: it fires once the clock passes the deadline, and a stopped
    watchdog never fires however far the clock moves (its thread has ended)."""
    now = {"t": 0.0}
    fired = threading.Event()
    dog = RenewWatchdog(deadline=10, on_expired=fired.set, tick=0.01, clock=lambda: now["t"])
    dog.renewed(0.0)
    dog.start()
    now["t"] = 9.0
    assert not dog.check() and not fired.is_set()  # within the deadline
    now["t"] = 10.5  # no renewal: as when every Lease call hangs
    assert fired.wait(5)
    dog.stop()
    late = threading.Event()
    stopped = RenewWatchdog(deadline=10, on_expired=late.set, tick=0.01, clock=lambda: now["t"])
    stopped.renewed(now["t"])
    before = set(threading.enumerate())
    stopped.start()
    (thread,) = set(threading.enumerate()) - before
    stopped.stop()  # a graceful release
    thread.join(5)
    now["t"] += 100
    assert not thread.is_alive() and not late.is_set()


def test_the_stop_comes_before_a_follower_can_take_over():
    """Deadline + one tick < lease duration for the defaults and the chart's timing."""
    for settings in (LeaderSettings(lease_name="l", namespace="n", identity="i"),
                     LeaderSettings(lease_name="l", namespace="n", identity="i", lease_duration=6, renew_deadline=4,
                                    retry_period=1)):
        assert settings.renew_deadline + RenewWatchdog(deadline=1, on_expired=lambda: None).tick < settings.lease_duration
        connect, read = settings.request_timeout
        assert connect == read == settings.renew_deadline / 2  # a hung call gives the loop a retry in the deadline


def test_identities_differ_per_process_and_the_lease_namespace_has_a_default(monkeypatch, tmp_path):
    from sglang_pd_operator.runtime import leader

    monkeypatch.delenv("POD_NAME", raising=False)
    assert default_identity() != default_identity()
    monkeypatch.setenv("POD_NAME", "op-0")
    assert default_identity() == "op-0"
    monkeypatch.setattr(leader, "_SA_NAMESPACE", tmp_path / "absent")
    assert default_lease_namespace(kubeconfig_namespace="ops")[0] == "ops"
    assert default_lease_namespace()[0] == "default"
    (tmp_path / "ns").write_text("sglang-system\n")
    monkeypatch.setattr(leader, "_SA_NAMESPACE", tmp_path / "ns")
    assert default_lease_namespace(kubeconfig_namespace="ops")[0] == "sglang-system"  # in a pod
