"""Heartbeats with a bounded age, and the ``/healthz`` answer built from them.

kopf's own liveness endpoint answers 200 as long as its event loop runs, even while
every handler thread and the resync loop wait on a frozen API call; the metrics port
answers as long as its thread runs. Neither says the operator works. Here each loop
that must keep moving registers a :class:`Heartbeats` entry and beats it as it goes:

- ``event-loop``: a ticker task on kopf's asyncio loop (a blocked loop stops it);
- ``resync``: the control loop's timer thread, every tick;
- ``workqueue``: progress, not an empty queue: a worker took or finished a key, or no key
  waits (``controller.Controller.work_one`` and ``tick``); a backlog of any age stays
  healthy while the workers get through it, and turns red only when they stop;
- ``slo-scraper``: the SLO scraper, once per pass (failed passes count: it moves);
- ``leader-election``: every read of the Lease, leader or follower;

and each reconcile in flight is a :meth:`Heartbeats.busy` entry, stuck once it has run
longer than its bound (the longest one is the metric
``sglang_pd_operator_reconcile_longest_running_seconds``). :meth:`Heartbeats.problems` names every stale beat and stuck
call; ``/healthz`` (served on the metrics port by ``metrics.operator_metrics``, where
the chart's liveness probe looks) answers 503 with those names, else 200. A replica
that waits for the Lease has registered no work beats yet and is healthy.

Pure bookkeeping on a monotonic clock; no imports from the rest of the operator.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Default bound, seconds, on one reconcile or one loop step before it counts as stuck.
#: Every API call has a timeout (``reconcilers.kube.ApiTimeouts``: at most about 2 minutes
#: when every retry hangs), so a step older than this is frozen outside them.
DEFAULT_STUCK_AFTER_S = 180.0


@dataclass(frozen=True)
class Beat:
    """One heartbeat: when it last beat (monotonic seconds) and the age it may reach."""

    name: str
    last: float
    max_age_s: float


class Heartbeats:
    """Named heartbeats and in-flight calls; thread-safe. ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._beats: dict[str, Beat] = {}
        self._busy: dict[int, tuple[str, float, float]] = {}  # token -> (what, started, max_s)
        self._tokens = itertools.count()
        self._guard = threading.Lock()

    def register(self, name: str, *, max_age_s: float) -> None:
        """Start expecting ``name`` to beat at least every ``max_age_s`` seconds (it beats now)."""
        if max_age_s <= 0:
            raise ValueError("max_age_s must be > 0")
        with self._guard:
            self._beats[name] = Beat(name, self.clock(), max_age_s)

    def unregister(self, name: str) -> None:
        """Stop expecting ``name`` (its loop ended on purpose)."""
        with self._guard:
            self._beats.pop(name, None)

    def beat(self, name: str) -> None:
        """``name`` made progress now; a name never registered is ignored."""
        with self._guard:
            old = self._beats.get(name)
            if old is not None:
                self._beats[name] = Beat(name, self.clock(), old.max_age_s)

    @contextmanager
    def busy(self, what: str, *, max_s: float) -> Iterator[None]:
        """Mark ``what`` (e.g. ``reconcile ns/name``) in flight for the ``with`` block; stuck after ``max_s``."""
        token = next(self._tokens)
        with self._guard:
            self._busy[token] = (what, self.clock(), max_s)
        try:
            yield
        finally:
            with self._guard:
                self._busy.pop(token, None)

    def longest_busy(self, prefix: str = "") -> float:
        """Seconds the longest call in flight whose name starts with ``prefix`` has run (0.0 when none)."""
        now = self.clock()
        with self._guard:
            return max((now - started for what, started, _ in self._busy.values() if what.startswith(prefix)),
                       default=0.0)

    def problems(self) -> list[str]:
        """One line per stale heartbeat or stuck call, oldest first; empty when healthy."""
        now = self.clock()
        with self._guard:
            beats = list(self._beats.values())
            busy = list(self._busy.values())
        found = [(now - b.last, f"{b.name}: no heartbeat for {now - b.last:.0f}s (bound {b.max_age_s:.0f}s)")
                 for b in beats if now - b.last > b.max_age_s]
        found += [(now - started, f"{what}: in flight for {now - started:.0f}s (bound {max_s:.0f}s)")
                  for what, started, max_s in busy if now - started > max_s]
        return [line for _, line in sorted(found, reverse=True)]

    def names(self) -> list[str]:
        """The registered heartbeat names."""
        with self._guard:
            return sorted(self._beats)


def healthz(heartbeats: Heartbeats) -> tuple[int, str]:
    """(HTTP status, body) of ``/healthz``: 200 ``ok`` and the watched beats, or 503 and every problem."""
    problems = heartbeats.problems()
    if problems:
        return 503, "stuck:\n" + "\n".join(problems) + "\n"
    return 200, "ok: " + (", ".join(heartbeats.names()) or "no loops started (waiting for the leader lease)") + "\n"
