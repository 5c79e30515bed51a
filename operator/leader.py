"""Leader election on a ``coordination.k8s.io`` Lease: only the replica holding it reconciles.

The chart runs two replicas of the operator. Both start, serve ``/metrics`` and wait
here; the one that acquires the Lease runs kopf (event handlers and the resync loop),
the other keeps trying. Built on the official client's ``kubernetes.leaderelection``
with its ``LeaseLock`` (the same algorithm as client-go: the holder renews every retry
period; a follower takes over once the lease has not been renewed for its duration).

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
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger(__name__)

EXIT_LOST_LEADERSHIP = 3


@dataclass(frozen=True)
class LeaderSettings:
    """Where the Lease lives, who we are, and the timing (seconds, client-go's defaults)."""

    lease_name: str
    namespace: str
    identity: str
    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2


def default_identity() -> str:
    """``$POD_NAME`` (the chart sets it), else ``<hostname>-<random>``: unique per process."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class _Lease(LeaseLock):
    """LeaseLock bound to our ApiClient that can be closed: after :meth:`close` it no longer renews."""

    def __init__(self, *, api_client: k8s.ApiClient, name: str, namespace: str, identity: str):
        super().__init__(name, namespace, identity)
        self.api_instance = k8s.CoordinationV1Api(api_client)
        self._guard = threading.Lock()
        self.closed = False

    # The library catches ApiException only; a connection error would end its thread (and a
    # leader would go on without renewing). Every failure is a failed attempt instead.
    def get(self, name, namespace):
        try:
            return super().get(name, namespace)
        except Exception as e:  # noqa: BLE001 - see above
            log.warning("leader lease %s/%s: read failed: %s", namespace, name, e)
            return False, e

    def create(self, name, namespace, election_record):
        with self._guard:
            if self.closed:
                return False
            try:
                return super().create(name, namespace, election_record)
            except Exception as e:  # noqa: BLE001
                log.warning("leader lease %s/%s: create failed: %s", namespace, name, e)
                return False

    def update(self, name, namespace, updated_record):
        with self._guard:
            if self.closed:
                return False
            try:
                return super().update(name, namespace, updated_record)
            except Exception as e:  # noqa: BLE001
                log.warning("leader lease %s/%s: update failed: %s", namespace, name, e)
                return False

    def close_and_release(self) -> bool:
        """Stop renewing; if we still hold the Lease, empty its holder. True when released."""
        with self._guard:
            self.closed = True
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
            except ApiException as e:
                log.warning("could not release the leader lease %s/%s: %s", self.namespace, self.name, e.reason)
                return False


def _exit_lost(settings: LeaderSettings) -> None:
    log.critical("lost the leader lease %s/%s (identity %s): exiting with code %d so that Kubernetes restarts "
                 "this replica as a follower", settings.namespace, settings.lease_name, settings.identity,
                 EXIT_LOST_LEADERSHIP)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_LOST_LEADERSHIP)


def run_when_leading(*, api_client: k8s.ApiClient, settings: LeaderSettings, run: Callable[[], None],
                     on_lost: Callable[[], None] | None = None) -> None:
    """Block until this process holds the Lease, then call ``run`` in this thread; release the Lease after.

    ``on_lost`` (default: log and ``os._exit(EXIT_LOST_LEADERSHIP)``) is called from the
    election thread when leadership is lost while ``run`` is still running.
    """
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:  # the library logs every renewal at INFO
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
    lock = _Lease(api_client=api_client, name=settings.lease_name, namespace=settings.namespace,
                  identity=settings.identity)
    leading = threading.Event()

    def stopped_leading() -> None:
        if lock.closed:  # we released it ourselves on a graceful stop
            return
        (on_lost or (lambda: _exit_lost(settings)))()

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
    log.info("acquired the leader lease %s/%s: this replica reconciles", settings.namespace, settings.lease_name)
    try:
        run()
    finally:
        if lock.close_and_release():
            log.info("released the leader lease %s/%s", settings.namespace, settings.lease_name)
