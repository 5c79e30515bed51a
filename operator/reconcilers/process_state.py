"""The operator process's state besides the cache, one class per concern, each the only owner of its state.

``Runtime`` (``runtime.py``) composes them; nothing else holds a copy:

- :class:`HealthStore`: each deployment's latest SLO figures (:class:`~..metrics.health.Health`),
  written by the control loop's SLO-source thread, read by reconciles to write status;
- :class:`ServedKinds`: which kinds the API server serves in a group/version (the optional
  LeaderWorkerSet and Prometheus Operator kinds), discovery re-asked every ``ttl_s``;
- :class:`CatalogSource`: the kernel catalog, the built-in one merged with the admin's
  ConfigMap, re-read every ``ttl_s``; its ``version`` moves when it changes;
- :class:`PlannerViews`: which deployments the built-in planner scales, and what it last
  read of each (``scaling.pressure_view``), so a move is acted on at once;
- :class:`KernelBuildUses`: the KernelBuilds each deployment's last reconcile used;
- :class:`AutoscalerCache`: the HPAs of a namespace that target PDRoleScales, re-read every ``ttl_s``;
- :class:`ObjectLocks`: one lock per object, serializing its reconciles.

Every class is thread-safe (its own lock) and forgets a deleted deployment on request.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kubernetes import client as k8s

from ..catalog import CATALOG_FILES, Catalog, CatalogError, builtin_catalog, load_catalog
from ..metrics.health import Health
from ..metrics.slo import format_duration
from . import status as S
from .kube import note_outside_read
from .scaling import pressure_view

log = logging.getLogger(__name__)

#: Name of the admin's catalog ConfigMap in the operator's namespace.
CATALOG_CONFIGMAP = "sglang-pd-operator-catalog"


class HealthChange(enum.Enum):
    """What a new :class:`Health` changes in a deployment's status (:meth:`HealthStore.set`).

    ``NONE``: nothing status shows; ``FIGURES``: only the rounded SLO figures
    (``status.slo``, ``status.scrape`` counts); ``CONDITIONS``: a condition (SLOMet,
    Degraded, KVStoreReady) or which pods answer. The control loop writes condition
    changes at once and figures at a bounded rate.
    """

    NONE = "none"
    FIGURES = "figures"
    CONDITIONS = "conditions"


@dataclass
class HealthStore:
    """Each deployment's latest health. ``max_age_s``: health older than this is not written into
    status (the scraper stopped); ``started_at``: Unix time the age of "no health yet" counts from,
    or the first time the store was asked about a deployment, whichever is later (a deployment
    created after the operator started is not stale for the operator's uptime: a fresh user saw
    "measured nothing ... in the 173s since it started" on a 53-second-old deployment)."""

    max_age_s: float = 60.0
    started_at: float = field(default_factory=time.time)
    _health: dict[tuple[str, str], tuple[Health, tuple, tuple]] = field(default_factory=dict)
    _first_asked: dict[tuple[str, str], float] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def _since(self, key: tuple[str, str], now: float) -> tuple[float, bool]:
        """(when the age counts from, whether a health arrived); the caller holds the guard."""
        entry = self._health.get(key)
        if entry is not None:
            return entry[0].evaluated_at, True
        return max(self.started_at, self._first_asked.setdefault(key, now)), False

    def set(self, health: Health) -> HealthChange:
        """Keep ``health`` as the deployment's latest; say what of status it changes (:class:`HealthChange`).

        A health that says what the kept one says at a later time (:meth:`Health.same_but_time`)
        changes nothing and keeps the kept views (no views made again)."""
        key = (health.namespace, health.name)
        with self._guard:
            old = self._health.get(key)
        if old is not None and old[0].same_but_time(health):
            with self._guard:
                self._health[key] = (health, old[1], old[2])
            return HealthChange.NONE
        conditions, figures = S.health_views(health)
        with self._guard:
            old = self._health.get(key)
            self._health[key] = (health, conditions, figures)
        if old is None or old[1] != conditions:
            return HealthChange.CONDITIONS
        return HealthChange.FIGURES if old[2] != figures else HealthChange.NONE

    def get(self, namespace: str, name: str) -> Health | None:
        """The latest health of a deployment, None when there is none younger than ``max_age_s``."""
        with self._guard:
            entry = self._health.get((namespace, name))
        if entry is None or time.time() - entry[0].evaluated_at > self.max_age_s:
            return None
        return entry[0]

    def stale(self, namespace: str, name: str, now: float | None = None) -> str | None:
        """Why the deployment has no fresh health, once none arrived for ``max_age_s``; else None.

        Counted from the latest health's ``evaluated_at`` (a scraper that stopped or
        hangs), or from ``started_at`` when none ever arrived (the scraper is off, or never
        reached this deployment). Status then turns SLOMet Unknown instead of keeping the
        last figures (reconcilers/status.py ``valid_status``).
        """
        now = time.time() if now is None else now
        with self._guard:
            since, measured = self._since((namespace, name), now)
        age = now - since
        if age <= self.max_age_s:
            return None
        limit = format_duration(self.max_age_s)
        if not measured:
            return (f"the operator has measured nothing for this deployment in the {age:.0f}s since it first saw it "
                    f"(limit {limit}): its SLO scraper is off (--slo-interval 0) or cannot reach the pods")
        return (f"the operator's latest SLO measurement is {age:.0f}s old, more than {limit} (last at "
                f"{S.rfc3339(since)}): its scraper stopped or hangs; the last figures are no longer shown")

    def stale_names(self, names: Iterable[tuple[str, str]], *, now: float) -> list[tuple[str, str]]:
        """Of ``names`` ((namespace, name) pairs), those whose health is stale at Unix time ``now``
        (its health, or none, older than ``max_age_s``: see :meth:`stale`), under one hold of the guard (the
        ticker asks about every deployment)."""
        with self._guard:
            return [key for key in names if now >= self._since(key, now)[0] + self.max_age_s]

    def forget(self, namespace: str, name: str) -> None:
        """Drop the deployment's health (it is gone)."""
        with self._guard:
            self._health.pop((namespace, name), None)
            self._first_asked.pop((namespace, name), None)


@dataclass
class ServedKinds:
    """Which kinds the API server serves per group/version (discovery, re-asked every ``ttl_s`` seconds).

    ``api_client``: returns the ``ApiClient`` to ask with.
    """

    api_client: Callable[[], k8s.ApiClient]
    ttl_s: float = 15.0
    #: group/version -> (kinds served, monotonic time of the check)
    _served: dict[str, tuple[frozenset[str], float]] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def kinds(self, api_version: str) -> frozenset[str]:
        """The kinds the API server serves in ``api_version``.

        Asks the API server's discovery directly rather than ``Kube.has_kind``: the
        DynamicClient's discovery cache is a file shared by processes and can still list
        kinds whose CRDs were deleted since. A 404 means none; any other failure keeps the
        last answer (none before the first).
        """
        now = time.monotonic()
        known = self._served.get(api_version)
        if known is not None and now - known[1] < self.ttl_s:
            return known[0]
        with self._guard:  # one request per period, not one per worker that finds it due
            known = self._served.get(api_version)
            if known is not None and time.monotonic() - known[1] < self.ttl_s:
                return known[0]  # answered by another worker while this one waited
            kinds = known[0] if known is not None else frozenset()
            group, _, version = api_version.rpartition("/")
            try:
                if group:
                    listed = k8s.CustomObjectsApi(self.api_client()).get_api_resources(group, version)
                else:
                    listed = k8s.CoreV1Api(self.api_client()).get_api_resources()
                kinds = frozenset(r.kind for r in listed.resources or [] if "/" not in r.name)
            except k8s.ApiException as e:
                if e.status == 404:
                    kinds = frozenset()
                else:  # discovery failed: keep the last answer
                    log.warning("cannot check which kinds %s serves: %s", api_version, e)
            except Exception as e:
                log.warning("cannot check which kinds %s serves: %s", api_version, e)
            self._served[api_version] = (kinds, time.monotonic())
            return kinds


@dataclass
class CatalogSource:
    """The built-in catalog merged with the admin's ConfigMap (re-read at most every ``ttl_s`` seconds).

    ``kube``: a ``Kube`` (the ConfigMap is read through ``uncached()``: it is the admin's
    object, not in the operator's cache); ``operator_namespace``: where the ConfigMap
    lives (None: the built-in catalog only).
    """

    kube: object
    operator_namespace: str | None = None
    ttl_s: float = 30.0
    #: Moves whenever the catalog in use changes (the control loop then reconciles everything).
    version: int = 0
    #: Why the ConfigMap was ignored (it does not match the schema), None when it was not.
    error: str | None = None
    _catalog: Catalog | None = None
    _data: dict[str, str] | None = None
    _read: float = -1e18
    _guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def overrides(self) -> dict[str, str]:
        """The admin's ConfigMap data in use (catalog file name -> YAML; empty: none)."""
        return dict(self._data or {})

    def get(self) -> Catalog:
        """The catalog in use. A ConfigMap that does not match the schema is ignored (the built-in
        catalog is used), the error kept in ``error`` and logged."""
        now = time.monotonic()
        if self._catalog is not None and now - self._read < self.ttl_s:
            return self._catalog
        data: dict[str, str] = {}
        if self.operator_namespace:
            cm = self.kube.uncached().get("v1", "ConfigMap", CATALOG_CONFIGMAP, self.operator_namespace)
            data = {k: v for k, v in ((cm or {}).get("data") or {}).items() if k in CATALOG_FILES}
        with self._guard:  # workers may read at once: one of them records a change
            if self._catalog is None or data != self._data:
                catalog = builtin_catalog()
                if data:
                    try:
                        catalog = load_catalog(overrides=data)
                        self.error = None
                    except CatalogError as e:
                        self.error = str(e)
                        log.error("catalog ConfigMap %s/%s ignored: %s", self.operator_namespace, CATALOG_CONFIGMAP, e)
                if self._catalog is not None:
                    self.version += 1
                    log.info("the kernel catalog changed (ConfigMap %s/%s): every PDDeployment is reconciled again",
                             self.operator_namespace, CATALOG_CONFIGMAP)
                self._catalog, self._data = catalog, data
            self._read = now
            return self._catalog


@dataclass
class PlannerViews:
    """The deployments the built-in planner scales (their last reconcile said so) -> what it last read of each."""

    _planned: dict[tuple[str, str], tuple] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def mark(self, namespace: str, name: str, planned: bool) -> None:
        """Whether the built-in planner scales the deployment (its last reconcile says so)."""
        with self._guard:
            if planned:
                self._planned.setdefault((namespace, name), ())
            else:
                self._planned.pop((namespace, name), None)

    def moved(self, health: Health) -> bool:
        """True when ``health`` moves what the built-in planner reads of a deployment it scales
        (``scaling.pressure_view``): the control loop then reconciles it at once, without waiting
        for the bounded rate of figure-only status writes. False for other deployments."""
        key = (health.namespace, health.name)
        with self._guard:
            if key not in self._planned:
                return False
        view = pressure_view(health)
        with self._guard:
            if key not in self._planned:
                return False
            moved, self._planned[key] = self._planned[key] != view, view
        return moved

    def forget(self, namespace: str, name: str) -> None:
        """Drop the deployment (it is gone)."""
        with self._guard:
            self._planned.pop((namespace, name), None)


@dataclass
class KernelBuildUses:
    """(namespace, PDDeployment) -> the KernelBuilds its last reconcile used."""

    _uses: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def record(self, namespace: str, name: str, builds: tuple[str, ...]) -> None:
        """The deployment's reconcile just used ``builds``."""
        with self._guard:
            self._uses[(namespace, name)] = tuple(builds)

    def users(self, namespace: str, build: str) -> list[str]:
        """PDDeployments of ``namespace`` whose last reconcile used KernelBuild ``build``."""
        with self._guard:
            return sorted(n for (ns, n), used in self._uses.items() if ns == namespace and build in used)

    def in_use(self, namespace: str, deployments: list[str]) -> set[str] | None:
        """KernelBuilds the PDDeployments ``deployments`` of ``namespace`` use; None while one of them
        has not been reconciled by this process yet (unknown: retention waits)."""
        with self._guard:
            if any((namespace, d) not in self._uses for d in deployments):
                return None
            return {b for d in deployments for b in self._uses[(namespace, d)]}

    def forget(self, namespace: str, name: str) -> None:
        """Drop the deployment (it is gone)."""
        with self._guard:
            self._uses.pop((namespace, name), None)


@dataclass
class AutoscalerCache:
    """The HPAs of a namespace that target PDRoleScales, re-read at most every ``ttl_s`` seconds.

    ``list_hpas(namespace)``: the reader (``scaling.list_autoscalers``); a failed read keeps
    the last answer (or none).
    """

    list_hpas: Callable[[str], dict[str, str]]
    ttl_s: float = 30.0
    _cache: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def get(self, namespace: str) -> dict[str, str]:
        """The namespace's HPAs by the PDRoleScale they target (see the class docstring). Counts as a read
        from outside the operator's view (``kube.note_outside_read``), remembered or not: a reconcile
        that used it is never skipped by the resync (no watch says when an HPA appears)."""
        note_outside_read()
        now = time.monotonic()
        with self._guard:
            cached = self._cache.get(namespace)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        try:
            found = self.list_hpas(namespace)
        except Exception as e:  # noqa: BLE001 - the planner must not stop on a failed read
            log.warning("cannot list HorizontalPodAutoscalers in %s: %s", namespace, e)
            found = cached[1] if cached is not None else {}
        with self._guard:
            self._cache[namespace] = (now, found)
        return found


@dataclass
class ObjectLocks:
    """One lock per (namespace, name), serializing reconciles of that object."""

    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """The object's lock (made on first use)."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the object's lock (it is gone)."""
        with self._guard:
            self._locks.pop((namespace, name), None)
