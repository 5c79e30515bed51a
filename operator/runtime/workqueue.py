"""A work queue of keys with the semantics of client-go's workqueue: coalescing, one worker per key, backoff.

The operator's control loop (``controller.py``) feeds every trigger (a watch event of a
PDDeployment, a KernelBuild or one of their children, an SLO figure that moved, the
periodic resync, a time-based rollout step) into one :class:`WorkQueue`; a bounded pool
of worker threads takes keys from it and reconciles them.

- **Coalescing**: a key is in the queue at most once. Triggers for a key that waits
  are absorbed; triggers for a key being processed mark it *dirty*, and it is queued
  once more when its worker calls :meth:`WorkQueue.done` — never two workers on one key.
- **Order**: first in, first out, by the time a key first entered the queue (an absorbed
  trigger does not move it back).
- **Delays**: :meth:`WorkQueue.add_after` queues a key once its time comes (a rollout's
  drain grace period ends; a retry after a failure). An earlier add wins over a later one.
- **Backoff**: :meth:`WorkQueue.retry` queues a failed key after ``base * 2**failures``
  seconds, capped at ``cap``; :meth:`WorkQueue.forget` resets the count after a success.
- **Observability**: :meth:`WorkQueue.depth` (keys waiting, ready now) and
  :meth:`WorkQueue.oldest_age` (seconds the longest-waiting ready key has waited).

Thread-safe; keys are any hashable value. No imports from the rest of the operator.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

#: Seconds before the first retry of a failed key, doubled per further failure.
DEFAULT_RETRY_BASE_S = 0.5
#: Longest wait, seconds, before a failed key is retried.
DEFAULT_RETRY_CAP_S = 120.0


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and empty of ready keys."""


@dataclass(frozen=True)
class QueueStats:
    """A snapshot: ``depth`` ready keys, ``delayed`` keys waiting for their time,
    ``processing`` keys held by workers, ``oldest_age_s`` of the longest-waiting ready key
    (0.0 when none waits), ``retries`` failed keys waiting for a retry."""

    depth: int
    delayed: int
    processing: int
    oldest_age_s: float
    retries: int


class WorkQueue:
    """Coalescing FIFO of keys with delayed adds and capped exponential retry backoff (see the module docstring).

    ``clock``: monotonic seconds. ``retry_base_s`` / ``retry_cap_s``: the backoff of
    :meth:`retry`: ``min(cap, base * 2**n)`` after the n-th consecutive failure (n from 0).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 retry_base_s: float = DEFAULT_RETRY_BASE_S, retry_cap_s: float = DEFAULT_RETRY_CAP_S) -> None:
        if retry_base_s <= 0 or retry_cap_s < retry_base_s:
            raise ValueError("need 0 < retry_base_s <= retry_cap_s")
        self.clock = clock
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self._cond = threading.Condition()
        self._ready: OrderedDict[Hashable, float] = OrderedDict()  # key -> when it became ready
        self._processing: set[Hashable] = set()
        self._dirty: set[Hashable] = set()  # processing keys triggered again meanwhile
        self._delayed: dict[Hashable, float] = {}  # key -> due time (the earliest asked)
        self._delayed_asked: dict[Hashable, float] = {}  # key -> when its due time was asked for
        self._heap: list[tuple[float, int, Hashable]] = []  # (due, seq, key); stale entries skipped
        self._seq = itertools.count()
        self._failures: dict[Hashable, int] = {}
        self._shutdown = False

    # ------------------------------------------------------------------ adding
    def add(self, key: Hashable) -> None:
        """Queue ``key`` now (absorbed when it already waits; marked dirty while a worker holds it)."""
        with self._cond:
            self._add_locked(key, self.clock())

    def add_after(self, key: Hashable, delay_s: float) -> None:
        """Queue ``key`` once ``delay_s`` seconds have passed (now when ``delay_s <= 0``).

        A key may wait for several times; the earliest wins. A key that is ready or being
        processed keeps its delayed add too (the later run sees the later state).
        """
        if delay_s <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            due = self.clock() + delay_s
            old = self._delayed.get(key)
            if old is not None and old <= due:
                return
            self._delayed[key] = due
            self._delayed_asked[key] = self.clock()
            heapq.heappush(self._heap, (due, next(self._seq), key))
            self._cond.notify()

    def cancel_after(self, key: Hashable, *, asked_before: float) -> bool:
        """Drop ``key``'s delayed add when it was asked for before ``asked_before`` (the queue's clock).

        A reconcile that succeeded computed every later look its key needs from the state it
        read; a delayed add asked before it began (an earlier reconcile's step, a failure's
        backoff, a status write put off) is superseded, and would only run a reconcile that
        finds nothing to do (1,000 of them a progress deadline after a burst). One asked
        meanwhile stays. True when one was dropped. The heap's entry is skipped when it comes due.
        """
        with self._cond:
            if key in self._delayed and self._delayed_asked.get(key, 0.0) < asked_before:
                del self._delayed[key]
                self._delayed_asked.pop(key, None)
                return True
            return False

    def retry(self, key: Hashable) -> float:
        """Queue a failed ``key`` after its backoff; returns the delay in seconds."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = min(self.retry_cap_s, self.retry_base_s * (2 ** min(n, 30)))
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """Reset ``key``'s failure count (its reconcile succeeded)."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        """Consecutive failures recorded for ``key``."""
        with self._cond:
            return self._failures.get(key, 0)

    def _add_locked(self, key: Hashable, now: float) -> None:
        if self._shutdown:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._ready:
            self._ready[key] = now
            self._cond.notify()

    def _promote_due_locked(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            due, _, key = heapq.heappop(self._heap)
            if self._delayed.get(key) != due:
                continue  # superseded by an earlier add_after of the same key
            del self._delayed[key]
            self._delayed_asked.pop(key, None)
            self._add_locked(key, now)

    # ------------------------------------------------------------------ taking
    def get(self, timeout: float | None = None) -> Hashable | None:
        """The next ready key, held by the caller until :meth:`done`; None after ``timeout`` seconds.

        Raises :class:`ShutDown` once the queue is shut down.
        """
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    raise ShutDown()
                now = self.clock()
                self._promote_due_locked(now)
                if self._ready:
                    key, _ = self._ready.popitem(last=False)
                    self._processing.add(key)
                    return key
                wait = None if deadline is None else deadline - now
                if wait is not None and wait <= 0:
                    return None
                if self._heap:
                    until_due = max(0.0, self._heap[0][0] - now)
                    wait = until_due if wait is None else min(wait, until_due)
                self._cond.wait(wait)

    def done(self, key: Hashable) -> None:
        """The worker finished ``key``; queue it again when it was triggered meanwhile."""
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key, self.clock())

    def shutdown(self) -> None:
        """Wake every waiting worker with :class:`ShutDown`; later adds are ignored."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ looking
    def depth(self) -> int:
        """Keys ready to be processed now (delayed keys that are due count)."""
        with self._cond:
            self._promote_due_locked(self.clock())
            return len(self._ready)

    def oldest_age(self) -> float:
        """Seconds the longest-waiting ready key has waited (0.0 when none waits)."""
        with self._cond:
            now = self.clock()
            self._promote_due_locked(now)
            if not self._ready:
                return 0.0
            return now - next(iter(self._ready.values()))

    def stats(self) -> QueueStats:
        """A consistent :class:`QueueStats` snapshot."""
        with self._cond:
            now = self.clock()
            self._promote_due_locked(now)
            oldest = now - next(iter(self._ready.values())) if self._ready else 0.0
            return QueueStats(depth=len(self._ready), delayed=len(self._delayed), processing=len(self._processing),
                              oldest_age_s=oldest, retries=len(self._failures))

    def pending(self, key: Hashable) -> bool:
        """True when ``key`` is ready, delayed, or will run again after its current run."""
        with self._cond:
            return key in self._ready or key in self._delayed or key in self._dirty
