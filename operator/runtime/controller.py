"""The control loop: one work queue, bounded workers, a spread resync, the SLO scraper in its own thread.

One reflector per watched kind (``informer.py``; the API server selects the children by
label, see ``cache.py`` ``WATCHED``) hands every watch event to :meth:`Controller.observe`,
and every change a re-list finds (deletions included) to the same queueing: the event
updates the shared :class:`~.cache.ObjectCache`
and, when it can change what a reconcile does, queues the key of the PDDeployment or
KernelBuild it concerns. Everything else that calls for a reconcile goes through the
same :class:`~.workqueue.WorkQueue`:

- an SLO figure that moved (the scraper thread; transitions at once, figures at most
  every ``LoopSettings.slo_status_period_s``; for a deployment the built-in planner scales,
  a move of what the planner reads at once, ``Runtime.planner_moved``);
- a time-based step a reconcile asked for (``Outcome.requeue_after``: a drain grace
  period or a progress deadline ending; a KernelBuild that is not finished);
- a deployment whose SLO figures went stale (SLOMet turns Unknown);
- a failed reconcile (retried with capped exponential backoff);
- the resync: every key once per ``resync_s``, each at its own offset in the period
  (a hash of its uid), so a thousand keys cost a steady trickle, not a burst; a key whose
  inputs did not change since its last reconcile is skipped (:class:`InputLedger`);
- a changed kernel catalog, or a change of the kinds the API server serves (every
  PDDeployment).

``workers`` threads take keys from the queue; a key is reconciled by one worker at a
time and triggers that arrive meanwhile coalesce into one more run. The queue's depth,
the age of its oldest key and the longest-running reconcile are metrics. Liveness
(``/healthz``) means stuck, not busy: it fails when no worker took or finished a key for
``stuck_after_s`` while keys wait, a reconcile runs longer than that, the ticker stops,
or the scraper stops passing; a long backlog (a catalog change queues every
PDDeployment) that workers work through keeps it green.

Before any worker starts, :meth:`Controller.start` fills the cache with one LIST per
watched kind, so no reconcile acts on a half-known world; each kind's watch then starts
from its LIST's resourceVersion, and LISTs again only after 410 Gone. When a burst of
reconciles is over (the queue idle after at least ``heap.TRIM_AFTER_RECONCILES``), the
ticker gives the heap's freed memory back to the OS (``heap.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..kernelbuild.inputs import LABEL_KERNELBUILD
from ..metrics.health import Health
from ..metrics.operator_metrics import UNCHANGED, OperatorMetrics
from ..metrics.prometheus_source import PrometheusSettings
from ..metrics.scraper import deployment_view, pod_view
from ..metrics.sources import SCRAPE, make_slo_source
from ..reconcilers.apierrors import brief, namespace_terminating
from ..reconcilers.kube import Kube, outside_reads
from ..reconcilers.observe import unschedulable_reason
from ..reconcilers.runtime import HealthChange, KernelBuildRuntime, Runtime
from ..render.labels import LABEL_DEPLOYMENT
from .cache import WATCHED, Change, ObjectCache, WatchedKind
from .heap import TrimPolicy, settle_heap
from .informer import Reflector
from .liveness import Heartbeats
from .workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)

PDDEPLOYMENT, KERNELBUILD = "PDDeployment", "KernelBuild"
Key = tuple[str, str, str]  # (kind, namespace, name)

#: Seconds between two ticks of the loop's timer thread (resync slots, staleness, metrics, liveness).
TICK_S = 1.0
#: Seconds until an unfinished KernelBuild is looked at again (its Job's progress, backoff, timeouts).
KERNELBUILD_POLL_S = 10.0
#: Seconds between looks for an optional kind served only since the operator started (then listed and watched).
UNWATCHED_POLL_S = 10.0
#: Seconds the first LIST of a kind may keep failing at start (429s aside) before the start fails.
START_LIST_DEADLINE_S = 60.0


class InputLedger:
    """Which keys' inputs moved since their last reconcile: what lets the resync skip a key (thread-safe).

    Every trigger of a key but the resync itself (a watch event or re-list change of the
    object or a child, an SLO change, a stale measurement, the catalog, served kinds,
    a planner's move, the start) counts as a move (:meth:`moved`). A reconcile records
    the count it began with (:meth:`began`); when it succeeds, asks for no later look
    (``requeue_after``) and read nothing from outside the operator's view
    (``kube.outside_reads``: an HPA, a PodMonitor, a PVC, the admin's catalog), the key is
    *settled* at that count (:meth:`finished`). A resync of a settled key whose count has
    not moved since (:meth:`unchanged`) would compute what its last reconcile computed from
    the same inputs; it is skipped. A move during the reconcile leaves the key unsettled
    (it is queued again anyway). A failed reconcile unsettles it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._moves: dict[Key, int] = {}
        self._settled: dict[Key, int] = {}

    def moved(self, key: Key) -> None:
        """An input of ``key`` changed (or may have)."""
        with self._lock:
            self._moves[key] = self._moves.get(key, 0) + 1

    def began(self, key: Key) -> int:
        """A reconcile of ``key`` begins: the move count it sees (hand it to :meth:`finished`)."""
        with self._lock:
            return self._moves.get(key, 0)

    def finished(self, key: Key, moves: int, *, settled: bool) -> None:
        """A reconcile of ``key`` that began at ``moves`` ended; ``settled``: it succeeded, asked for no later
        look and read nothing outside the view."""
        with self._lock:
            if settled:
                self._settled[key] = moves
            else:
                self._settled.pop(key, None)

    def unchanged(self, key: Key) -> bool:
        """``key`` is settled and no input moved since its last reconcile."""
        with self._lock:
            at = self._settled.get(key)
            return at is not None and at == self._moves.get(key, 0)

    def forget(self, key: Key) -> None:
        """``key``'s object is gone."""
        with self._lock:
            self._moves.pop(key, None)
            self._settled.pop(key, None)


@dataclass(frozen=True)
class LoopSettings:
    """How the loop runs; every duration in seconds.

    ``workers``: reconcile threads; ``resync_s``: period in which every key is reconciled
    once (spread); ``slo_interval_s``: seconds
    between SLO scrapes (0: no scraper); ``slo_status_period_s``: least time between two
    status writes that only move SLO figures; ``stuck_after_s``: liveness bound;
    ``namespaces``: watched namespaces (None: the whole cluster); ``slo_source`` /
    ``prometheus``: where SLO figures come from (``metrics/sources.py``).
    """

    workers: int = 4
    resync_s: float = 300.0
    slo_interval_s: float = 15.0
    slo_status_period_s: float = 60.0
    stuck_after_s: float = 180.0
    namespaces: tuple[str, ...] | None = None
    slo_source: str = SCRAPE
    prometheus: PrometheusSettings | None = None


def resync_offset(key: Key, uid: str | None, period_s: float) -> float:
    """Where in each resync period ``key`` is due: a stable hash of its uid (else its key), in [0, period)."""
    digest = zlib.crc32((uid or "/".join(key)).encode())
    return (digest / 2**32) * period_s


#: Seconds between two looks for deployments whose SLO figures went stale (the bound itself is a
#: minute: ``HealthStore.max_age_s``); the other duties of a tick run every tick.
STALE_CHECK_S = 5.0
#: Seconds a resync schedule (:meth:`Controller._resync_schedule`) serves while the number of keys stays the same.
SCHEDULE_REFRESH_S = 15.0


class Controller:
    """The control loop of one operator process (see the module docstring).

    ``runtime`` / ``kernelbuilds``: what reconciles PDDeployments and KernelBuilds;
    ``kube``: the cached API access (its ``cache`` is the loop's view); ``metrics``:
    the process's exporter; ``heartbeats``: liveness; ``clock``: monotonic seconds.
    """

    def __init__(self, *, runtime: Runtime, kernelbuilds: KernelBuildRuntime, kube: Kube,
                 settings: LoopSettings, metrics: OperatorMetrics | None = None,
                 heartbeats: Heartbeats | None = None, clock: Callable[[], float] = time.monotonic,
                 watch_client: Any = None) -> None:
        if kube.cache is None:
            raise ValueError("the controller needs a Kube with an ObjectCache")
        self.runtime = runtime
        self.kernelbuilds = kernelbuilds
        self.kube = kube
        self.watch_client = watch_client if watch_client is not None else kube.api_client
        self.cache: ObjectCache = kube.cache
        self.settings = settings
        self.metrics = metrics
        self.heartbeats = heartbeats if heartbeats is not None else Heartbeats(clock=clock)
        self.clock = clock
        self.queue = WorkQueue(clock=clock)
        self.ledger = InputLedger()
        #: what the API server serves that a reconcile's result depends on (None: not looked yet)
        self._served_env: tuple[bool, ...] | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._scraper_loop: asyncio.AbstractEventLoop | None = None
        self._scraper_task: asyncio.Task | None = None
        self._figures_written: dict[tuple[str, str], float] = {}  # (ns, name) -> monotonic time figures were queued
        self._stale_flagged: set[tuple[str, str]] = set()
        self._catalog_version = runtime.catalog_version
        self._resync = _ResyncPass(start=clock())
        self._resync_lock = threading.Lock()
        self._last_pass_s: float | None = None
        self._last_lag_s: float | None = None
        self._trim = TrimPolicy()  # under _resync_lock
        #: optional kinds served when the loop started: kopf's scan at start found them and watches them
        self._watched_optional: set[str] = set()
        self._next_poll = 0.0
        self._next_stale_check = 0.0
        #: (key, uid, period) -> its resync offset: a schedule of 1,000 keys looks them up, it does not hash them
        self._offsets: dict[tuple[Key, str | None, float], float] = {}
        #: ((key count, period), made again after, sorted offsets, keys in that order): _resync_schedule
        self._schedule: tuple[tuple[int, float], float, list[float], list[Key]] | None = None
        self._reflectors: list[Reflector] = []
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Fill the cache (one LIST per watched kind), then start the workers, the watches, the ticker and the scraper.

        Raises the API error of a LIST that still fails after :data:`START_LIST_DEADLINE_S`
        (429s are waited out: ``informer.py``): without a full view nothing may reconcile.
        """
        started = time.perf_counter()
        self._watched_optional = {w.kind for w in WATCHED if w.optional and self.served(w)}
        for watched in WATCHED:
            self.sync_kind(watched, reason="start", deadline_s=START_LIST_DEADLINE_S)
        log.info("cache filled in %.1fs: %s", time.perf_counter() - started,
                 ", ".join(f"{self.cache.count(w.api_version, w.kind)} {w.plural}" for w in WATCHED))
        self.heartbeats.register("workqueue", max_age_s=self.settings.stuck_after_s)
        self.heartbeats.register("resync", max_age_s=self.settings.stuck_after_s)
        for key in self._all_keys():
            self.trigger(key)  # everything once at start: the loop is level-triggered
        self._started = True
        for i in range(self.settings.workers):
            self._spawn(f"reconcile-worker-{i}", self._work)
        for reflector in self._reflectors:
            reflector.start()  # each WATCHes from its LIST's resourceVersion
        self._spawn("loop-ticker", self._tick_loop)
        if self.settings.slo_interval_s > 0:
            self.heartbeats.register("slo-scraper", max_age_s=self.settings.slo_interval_s + self.settings.stuck_after_s)
            self._spawn("slo-scraper", self._scrape_loop)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every thread and watch (a reconcile in flight finishes first); their heartbeats are no longer expected."""
        self._stop.set()
        self.queue.shutdown()
        for reflector in self._reflectors:
            reflector.stop(timeout=1.0)
        loop, task = self._scraper_loop, self._scraper_task
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)
        for t in self._threads:
            t.join(timeout)
        for beat in ("workqueue", "resync", "slo-scraper"):
            self.heartbeats.unregister(beat)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def served(self, watched: WatchedKind) -> bool:
        """True unless ``watched`` is optional and the API server does not serve it now (runtime's discovery, cached)."""
        return not watched.optional or watched.kind in self.runtime.kinds_served(watched.api_version)

    def sync_kind(self, watched: WatchedKind, *, reason: str = "start",
                  deadline_s: float | None = None) -> list[tuple[tuple[str, str], Change]]:
        """LIST ``watched`` (per watched namespace) into the cache through its reflectors (made here, not yet
        watching: :meth:`start` starts them); queue the keys whose objects changed.

        An optional kind the API server does not serve is skipped (nothing of it exists;
        the cache stays unsynced for it, so reads of it ask the API server).
        """
        if not self.served(watched):
            return []
        namespaces = list(self.settings.namespaces) if self.settings.namespaces else [None]
        changes: list[tuple[tuple[str, str], Change]] = []
        for ns in namespaces:
            reflector = next((r for r in self._reflectors if r.watched == watched and r.namespace == ns), None)
            if reflector is None:
                reflector = Reflector(watched, ns, kube=self.kube, cache=self.cache, on_listed=self._on_listed,
                                      on_event=self.observe, watch_client=self.watch_client,
                                      on_list=self.metrics.record_list if self.metrics is not None else None)
                self._reflectors.append(reflector)
            found = reflector.list(reason, deadline_s=deadline_s)
            self._on_listed(watched, found)
            changes.extend(found)
        return changes

    def _on_listed(self, watched: WatchedKind, changes: list[tuple[tuple[str, str], Change]]) -> None:
        """A LIST changed the view (a re-list after 410 Gone: deletions included): queue what it concerns."""
        if not self._started:
            return  # the first fill: start() queues every key anyway
        for ref, change in changes:
            for key in self._keys_for(watched, ref, change, deleted=change.new is None):
                self.trigger(key)

    # ------------------------------------------------------------------ events
    def observe(self, watched: WatchedKind, event: dict[str, Any]) -> list[Key]:
        """Apply one watch event to the cache; queue and return the keys it concerns.

        ``event``: ``{"type": None|ADDED|MODIFIED|DELETED, "object": {...}}`` as kopf hands
        it. An event that carries nothing newer than the cache (the echo of the operator's
        own write, whose answer is stored already) queues nothing.
        """
        obj = event.get("object") or {}
        deleted = event.get("type") == "DELETED"
        change = self.cache.remove(obj) if deleted else self.cache.upsert(obj)
        if not change.stored:
            return []
        meta = obj.get("metadata") or {}
        keys = self._keys_for(watched, (meta.get("namespace") or "", meta.get("name") or ""), change, deleted=deleted)
        for key in keys:
            self.trigger(key)
        return keys

    def trigger(self, key: Key) -> None:
        """Queue ``key`` because an input of it moved (see :class:`InputLedger`): every trigger but the
        resync goes through here (the oracle's answer too: ``main.py``)."""
        self.ledger.moved(key)
        self.queue.add(key)

    def _trigger_after(self, key: Key, seconds: float) -> None:
        """Queue ``key`` in ``seconds`` because an input of it moved (an SLO figure held back)."""
        self.ledger.moved(key)
        self.queue.add_after(key, seconds)

    def _keys_for(self, watched: WatchedKind, ref: tuple[str, str], change: Change, *, deleted: bool) -> list[Key]:
        """The keys a stored change of the object ``ref`` = (namespace, name) concerns (see :meth:`observe`)."""
        ns, name = ref
        labels = change.labels
        if watched.kind == PDDEPLOYMENT:
            if deleted:
                self.runtime.forget(ns, name)
                self.ledger.forget((PDDEPLOYMENT, ns, name))
                if self.metrics is not None:
                    self.metrics.forget_key(PDDEPLOYMENT, ns, name)
                return []
            return [(PDDEPLOYMENT, ns, name)] if _spec_changed(change.old, change.new) else []
        if watched.kind == KERNELBUILD:
            users = [(PDDEPLOYMENT, ns, d) for d in self.runtime.kernelbuild_users(ns, name)]
            if deleted:
                self.kernelbuilds.forget(ns, name)
                self.ledger.forget((KERNELBUILD, ns, name))
                if self.metrics is not None:
                    self.metrics.forget_key(KERNELBUILD, ns, name)
                return users  # a PDDeployment with cache auto creates it again
            moved = _status_of(change.old) != _status_of(change.new)
            return [(KERNELBUILD, ns, name)] + (users if moved else [])
        keys: list[Key] = []
        if labels.get(LABEL_KERNELBUILD):
            keys.append((KERNELBUILD, ns, labels[LABEL_KERNELBUILD]))
        owner = labels.get(LABEL_DEPLOYMENT)
        if owner:
            if watched.kind != "Pod" or _scheduling_moved(change.old, None if deleted else change.new):
                keys.append((PDDEPLOYMENT, ns, owner))
        return keys

    # ------------------------------------------------------------------ health
    def on_health(self, health: Health) -> None:
        """The scraper's result for one deployment: keep it; queue a status write per the change (see module docstring)."""
        change = self.runtime.set_health(health)
        key2 = (health.namespace, health.name)
        self._stale_flagged.discard(key2)
        key: Key = (PDDEPLOYMENT, health.namespace, health.name)
        if self.runtime.planner_moved(health):  # the built-in planner's reading moved: act now
            self._figures_written[key2] = self.clock()
            self.trigger(key)
        elif change is HealthChange.CONDITIONS:
            self._figures_written[key2] = self.clock()
            self.trigger(key)
        elif change is HealthChange.FIGURES:
            since = self.clock() - self._figures_written.get(key2, -1e18)
            wait = self.settings.slo_status_period_s - since
            if wait <= 0:
                self._figures_written[key2] = self.clock()
                self.trigger(key)
            elif not self.queue.pending(key):
                self._figures_written[key2] = self.clock() + wait
                self._trigger_after(key, wait)

    def on_forget(self, deployment_key: str) -> None:
        """The scraper dropped a deployment that is gone."""
        self.runtime.forget_health(deployment_key)
        ns, _, name = deployment_key.partition("/")
        self._figures_written.pop((ns, name), None)

    # ------------------------------------------------------------------ threads
    def _work(self) -> None:
        while self.work_one() is not ShutDown:
            pass

    def work_one(self, timeout: float | None = None) -> Key | None | type[ShutDown]:
        """One worker step: take a key, reconcile it, hand it back; each of the three beats ``workqueue``.

        Returns the key (None when ``timeout`` seconds passed without one; :class:`ShutDown`
        once the queue is shut down). A reconcile in flight is a ``Heartbeats.busy`` entry:
        stuck after ``stuck_after_s``.
        """
        try:
            key = self.queue.get(timeout)
        except ShutDown:
            return ShutDown
        if key is None:
            return None
        self.heartbeats.beat("workqueue")  # progress: a key taken
        try:
            kind, ns, name = key
            with self.heartbeats.busy(f"reconcile {kind} {ns}/{name}", max_s=self.settings.stuck_after_s):
                self._reconcile(key)
        finally:
            self.queue.done(key)
            self.heartbeats.beat("workqueue")  # progress: a key finished
            if self.metrics is not None:
                self.metrics.record_key(*key)
        return key

    def _reconcile(self, key: Key) -> None:
        kind, ns, name = key
        moves, reads, began = self.ledger.began(key), outside_reads(), self.clock()
        try:
            if kind == PDDEPLOYMENT:
                outcome = self.runtime.reconcile_key(ns, name)
                after = outcome.requeue_after if outcome is not None else None
            else:
                after = _kernelbuild_next_look(self.kernelbuilds.reconcile_key(ns, name), now=time.time())
        except Exception as e:  # noqa: BLE001 - every failure is retried with backoff
            self.ledger.finished(key, moves, settled=False)
            delay = self.queue.retry(key)
            if _is_api_error(e):  # one line: the server's answer; a namespace being deleted is expected
                log.log(logging.INFO if namespace_terminating(e) else logging.WARNING,
                        "reconcile %s %s/%s failed (retry in %.1fs): %s", kind, ns, name, delay, brief(e))
            else:
                log.warning("reconcile %s %s/%s failed (retry in %.1fs): %s", kind, ns, name, delay, e, exc_info=True)
            if self.metrics is not None:
                self.metrics.record_retry(kind)
            return
        self.ledger.finished(key, moves, settled=after is None and outside_reads() == reads)
        self.queue.forget(key)
        self.queue.cancel_after(key, asked_before=began)  # this reconcile says when to look again
        if after is not None:
            self.queue.add_after(key, after + 0.5)
        with self._resync_lock:
            self._resync.reconciled(key, self.clock())
            self._trim.reconciled()

    def _tick_loop(self) -> None:
        previous = self.clock()
        while not self._stop.wait(TICK_S):
            now = self.clock()
            self.tick(previous, now)
            previous = now

    def tick(self, previous: float, now: float) -> None:
        """One tick of the loop's timer thread (every :data:`TICK_S`): the resync slots due in
        (previous, now], stale SLO figures, the catalog, kinds that appeared, liveness and metrics.

        Liveness means stuck, not busy: ``workqueue`` beats whenever a worker takes or
        finishes a key (:meth:`work_one`) and here when no key waits; a backlog however old
        stays healthy while workers make progress, and a reconcile in flight past
        ``stuck_after_s`` is named by ``/healthz`` (``liveness.py``).
        """
        try:
            self._resync_due(previous, now, self.settings.resync_s)
            if now >= self._next_stale_check:
                self._next_stale_check = now + STALE_CHECK_S
                self._flag_stale()
            self._catalog_changes()
            self._poll_unwatched(now)
        except Exception as e:  # noqa: BLE001 - the ticker must keep ticking
            log.warning("control loop tick: %s", brief(e) if _is_api_error(e) else e, exc_info=not _is_api_error(e))
        self.heartbeats.beat("resync")
        stats = self.queue.stats()
        if stats.depth == 0:
            self.heartbeats.beat("workqueue")  # nothing waits: idle is not stuck
        with self._resync_lock:
            trim = self._trim.due(now=now, idle=stats.depth == 0 and stats.processing == 0)
        if trim:  # a burst ended: give what it freed back to the OS (heap.py)
            log.debug("reconcile burst over: heap settled (%s)", "released" if settle_heap() else "nothing to release")
        if self.metrics is not None:
            longest = self.heartbeats.longest_busy("reconcile ")
            self.metrics.record_queue(stats, resync_pass_s=self._last_pass_s, resync_lag_s=self._last_lag_s,
                                      longest_running_s=longest)
            self.metrics.record_cache({w.kind: self.cache.count(w.api_version, w.kind) for w in WATCHED})

    def _poll_unwatched(self, now: float) -> None:
        """Every :data:`UNWATCHED_POLL_S`, look for optional kinds served now but not when the loop started
        (a LeaderWorkerSet installed later): LIST and WATCH each one found, and queue every
        PDDeployment (one may have waited for it: LeaderWorkerSetMissing). Likewise when what
        else a reconcile asks discovery about changes (the Prometheus Operator's kinds
        installed or removed, :meth:`served_env`): a settled key would not look again.
        """
        if now < self._next_poll:
            return
        self._next_poll = now + UNWATCHED_POLL_S
        env = self.served_env()
        if self._served_env is not None and env != self._served_env:
            log.info("the kinds the API server serves changed: every PDDeployment is reconciled again")
            for key in self._all_keys():
                if key[0] == PDDEPLOYMENT:
                    self.trigger(key)
        self._served_env = env
        for watched in WATCHED:
            if watched.optional and watched.kind not in self._watched_optional and self.served(watched):
                log.info("%s are served since the operator started: listing and watching them", watched.plural)
                self.sync_kind(watched, reason="appeared")
                self._watched_optional.add(watched.kind)
                if self._started:
                    for reflector in self._reflectors:
                        if reflector.watched == watched:
                            reflector.start()
                for key in self._all_keys():
                    if key[0] == PDDEPLOYMENT:
                        self.trigger(key)

    def served_env(self) -> tuple[bool, ...]:
        """What a PDDeployment reconcile's result depends on besides its objects: whether the API server
        serves the Prometheus Operator's kinds, LeaderWorkerSets and ComputeDomains (discovery,
        cached by the runtime)."""
        return (self.runtime.monitoring_available(), self.runtime.lws_available(),
                self.runtime.compute_domains_available())

    def _resync_due(self, previous: float, now: float, period: float) -> None:
        """Queue the keys whose offset in the resync period falls in (previous, now].

        When a new period begins, the one that ended is published (see :class:`_ResyncPass`):
        its pass (from its start until its last key was reconciled; a period whose keys
        were not all reconciled before the next one began lasts until then, at least the
        period) and its lag (the longest a key waited from its due time until its
        reconcile finished). A period that queued no key publishes nothing. A due key whose
        inputs did not move since its last reconcile (:class:`InputLedger`) is skipped and
        counted (``sglang_pd_operator_reconciles_total{result="unchanged"}``).
        """
        lo, hi = previous % period, now % period
        if hi < lo or now - previous >= period:  # a new period began
            with self._resync_lock:
                ended, self._resync = self._resync, _ResyncPass(start=now - hi)
            figures = ended.finish(now)
            if figures is not None:
                self._last_pass_s, self._last_lag_s = figures
        offsets, keys = self._resync_schedule(now, period)
        if now - previous >= period:
            due = keys
        elif lo <= hi:  # (lo, hi]
            due = keys[bisect.bisect_right(offsets, lo):bisect.bisect_right(offsets, hi)]
        else:  # (lo, period) and [0, hi]
            due = keys[bisect.bisect_right(offsets, lo):] + keys[:bisect.bisect_right(offsets, hi)]
        for key in due:
            if self.ledger.unchanged(key):
                if self.metrics is not None:
                    self.metrics.record_key(*key, result=UNCHANGED)
                continue
            with self._resync_lock:
                self._resync.queued(key, now)
            self.queue.add(key)

    def _flag_stale(self) -> None:
        """Queue deployments whose SLO figures just went stale (status turns SLOMet Unknown); every
        :data:`STALE_CHECK_S` seconds of ticks."""
        watched = next(w for w in WATCHED if w.kind == PDDEPLOYMENT)
        names = [(ns, name) for ns, name, _ in self.cache.keys(watched.api_version, PDDEPLOYMENT)
                 if (ns, name) not in self._stale_flagged]
        for ns, name in self.runtime.stale(names, now=time.time()):
            self._stale_flagged.add((ns, name))
            self.trigger((PDDEPLOYMENT, ns, name))

    def _catalog_changes(self) -> None:
        """A changed kernel catalog concerns every PDDeployment: spread them over the next ticks."""
        self.runtime.catalog()  # re-reads the admin's ConfigMap at most every catalog_ttl_s
        if self.runtime.catalog_version != self._catalog_version:
            self._catalog_version = self.runtime.catalog_version
            for key in self._all_keys():
                if key[0] == PDDEPLOYMENT:
                    self.trigger(key)

    def _scrape_loop(self) -> None:
        """The SLO source (the scraper, or the Prometheus source) on an asyncio loop of its own, in this
        thread, until :meth:`stop`."""
        namespaces = list(self.settings.namespaces or []) or None
        scraper = make_slo_source(
            self.settings.slo_source,
            # projections the cache keeps per object version: a pass at rest decodes nothing
            list_deployments=lambda: self.runtime.list_bodies(namespaces, project=deployment_view),
            serving_key_of=self.runtime.serving_key_of,
            list_pods=lambda ns: self.runtime.list_managed_pods(ns, project=pod_view),
            on_health=self.on_health,
            on_forget=self.on_forget,
            metrics=self.metrics,
            interval=self.settings.slo_interval_s,
            on_pass=lambda: self.heartbeats.beat("slo-scraper"),
            namespaces=namespaces,
            prometheus=self.settings.prometheus,
        )
        store = self.runtime.health_store
        store.max_age_s = max(store.max_age_s, 4 * self.settings.slo_interval_s)

        async def main() -> None:
            self._scraper_loop = asyncio.get_running_loop()
            self._scraper_task = asyncio.current_task()
            try:
                await scraper.run()
            except asyncio.CancelledError:
                pass

        asyncio.run(main())

    # ------------------------------------------------------------------ views
    def _all_keys(self) -> list[Key]:
        return [k for k, _ in self._all_keys_with_uids()]

    def _resync_schedule(self, now: float, period: float) -> tuple[list[float], list[Key]]:
        """Every key's resync offset in ``period``, sorted, and the keys in that order: a tick takes the
        keys due in its interval by bisection instead of looking at every key (1,000 keys every second
        were a tenth of the operator's CPU at rest). Made again every :data:`SCHEDULE_REFRESH_S` and
        whenever the number of keys or the period changes; a key that comes in between is reconciled
        by its own watch event, one gone is found unchanged or missing when due."""
        count = sum(self.cache.count(w.api_version, w.kind) for w in WATCHED if w.kind in (PDDEPLOYMENT, KERNELBUILD))
        memo = self._schedule
        if memo is not None and memo[0] == (count, period) and now < memo[1]:
            return memo[2], memo[3]
        keys = self._all_keys_with_uids()
        cached = self._offsets
        if len(cached) > 2 * len(keys) + 64:  # keys gone (or a new uid): start the memo again
            cached.clear()
        order = []
        for key, uid in keys:
            at = cached.get((key, uid, period))
            if at is None:
                at = cached[(key, uid, period)] = resync_offset(key, uid, period)
            order.append((at, key))
        order.sort()
        offsets, in_order = [at for at, _ in order], [key for _, key in order]
        self._schedule = ((count, period), now + SCHEDULE_REFRESH_S, offsets, in_order)
        return offsets, in_order

    def _all_keys_with_uids(self) -> list[tuple[Key, str | None]]:
        out: list[tuple[Key, str | None]] = []
        for kind in (PDDEPLOYMENT, KERNELBUILD):
            watched = next(w for w in WATCHED if w.kind == kind)
            out.extend(((kind, ns, name), uid) for ns, name, uid in self.cache.keys(watched.api_version, kind))
        return out


class _ResyncPass:
    """One resync period's bookkeeping: which of its keys are still to be reconciled, since when.

    Not thread-safe by itself: the controller holds ``_resync_lock`` around every call.
    ``start``: the period's start (monotonic seconds).
    """

    def __init__(self, *, start: float) -> None:
        self.start = start
        self.pending: dict[Key, float] = {}  # key -> when it was due
        self.queued_any = False
        self.drained_at: float | None = None
        self.lag = 0.0

    def queued(self, key: Key, now: float) -> None:
        """``key`` is due at ``now`` (a key already pending keeps its first due time)."""
        self.pending.setdefault(key, now)
        self.queued_any = True

    def reconciled(self, key: Key, now: float) -> None:
        """A reconcile of ``key`` finished at ``now`` (any reconcile counts: it saw the current state)."""
        due = self.pending.pop(key, None)
        if due is None:
            return
        self.lag = max(self.lag, now - due)
        if not self.pending:
            self.drained_at = now

    def finish(self, now: float) -> tuple[float, float] | None:
        """(pass seconds, lag seconds) of this period, which ends at ``now``; None when it queued no key."""
        if not self.queued_any:
            return None
        if self.pending:  # not done before the next period began: it lasted at least until now
            return now - self.start, max([self.lag, *(now - due for due in self.pending.values())])
        return (self.drained_at if self.drained_at is not None else now) - self.start, self.lag


def _kernelbuild_next_look(outcome: Any, *, now: float) -> float | None:
    """Seconds until a KernelBuild should be looked at again without an event: a build in
    progress every ``KERNELBUILD_POLL_S``, a failed one when its retry is due, a finished one never."""
    if outcome is None or outcome.deleted:
        return None
    if outcome.phase in ("Pending", "Building"):
        return KERNELBUILD_POLL_S
    if outcome.next_retry_at is not None:
        return max(0.0, outcome.next_retry_at - now)
    return None


def _spec_changed(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """True unless only status (or bookkeeping) changed between two versions of a custom object."""
    if old is None or new is None:
        return True
    o, n = old.get("metadata") or {}, new.get("metadata") or {}
    return (o.get("uid"), o.get("generation"), o.get("deletionTimestamp"), o.get("labels")) != \
        (n.get("uid"), n.get("generation"), n.get("deletionTimestamp"), n.get("labels"))


def _status_of(obj: dict[str, Any] | None) -> Any:
    return (obj or {}).get("status")


def _scheduling_moved(old: dict[str, Any] | None, new: dict[str, Any] | None) -> bool:
    """A pod's event matters to its PDDeployment's reconcile only when its 'cannot be scheduled' state moved
    (readiness reaches the reconcile through the Deployment's status)."""
    return unschedulable_reason(old or {}) != unschedulable_reason(new or {})


def _is_api_error(e: Exception) -> bool:
    from kubernetes.client import ApiException

    return isinstance(e, ApiException)
