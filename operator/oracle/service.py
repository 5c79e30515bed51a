"""The SGLang oracle as an HTTP service: ``sglang-pd-operator oracle serve``.

A thin layer over :class:`~.judge.Oracle` (the same code path as ``check --sglang``):
it takes a PDDeployment (its ``spec``, never a Secret: the service reads nothing from the
cluster and a pod's secret values are placeholders in the oracle), plans it with the
catalog the operator uses, and answers SGLang's :class:`~.judge.Verdict` in the JSON of
``check --sglang -o json`` (key ``sglang``). What SGLang's deeper stages add to
``Oracle.judge_plan`` arrives here unchanged.

Endpoints:

- ``POST /v1/verdict`` {"object": PDDeployment, "catalogOverrides": {file: text} | null}
  -> 200 {"valid", "problems", "compatKey", "sglang": {...verdict, "seconds"},
  "oracle": {"key", "cached", "queuedSeconds", "judgedSeconds"}}; 400 not JSON or not
  that shape, 411 no Content-Length, 413 body over ``max_body_bytes``, 422 the spec does
  not plan (its schema problems), 503 the queue is full or the oracle failed (a worker
  died: no verdict), 504 no verdict within ``request_timeout_s``.
- ``GET /healthz``: 200 while the process serves. ``GET /readyz``: 200 once the warm
  workers (one per ``warm`` accelerator) imported SGLang, 503 before.
- ``GET /metrics``-like figures are in ``GET /stats`` (JSON: queue depth, cache hits).

Verdicts are cached by :func:`judged_key`, the hash of what was judged: both roles'
rendered launches (config file, args, env of every pod of a replica), each role's
accelerator facts, the plugin catalog, the model's HF config and the sglang version.
An indeterminate verdict (``accepted`` None: the oracle could not judge, e.g. a bootstrap
or handshake request that timed out on a loaded machine, an ``OracleLimit``) may be
transient, so it is kept only ``indeterminate_ttl_s`` seconds and then judged again;
SGLang's accept or refusal is kept until evicted (LRU, ``cache_size`` entries).
Two requests for the same key at once are judged once. Jobs wait in a bounded queue
(``queue_size``) for ``judges`` threads; a job whose request already timed out is
dropped unjudged. The pool's per-call timeout equals the request timeout, so a worker
that hangs is killed (:mod:`.pool`).

Limits against a huge or hostile request: the body size, one deadline per request for
its request line, headers and body (``read_timeout_s`` from the moment the server waits
for the request, however slowly the bytes trickle in: a client sending a byte every few
seconds is cut off at the deadline, with a 408 once the headers are in), the concurrent
connections (``max_connections``; more are answered 503 at once), the queue, the
per-request time. Nothing here imports SGLang.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import io
import json
import logging
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from ..catalog import Catalog, CatalogError, builtin_catalog, load_catalog
from ..planning.plan import plan_object
from ..planning.problems import errors
from ..planning.structs import Plan
from .device import device_facts
from .judge import Oracle, pod_launches
from .pool import OracleError

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
API_PATH = "/v1/verdict"
DEFAULT_PORT = 8090
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_REQUEST_TIMEOUT_S = 120.0
DEFAULT_QUEUE_SIZE = 64
#: Seconds an indeterminate verdict is served from the cache before the same inputs are judged
#: again (it may be transient: a handshake that timed out under load). The operator asks again
#: every ``reconcilers.sglang_gate.RETRY_S`` (5 s) while it waits, so SGLang judges such a key
#: at most once per this interval, however many deployments wait for it.
DEFAULT_INDETERMINATE_TTL_S = 30.0
#: Seconds a request's line, headers and body may take to arrive, in all.
DEFAULT_READ_TIMEOUT_S = 10.0
#: Distinct catalogs (the built-in one and admins' overrides) the service keeps an oracle for.
MAX_CATALOGS = 4


def judged_key(plan: Plan, catalog: Catalog, *, sglang_version: str = SGLANG_VERSION) -> str:
    """sha256 (hex, 64 chars) of everything the oracle's verdict on ``plan`` depends on.

    Both roles' pod launches (``judge.pod_launches``: the config file, args and env each
    pod of a replica starts with), each role's accelerator facts (``device.device_facts``)
    and plugin entry, the catalog's plugins (the workers' stand-in distribution), the
    model's HF config and ``sglang_version``. The deployment's name and namespace are not
    part of it: two tenants with the same spec share a verdict (the verdict carries no
    name). Raises nothing for a planned spec; an accelerator missing from the catalog
    hashes as None (the verdict is then indeterminate, and cached only briefly, like every
    indeterminate verdict: ``VerdictService.indeterminate_ttl_s``).
    """
    roles = {}
    for role in (plan.prefill, plan.decode):
        acc = role.inputs.accelerator
        roles[role.role] = {
            "accelerator": role.inputs.accelerator_name,
            "device": device_facts(acc).to_json() if acc is not None else None,
            "plugin": role.inputs.plugin.model_dump(mode="json") if role.inputs.plugin is not None else None,
            "launches": pod_launches(plan, role),
        }
    data = {
        "sglang": sglang_version,
        "model": plan.spec.model.name,
        "hfConfig": catalog.hf_config(plan.spec.model.name),
        "plugins": {k: v.model_dump(mode="json") for k, v in sorted(catalog.plugins.items())},
        "speculative": plan.spec.speculative.model_dump(mode="json") if plan.spec.speculative else None,
        "roles": roles,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


class Rejected(Exception):
    """A request the service answers with an HTTP error: ``status`` and a ``message`` naming the fix."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


@dataclass
class _Job:
    key: str
    plan: Plan
    oracle: Oracle
    deadline: float
    queued_at: float
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class VerdictService:
    """Judges PDDeployments with warm oracle workers; see the module docstring.

    ``oracle_factory(catalog) -> Oracle`` makes the oracle of one catalog (default: an
    :class:`Oracle` with ``python``, ``max_workers`` and a per-call timeout of
    ``request_timeout_s``); ``warm``: accelerator names whose workers start at
    :meth:`start` (``/readyz`` waits for them). ``cache_size``: verdicts kept (LRU);
    ``indeterminate_ttl_s``: seconds an indeterminate one of them is kept (0: never
    cached). ``clock``: monotonic seconds.
    """

    def __init__(self, *, catalog: Catalog | None = None, warm: tuple[str, ...] = (), judges: int = 2,
                 queue_size: int = DEFAULT_QUEUE_SIZE, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 cache_size: int = 4096, indeterminate_ttl_s: float = DEFAULT_INDETERMINATE_TTL_S,
                 python: str | None = None, max_workers: int = 4,
                 oracle_factory: Callable[[Catalog], Oracle] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.catalog = catalog or builtin_catalog()
        self.warm = tuple(warm)
        self.judges = max(1, judges)
        self.request_timeout_s = request_timeout_s
        self.cache_size = cache_size
        self.indeterminate_ttl_s = indeterminate_ttl_s
        self.clock = clock
        self._factory = oracle_factory or (lambda c: Oracle(catalog=c, python=python, max_workers=max_workers,
                                                            timeout=request_timeout_s))
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        #: judged key -> (the verdict's JSON, when it expires in ``clock`` seconds; None: kept until evicted)
        self._cache: collections.OrderedDict[str, tuple[dict[str, Any], float | None]] = collections.OrderedDict()
        self._inflight: dict[str, _Job] = {}
        self._oracles: dict[str, tuple[Catalog, Oracle]] = {}
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()
        self.warm_error: str | None = None
        self.warm_seconds: dict[str, float] = {}
        self.stats = {"requests": 0, "cacheHits": 0, "coalesced": 0, "judged": 0, "indeterminate": 0,
                      "oracleErrors": 0, "rejectedQueueFull": 0, "timeouts": 0, "expiredInQueue": 0}

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self.stats[name] += 1

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the judge threads and warm the ``warm`` accelerators' workers (in the background)."""
        for i in range(self.judges):
            t = threading.Thread(target=self._judge_loop, name=f"oracle-judge-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        threading.Thread(target=self._warm, name="oracle-warm", daemon=True).start()

    def _warm(self) -> None:
        oracle = self._oracle(None)
        try:
            for acc in self.warm:
                t0 = time.monotonic()
                oracle.pool.worker(acc)
                self.warm_seconds[acc] = round(time.monotonic() - t0, 2)
                log.info("oracle worker for %s is warm (%.1f s)", acc, self.warm_seconds[acc])
        except OracleError as e:
            self.warm_error = str(e).splitlines()[0]
            log.error("oracle: a warm worker did not start: %s", e)
            return
        self.ready.set()

    def close(self) -> None:
        """Stop the judges (jobs still queued fail) and every oracle's workers."""
        for _ in self._threads:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break
        with self._lock:
            oracles = [o for _, o in self._oracles.values()]
            self._oracles.clear()
        for o in oracles:
            o.close()

    # ------------------------------------------------------------------ judging
    def _oracle(self, overrides: dict[str, str] | None) -> Oracle:
        digest = hashlib.sha256(json.dumps(overrides or {}, sort_keys=True).encode()).hexdigest()
        with self._lock:
            if digest in self._oracles:
                return self._oracles[digest][1]
            if len(self._oracles) >= MAX_CATALOGS:
                raise Rejected(HTTPStatus.SERVICE_UNAVAILABLE,
                               f"the service already keeps {MAX_CATALOGS} distinct catalogs; restart it to change catalogs")
        try:
            catalog = load_catalog(overrides=overrides) if overrides else self.catalog
        except CatalogError as e:
            raise Rejected(HTTPStatus.BAD_REQUEST, f"catalogOverrides: {e}") from e
        with self._lock:
            if digest not in self._oracles:
                self._oracles[digest] = (catalog, self._factory(catalog))
            return self._oracles[digest][1]

    def verdict(self, request: Any) -> dict[str, Any]:
        """Answer one decoded request body (see the module docstring); raises :class:`Rejected`."""
        if not isinstance(request, dict) or not isinstance(request.get("object"), dict):
            raise Rejected(HTTPStatus.BAD_REQUEST, 'the body must be {"object": <PDDeployment>, "catalogOverrides": ...}')
        overrides = request.get("catalogOverrides")
        if overrides is not None and not (isinstance(overrides, dict)
                                          and all(isinstance(v, str) for v in overrides.values())):
            raise Rejected(HTTPStatus.BAD_REQUEST, "catalogOverrides must map a catalog file name to its text")
        obj = request["object"]
        self._count("requests")
        started = self.clock()
        oracle = self._oracle(overrides)
        try:
            plan, problems = plan_object(obj, oracle.catalog)
        except (RecursionError, ValueError, TypeError, KeyError, AttributeError) as e:  # a hostile object
            raise Rejected(HTTPStatus.UNPROCESSABLE_ENTITY, f"the object cannot be read as a PDDeployment: {e}") from None
        if plan is None:
            raise Rejected(HTTPStatus.UNPROCESSABLE_ENTITY, "the object does not parse as a PDDeployment",
                           problems=[p.to_dict() for p in problems])
        key = judged_key(plan, oracle.catalog)
        base = {"valid": not errors(problems), "problems": [p.to_dict() for p in problems], "compatKey": plan.compat_key}
        with self._lock:
            hit = self._cached(key)
            if hit is not None:
                self._count("cacheHits")
                return {**base, "sglang": hit, "oracle": {"key": key, "cached": True, "queuedSeconds": 0.0}}
            job = self._inflight.get(key)
            if job is not None:
                self._count("coalesced")
            else:
                job = _Job(key=key, plan=plan, oracle=oracle, deadline=started + self.request_timeout_s,
                           queued_at=started)
                try:
                    self._queue.put_nowait(job)
                except queue.Full:
                    self._count("rejectedQueueFull")
                    raise Rejected(HTTPStatus.SERVICE_UNAVAILABLE,
                                   f"the oracle's queue is full ({self._queue.maxsize} specs waiting); retry later",
                                   retryAfter=5) from None
                self._inflight[key] = job
        try:
            sglang, timing = job.future.result(timeout=max(0.0, started + self.request_timeout_s - self.clock()))
        except concurrent.futures.TimeoutError:
            self._count("timeouts")
            raise Rejected(HTTPStatus.GATEWAY_TIMEOUT,
                           f"SGLang gave no verdict within {self.request_timeout_s:.0f} s") from None
        except OracleError as e:
            raise Rejected(HTTPStatus.SERVICE_UNAVAILABLE, f"the oracle failed, no verdict: {e}") from None
        return {**base, "sglang": sglang, "oracle": {"key": key, "cached": False, **timing}}

    def _cached(self, key: str) -> dict[str, Any] | None:
        """The cached verdict's JSON for ``key``, None when there is none or it expired (dropped then).

        The caller holds ``self._lock``.
        """
        entry = self._cache.get(key)
        if entry is None:
            return None
        data, expires = entry
        if expires is not None and self.clock() >= expires:
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return data

    def _remember(self, key: str, data: dict[str, Any]) -> None:
        """Cache a verdict's JSON: SGLang's accept or refusal until evicted, an indeterminate one
        (``accepted`` None) for ``indeterminate_ttl_s`` seconds (not at all when that is 0)."""
        expires = None
        if data.get("accepted") is None:
            self._count("indeterminate")
            if self.indeterminate_ttl_s <= 0:
                return
            expires = self.clock() + self.indeterminate_ttl_s
        with self._lock:
            self._cache[key] = (data, expires)
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _judge_loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            began = self.clock()
            try:
                if began > job.deadline:
                    self._count("expiredInQueue")
                    raise OracleError("the request timed out while it waited in the queue")
                verdict = job.oracle.judge_plan(job.plan)
                data = verdict.to_dict()
                data["seconds"] = round(self.clock() - began, 3)
                self._remember(job.key, data)
                self._count("judged")
                job.future.set_result((data, {"queuedSeconds": round(began - job.queued_at, 3)}))
            except OracleError as e:
                self._count("oracleErrors")
                job.future.set_exception(e)
            except Exception as e:  # a bug of the oracle: no verdict, never a crash of the service
                log.exception("oracle: judging %s failed", job.key[:12])
                self._count("oracleErrors")
                job.future.set_exception(OracleError(f"{type(e).__name__}: {e}"))
            finally:
                with self._lock:
                    self._inflight.pop(job.key, None)

    def snapshot(self) -> dict[str, Any]:
        """The service's figures: queue depth, cache size, counters, warm workers' start seconds."""
        with self._lock, self._stats_lock:
            return {**self.stats, "queued": self._queue.qsize(), "cached": len(self._cache),
                    "inflight": len(self._inflight), "ready": self.ready.is_set(), "warm": dict(self.warm_seconds),
                    "warmError": self.warm_error}


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each against its handler's ``read_deadline`` (``time.monotonic`` seconds).

    Every ``recv`` gets the time left until the deadline as its socket timeout, so the
    request line, headers and body of one request arrive within the deadline in all,
    however slowly they trickle in. Past it a read raises ``TimeoutError`` (which
    ``BaseHTTPRequestHandler`` answers by closing the connection). After each read the
    socket's timeout is ``idle_timeout_s`` again: writes keep a per-operation timeout.
    """

    def __init__(self, sock: socket.socket, handler: "_Handler", *, idle_timeout_s: float) -> None:
        super().__init__()
        self._sock = sock
        self._handler = handler
        self._idle_timeout_s = idle_timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._handler.read_deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not read within its deadline")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle_timeout_s)


class _Handler(BaseHTTPRequestHandler):
    server: "OracleHTTPServer"
    protocol_version = "HTTP/1.1"
    #: ``time.monotonic`` seconds by which the current request's line, headers and body must be read.
    read_deadline: float = 0.0

    def setup(self) -> None:
        """The connection's reader keeps each request's deadline (:class:`_DeadlineReader`)."""
        super().setup()
        self.rfile.close()  # the socket's own reader: its reference would keep the socket open
        self.rfile = io.BufferedReader(
            _DeadlineReader(self.connection, self, idle_timeout_s=self.server.read_timeout_s),
            self.rbufsize if self.rbufsize > 0 else io.DEFAULT_BUFFER_SIZE)

    def handle_one_request(self) -> None:
        """One request, its line, headers and body read within ``server.read_timeout_s`` from now."""
        self.read_deadline = time.monotonic() + self.server.read_timeout_s
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        service = self.server.service
        if self.path == "/healthz":
            self._send(200, {"ok": True})
        elif self.path == "/readyz":
            ready = service.ready.is_set()
            why = service.warm_error or f"warming the workers of {', '.join(service.warm)}"
            self._send(200 if ready else 503, {"ready": ready, **({} if ready else {"why": why})})
        elif self.path == "/stats":
            self._send(200, service.snapshot())
        else:
            self._send(404, {"error": f"no such path {self.path}; POST {API_PATH}, GET /healthz, /readyz, /stats"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != API_PATH:
            self.close_connection = True
            self._send(404, {"error": f"no such path {self.path}; POST {API_PATH}"})
            return
        try:
            body = self._read_body()
            try:
                request = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise Rejected(HTTPStatus.BAD_REQUEST, f"the body is not JSON (or nests too deep): {e}") from None
            self._send(200, self.server.service.verdict(request))
        except Rejected as e:
            headers = {"Retry-After": str(e.extra["retryAfter"])} if "retryAfter" in e.extra else None
            self._send(e.status, {"error": e.message, **{k: v for k, v in e.extra.items() if k != "retryAfter"}},
                       headers)

    def _read_body(self) -> bytes:
        """The request's body (Content-Length bytes, at most ``server.max_body_bytes``), read by the
        request's deadline; raises :class:`Rejected` 411 (no length), 413 (too large), 408 (the
        deadline passed), 400 (the client closed before the body ended)."""
        length = self.headers.get("Content-Length")
        limit = self.server.max_body_bytes
        if length is None or not length.isdigit():
            self.close_connection = True
            raise Rejected(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        if int(length) > limit:
            self.close_connection = True
            raise Rejected(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"the body has {int(length)} bytes, more than the limit of {limit}")
        try:
            body = self.rfile.read(int(length))
        except TimeoutError:
            self.close_connection = True
            raise Rejected(HTTPStatus.REQUEST_TIMEOUT, f"the request's headers and body did not arrive within "
                           f"{self.server.read_timeout_s:g} s") from None
        if len(body) < int(length):  # the client closed its side early
            self.close_connection = True
            raise Rejected(HTTPStatus.BAD_REQUEST, f"the body ended after {len(body)} of {int(length)} bytes")
        return body


class OracleHTTPServer(ThreadingHTTPServer):
    """The HTTP front of a :class:`VerdictService`: one thread per connection, at most ``max_connections``.

    ``max_body_bytes``: the largest body (413 beyond, 411 without Content-Length);
    ``read_timeout_s``: seconds each request's line, headers and body may take in all (the
    connection is closed past it, with a 408 once the headers are in), also the timeout of
    each write.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], service: VerdictService, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, max_connections: int = 128) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Refuse a connection beyond ``max_connections`` at once (503), else serve it on a thread."""
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            finally:
                self.shutdown_request(request)
            return
        request.settimeout(self.read_timeout_s)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:  # noqa: D102
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
