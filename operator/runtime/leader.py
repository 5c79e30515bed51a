"""Leader election on a ``coordination.k8s.io`` Lease: only the replica holding it reconciles.

On by default (``run --leader-elect``): any two operator processes that reach one
cluster meet on the same Lease, whether they are the chart's two replicas, a second
``sglang-pd-operator run`` on a laptop, or an old pod still terminating beside its
replacement. Each process serves ``/metrics`` and ``/healthz`` and waits here; the one
that acquires the Lease runs kopf (event handlers and the resync loop), the other keeps
trying. Built on the official client's ``kubernetes.leaderelection`` with its
``LeaseLock`` (client-go's algorithm: the holder renews every retry period; a follower
takes over once it has seen no renewal for a lease duration, timed on its own clock).

- Who leads is logged: a follower names the holder when it starts waiting and whenever
  the holder changes; the leader logs its identity and the Lease when it acquires it.
- Every Lease call has a timeout (:attr:`LeaderSettings.call_timeout`, default half the
  renew deadline), so a half-open connection cannot hold a renewal.
- A watchdog (:class:`RenewWatchdog`), independent of the library's renew loop, ends
  leadership once no renewal has succeeded for the renew deadline, timed from when the
  last successful renewal was *sent*: a follower can only take over a lease duration
  after it saw that renewal, which it saw after it was sent, and the renew deadline is
  shorter than the lease duration, so two replicas never lead at once (as long as the
  clocks run at about the same rate; the margin is lease duration - renew deadline).
- Lost leadership (not renewed within the renew deadline, or another holder in the
  Lease) ends the process at once with exit code :data:`EXIT_LOST_LEADERSHIP`, as
  client-go controllers do: no handler or resync of this process runs after another
  replica may have started, and Kubernetes restarts the pod as a follower.
- A graceful stop (SIGTERM -> kopf returns) stops renewing and releases the Lease
  (empty holder), so the other replica takes over within a retry period instead of a
  whole lease duration.

Needs RBAC on leases in the Lease's namespace: get, create, update.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client as k8s
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)

EXIT_LOST_LEADERSHIP = 3

#: The Lease every operator process uses unless told otherwise (``--leader-elect-lease``).
DEFAULT_LEASE = "sglang-pd-operator"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class LeaderSettings:
    """Where the Lease lives, who we are, and the timing (seconds, client-go's defaults).

    ``call_timeout``: connect and read timeout of each Lease request (None: half the
    renew deadline). Constraint (checked by ``run``): lease > renew > 1.2 * retry.
    """

    lease_name: str
    namespace: str
    identity: str
    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2
    call_timeout: float | None = None

    @property
    def request_timeout(self) -> tuple[float, float]:
        """(connect, read) seconds for every Lease call."""
        t = self.call_timeout if self.call_timeout is not None else self.renew_deadline / 2
        return (t, t)


def default_identity() -> str:
    """``$POD_NAME`` (the chart sets it), else ``<hostname>-<pid>-<random>``: unique per process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def default_lease_namespace(*, kubeconfig_namespace: str | None = None) -> tuple[str, str]:
    """(namespace of the Lease, where that came from) when ``--operator-namespace`` is not given.

    In a pod: the service account's namespace (the file Kubernetes mounts). Outside: the
    kubeconfig context's namespace, else ``default``. Every process started the same way
    on one cluster picks the same namespace, so they meet on one Lease.
    """
    try:
        ns = _SA_NAMESPACE.read_text().strip()
        if ns:
            return ns, f"the service account's namespace ({_SA_NAMESPACE})"
    except OSError:
        pass
    if kubeconfig_namespace:
        return kubeconfig_namespace, "the kubeconfig context's namespace"
    return "default", "no --operator-namespace, $POD_NAMESPACE or kubeconfig namespace"


class RenewWatchdog:
    """Ends leadership when no renewal succeeded for ``deadline`` seconds (see the module docstring).

    :meth:`renewed` takes the monotonic time at which the successful request was sent.
    :meth:`expired` is checked by a thread every ``tick`` seconds while leading;
    ``on_expired`` is then called once.
    """

    def __init__(self, *, deadline: float, on_expired: Callable[[], None], clock: Callable[[], float] = time.monotonic,
                 tick: float = 0.25):
        self.deadline = deadline
        self.on_expired = on_expired
        self.clock = clock
        self.tick = tick
        self._last: float | None = None
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._fired = False

    def renewed(self, sent_at: float) -> None:
        """A create or update of the Lease sent at ``sent_at`` (monotonic seconds) succeeded."""
        with self._guard:
            if self._last is None or sent_at > self._last:
                self._last = sent_at

    def age(self) -> float | None:
        """Seconds since the last successful renewal was sent (None: never)."""
        with self._guard:
            return None if self._last is None else self.clock() - self._last

    def expired(self) -> bool:
        """True when the last successful renewal was sent more than ``deadline`` seconds ago."""
        age = self.age()
        return age is not None and age > self.deadline

    def check(self) -> bool:
        """Call ``on_expired`` (once) when expired; returns whether it fired."""
        if self.expired() and not self._fired and not self._stop.is_set():
            self._fired = True
            self.on_expired()
        return self._fired

    def start(self) -> None:
        """Check every ``tick`` seconds in a daemon thread until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.wait(self.tick):
                if self.check():
                    return
        threading.Thread(target=loop, name="leader-renew-watchdog", daemon=True).start()

    def stop(self) -> None:
        """Stop checking (a graceful release)."""
        self._stop.set()


class _TimedLeases:
    """The three Lease calls ``LeaseLock`` makes, each with ``request_timeout``."""

    def __init__(self, api: k8s.CoordinationV1Api, request_timeout: tuple[float, float]):
        self._api = api
        self._timeout = request_timeout

    def read_namespaced_lease(self, name, namespace, **kw):
        return self._api.read_namespaced_lease(name, namespace, _request_timeout=self._timeout, **kw)

    def create_namespaced_lease(self, namespace, body, **kw):
        return self._api.create_namespaced_lease(namespace, body, _request_timeout=self._timeout, **kw)

    def replace_namespaced_lease(self, name, namespace, body, **kw):
        return self._api.replace_namespaced_lease(name=name, namespace=namespace, body=body,
                                                  _request_timeout=self._timeout, **kw)


class _Lease(LeaseLock):
    """LeaseLock bound to our ApiClient, with timed calls, that can be closed: after :meth:`close` it no longer renews.

    Reports each successful create/update to ``watchdog`` (its send time), each read to
    ``on_read`` (a heartbeat), and logs the holder whenever it changes.
    """

    def __init__(self, *, api_client: k8s.ApiClient, settings: LeaderSettings, watchdog: RenewWatchdog,
                 on_read: Callable[[], None] | None = None):
        super().__init__(settings.lease_name, settings.namespace, settings.identity)
        self.api_instance = _TimedLeases(k8s.CoordinationV1Api(api_client), settings.request_timeout)
        self.watchdog = watchdog
        self.on_read = on_read
        self._guard = threading.Lock()
        self.closed = False
        self.holder: str | None = None

    # The library catches ApiException only; a connection error would end its thread (and a
    # leader would go on without renewing). Every failure is a failed attempt instead.
    def get(self, name, namespace):
        try:
            found, record = super().get(name, namespace)
        except Exception as e:  # noqa: BLE001 - see above
            log.warning("leader lease %s/%s: read failed: %s", namespace, name, e)
            return False, e
        if self.on_read is not None:
            self.on_read()
        holder = getattr(record, "holder_identity", None) if found else None
        if found and holder != self.holder:
            self.holder = holder
            if holder and holder != self.identity:
                log.info("leader lease %s/%s is held by %s; this replica (%s) follows and takes over when it "
                         "is not renewed for %ss", namespace, name, holder, self.identity,
                         getattr(record, "lease_duration", "?"))
        return found, record

    def create(self, name, namespace, election_record):
        with self._guard:
            if self.closed:
                return False
            sent = time.monotonic()
            try:
                ok = super().create(name, namespace, election_record)
            except Exception as e:  # noqa: BLE001
                log.warning("leader lease %s/%s: create failed: %s", namespace, name, e)
                return False
            if ok:
                self.watchdog.renewed(sent)
            return ok

    def update(self, name, namespace, updated_record):
        with self._guard:
            if self.closed:
                return False
            sent = time.monotonic()
            try:
                ok = super().update(name, namespace, updated_record)
            except Exception as e:  # noqa: BLE001
                log.warning("leader lease %s/%s: update failed: %s", namespace, name, e)
                return False
            if ok:
                self.watchdog.renewed(sent)
            return ok

    def close_and_release(self) -> bool:
        """Stop renewing; if we still hold the Lease, empty its holder. True when released."""
        with self._guard:
            self.closed = True
            self.watchdog.stop()
            try:
                lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return False
                now = datetime.now(timezone.utc)
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = now
                lease.spec.acquire_time = now
                self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
                return True
            except Exception as e:  # noqa: BLE001 - a stop must not hang or raise on a dead connection
                log.warning("could not release the leader lease %s/%s: %s", self.namespace, self.name,
                            getattr(e, "reason", e))
                return False


class AnotherLeader(Exception):
    """Another process holds the Lease, and this one was started without leader election."""


def refuse_if_led(*, api_client: k8s.ApiClient, settings: LeaderSettings,
                  now: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
    """Raise :class:`AnotherLeader` when the Lease names a holder whose lease has not run out.

    For ``run --no-leader-elect``: a process that reconciles without the Lease must not
    start beside one that leads. The check compares the Lease's renewTime + duration with
    this machine's clock. A Lease that cannot be read (missing, no RBAC, API down) lets
    the process start; so does a holder that stopped renewing. It cannot see a second
    process started with --no-leader-elect: those never write the Lease.
    """
    try:
        lease = k8s.CoordinationV1Api(api_client).read_namespaced_lease(
            settings.lease_name, settings.namespace, _request_timeout=settings.request_timeout)
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.debug("leader lease %s/%s not readable (%s): no other leader known", settings.namespace,
                  settings.lease_name, getattr(e, "reason", e))
        return
    spec = lease.spec
    if spec is None or not spec.holder_identity or spec.renew_time is None:
        return
    until = spec.renew_time.timestamp() + (spec.lease_duration_seconds or settings.lease_duration)
    if until > now().timestamp():
        raise AnotherLeader(
            f"{spec.holder_identity} holds the leader lease {settings.namespace}/{settings.lease_name} and "
            f"reconciles this cluster; started with --no-leader-elect, this process would reconcile every "
            f"object a second time. Drop --no-leader-elect (it then waits as a follower), or stop the other one")


def _exit_lost(settings: LeaderSettings) -> None:
    log.critical("lost the leader lease %s/%s (identity %s): exiting with code %d so that Kubernetes restarts "
                 "this replica as a follower", settings.namespace, settings.lease_name, settings.identity,
                 EXIT_LOST_LEADERSHIP)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOST_LEADERSHIP)


def run_when_leading(*, api_client: k8s.ApiClient, settings: LeaderSettings, run: Callable[[], None],
                     on_lost: Callable[[], None] | None = None, on_read: Callable[[], None] | None = None) -> None:
    """Block until this process holds the Lease, then call ``run`` in this thread; release the Lease after.

    ``on_lost`` (default: log and ``os._exit(EXIT_LOST_LEADERSHIP)``) is called once, from
    the election thread or the renew watchdog, when leadership is lost while ``run`` is
    still running. ``on_read`` is called after every successful read of the Lease (about
    every retry period, leader or follower: a heartbeat of the election).
    """
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:  # the library logs every renewal at INFO
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
    lost_once = threading.Lock()
    lock: _Lease

    def stopped_leading() -> None:
        if lock.closed:  # we released it ourselves on a graceful stop
            return
        if lost_once.acquire(blocking=False):
            (on_lost or (lambda: _exit_lost(settings)))()

    def renew_deadline_passed() -> None:
        log.error("leader lease %s/%s: no renewal succeeded for %ss (renew deadline); stopping before the lease "
                  "(%ss) can pass to another replica", settings.namespace, settings.lease_name,
                  settings.renew_deadline, settings.lease_duration)
        stopped_leading()

    watchdog = RenewWatchdog(deadline=settings.renew_deadline, on_expired=renew_deadline_passed)
    lock = _Lease(api_client=api_client, settings=settings, watchdog=watchdog, on_read=on_read)
    leading = threading.Event()

    config = electionconfig.Config(
        lock=lock,
        lease_duration=settings.lease_duration,
        renew_deadline=settings.renew_deadline,
        retry_period=settings.retry_period,
        onstarted_leading=leading.set,
        onstopped_leading=stopped_leading,
    )

    def elect() -> None:
        try:
            leaderelection.LeaderElection(config).run()  # returns only after leadership was lost
        except BaseException:  # noqa: BLE001 - an election that died must not leave a leader running
            log.exception("leader election failed")
            stopped_leading()

    elector = threading.Thread(target=elect, name="leader-election", daemon=True)
    elector.start()
    log.info("waiting for the leader lease %s/%s (identity %s)", settings.namespace, settings.lease_name,
             settings.identity)
    leading.wait()
    watchdog.start()
    log.info("acquired the leader lease %s/%s: this replica (%s) leads and reconciles", settings.namespace,
             settings.lease_name, settings.identity)
    try:
        run()
    finally:
        if lock.close_and_release():
            log.info("released the leader lease %s/%s", settings.namespace, settings.lease_name)
