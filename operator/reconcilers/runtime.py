"""What a reconcile needs besides the object itself: API access, catalog, health, memos.

:class:`Runtime` serves PDDeployments, :class:`KernelBuildRuntime` KernelBuilds. The
control loop (``controller.py``) calls their ``reconcile_key`` from its worker threads;
each reads the object from ``kube`` (the process's object cache, ``cache.py``) and runs
the reconciler under a lock per object (the work queue already gives a key to one worker
at a time; the lock keeps direct callers, such as tests, safe too).

The SLO scraper stores each deployment's latest
:class:`~sglang_pd_operator.metrics.health.Health` here (:meth:`Runtime.set_health`),
saying whether a condition or only a figure moved; the reconcile reads it back to write
status. Whether the cluster serves the Prometheus Operator's kinds and LeaderWorkerSets
is checked here too, at most every ``monitoring_check_ttl_s``. Each reconcile is in flight in
:attr:`Runtime.heartbeats` (``liveness.py``) while it holds its lock, so a frozen one
turns ``/healthz`` to 503 after ``stuck_after_s``.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import computedomain as cd
from ..api import lws
from ..api.kernelbuild import KIND as KERNELBUILD_KIND
from ..api.v1alpha1 import API_VERSION
from ..catalog import CATALOG_FILES, Catalog, CatalogError, builtin_catalog, load_catalog
from ..kernelbuild.recipes import BuildCatalog, builtin_build_catalog
from ..runtime.liveness import DEFAULT_STUCK_AFTER_S, Heartbeats
from ..metrics.health import Health
from ..metrics.monitoring import MONITORING_API_VERSION
from ..metrics.slo import format_duration
from ..planning.plan import RuleMemo
from ..render.labels import MANAGED_BY
from . import kernelbuild as kernelbuild_reconciler
from . import status as S
from .kube import ApiTimeouts, Kube, with_timeouts
from .pddeployment import Outcome, reconcile
from .scaling import list_autoscalers, pressure_view
from .sglang_gate import OracleSettings

log = logging.getLogger(__name__)

CATALOG_CONFIGMAP = "sglang-pd-operator-catalog"


def api_client_from_env(kubeconfig: str | None = None, *, timeouts: ApiTimeouts | None = None) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else the in-cluster service account.

    Every request it sends has ``timeouts`` (default :class:`ApiTimeouts`: 5 s connect,
    30 s read) unless the call passes its own (see ``kube.with_timeouts``).
    """
    timeouts = timeouts or ApiTimeouts()
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (k8s_config.ConfigException, FileNotFoundError, TypeError):
        k8s_config.load_incluster_config(client_configuration=configuration)
    configuration.retries = timeouts.retries()  # read by the REST client's pool when it is made
    return with_timeouts(k8s.ApiClient(configuration), timeouts)


@dataclass
class Hooks:
    """Callbacks the metrics layer installs; all optional."""

    on_write: Callable[[str, str], None] | None = None
    on_reconcile: Callable[[str, str, float, bool], None] | None = None  # namespace, name, seconds, ok


class HealthChange(enum.Enum):
    """What a new :class:`Health` changes in a deployment's status (:meth:`Runtime.set_health`).

    ``NONE``: nothing status shows; ``FIGURES``: only the rounded SLO figures
    (``status.slo``, ``status.scrape`` counts); ``CONDITIONS``: a condition (SLOMet,
    Degraded, KVStoreReady) or which pods answer. The control loop writes condition
    changes at once and figures at a bounded rate.
    """

    NONE = "none"
    FIGURES = "figures"
    CONDITIONS = "conditions"


@dataclass
class Runtime:
    """Everything a PDDeployment reconcile needs besides the object itself."""

    kube: Kube
    operator_namespace: str | None = None
    catalog_ttl_s: float = 30.0
    hooks: Hooks = field(default_factory=Hooks)
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)
    _catalog: Catalog | None = None
    _catalog_data: dict[str, str] | None = None
    _catalog_read: float = -1e18
    #: Incremented whenever the catalog in use changes (the control loop then reconciles everything).
    catalog_version: int = 0
    catalog_error: str | None = None
    #: Health older than this (seconds) is not written into status (the scraper stopped).
    health_max_age_s: float = 60.0
    monitoring_check_ttl_s: float = 15.0
    _health: dict[tuple[str, str], tuple[Health, tuple, tuple]] = field(default_factory=dict)
    _health_guard: threading.Lock = field(default_factory=threading.Lock)
    #: group/version -> (kinds served, monotonic time of the check); see :meth:`kinds_served`.
    _served: dict[str, tuple[frozenset[str], float]] = field(default_factory=dict)
    _served_guard: threading.Lock = field(default_factory=threading.Lock)
    #: Unix time this runtime was made: the age of "no health yet" counts from here.
    started_at: float = field(default_factory=time.time)
    #: Liveness: each reconcile is in flight here while it holds its lock; stuck after ``stuck_after_s``.
    heartbeats: Heartbeats = field(default_factory=Heartbeats)
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    #: The CEL verdict per object generation (``planning.plan.RuleMemo``).
    rule_memo: RuleMemo = field(default_factory=RuleMemo)
    #: (namespace, PDDeployment) -> the KernelBuilds its last reconcile used.
    _uses: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    #: Seconds an HPA listing of a namespace is reused (``scaling.list_autoscalers``).
    autoscaler_ttl_s: float = 30.0
    _autoscalers: dict[str, tuple[float, dict[str, str]]] = field(default_factory=dict)
    #: The SGLang oracle service every new generation waits for (``sglang_gate``); None: the rules alone.
    oracle: OracleSettings | None = None
    #: PDDeployments the built-in planner scales (their last reconcile said so) -> last pressure view.
    _planned: dict[tuple[str, str], tuple] = field(default_factory=dict)

    # ------------------------------------------------------------------ SLO health
    def set_health(self, health: Health) -> HealthChange:
        """Keep ``health`` as the deployment's latest; say what of status it changes (:class:`HealthChange`)."""
        conditions, figures = S.health_views(health)
        key = (health.namespace, health.name)
        with self._health_guard:
            old = self._health.get(key)
            self._health[key] = (health, conditions, figures)
        if old is None or old[1] != conditions:
            return HealthChange.CONDITIONS
        return HealthChange.FIGURES if old[2] != figures else HealthChange.NONE

    def health(self, namespace: str, name: str) -> Health | None:
        """The latest health of a deployment, None when there is none younger than ``health_max_age_s``."""
        with self._health_guard:
            entry = self._health.get((namespace, name))
        if entry is None or time.time() - entry[0].evaluated_at > self.health_max_age_s:
            return None
        return entry[0]

    def health_stale(self, namespace: str, name: str, now: float | None = None) -> str | None:
        """Why the deployment has no fresh health, once none arrived for ``health_max_age_s``; else None.

        Counted from the latest health's ``evaluated_at`` (a scraper that stopped or
        hangs), or from this runtime's start when none ever arrived (the scraper is off,
        or never reached this deployment). Status then turns SLOMet Unknown instead of
        keeping the last figures (reconcilers/status.py ``valid_status``).
        """
        now = time.time() if now is None else now
        with self._health_guard:
            entry = self._health.get((namespace, name))
        since = entry[0].evaluated_at if entry is not None else self.started_at
        age = now - since
        if age <= self.health_max_age_s:
            return None
        limit = format_duration(self.health_max_age_s)
        if entry is None:
            return (f"the operator has measured nothing for this deployment in the {age:.0f}s since it started "
                    f"(limit {limit}): its SLO scraper is off (--slo-interval 0) or cannot reach the pods")
        return (f"the operator's latest SLO measurement is {age:.0f}s old, more than {limit} (last at "
                f"{S.rfc3339(since)}): its scraper stopped or hangs; the last figures are no longer shown")

    def stale_since(self, namespace: str, name: str) -> float:
        """Unix time from which the deployment's health counts as stale (see :meth:`health_stale`)."""
        with self._health_guard:
            entry = self._health.get((namespace, name))
        since = entry[0].evaluated_at if entry is not None else self.started_at
        return since + self.health_max_age_s

    def forget_health(self, key: str) -> None:
        """Drop the health of ``namespace/name`` (the deployment is gone)."""
        namespace, _, name = key.partition("/")
        with self._health_guard:
            self._health.pop((namespace, name), None)

    def forget(self, namespace: str, name: str) -> None:
        """The PDDeployment is gone: drop its health, lock, KernelBuild uses and planner view."""
        self.forget_health(f"{namespace}/{name}")
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
            self._uses.pop((namespace, name), None)
            self._planned.pop((namespace, name), None)

    # ------------------------------------------------------------------ the planner
    def mark_planned(self, namespace: str, name: str, planned: bool) -> None:
        """Whether the built-in planner scales the deployment (its last reconcile says so)."""
        with self._locks_guard:
            if planned:
                self._planned.setdefault((namespace, name), ())
            else:
                self._planned.pop((namespace, name), None)

    def planner_moved(self, health: Health) -> bool:
        """True when ``health`` moves what the built-in planner reads of a deployment it scales
        (``scaling.pressure_view``): the control loop then reconciles it at once, without waiting
        for the bounded rate of figure-only status writes. False for other deployments."""
        key = (health.namespace, health.name)
        with self._locks_guard:
            if key not in self._planned:
                return False
        view = pressure_view(health)
        with self._locks_guard:
            if key not in self._planned:
                return False
            moved, self._planned[key] = self._planned[key] != view, view
        return moved

    def autoscalers(self, namespace: str) -> dict[str, str]:
        """The HPAs of ``namespace`` that target PDRoleScales (``scaling.list_autoscalers``), re-read at
        most every ``autoscaler_ttl_s``; a failed read keeps the last answer (or none)."""
        now = time.monotonic()
        with self._locks_guard:
            cached = self._autoscalers.get(namespace)
        if cached is not None and now - cached[0] < self.autoscaler_ttl_s:
            return cached[1]
        try:
            found = list_autoscalers(self.kube, namespace)
        except Exception as e:  # noqa: BLE001 - the planner must not stop on a failed read
            log.warning("cannot list HorizontalPodAutoscalers in %s: %s", namespace, e)
            found = cached[1] if cached is not None else {}
        with self._locks_guard:
            self._autoscalers[namespace] = (now, found)
        return found

    # ------------------------------------------------------------------ KernelBuild uses
    def kernelbuild_users(self, namespace: str, build: str) -> list[str]:
        """PDDeployments of ``namespace`` whose last reconcile used KernelBuild ``build``."""
        with self._locks_guard:
            return sorted(n for (ns, n), used in self._uses.items() if ns == namespace and build in used)

    def builds_in_use(self, namespace: str, deployments: list[str]) -> set[str] | None:
        """KernelBuilds the PDDeployments ``deployments`` of ``namespace`` use; None while one of them
        has not been reconciled by this process yet (unknown: retention waits)."""
        with self._locks_guard:
            if any((namespace, d) not in self._uses for d in deployments):
                return None
            return {b for d in deployments for b in self._uses[(namespace, d)]}

    # ------------------------------------------------------------------ cluster facts
    def kinds_served(self, api_version: str) -> frozenset[str]:
        """The kinds the API server serves in ``api_version`` (re-checked every ``monitoring_check_ttl_s``).

        Asks the API server's discovery directly rather than ``Kube.has_kind``: the
        DynamicClient's discovery cache is a file shared by processes and can still list
        kinds whose CRDs were deleted since. A 404 means none; any other failure keeps the
        last answer (none before the first).
        """
        now = time.monotonic()
        known = self._served.get(api_version)
        if known is not None and now - known[1] < self.monitoring_check_ttl_s:
            return known[0]
        with self._served_guard:  # one request per period, not one per worker that finds it due
            known = self._served.get(api_version)
            if known is not None and time.monotonic() - known[1] < self.monitoring_check_ttl_s:
                return known[0]  # answered by another worker while this one waited
            kinds = known[0] if known is not None else frozenset()
            group, _, version = api_version.rpartition("/")
            try:
                if group:
                    listed = k8s.CustomObjectsApi(self.kube.api_client).get_api_resources(group, version)
                else:
                    listed = k8s.CoreV1Api(self.kube.api_client).get_api_resources()
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

    def monitoring_available(self) -> bool:
        """True when the API server serves PodMonitor and PrometheusRule (the Prometheus Operator's kinds)."""
        return {"PodMonitor", "PrometheusRule"} <= self.kinds_served(MONITORING_API_VERSION)

    def lws_available(self) -> bool:
        """True when the API server serves LeaderWorkerSets (sigs.k8s.io/lws): multi-node roles can be created."""
        return lws.KIND in self.kinds_served(lws.API_VERSION)

    def compute_domains_available(self) -> bool:
        """True when the API server serves ComputeDomains (NVIDIA's DRA driver): GB200 / GB300 multi-node roles get IMEX channels."""
        return cd.KIND in self.kinds_served(cd.API_VERSION)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock serializing reconciles of one object."""
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def catalog(self) -> Catalog:
        """The built-in catalog merged with the admin's ConfigMap (re-read at most every ``catalog_ttl_s``).

        The ConfigMap is read from the API server (it is the admin's object, not in the
        operator's cache). A ConfigMap that does not match the schema is ignored (the
        built-in catalog is used) and the error is kept in ``catalog_error`` and logged.
        ``catalog_version`` moves when the catalog in use changes.
        """
        now = time.monotonic()
        if self._catalog is not None and now - self._catalog_read < self.catalog_ttl_s:
            return self._catalog
        data: dict[str, str] = {}
        if self.operator_namespace:
            cm = self.kube.uncached().get("v1", "ConfigMap", CATALOG_CONFIGMAP, self.operator_namespace)
            data = {k: v for k, v in ((cm or {}).get("data") or {}).items() if k in CATALOG_FILES}
        if self._catalog is None or data != self._catalog_data:
            catalog = builtin_catalog()
            if data:
                try:
                    catalog = load_catalog(overrides=data)
                    self.catalog_error = None
                except CatalogError as e:
                    self.catalog_error = str(e)
                    log.error("catalog ConfigMap %s/%s ignored: %s", self.operator_namespace, CATALOG_CONFIGMAP, e)
            if self._catalog is not None:
                self.catalog_version += 1
                log.info("the kernel catalog changed (ConfigMap %s/%s): every PDDeployment is reconciled again",
                         self.operator_namespace, CATALOG_CONFIGMAP)
            self._catalog, self._catalog_data = catalog, data
        self._catalog_read = now
        return self._catalog

    # ------------------------------------------------------------------ reconcile
    def reconcile_body(self, body: dict[str, Any]) -> Outcome | None:
        """Reconcile a PDDeployment body under its lock (the body must be fresh: read under the same lock).

        None when the object was deleted meanwhile (see :meth:`reconcile_key`).
        """
        meta = body["metadata"]
        with self.lock(meta["namespace"], meta["name"]):
            return self._reconcile_locked(body)

    def _reconcile_locked(self, body: dict[str, Any]) -> Outcome | None:
        meta = body["metadata"]
        start = time.perf_counter()
        ok = False
        try:
            with self.heartbeats.busy(f"reconcile {meta['namespace']}/{meta['name']}", max_s=self.stuck_after_s):
                outcome = reconcile(
                    kube=self.kube,
                    body=body,
                    catalog=self.catalog(),
                    health=self.health(meta["namespace"], meta["name"]),
                    health_stale=self.health_stale(meta["namespace"], meta["name"]),
                    monitoring=self.monitoring_available(),
                    lws_served=self.lws_available(),
                    cd_served=self.compute_domains_available(),
                    rule_memo=self.rule_memo,
                    autoscalers=self.autoscalers,
                    oracle=self.oracle,
                    catalog_overrides=self._catalog_data or None,
                )
            with self._locks_guard:
                self._uses[(meta["namespace"], meta["name"])] = outcome.kernelbuilds
            self.mark_planned(meta["namespace"], meta["name"], outcome.autoscaled)
            ok = True
            return outcome
        except k8s.ApiException as e:
            if e.status != 404 or not self._gone(body):
                raise
            ok = True  # nothing failed: the object is gone, its children go with it
            log.debug("%s/%s was deleted while it was reconciled (%s %s); nothing to do",
                      meta["namespace"], meta["name"], e.status, e.reason)
            return None
        finally:
            if self.hooks.on_reconcile:
                self.hooks.on_reconcile(meta["namespace"], meta["name"], time.perf_counter() - start, ok)

    def reconcile_key(self, namespace: str, name: str) -> Outcome | None:
        """Read the PDDeployment and reconcile it, both under its lock; None when it no longer exists.

        Reading under the lock matters: a reconcile that waited for another must see the
        status that one wrote (the cache holds the API server's answer to that write), or
        it would act on a stale rollout status. A PDDeployment deleted while it was
        reconciled makes a write answer 404 (its status subresource, or a child in its
        namespace being deleted): that is "gone", logged at debug level, and None is
        returned. Any other error, and a 404 while the object still exists, propagates.
        """
        with self.lock(namespace, name):
            body = self.kube.get(API_VERSION, "PDDeployment", name, namespace)
            if body is None:
                return None
            return self._reconcile_locked(body)

    def _gone(self, body: dict[str, Any]) -> bool:
        """True when the PDDeployment ``body`` no longer exists (deleted, or replaced by a new object of its name).

        Asks the API server: the cache may not have seen the deletion yet.
        """
        meta = body["metadata"]
        now = self.kube.uncached().get(API_VERSION, "PDDeployment", meta["name"], meta["namespace"])
        return now is None or now["metadata"].get("uid") != meta.get("uid")

    def list_keys(self, namespaces: list[str] | None = None) -> list[tuple[str, str]]:
        """(namespace, name) of every PDDeployment (in ``namespaces``, or cluster-wide)."""
        return [(b["metadata"]["namespace"], b["metadata"]["name"]) for b in self.list_bodies(namespaces)]

    def list_bodies(self, namespaces: list[str] | None = None) -> list[dict[str, Any]]:
        """Every PDDeployment (in ``namespaces``, or cluster-wide), from the cache when there is one."""
        out = []
        for ns in namespaces or [None]:
            out.extend(self.kube.list(API_VERSION, "PDDeployment", ns, ""))
        return out

    def list_managed_pods(self, namespace: str) -> list[dict[str, Any]]:
        """Pods the operator made in ``namespace`` (engine and gateway pods of every PDDeployment)."""
        return self.kube.list("v1", "Pod", namespace, f"app.kubernetes.io/managed-by={MANAGED_BY}")


@dataclass
class KernelBuildRuntime:
    """What a KernelBuild reconcile needs: API access, catalogs, per-object locks, which builds are in use.

    ``catalog``: the PDDeployment runtime's catalog getter (one catalog per process);
    ``in_use(namespace)``: the KernelBuild names the namespace's PDDeployments use, None
    when unknown (retention then waits), see :meth:`Runtime.builds_in_use`.
    """

    kube: Kube
    catalog: Callable[[], Catalog]
    in_use: Callable[[str], set[str] | None]
    builds: Callable[[], BuildCatalog] = builtin_build_catalog
    builder_image: str | None = None
    _locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock serializing reconciles of one KernelBuild."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile_key(self, namespace: str, name: str) -> kernelbuild_reconciler.KernelBuildOutcome | None:
        """Read the KernelBuild and reconcile it; None when it no longer exists."""
        with self.lock(namespace, name):
            body = self.kube.get(API_VERSION, KERNELBUILD_KIND, name, namespace)
            if body is None:
                return None
            used = self.in_use(namespace)
            outcome = kernelbuild_reconciler.reconcile(
                kube=self.kube,
                body=body,
                catalog=self.catalog(),
                builds=self.builds(),
                in_use=None if used is None else name in used,
                builder_image=self.builder_image,
            )
        if outcome.created_job or outcome.deleted or outcome.events:
            log.info("kernelbuild %s/%s: phase %s, job %s, deleted %s", namespace, name, outcome.phase,
                     outcome.created_job, outcome.deleted)
        return outcome

    def forget(self, namespace: str, name: str) -> None:
        """The KernelBuild is gone: drop its lock."""
        with self._guard:
            self._locks.pop((namespace, name), None)
