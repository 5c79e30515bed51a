"""What a reconcile needs besides the object itself: API access, catalog, health, memos.

:class:`Runtime` serves PDDeployments, :class:`KernelBuildRuntime` KernelBuilds. The
control loop (``controller.py``) calls their ``reconcile_key`` from its worker threads;
each reads the object from ``kube`` (the process's object cache, ``cache.py``) and runs
the reconciler under a lock per object (the work queue already gives a key to one worker
at a time; the lock keeps direct callers, such as tests, safe too).

The state a reconcile reads besides the object lives in parts with one owner each
(``process_state.py``): the SLO figures, the served kinds, the catalog, the planner's
views, KernelBuild uses, HPAs, locks. Liveness (a reconcile in flight, worker progress) is
the control loop's (``runtime/controller.py``), not kept here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from ..api import computedomain as cd
from ..api import lws
from ..api.kernelbuild import KIND as KERNELBUILD_KIND
from ..api.v1alpha1 import API_VERSION
from ..catalog import Catalog
from ..kernelbuild.recipes import BuildCatalog, builtin_build_catalog
from ..metrics.health import Health
from ..metrics.monitoring import MONITORING_API_VERSION
from ..planning.plan import RuleMemo
from ..render.labels import MANAGED_BY
from ..runtime.cache import Projection
from . import kernelbuild as kernelbuild_reconciler
from .kube import ApiTimeouts, Kube, with_timeouts
from .observe import service_serving_key
from .pddeployment import Outcome, reconcile
from .process_state import (CATALOG_CONFIGMAP, AutoscalerCache, CatalogSource, HealthChange, HealthStore,
                            KernelBuildUses, ObjectLocks, PlannerViews, ServedKinds)
from .scaling import list_autoscalers
from .sglang_gate import OracleSettings

log = logging.getLogger(__name__)

__all__ = ["CATALOG_CONFIGMAP", "HealthChange", "Hooks", "KernelBuildRuntime", "Runtime", "api_client_from_env"]


def api_client_from_env(kubeconfig: str | None = None, *, timeouts: ApiTimeouts | None = None,
                        pool_maxsize: int | None = None) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig`` (or $KUBECONFIG / ~/.kube/config), else the in-cluster service account.

    Every request it sends has ``timeouts`` (default :class:`ApiTimeouts`: 5 s connect,
    30 s read) unless the call passes its own (see ``kube.with_timeouts``).
    ``pool_maxsize``: connections kept per host (default the client's).
    """
    timeouts = timeouts or ApiTimeouts()
    configuration = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (k8s_config.ConfigException, FileNotFoundError, TypeError):
        k8s_config.load_incluster_config(client_configuration=configuration)
    configuration.retries = timeouts.retries()  # read by the REST client's pool when it is made
    if pool_maxsize is not None:
        configuration.connection_pool_maxsize = pool_maxsize
    return with_timeouts(k8s.ApiClient(configuration), timeouts)


@dataclass
class Hooks:
    """Callbacks the metrics layer installs; all optional."""

    on_write: Callable[[str, str], None] | None = None
    on_reconcile: Callable[[str, str, float, bool], None] | None = None  # namespace, name, seconds, ok


@dataclass
class Runtime:
    """Everything a PDDeployment reconcile needs besides the object itself, one part per concern.

    Each piece of state has one owner (``process_state.py``): :attr:`health_store` (the SLO
    source's latest figures; written by the control loop's scraper thread only),
    :attr:`served` (which optional kinds the API server serves), :attr:`catalog_source`
    (the kernel catalog and its version), :attr:`planner` (what the built-in planner last
    read of the deployments it scales), :attr:`uses` (the KernelBuilds each deployment's
    last reconcile used), :attr:`hpas` (HPAs targeting PDRoleScales, per namespace),
    :attr:`locks` (one lock per object) and :attr:`rule_memo` (the CEL verdict per
    generation). The methods below are the reconcile path's and the control loop's door to
    them (each delegates to its part); :meth:`forget` drops a deleted PDDeployment from all.
    """

    kube: Kube
    operator_namespace: str | None = None
    hooks: Hooks = field(default_factory=Hooks)
    health_store: HealthStore = field(default_factory=HealthStore)
    served: ServedKinds | None = None
    catalog_source: CatalogSource | None = None
    planner: PlannerViews = field(default_factory=PlannerViews)
    uses: KernelBuildUses = field(default_factory=KernelBuildUses)
    hpas: AutoscalerCache | None = None
    locks: ObjectLocks = field(default_factory=ObjectLocks)
    #: The CEL verdict per object generation (``planning.plan.RuleMemo``).
    rule_memo: RuleMemo = field(default_factory=RuleMemo)
    #: The SGLang oracle service every new generation waits for (``sglang_gate``); None: the rules alone.
    oracle: OracleSettings | None = None
    #: The default Kueue LocalQueue of PDDeployments without ``spec.scheduling.queueName`` (``run
    #: --default-queue-name``, the chart's ``scheduling.defaultQueueName``); None: none.
    default_queue: str | None = None

    def __post_init__(self) -> None:
        if self.served is None:
            self.served = ServedKinds(api_client=lambda: self.kube.api_client)
        if self.catalog_source is None:
            self.catalog_source = CatalogSource(kube=self.kube, operator_namespace=self.operator_namespace)
        if self.hpas is None:
            self.hpas = AutoscalerCache(list_hpas=lambda ns: list_autoscalers(self.kube, ns))

    # ------------------------------------------------------------------ the parts' doors
    @property
    def catalog_version(self) -> int:
        """Moves whenever the catalog in use changes (the control loop then reconciles everything)."""
        return self.catalog_source.version

    @property
    def catalog_error(self) -> str | None:
        """Why the admin's catalog ConfigMap was ignored, None when it was not."""
        return self.catalog_source.error

    def catalog(self) -> Catalog:
        """The catalog in use (:meth:`CatalogSource.get`)."""
        return self.catalog_source.get()

    def set_health(self, health: Health) -> HealthChange:
        """Keep ``health`` (:meth:`HealthStore.set`); what of status it changes."""
        return self.health_store.set(health)

    def health(self, namespace: str, name: str) -> Health | None:
        """The deployment's fresh health (:meth:`HealthStore.get`)."""
        return self.health_store.get(namespace, name)

    def health_stale(self, namespace: str, name: str, now: float | None = None) -> str | None:
        """Why the deployment has no fresh health (:meth:`HealthStore.stale`)."""
        return self.health_store.stale(namespace, name, now)

    def stale(self, names: Iterable[tuple[str, str]], *, now: float) -> list[tuple[str, str]]:
        """Of ``names`` ((namespace, name) pairs), those whose health counts as stale at Unix time ``now``."""
        return self.health_store.stale_names(names, now=now)

    def forget_health(self, key: str) -> None:
        """Drop the health of ``namespace/name``."""
        namespace, _, name = key.partition("/")
        self.health_store.forget(namespace, name)

    def forget(self, namespace: str, name: str) -> None:
        """The PDDeployment is gone: drop its health, lock, KernelBuild uses and planner view."""
        self.health_store.forget(namespace, name)
        self.locks.forget(namespace, name)
        self.uses.forget(namespace, name)
        self.planner.forget(namespace, name)

    def planner_moved(self, health: Health) -> bool:
        """True when ``health`` moves what the built-in planner reads of a deployment it scales."""
        return self.planner.moved(health)

    def autoscalers(self, namespace: str) -> dict[str, str]:
        """The HPAs of ``namespace`` that target PDRoleScales (:class:`AutoscalerCache`)."""
        return self.hpas.get(namespace)

    def kernelbuild_users(self, namespace: str, build: str) -> list[str]:
        """PDDeployments of ``namespace`` whose last reconcile used KernelBuild ``build``."""
        return self.uses.users(namespace, build)

    def builds_in_use(self, namespace: str, deployments: list[str]) -> set[str] | None:
        """KernelBuilds the given PDDeployments use; None while one of them was not reconciled yet."""
        return self.uses.in_use(namespace, deployments)

    def kinds_served(self, api_version: str) -> frozenset[str]:
        """The kinds the API server serves in ``api_version`` (:class:`ServedKinds`)."""
        return self.served.kinds(api_version)

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
        return self.locks.lock(namespace, name)

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
            outcome = reconcile(  # in flight: the controller's Heartbeats.busy entry (runtime/controller.py)
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
                catalog_overrides=self.catalog_source.overrides or None,
                default_queue=self.default_queue,
            )
            self.uses.record(meta["namespace"], meta["name"], outcome.kernelbuilds)
            self.planner.mark(meta["namespace"], meta["name"], outcome.autoscaled)
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

    def list_bodies(self, namespaces: list[str] | None = None, *, project: Projection | None = None) -> list[Any]:
        """Every PDDeployment (in ``namespaces``, or cluster-wide), from the cache when there is one;
        ``project``: a projection of each instead (``Kube.list``)."""
        out = []
        for ns in namespaces or [None]:
            out.extend(self.kube.list(API_VERSION, "PDDeployment", ns, "", project=project))
        return out

    def serving_key_of(self, namespace: str, name: str) -> str | None:
        """The compat key the PDDeployment ``namespace/name`` serves from: its user-facing Service's
        selector, from the cache (no API call; read once per version of the Service); None before
        the Service exists."""
        return self.kube.get("v1", "Service", name, namespace, project=service_serving_key)

    def list_managed_pods(self, namespace: str, *, project: Projection | None = None) -> list[Any]:
        """Pods the operator made in ``namespace`` (engine and gateway pods of every PDDeployment);
        ``project``: a projection of each instead (``Kube.list``)."""
        return self.kube.list("v1", "Pod", namespace, f"app.kubernetes.io/managed-by={MANAGED_BY}", project=project)


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
