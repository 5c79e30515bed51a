"""The operator's one door to the API server: get, list, server-side apply, delete, status, events.

Built on the official client's DynamicClient, so any kind is handled the same way. Every
write is counted (``writes``, and an optional ``on_write`` callback for the metrics), so
tests and benchmarks can prove that a reconcile of an unchanged spec writes nothing.
Server-side apply always uses one field manager and forces conflicts: the operator owns
the fields it renders.

No call waits forever: :func:`with_timeouts` gives every request of an ``ApiClient`` a
connect and a read timeout (:class:`ApiTimeouts`) unless the caller passes its own
``_request_timeout``. The official client sends ``timeout=None`` to urllib3 otherwise,
and a half-open connection (a peer that vanished without a FIN) blocks the calling
thread, and through the per-object lock every reconcile of that object, for good.

With an :class:`~sglang_pd_operator.runtime.cache.ObjectCache` attached (the operator
process), ``get`` and ``list`` of a watched kind read the cache once it is synced, not
the API server; every write's answer is stored in it (read your writes). Reads of
objects the operator does not own (the catalog ConfigMap, a PVC) go through
:meth:`Kube.uncached` or are of kinds the cache does not hold.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Iterator
from typing import Any, Callable

import urllib3
from kubernetes import client as k8s
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from ..render.labels import FIELD_MANAGER
from ..runtime.cache import ObjectCache, Projection, WatchedKind, watched_kind
from .drift import needs_apply, with_applied_hash

#: Items per page of :meth:`Kube.list_kind` (the API server's ``limit``).
LIST_PAGE = 500


@dataclass(frozen=True)
class ApiTimeouts:
    """Seconds to wait for a connection (TCP and TLS handshake) and for each read of an answer.

    ``read`` bounds the silence between two reads of one answer, not the whole answer, so a
    long list that keeps streaming is not cut. The API server ends any request that is not
    a watch after its own ``--request-timeout`` (60 s by default), so a read silent for
    longer than that is a dead connection.
    """

    connect: float = 5.0
    read: float = 30.0

    def as_request_timeout(self) -> tuple[float, float]:
        """The ``_request_timeout`` pair the official client takes: (connect, read)."""
        return (self.connect, self.read)

    def retries(self) -> urllib3.Retry:
        """urllib3's retries for the client's pool: two connect retries, none after a request was sent.

        With these a call gives up after at most ``3 * connect + read`` seconds (45 s with
        the defaults) when every attempt hangs. A read that timed out is not retried: the
        pooled connections share its path and are dropped (see :func:`with_timeouts`), and
        the caller (a reconcile, the resync loop, the next renewal) tries again anyway. No
        retry on HTTP status: the reconcile decides what an error means.
        """
        return urllib3.Retry(total=2, connect=2, read=0, redirect=2, status=0, other=0)


def with_timeouts(api_client: k8s.ApiClient, timeouts: ApiTimeouts) -> k8s.ApiClient:
    """Make every request of ``api_client`` use ``timeouts`` unless it passes ``_request_timeout``; returns it.

    Wraps the client's REST layer (``api_client.rest_client.request``), which every typed
    API, the DynamicClient and ``kubernetes.leaderelection`` go through. A timed-out call
    raises ``urllib3.exceptions.MaxRetryError``/``TimeoutError`` (a ``ReadTimeoutError`` or
    ``ConnectTimeoutError``) in the caller and its connection is dropped from the pool, so
    the next call opens a fresh one; so do the other idle pooled connections (the pool is
    cleared), which share the path that just failed.
    """
    rest = api_client.rest_client
    inner = getattr(rest, "_untimed_request", rest.request)
    default = timeouts.as_request_timeout()

    def request(method, url, *args, _request_timeout=None, **kwargs):
        try:
            return inner(method, url, *args, _request_timeout=_request_timeout or default, **kwargs)
        except (urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError):
            # the path to the API server broke: the other idle pooled connections went the
            # same way and may be half-open too; drop them so the next calls connect afresh
            # instead of each waiting out a read timeout on one of them
            rest.pool_manager.clear()
            raise

    rest._untimed_request = inner
    rest.request = request
    api_client.default_timeouts = timeouts
    return api_client


_OUTSIDE = threading.local()


def outside_reads() -> int:
    """Reads this thread made so far of what the operator's view does not hold: API GETs and LISTs
    of kinds the cache does not watch (or has not synced), and answers remembered from such reads
    (:func:`note_outside_read`). The control loop compares it before and after a reconcile: a
    reconcile that read something from outside the view cannot be skipped by the resync, since
    no watch event would say that its input changed (``runtime/controller.py`` ``InputLedger``)."""
    return getattr(_OUTSIDE, "n", 0)


def note_outside_read() -> None:
    """Count one read of something outside the operator's view in this thread (:func:`outside_reads`)."""
    _OUTSIDE.n = getattr(_OUTSIDE, "n", 0) + 1


def apply_body(obj: dict[str, Any]) -> bytes:
    """``obj`` as the body of a server-side apply: JSON (valid YAML) encoded as UTF-8.

    The apply patch's content type is ``application/apply-patch+yaml``, which the API server
    reads with a YAML parser; the client's default serialisation (``json.dumps``, ASCII
    escapes) writes a character outside the BMP as a ``\\ud83d\\ude00`` surrogate pair, which
    a YAML parser decodes escape by escape into two invalid characters. Written as UTF-8
    text, every string reaches the API server as it is in the spec.
    """
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def json_answer(_client: Any, data: Any) -> Any:
    """The API server's answer to a write as parsed JSON (a dict): the dynamic client's ``serializer``.

    Its default wraps every field of the answer in a ``ResourceInstance`` / ``ResourceField``
    object, which the cache turned back into a dict at once; for the thousands of applies
    of a burst that round trip was a measurable share of the operator's CPU (docs/scale.md).
    """
    return data


class MetadataBumps:
    """The generations this process's own metadata-only patches gave workloads (thread-safe).

    apps/v1 bumps a Deployment's ``metadata.generation`` when its annotations change
    (pkg/registry/apps/deployment/strategy.go), so a patch of the render record alone (the
    adoption of a group made before 0.2.0, ``reconcilers/upgrade.adopt``) leaves the
    Deployment with a generation its controller has not observed yet, which would read as a
    rollout not settled (Ready False) until the controller catches up, though no pod
    changes. :meth:`settles` tells that case: the only generation not observed yet is the
    one our metadata patch made.
    """

    def __init__(self) -> None:
        self._made: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def record(self, kind: str, namespace: str, name: str, generation: int | None) -> None:
        """Our metadata-only patch of the object left it at ``generation``."""
        if generation is not None:
            with self._lock:
                self._made[(kind, namespace, name)] = int(generation)

    def forget(self, kind: str, namespace: str | None, name: str) -> None:
        with self._lock:
            self._made.pop((kind, namespace or "", name), None)

    def settles(self, kind: str, namespace: str, name: str, *, generation: int, observed: int) -> bool:
        """The object's controller observed every generation but ``generation``, which our
        metadata-only patch made (no spec change is waiting to be observed)."""
        with self._lock:
            made = self._made.get((kind, namespace, name))
        return made is not None and made == generation and observed == generation - 1


class Kube:
    """API access for reconcilers.

    ``api_client`` is a configured ``kubernetes.client.ApiClient``; ``on_write(verb, kind)``
    is called after every write (the operator process counts them in a metric);
    ``cache``: the process's object cache (see the module docstring), None to always ask
    the API server. ``dry_run``: every write is a server-side dry run (``dryRun=All``: the
    API server validates and admits it, nothing is stored), deletes, status patches and
    events are not sent. ``dry_run_writes`` lists every request sent with ``dryRun=All``
    (``apply Deployment ns/name``, ``create ...``, ``scale ...``), ``dry_run_skipped`` the
    writes not sent (``delete ...``, ``write the status of ...``: a status patch of an object
    that exists only as a dry run has nothing to patch); the CRD differential
    (tests/e2e/crd_differential.py) runs the operator's reconcile so.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        field_manager: str = FIELD_MANAGER,
        on_write: Callable[[str, str], None] | None = None,
        cache: ObjectCache | None = None,
        dry_run: bool = False,
    ):
        self.api_client = api_client
        self.dry_run = dry_run
        self.dry_run_writes: list[str] = []
        self.dry_run_skipped: list[str] = []
        self.field_manager = field_manager
        self.on_write = on_write
        self.cache = cache
        self._dynamic: DynamicClient | None = None
        self._lock = threading.Lock()
        self.writes: Counter[str] = Counter()
        self.metadata_bumps = MetadataBumps()

    def uncached(self) -> "Kube":
        """A Kube on the same client and discovery that always asks the API server (writes are counted here too)."""
        other = Kube(self.api_client, field_manager=self.field_manager, on_write=self.on_write, dry_run=self.dry_run)
        other._dynamic, other.writes, other.dry_run_writes = self._dynamic, self.writes, self.dry_run_writes
        other.metadata_bumps = self.metadata_bumps
        other.dry_run_skipped = self.dry_run_skipped
        return other

    def _cached(self, api_version: str, kind: str) -> ObjectCache | None:
        """The cache, when it holds a synced view of ``kind``."""
        if self.cache is not None and self.cache.synced(api_version, kind):
            return self.cache
        return None

    def _store(self, result: Any, before: dict[str, Any] | None = None) -> None:
        """Keep the API server's answer to a write of a watched kind in the cache (``ObjectCache.record_write``).

        ``before``: the object as the writer read it (its resourceVersion tells a no-op answer).
        """
        if self.cache is None or result is None:
            return
        obj = result.to_dict() if hasattr(result, "to_dict") else result
        if isinstance(obj, dict) and watched_kind(obj.get("apiVersion", ""), obj.get("kind", "")) is not None:
            self.cache.record_write(obj, before=((before or {}).get("metadata") or {}).get("resourceVersion"))

    @property
    def dynamic(self) -> DynamicClient:
        """The DynamicClient (discovery runs once, on first use)."""
        with self._lock:
            if self._dynamic is None:
                self._dynamic = DynamicClient(self.api_client)
            return self._dynamic

    def _resource(self, api_version: str, kind: str):
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def _count(self, verb: str, kind: str) -> None:
        self.writes[f"{verb} {kind}"] += 1
        if self.on_write is not None:
            self.on_write(verb, kind)

    @property
    def total_writes(self) -> int:
        """Writes issued by this client since it was made."""
        return sum(self.writes.values())

    def has_kind(self, api_version: str, kind: str) -> bool:
        """True when the API server serves ``kind`` (e.g. the Prometheus Operator's PodMonitor)."""
        try:
            self._resource(api_version, kind)
            return True
        except ResourceNotFoundError:
            return False

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
            project: Projection | None = None) -> Any:
        """The object as a dict, or None when it does not exist (from the cache for a watched, synced kind).

        ``project``: return ``project(object)`` instead (memoized per stored version by the
        cache, ``ObjectCache.get``; computed on each read from the API server).
        """
        cache = self._cached(api_version, kind)
        if cache is not None:
            return cache.get(api_version, kind, name, namespace, project=project)
        note_outside_read()
        try:
            obj = self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None
        return obj if project is None else project(obj)

    def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str, *,
             project: Projection | None = None) -> list[Any]:
        """Objects of ``kind`` matching ``label_selector`` in ``namespace`` (None: all namespaces).

        From the cache for a watched, synced kind (which holds only the objects its watch
        selects: a child kind's list sees only the operator's objects). ``project``: as in :meth:`get`.
        """
        cache = self._cached(api_version, kind)
        if cache is not None:
            return cache.list(api_version, kind, namespace, label_selector, project=project)
        note_outside_read()
        res = self._resource(api_version, kind).get(namespace=namespace, label_selector=label_selector)
        return [item.to_dict() if project is None else project(item.to_dict()) for item in res.items]

    def apply(self, desired: dict[str, Any], live: dict[str, Any] | None = None, *, fetch: bool = True,
              dry_run: bool = False) -> bool:
        """Server-side apply ``desired`` unless the live object already matches; returns True if it wrote.

        ``live`` may be passed when the caller has already read the object; with
        ``fetch`` the object is read first. ``dry_run`` (or a dry-run client): the API
        server validates and admits the object (``dryRun=All``) and stores nothing; no
        write is counted. Raises ``kubernetes.client.ApiException`` on API errors
        (including a refused object).
        """
        desired = with_applied_hash(desired)
        meta = desired["metadata"]
        if live is None and fetch:
            live = self.get(desired["apiVersion"], desired["kind"], meta["name"], meta.get("namespace"))
        if not needs_apply(desired, live):
            return False
        dry = dry_run or self.dry_run
        result = self.dynamic.server_side_apply(
            self._resource(desired["apiVersion"], desired["kind"]),
            body=apply_body(desired),
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=self.field_manager,
            force_conflicts=True,
            serializer=json_answer,
            **({"dry_run": "All"} if dry else {}),
        )
        if dry:
            self.dry_run_writes.append(f"apply {desired['kind']} {meta.get('namespace')}/{meta['name']}")
            return True
        self._count("apply", desired["kind"])
        self._store(result, before=live)
        return True

    def create(self, obj: dict[str, Any]) -> bool:
        """Create ``obj`` (POST, this client's field manager); False when an object of its name exists already.

        For an object whose fields are not all the operator's to apply: a PDRoleScale's
        ``spec.replicas`` is written here once and then only through ``/scale``
        (``reconcilers/scaling.py``), so server-side apply never owns it. Other API errors raise.
        """
        meta = obj["metadata"]
        try:
            result = self.dynamic.create(self._resource(obj["apiVersion"], obj["kind"]), body=obj,
                                         namespace=meta.get("namespace"), field_manager=self.field_manager,
                                         serializer=json_answer, **({"dry_run": "All"} if self.dry_run else {}))
        except k8s.ApiException as e:
            if e.status == 409:
                return False
            raise
        if self.dry_run:
            self.dry_run_writes.append(f"create {obj['kind']} {meta.get('namespace')}/{meta['name']}")
            return True
        self._count("create", obj["kind"])
        self._store(result)
        return True

    def scale(self, api_version: str, kind: str, name: str, namespace: str, replicas: int, *,
              field_manager: str | None = None) -> None:
        """Set ``spec.replicas`` through the ``/scale`` subresource (merge patch), as kubectl scale and HPA do.

        ``field_manager``: the manager recorded in managedFields (default: this client's);
        the planner writes as :data:`~..render.labels.PLANNER_FIELD_MANAGER`. Raises
        ``ApiException`` (404 when the object is gone).
        """
        res = self._resource(api_version, kind)
        self.dynamic.patch(res.subresources["scale"], body={"spec": {"replicas": int(replicas)}}, name=name,
                           namespace=namespace, content_type="application/merge-patch+json",
                           field_manager=field_manager or self.field_manager, serializer=json_answer,
                           **({"dry_run": "All"} if self.dry_run else {}))
        if self.dry_run:
            self.dry_run_writes.append(f"scale {kind} {namespace}/{name}")
            return
        self._count("patch-scale", kind)

    def patch_metadata(self, api_version: str, kind: str, name: str, namespace: str, *,
                       annotations: dict[str, str]) -> None:
        """Merge-patch ``metadata.annotations`` of one object (nothing else: a workload's pods are not touched).

        Raises ``ApiException`` (404 when the object is gone).
        """
        result = self._resource(api_version, kind).patch(
            body={"metadata": {"annotations": dict(annotations)}}, name=name, namespace=namespace,
            content_type="application/merge-patch+json", field_manager=self.field_manager, serializer=json_answer)
        self._count("patch", kind)
        self._store(result)
        obj = result.to_dict() if hasattr(result, "to_dict") else (result or {})
        self.metadata_bumps.record(kind, namespace, name, (obj.get("metadata") or {}).get("generation"))

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None) -> bool:
        """Delete with background propagation; returns False when it was already gone."""
        if self.dry_run:
            self.dry_run_skipped.append(f"delete {kind} {namespace}/{name}")
            return True
        try:
            self._resource(api_version, kind).delete(
                name=name, namespace=namespace, body={"propagationPolicy": "Background"}
            )
        except NotFoundError:
            self._forget(api_version, kind, name, namespace)
            return False
        self._count("delete", kind)
        self._forget(api_version, kind, name, namespace)
        self.metadata_bumps.forget(kind, namespace, name)
        return True

    def _forget(self, api_version: str, kind: str, name: str, namespace: str | None) -> None:
        if self.cache is not None and watched_kind(api_version, kind) is not None:
            self.cache.forget(api_version, kind, name, namespace)

    def patch_status(self, api_version: str, kind: str, name: str, namespace: str, status: dict[str, Any], *,
                     resource_version: str | None = None) -> None:
        """Merge-patch the status subresource of a custom object.

        ``resource_version``: the version the patch was computed against (a precondition:
        the API server answers 409 Conflict, raised as ``ApiException``, when the object
        changed since, e.g. another replica or a user rewrote status; the caller's retry
        reads the newer object). None: no precondition.
        """
        if self.dry_run:  # skipped by a dry-run client
            self.dry_run_skipped.append(f"write the status of {kind} {namespace}/{name}")
            return
        res = self._resource(api_version, kind)
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        result = self.dynamic.patch(
            res.subresources["status"],
            body=body,
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
            serializer=json_answer,
        )
        self._count("patch-status", kind)
        self._store(result)

    def list_kind(self, watched: WatchedKind, namespace: str | None,
                  listed: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every object of ``watched`` in ``namespace`` (None: cluster-wide) its selector matches, from the API server.

        Raw JSON read in pages of :data:`LIST_PAGE` (no model objects: fast for thousands of
        pods) and yielded one by one as each page arrives, so a consumer that keeps only
        what it needs never holds the whole list (3,000 pods as parsed JSON are about
        100 MB); each item gets the list's ``apiVersion`` and ``kind``. What fills the
        cache (``ObjectCache.replace_kind``). ``listed``, when given, receives the LIST's
        ``resourceVersion`` (where its watch starts: ``runtime/informer.py``) with the first
        page. Raises ``ApiException`` for a page that fails.
        """
        resource = self._resource(watched.api_version, watched.kind)
        path = resource.path(namespace=namespace) if namespace else resource.path()
        token = ""
        while True:
            query = [("limit", LIST_PAGE)]
            if watched.label_selector:
                query.append(("labelSelector", watched.label_selector))
            if token:
                query.append(("continue", token))
            request = self.api_client.param_serialize(
                "GET", path, query_params=query, header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"])
            response = self.api_client.call_api(*request)
            response.read()
            if not 200 <= response.status < 300:
                raise k8s.ApiException(http_resp=response)
            page = json.loads(response.data)
            del response
            if listed is not None and "resourceVersion" not in listed:
                listed["resourceVersion"] = (page.get("metadata") or {}).get("resourceVersion")
            token = (page.get("metadata") or {}).get("continue") or ""
            items = page.get("items") or []
            del page
            items.reverse()
            while items:  # popped as yielded: the page's memory goes item by item
                item = items.pop()
                item.setdefault("apiVersion", watched.api_version)
                item.setdefault("kind", watched.kind)
                yield item
            if not token:
                return

    def event(self, involved: dict[str, Any], *, type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event about ``involved`` (Normal or Warning); none from a dry-run client."""
        if self.dry_run:
            return
        meta = involved["metadata"]
        now = datetime.now(timezone.utc)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.field_manager},
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
        }
        self._resource("v1", "Event").create(body=body, namespace=meta["namespace"])
        self._count("create", "Event")
