"""The simulator's load model: queues and batches that make latency grow with load (``--load-model``).

Off by default (then every latency is drawn independently, as before). On, a PD pair of
simulators follows the request flow of SGLang 0.5.23's disaggregation
(``sglang/srt/disaggregation/prefill.py`` and ``decode.py``) closely enough that
queueing shows where SGLang shows it, under the gauges SGLang sets for it
(``observability/metrics_collector.py``; ``managers/scheduler_components/metrics_reporter.py``):

decode (``DecodeLoad``), for a request carrying ``bootstrap_room``:
  1. *prealloc queue* (``sglang:num_decode_prealloc_queue_reqs``): waits while the
     requests decode holds KV for reach ``max_running`` (its KV pool is full;
     ``sglang:token_usage`` = held / max_running);
  2. *transfer queue* (``sglang:num_decode_transfer_queue_reqs``): pre-allocated, it
     tells the prefill's bootstrap server that its KV may come (``POST
     /simulator/kv`` on ``bootstrap_host:bootstrap_port``, the simulator's stand-in for the
     KV sender handshake) and waits until that prefill has sent it;
  3. *running* (``sglang:num_running_reqs``): one decode step per token; a step takes the
     drawn ITL times ``1 + itl_batch_slope x (running - 1)``: a larger decode batch makes
     every request's steps slower, as a memory-bound decode step does. The first token
     comes one step after the KV arrived, so decode's TTFT covers prefill's queueing too.

prefill (``PrefillLoad``), for the same request:
  1. *bootstrap queue* (``sglang:num_prefill_bootstrap_queue_reqs``): waits until decode
     pre-allocated (step 2 above) — a decode short of KV memory holds prefill's requests
     here, as SGLang's bootstrap queue does; gives up after ``bootstrap_timeout``
     (``sglang:num_bootstrap_failed_reqs_total``);
  2. *waiting queue* (``sglang:num_queue_reqs``): waits for one of ``prefill_slots``
     forwards (the prefill's compute: ``prefill_slots / prefill median`` requests per second);
  3. *running* (``sglang:num_running_reqs``): the drawn prefill time;
  4. *inflight* (``sglang:num_prefill_inflight_queue_reqs``): the KV transfer time, then
     decode's step 2 ends and prefill answers its one token.

A request without ``bootstrap_room`` (sent to one simulator directly) skips the
handshake: prefill queues for a slot, decode for KV memory, and decode's first token
comes after the drawn TTFT. Gauges are written for DP rank 0 (the queue is one per
simulator). It is a model for testing an autoscaler, not a performance model of SGLang.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: Path of the handshake on the prefill's bootstrap port (a simulator route, not SGLang's).
KV_PATH = "/simulator/kv"


class BootstrapTimeout(Exception):
    """No decode pre-allocated the request within the bootstrap timeout."""


@dataclass
class Room:
    """One PD request (``bootstrap_room``) on a prefill: decode is ready for its KV; its KV was sent."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)


class PrefillLoad:
    """A prefill simulator's queues (see the module docstring). ``metrics``: ``EngineMetrics``."""

    def __init__(self, *, slots: int, metrics: Any, bootstrap_timeout: float) -> None:
        self.slots = asyncio.Semaphore(max(1, slots))
        self.capacity = max(1, slots)
        self.metrics = metrics
        self.bootstrap_timeout = bootstrap_timeout
        self.rooms: dict[str, Room] = {}
        self.bootstrap = self.waiting = self.running = self.inflight = 0

    def room(self, room_id: str) -> Room:
        """The room of ``room_id`` (made by whichever side arrives first); old rooms are dropped."""
        now = time.monotonic()
        if len(self.rooms) > 1024:
            for k in [k for k, r in self.rooms.items() if now - r.created > 2 * self.bootstrap_timeout]:
                del self.rooms[k]
        return self.rooms.setdefault(room_id, Room())

    def publish(self) -> None:
        """Set the gauges SGLang's prefill scheduler sets (DP rank 0)."""
        m, labels = self.metrics, self.metrics.sched(0)
        m.prefill_bootstrap_queue.labels(**labels).set(self.bootstrap)
        m.num_queue.labels(**labels).set(self.waiting)
        m.num_running.labels(**labels).set(self.running)
        m.prefill_inflight_queue.labels(**labels).set(self.inflight)
        m.token_usage.labels(**labels).set(self.running / self.capacity)

    async def run(self, room_id: str | None, *, prefill_s: float, kv_s: float) -> None:
        """One request through bootstrap, waiting, running and inflight; raises :class:`BootstrapTimeout`."""
        room = self.room(room_id) if room_id is not None else None
        if room is not None:
            self.bootstrap += 1
            self.publish()
            try:
                await asyncio.wait_for(room.ready.wait(), self.bootstrap_timeout)
            except asyncio.TimeoutError:
                self.rooms.pop(room_id, None)
                raise BootstrapTimeout(room_id) from None
            finally:
                self.bootstrap -= 1
        self.waiting += 1
        self.publish()
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.publish()
        try:
            await asyncio.sleep(prefill_s)
        finally:
            self.running -= 1
            self.slots.release()
        self.inflight += 1
        self.publish()
        try:
            await asyncio.sleep(kv_s)
        finally:
            self.inflight -= 1
            self.publish()
        if room is not None:
            room.done.set()

    async def handshake(self, room_id: str, timeout: float) -> bool:
        """Decode's side: it pre-allocated ``room_id``; wait until the KV was sent (False: timed out)."""
        room = self.room(room_id)
        room.ready.set()
        try:
            await asyncio.wait_for(room.done.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            if room.done.is_set():
                self.rooms.pop(room_id, None)


class DecodeLoad:
    """A decode simulator's queues and batch (see the module docstring)."""

    def __init__(self, *, max_running: int, itl_batch_slope: float, metrics: Any, kv_timeout: float) -> None:
        self.max_running = max(1, max_running)
        self.slope = itl_batch_slope
        self.metrics = metrics
        self.kv_timeout = kv_timeout
        self.held = self.prealloc = self.transfer = self.running = 0
        self._freed = asyncio.Condition()

    def publish(self) -> None:
        """Set the gauges SGLang's decode scheduler sets (DP rank 0)."""
        m, labels = self.metrics, self.metrics.sched(0)
        m.decode_prealloc_queue.labels(**labels).set(self.prealloc)
        m.decode_transfer_queue.labels(**labels).set(self.transfer)
        m.num_running.labels(**labels).set(self.running)
        m.num_queue.labels(**labels).set(0)
        m.token_usage.labels(**labels).set(self.held / self.max_running)

    async def admit(self) -> None:
        """Wait in the prealloc queue for KV memory, then hold it (call :meth:`release` after)."""
        if self.held >= self.max_running:
            self.prealloc += 1
            self.publish()
            try:
                async with self._freed:
                    await self._freed.wait_for(lambda: self.held < self.max_running)
            finally:
                self.prealloc -= 1
        self.held += 1
        self.publish()

    async def release(self) -> None:
        """The request finished (or failed): its KV memory is free."""
        self.held -= 1
        self.publish()
        async with self._freed:
            self._freed.notify(1)

    async def receive_kv(self, session: aiohttp.ClientSession, host: str, port: int, room: str) -> bool:
        """The transfer queue: tell the prefill at ``host:port`` decode is ready, wait for the KV (False: failed)."""
        self.transfer += 1
        self.publish()
        try:
            async with session.post(f"http://{host}:{port}{KV_PATH}", json={"room": room},
                                    timeout=aiohttp.ClientTimeout(total=self.kv_timeout + 5)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False
        finally:
            self.transfer -= 1
            self.publish()

    def start_running(self) -> None:
        """The request joins the decode batch."""
        self.running += 1
        self.publish()

    def stop_running(self) -> None:
        """The request leaves the decode batch."""
        self.running -= 1
        self.publish()

    def step(self, drawn: float) -> float:
        """One decode step's time for a drawn ITL: ``drawn x (1 + slope x (running - 1))``."""
        return drawn * (1.0 + self.slope * max(0, self.running - 1))
