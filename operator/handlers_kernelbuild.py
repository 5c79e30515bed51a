"""kopf handlers for KernelBuilds: thin. Each turns an event into "reconcile this KernelBuild".

- a KernelBuild event (added, modified) reconciles it;
- an event of a build Job or a build pod (labelled ``pd.sglang-operator.io/kernelbuild``)
  reconciles its KernelBuild: Job completion, and the builder's result arriving in the
  pod's termination message, move the status on;
- a resync loop reconciles every KernelBuild every ``--resync`` seconds: retry backoff,
  the result timeout and retention are time-based and must not depend on an event.

Like ``handlers.py``: event handlers only (no create/update/timer handlers, so kopf adds
no finalizers or annotations to the user's object). ``handlers.py`` imports this module
so kopf registers these handlers in the same operator process; the runtime (API client,
catalog) is taken from ``handlers.RUNTIME`` unless :func:`configure` set one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import kopf

from .api.kernelbuild import KIND, PLURAL
from .api.v1alpha1 import API_VERSION, GROUP, VERSION
from .catalog import Catalog
from .kernelbuild.inputs import LABEL_KERNELBUILD
from .kernelbuild.recipes import BuildCatalog, builtin_build_catalog
from .reconcilers.kernelbuild import KernelBuildOutcome, builds_in_use, reconcile
from .reconcilers.kube import Kube

log = logging.getLogger(__name__)

RESYNC_SECONDS: float | None = None  # None: follow handlers.RESYNC_SECONDS (the --resync option)
IN_USE_TTL_SECONDS: float = 10.0


@dataclass
class KernelBuildRuntime:
    """What a KernelBuild reconcile needs: API access, catalogs, per-object locks, a cache of usage."""

    kube: Kube
    catalog: Callable[[], Catalog]
    builds: Callable[[], BuildCatalog] = builtin_build_catalog
    builder_image: str | None = None
    namespaces: list[str] | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _in_use: dict[str, tuple[float, set[str] | None]] = field(default_factory=dict)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock serializing reconciles of one KernelBuild."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def in_use(self, namespace: str) -> set[str] | None:
        """KernelBuild names the namespace's PDDeployments use (cached for IN_USE_TTL_SECONDS)."""
        now = time.monotonic()
        cached = self._in_use.get(namespace)
        if cached is not None and now - cached[0] < IN_USE_TTL_SECONDS:
            return cached[1]
        used = builds_in_use(self.kube, namespace, self.catalog(), self.builds())
        self._in_use[namespace] = (now, used)
        return used

    def reconcile_key(self, namespace: str, name: str) -> KernelBuildOutcome | None:
        """Read the KernelBuild fresh and reconcile it; None when it no longer exists."""
        with self.lock(namespace, name):
            body = self.kube.get(API_VERSION, KIND, name, namespace)
            if body is None:
                return None
            used = self.in_use(namespace)
            return reconcile(
                kube=self.kube,
                body=body,
                catalog=self.catalog(),
                builds=self.builds(),
                in_use=None if used is None else name in used,
                builder_image=self.builder_image,
            )

    def list_keys(self) -> list[tuple[str, str]]:
        """(namespace, name) of every KernelBuild (in ``namespaces``, or cluster-wide)."""
        out = []
        for ns in self.namespaces or [None]:
            for item in self.kube.list(API_VERSION, KIND, ns, ""):
                out.append((item["metadata"]["namespace"], item["metadata"]["name"]))
        return out


RUNTIME: KernelBuildRuntime | None = None


def configure(runtime: KernelBuildRuntime) -> None:
    """Use ``runtime`` (tests, or an operator process that builds its own)."""
    global RUNTIME
    RUNTIME = runtime


def _runtime() -> KernelBuildRuntime:
    global RUNTIME
    if RUNTIME is None:
        from . import handlers  # the PDDeployment handlers' runtime: one API client per process

        if handlers.RUNTIME is None:  # pragma: no cover - cli.run always sets it
            raise RuntimeError("no runtime: start the operator with `sglang-pd-operator run`")
        RUNTIME = KernelBuildRuntime(
            kube=handlers.RUNTIME.kube, catalog=handlers.RUNTIME.catalog, namespaces=handlers.NAMESPACES
        )
    return RUNTIME


def _reconcile(namespace: str | None, name: str | None) -> None:
    if not namespace or not name:
        return
    outcome = _runtime().reconcile_key(namespace, name)
    if outcome is not None and (outcome.created_job or outcome.deleted or outcome.events):
        log.info(
            "kernelbuild %s/%s: phase %s, job %s, deleted %s",
            namespace,
            name,
            outcome.phase,
            outcome.created_job,
            outcome.deleted,
        )


@kopf.on.startup()
async def start_kernelbuild_resync(memo: kopf.Memo, **_: Any) -> None:
    """Start the KernelBuild resync loop (time-based steps: retry backoff, result timeout, retention).

    It beats the ``kernelbuild-resync`` liveness heartbeat (``liveness.py``) of the
    PDDeployment runtime, when there is one, after each KernelBuild and each sleep.
    """
    beats = _heartbeats()
    if beats is not None:
        from . import handlers

        beats.register(HEARTBEAT, max_age_s=_interval() + handlers.RUNTIME.stuck_after_s)
    memo["kernelbuild_resync"] = asyncio.get_running_loop().create_task(_resync_loop())


@kopf.on.cleanup()
async def stop_kernelbuild_resync(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync loop (its heartbeat is no longer expected)."""
    task = memo.get("kernelbuild_resync")
    if task is not None:
        task.cancel()
    beats = _heartbeats()
    if beats is not None:
        beats.unregister(HEARTBEAT)


HEARTBEAT = "kernelbuild-resync"


def _heartbeats():
    """The operator process's ``liveness.Heartbeats`` (None outside ``run``)."""
    from . import handlers

    return handlers.RUNTIME.heartbeats if handlers.RUNTIME is not None else None


def _beat() -> None:
    beats = _heartbeats()
    if beats is not None:
        beats.beat(HEARTBEAT)


def _interval() -> float:
    if RESYNC_SECONDS is not None:
        return RESYNC_SECONDS
    from . import handlers

    return handlers.RESYNC_SECONDS


async def _resync_loop() -> None:
    while True:
        await asyncio.sleep(_interval())
        _beat()
        try:
            rt = _runtime()
            keys = await asyncio.to_thread(rt.list_keys)
        except Exception as e:  # keep the loop alive across API hiccups
            log.warning("kernelbuild resync: cannot list KernelBuilds: %s", e)
            continue
        for ns, name in keys:
            try:
                await asyncio.to_thread(_reconcile, ns, name)
            except Exception as e:
                log.exception("kernelbuild resync: reconcile %s/%s failed: %s", ns, name, e)
            _beat()


@kopf.on.event(GROUP, VERSION, PLURAL)
def kernelbuild_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """Reconcile the KernelBuild that changed (deletion: owner references collect its children)."""
    if event.get("type") == "DELETED":
        return
    _reconcile(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_KERNELBUILD: kopf.PRESENT})
def kernelbuild_job_event(event: dict[str, Any], labels: dict[str, str], namespace: str, **_: Any) -> None:
    """A build Job changed (started, completed, failed): reconcile its KernelBuild."""
    if event.get("type") == "DELETED":
        return
    _reconcile(namespace, labels.get(LABEL_KERNELBUILD))


@kopf.on.event("", "v1", "pods", labels={LABEL_KERNELBUILD: kopf.PRESENT})
def kernelbuild_pod_event(event: dict[str, Any], labels: dict[str, str], namespace: str, **_: Any) -> None:
    """A build pod changed: its termination message carries the builder's result."""
    if event.get("type") == "DELETED":
        return
    _reconcile(namespace, labels.get(LABEL_KERNELBUILD))
