"""The watches that keep the cache current: one LIST, then a WATCH from the LIST's resourceVersion, per kind.

client-go's reflector, on the official client's :class:`kubernetes.watch.Watch`, one
:class:`Reflector` per watched kind (``cache.WATCHED``) and namespace, each in a thread
of its own:

1. **LIST** the kind, page by page, with its label selector (``Kube.list_kind``), into
   :meth:`~.cache.ObjectCache.replace_kind`: the view becomes equal to the LIST, and an
   object the view held that the LIST no longer holds is removed and reported (client-go's
   ``Replace``: the deletions a watch that went down never delivered). Once at start,
   before any reconcile (``Controller.start``), and again only when the watch cannot go on.
2. **WATCH** from the LIST's resourceVersion with ``allowWatchBookmarks``: every event goes
   to the control loop (``Controller.observe``) in the order the API server sends it;
   a BOOKMARK only moves the resourceVersion the next watch request resumes from. The
   server ends each watch after ``WATCH_SERVER_TIMEOUT_S``; the next one resumes from the
   last resourceVersion seen, without a LIST. A stream silent for :data:`WATCH_READ_S`
   (no event, no bookmark: the server sends one about every minute) is dropped and
   resumed the same way.
3. **410 Gone** (the resourceVersion is too old: the API server or etcd no longer has the
   events since) is the only reason to LIST again (step 1), then WATCH from the new LIST.

resourceVersions are passed back to the API server as they came and never compared. A
LIST answered 429 (the API server's cache of a CRD created a moment ago is still filling)
is asked again after the answer's Retry-After (at most :data:`RETRY_429_MAX_S`), so the
first start right after the CRDs were installed converges in seconds; other errors are
retried with a capped backoff. Each LIST is counted in
``sglang_pd_operator_watch_lists_total{kind,reason}`` (``start``, ``gone``, ``appeared``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s
from kubernetes.watch import Watch

from .cache import Change, ObjectCache, WatchedKind

log = logging.getLogger(__name__)

#: Seconds the API server keeps one watch request open before it ends it (the next resumes).
WATCH_SERVER_TIMEOUT_S = 300
#: Seconds a watch stream may stay silent (no event, no bookmark) before it is dropped and resumed.
WATCH_READ_S = 75.0
#: Longest wait, seconds, before a LIST answered 429 is asked again (Retry-After is obeyed up to this).
RETRY_429_MAX_S = 2.0
#: Backoff, seconds, after another failed LIST or watch request: doubled per failure up to the cap.
RETRY_BASE_S, RETRY_CAP_S = 0.5, 30.0

Changes = list[tuple[tuple[str, str], Change]]


class Reflector:
    """LIST then WATCH one kind in one namespace (None: cluster-wide) into the cache (see the module docstring).

    ``kube``: a ``reconcilers.kube.Kube`` (its ``list_kind`` and discovery);
    ``watch_client``: the ``ApiClient`` the watch streams use (a pool of its own, so a
    long-lived stream never takes a reconcile's connection); ``on_listed(watched, changes)``:
    what a LIST changed in the view; ``on_event(watched, event)``: one watch event
    (``{"type": ADDED|MODIFIED|DELETED, "object": {...}}``); ``on_list(kind, reason)``:
    counts LISTs; ``connect_s``: the connect timeout of a watch request.
    """

    def __init__(self, watched: WatchedKind, namespace: str | None, *, kube: Any, cache: ObjectCache,
                 on_listed: Callable[[WatchedKind, Changes], None],
                 on_event: Callable[[WatchedKind, dict[str, Any]], None],
                 watch_client: k8s.ApiClient | None = None,
                 on_list: Callable[[str, str], None] | None = None,
                 connect_s: float = 5.0, sleep: Callable[[float], bool] | None = None) -> None:
        self.watched = watched
        self.namespace = namespace
        self.kube = kube
        self.cache = cache
        self.on_listed = on_listed
        self.on_event = on_event
        self.watch_client = watch_client or kube.api_client
        self.on_list = on_list
        self.connect_s = connect_s
        self._stopped = threading.Event()
        self._sleep = sleep or self._stopped.wait  # returns True once stopped
        self.resource_version: str | None = None
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ LIST
    def list(self, reason: str, *, deadline_s: float | None = None) -> Changes:
        """LIST into the cache (``replace_kind``), keep the LIST's resourceVersion; return what changed.

        429 answers are retried after their Retry-After (see the module docstring); with
        ``deadline_s`` other errors are retried too until that many seconds passed, then
        raised (``ApiException`` or a connection error); without it the first such error raises.
        """
        started = time.monotonic()
        failures = 0
        while True:
            try:
                return self._list_once(reason)
            except k8s.ApiException as e:
                if e.status == 429:
                    wait = _retry_after(e)
                    log.info("LIST %s answered 429 (%s): again in %.1fs", self.watched.plural,
                             (e.reason or "").strip(), wait)
                elif deadline_s is None or time.monotonic() - started > deadline_s:
                    raise
                else:
                    wait, failures = _backoff(failures), failures + 1
                    log.warning("LIST %s failed (%s %s): again in %.1fs", self.watched.plural, e.status, e.reason, wait)
            except Exception as e:  # noqa: BLE001 - a connection error: retried like the others
                if deadline_s is None or time.monotonic() - started > deadline_s:
                    raise
                wait, failures = _backoff(failures), failures + 1
                log.warning("LIST %s failed (%s): again in %.1fs", self.watched.plural, e, wait)
            if self._sleep(wait):
                return []

    def _list_once(self, reason: str) -> Changes:
        listed: dict[str, Any] = {}
        since = self.cache.write_seq()
        changes = self.cache.replace_kind(
            self.watched.api_version, self.watched.kind,
            self.kube.list_kind(self.watched, self.namespace, listed=listed),
            namespaces=[self.namespace] if self.namespace is not None else None, listed_after=since)
        self.resource_version = listed.get("resourceVersion")
        if self.on_list is not None:
            self.on_list(self.watched.kind, reason)
        return changes

    # ------------------------------------------------------------------ WATCH
    def start(self) -> None:
        """Watch in a thread of its own from the last LIST's resourceVersion (LIST first when there was none)."""
        self._thread = threading.Thread(target=self.run, name=f"watch-{self.watched.plural}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch (its stream is shut down at once) and wait for the thread."""
        self._stopped.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """WATCH, resume, LIST again on 410 Gone, until :meth:`stop` (the thread's body)."""
        failures = 0
        while not self._stopped.is_set():
            try:
                if self.resource_version is None:
                    self.on_listed(self.watched, self.list("gone"))
                    continue
                self.watch_once()
                failures = 0
            except k8s.ApiException as e:
                if e.status == 410:
                    log.info("watch of %s: 410 Gone (%s): LIST again", self.watched.plural, (e.reason or "").strip())
                    self.resource_version = None
                    continue
                wait = _retry_after(e) if e.status == 429 else _backoff(failures)
                failures += 1
                log.warning("watch of %s failed (%s %s): again in %.1fs", self.watched.plural, e.status, e.reason, wait)
                self._sleep(wait)
            except Exception as e:  # noqa: BLE001 - a dropped or silent stream: resume from the last version
                if self._stopped.is_set():
                    return
                wait = _backoff(failures)
                failures += 1
                log.info("watch of %s ended (%s): resuming in %.1fs", self.watched.plural, type(e).__name__, wait)
                self._sleep(wait)

    def watch_once(self) -> None:
        """One watch request from :attr:`resource_version` until the server ends it.

        Raises ``ApiException`` (410 when the version is too old) or a connection error.
        """
        watch = self._watch = Watch()
        for event in watch.stream(self._request, timeout_seconds=WATCH_SERVER_TIMEOUT_S,
                                  resource_version=self.resource_version):
            if self._stopped.is_set():
                watch.stop()
                return
            type_, obj = event.get("type"), event.get("raw_object") or event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if type_ == "BOOKMARK":
                self.resource_version = rv or self.resource_version
                continue
            if type_ not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            obj.setdefault("apiVersion", self.watched.api_version)
            obj.setdefault("kind", self.watched.kind)
            self.on_event(self.watched, {"type": type_, "object": obj})
            self.resource_version = rv or self.resource_version

    def _request(self, *, watch: bool = True, _preload_content: bool = False, resource_version: str | None = None,
                 timeout_seconds: int | None = None, **_: Any) -> Any:
        """The raw watch request :class:`kubernetes.watch.Watch` streams (no model objects: plain dicts)."""
        resource = self.kube._resource(self.watched.api_version, self.watched.kind)
        path = resource.path(namespace=self.namespace) if self.namespace else resource.path()
        query: list[tuple[str, Any]] = [("watch", "true"), ("allowWatchBookmarks", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if timeout_seconds:
            query.append(("timeoutSeconds", timeout_seconds))
        if self.watched.label_selector:
            query.append(("labelSelector", self.watched.label_selector))
        request = self.watch_client.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"])
        response = self.watch_client.call_api(*request, _request_timeout=(self.connect_s, WATCH_READ_S))
        if not 200 <= response.status < 300:
            response.read()
            raise k8s.ApiException(http_resp=response)
        return response.response  # the urllib3 response: Watch reads its stream line by line


def _retry_after(e: k8s.ApiException) -> float:
    """Seconds to wait after a 429: its Retry-After, between 0.2 and :data:`RETRY_429_MAX_S`."""
    try:
        value = float((e.headers or {}).get("Retry-After", 1))
    except (TypeError, ValueError):
        value = 1.0
    return min(RETRY_429_MAX_S, max(0.2, value))


def _backoff(failures: int) -> float:
    return min(RETRY_CAP_S, RETRY_BASE_S * 2 ** min(failures, 10))
