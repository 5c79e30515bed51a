"""Scrape every PDDeployment's engine and gateway pods each interval and evaluate its SLO.

The operator process runs one :class:`Scraper` in a thread of its own, on an asyncio loop
of its own (``controller.py`` starts and stops it), so neither kopf's event loop nor the
reconcile workers wait for it. Every ``interval`` seconds it:

1. reads the PDDeployments and, per namespace, the pods the operator made through
   functions the operator hands in (the process's object cache: no API call; this
   module never imports the reconcilers), and groups the pods by deployment once
   (:func:`pods_by_deployment`: a pass is linear in pods);
2. picks, per PDDeployment, the *serving* group's ready pods (the compat key its
   user-facing Service selects, ``serving_key_of``: the operator's cache, not status)
   with a pod IP: prefill and decode on the SGLang port (30000), the gateway
   on smg's ``--prometheus-port`` (29000) — :func:`deployment_targets`, pure;
3. GETs ``http://<podIP>:<port>/metrics`` (:meth:`Scraper.fetch`), at most
   ``concurrency`` requests in flight, each with ``timeout`` seconds; a pod that does not
   answer 200 in time, or whose text does not parse, is a scrape error
   (``sglang_pd_operator_scrape_errors_total{role}``) and is not *reachable*. Real SGLang
   answers ``?name[]=`` with an empty page (its registry holds only a
   MultiProcessCollector, which prometheus_client's ``restricted_registry`` cannot see:
   ``sglang/srt/utils/common.py`` ``add_prometheus_middleware``), so the filter is used
   only where it provably returns the series: a pod is first asked with ``name[]``; a
   reply carrying none of the asked families is followed at once by an unfiltered GET,
   and when that page does carry them the pod is remembered (per pod UID and URL) as one
   that ignores the filter and is asked unfiltered from then on. A reply that carries
   them proves the filter works there;
4. parses from each page only the families the evaluator reads for that role and spec
   (``SLOEvaluator.families_for``; ``exposition.parse_exposition`` drops the other lines
   before the parser sees them), feeds them to the
   :class:`~sglang_pd_operator.metrics.slo.SLOEvaluator` and evaluates the deployment
   (its ``spec.slo``, or only KV transfer health without one), in a worker thread so that
   parsing does not stall kopf's event loop; publishes the result to
   :class:`~sglang_pd_operator.metrics.operator_metrics.OperatorMetrics` (deployments with
   ``spec.slo`` only);
5. hands a :class:`Health` per deployment (the SLO result, per-role ready and reachable
   pod counts, KV transfer figures, the Mooncake master's health) to ``on_health``; the
   operator keeps it in its Runtime, and the reconcile writes it into status (``SLOMet``,
   ``status.slo``, ``Degraded`` NoPrefill / KVTransferFailing, ``KVStoreReady``).

With ``kvCache.hicache.storage.backend: mooncake`` the same pass probes the deployment's
Mooncake Store master (``kvstore.probe_master_async``: ``/health`` and ``/metrics``): its
pod is found among the pods already listed (labels ``deployment`` = the PDDeployment,
``role`` = ``mooncake-master``; the ``metrics`` container port), so the liveness check
needs no extra API call and never blocks a reconcile. Its figures and the KV transfer
speed (asked from prefill pods beside the SLO families) are exported through
``OperatorMetrics.kvstore``.

A deployment's first pass only takes baselines (the increase since a pod's previous
scrape is what counts), so ``on_health`` is called from its second pass on.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from pydantic import ValidationError

from ..api.v1alpha1 import MooncakeMasterSpec, SLOSpec
from ..planning.engine_args import ENGINE_PORT
from ..planning.hicache import MASTER_COMPONENT, master_host, master_service_name
from ..render import labels as L
from ..render.gateway import GATEWAY_METRICS_PORT
from . import exposition as ex
from .health import Health, MasterHealth
from .kvstore import probe_master_async, transfer_families, transfer_summary
from .operator_metrics import OperatorMetrics
from .periodic import deliver, run_every
from .slo import LOAD_FAMILIES, ROLE_DECODE, ROLE_GATEWAY, ROLE_PREFILL, SLOEvaluator

log = logging.getLogger(__name__)

SCRAPED_ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_GATEWAY)
#: Port of ``/metrics`` per role: SGLang serves it on its HTTP port (``--enable-metrics``),
#: smg on ``--prometheus-port``.
METRICS_PORTS: Mapping[str, int] = {ROLE_PREFILL: ENGINE_PORT, ROLE_DECODE: ENGINE_PORT,
                                    ROLE_GATEWAY: GATEWAY_METRICS_PORT}
DEFAULT_CONCURRENCY = 32
#: How a pod answers ``?name[]=``: not known yet, it returns the named series, it ignores
#: the filter (real SGLang's empty page; the whole page is read instead).
FILTER_UNKNOWN, FILTER_WORKS, FILTER_IGNORED = "unknown", "works", "ignored"
#: A pod that answered nothing (refused, timed out) in a row is asked again after 1, 2, 4, then at most
#: this many passes (2 minutes at the default 15 s interval); it counts as unreachable meanwhile. Only a
#: Ready pod is asked, and one that stops being Ready (a restarting engine) starts again at every pass.
SILENT_MAX_PASSES = 8
#: Evaluation of a deployment without ``spec.slo``: no target, KV transfer health over 5m.
NO_SLO = SLOSpec()


@dataclass(frozen=True)
class PodTarget:
    """One pod to scrape: its role, name, UID and ``/metrics`` URL (without query)."""

    role: str
    name: str
    uid: str | None
    url: str


@dataclass(frozen=True)
class MasterTarget:
    """The Mooncake Store master to probe for one PDDeployment.

    ``url``: ``http://<pod IP>:<metrics port>`` of its pod, None when there is no pod
    with an IP (``problem`` says why, ``exists`` whether any master pod was found).
    ``pod_ready``: that pod is Running and Ready.
    """

    deployment: str
    url: str | None
    pod: str | None = None
    pod_ready: bool = False
    exists: bool = False
    problem: str | None = None

    def health_without_probe(self, service_url: str) -> MasterHealth:
        """The master's health when there is nothing to probe."""
        return MasterHealth(url=self.url or service_url, reachable=False, ready=False,
                            deployment_ready=False if self.exists else None, exists=self.exists,
                            error=self.problem)


@dataclass(frozen=True)
class DeploymentTargets:
    """What to scrape for one PDDeployment in this interval.

    ``serving_key``: the compat key of the group the user-facing Service selects (None
    before the first reconcile wrote it). ``slo_spec``: the parsed ``spec.slo`` (None when
    unset or invalid). ``pods``: the serving group's ready pods with an IP; ``ready``:
    their number per role. ``load``: the deployment has ``spec.autoscaling``, so the
    planner's load gauges (``slo.LOAD_FAMILIES``) are read too.
    """

    namespace: str
    name: str
    serving_key: str | None
    slo_spec: SLOSpec | None
    pods: tuple[PodTarget, ...] = ()
    ready: Mapping[str, int] = field(default_factory=dict)
    master: MasterTarget | None = None
    master_service_url: str | None = None
    load: bool = False

    @property
    def key(self) -> str:
        """``namespace/name``, the evaluator's and the metrics' key."""
        return f"{self.namespace}/{self.name}"


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


#: ``(namespace, name) -> compat key`` of the group a PDDeployment serves from: the selector of its
#: user-facing Service, read from the operator's cache (None: no Service yet). Both SLO sources take
#: one, so neither reads the serving group back out of the PDDeployment's status.
ServingKeyOf = Callable[[str, str], "str | None"]


def slo_spec_of(body: Mapping[str, Any]) -> SLOSpec | None:
    """``spec.slo`` parsed, or None when unset or invalid (the reconcile reports an invalid spec)."""
    raw = (body.get("spec") or {}).get("slo")
    if not raw:
        return None
    try:
        return SLOSpec.model_validate(raw)
    except ValidationError:
        return None


def autoscaled(body: Mapping[str, Any]) -> bool:
    """The PDDeployment asks for the built-in planner (``spec.autoscaling`` is set)."""
    return bool((body.get("spec") or {}).get("autoscaling"))


def mooncake_storage_of(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``spec.kvCache.hicache.storage.mooncake`` (``{}`` when defaulted) when the storage backend is mooncake, else None."""
    hicache = ((body.get("spec") or {}).get("kvCache") or {}).get("hicache") or {}
    storage = hicache.get("storage") or {}
    if storage.get("backend") != "mooncake":
        return None
    return storage.get("mooncake") or {}


def _spec_metrics_port(mc: Mapping[str, Any]) -> int:
    return int((mc.get("master") or {}).get("metricsPort") or MooncakeMasterSpec().metricsPort)


def _master_port(pod: Mapping[str, Any], default: int) -> int:
    """The pod's container port named ``metrics`` (what the rendered Deployment declares), else ``default``."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for port in c.get("ports") or []:
            if port.get("name") == "metrics" and port.get("containerPort"):
                return int(port["containerPort"])
    return default


def master_target(body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> MasterTarget | None:
    """The Mooncake master pod to probe for the PDDeployment ``body`` among ``pods``, pure.

    None without Mooncake storage. The pod is the master Deployment's (labels
    ``deployment`` = the PDDeployment, ``role`` = ``mooncake-master``): a Ready one with an
    IP first, then one not being deleted, then the newest.
    """
    mc = mooncake_storage_of(body)
    if mc is None:
        return None
    name = body["metadata"]["name"]
    deployment = master_service_name(name)
    candidates = [
        p for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(L.LABEL_DEPLOYMENT) == name
        and ((p.get("metadata") or {}).get("labels") or {}).get(L.LABEL_ROLE) == MASTER_COMPONENT
    ]  # fmt: skip
    if not candidates:
        return MasterTarget(deployment=deployment, url=None,
                            problem=f"Deployment {deployment} has no pod (not created yet, or its pod was lost)")

    def rank(p: Mapping[str, Any]) -> tuple:
        meta = p.get("metadata") or {}
        return (_pod_ready(p), not meta.get("deletionTimestamp"), bool((p.get("status") or {}).get("podIP")),
                meta.get("creationTimestamp") or "")

    pod = max(candidates, key=rank)
    pod_name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    ready = _pod_ready(pod)
    ip = status.get("podIP")
    if not ip:
        return MasterTarget(deployment=deployment, url=None, pod=pod_name, exists=True,
                            problem=f"pod {pod_name} is {status.get('phase') or 'Pending'} without an IP")
    url = f"http://{ip}:{_master_port(pod, _spec_metrics_port(mc))}"
    problem = None if ready else f"pod {pod_name} is not Ready"
    return MasterTarget(deployment=deployment, url=url, pod=pod_name, pod_ready=ready, exists=True, problem=problem)


def pods_by_deployment(pods_by_namespace: Mapping[str, Sequence[Mapping[str, Any]]]
                       ) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Group pods by (namespace, PDDeployment label) in one pass, so each deployment's targets
    are picked from its own pods: a pass costs time linear in pods, not pods x deployments."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for namespace, pods in pods_by_namespace.items():
        for pod in pods:
            owner = ((pod.get("metadata") or {}).get("labels") or {}).get(L.LABEL_DEPLOYMENT)
            if owner:
                out.setdefault((namespace, owner), []).append(pod)
    return out


def deployment_targets(
    body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, serving_key: str | None,
    ports: Mapping[str, int] = METRICS_PORTS,
) -> DeploymentTargets:
    """The pods to scrape for the PDDeployment ``body`` among ``pods`` (of its namespace), pure.

    Only the serving group's pods (labels ``deployment`` = its name, ``compat-key`` =
    ``serving_key``, the key its user-facing Service selects; ``role`` prefill | decode |
    gateway) that are Running, Ready and have an IP; ``ports``: the ``/metrics`` port per
    role. ``serving_key`` None (no Service yet): no pods.
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    key = serving_key
    targets: list[PodTarget] = []
    ready = {r: 0 for r in SCRAPED_ROLES}
    if key:
        for pod in pods:
            pm = pod.get("metadata") or {}
            labels = pm.get("labels") or {}
            role = labels.get(L.LABEL_ROLE)
            if (labels.get(L.LABEL_DEPLOYMENT) != name or labels.get(L.LABEL_COMPAT_KEY) != key
                    or role not in SCRAPED_ROLES or not _pod_ready(pod)):
                continue
            ready[role] += 1
            url = f"http://{pod['status']['podIP']}:{ports[role]}/metrics"
            targets.append(PodTarget(role=role, name=pm["name"], uid=pm.get("uid"), url=url))
    targets.sort(key=lambda t: (t.role, t.name))
    master = master_target(body, pods)
    service_url = None
    if master is not None:
        service_url = f"http://{master_host(name, namespace)}:{_spec_metrics_port(mooncake_storage_of(body) or {})}"
    return DeploymentTargets(namespace=namespace, name=name, serving_key=key, slo_spec=slo_spec_of(body),
                             pods=tuple(targets), ready=ready, master=master, master_service_url=service_url,
                             load=autoscaled(body))


def deployment_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the SLO sources read of a PDDeployment (:func:`deployment_targets`): its name and
    namespace, ``spec.slo``, ``spec.autoscaling`` and ``spec.kvCache.hicache.storage``.

    A projection for the operator's cache (``ObjectCache.list`` with ``project``): computed
    once per version of the object, so a pass at rest decodes no PDDeployment.
    """
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    storage = ((spec.get("kvCache") or {}).get("hicache") or {}).get("storage")
    view_spec = {k: spec[k] for k in ("slo", "autoscaling") if spec.get(k)}
    if storage:
        view_spec["kvCache"] = {"hicache": {"storage": storage}}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")}, "spec": view_spec}


def pod_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the SLO sources read of a pod (:func:`deployment_targets`, :func:`master_target`): its
    name, uid, the three labels that place it, its age and deletion, phase, IP, Ready condition and
    ``metrics`` container port. A projection for the operator's cache, as :func:`deployment_view`."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    ports = [{"name": "metrics", "containerPort": port["containerPort"]}
             for c in (pod.get("spec") or {}).get("containers") or [] for port in c.get("ports") or []
             if port.get("name") == "metrics" and port.get("containerPort")]
    return {
        "metadata": {**{k: meta[k] for k in ("name", "uid", "creationTimestamp", "deletionTimestamp") if meta.get(k)},
                     "labels": {k: labels[k] for k in (L.LABEL_DEPLOYMENT, L.LABEL_ROLE, L.LABEL_COMPAT_KEY)
                                if k in labels}},
        "spec": {"containers": [{"ports": ports}]} if ports else {},
        "status": {**{k: status[k] for k in ("phase", "podIP") if status.get(k)},
                   "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]},
    }


class TargetsMemo:
    """:func:`deployment_targets` per deployment, computed again only when one of its inputs changed.

    Inputs are compared by identity: the cache's projections (:func:`deployment_view`,
    :func:`pod_view`) are the same objects while their objects do not change, so a pass at
    rest reuses every deployment's targets; fresh dicts (no cache) are computed every pass.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], tuple[Any, str | None, tuple[Any, ...], DeploymentTargets]] = {}

    def targets(self, body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, serving_key: str | None,
                ports: Mapping[str, int] = METRICS_PORTS) -> DeploymentTargets:
        """``deployment_targets(body, pods, serving_key=..., ports=...)``, from the memo when nothing moved."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        pods = tuple(pods)
        held = self._memo.get(key)
        if (held is not None and held[0] is body and held[1] == serving_key and len(held[2]) == len(pods)
                and all(a is b for a, b in zip(held[2], pods))):
            return held[3]
        t = deployment_targets(body, pods, serving_key=serving_key, ports=ports)
        self._memo[key] = (body, serving_key, pods, t)
        return t

    def retain(self, keys: set[tuple[str, str]]) -> None:
        """Forget the deployments not in ``keys`` (gone)."""
        for key in [k for k in self._memo if k not in keys]:
            del self._memo[key]


HealthCallback = Callable[[Health], Awaitable[None] | None]


async def probe_master(session: aiohttp.ClientSession, t: DeploymentTargets, *, timeout: float) -> MasterHealth | None:
    """This pass's look at the deployment's Mooncake master (None without Mooncake storage).

    Ready needs both: the pod Ready and ``/health`` serving. ``timeout``: seconds per request.
    """
    m = t.master
    if m is None:
        return None
    if m.url is None:
        return m.health_without_probe(t.master_service_url or "")
    probed = await probe_master_async(session, m.url, timeout=timeout)
    if m.pod_ready:
        return replace(probed, deployment_ready=True, exists=True)
    return replace(probed, ready=False, deployment_ready=False, exists=True,
                   error=probed.error if not probed.reachable else m.problem)


@dataclass(eq=False)
class _Planned:
    """One deployment in one pass: its targets, families and the pages fetched (None: none)."""

    targets: DeploymentTargets
    families: dict[str, dict[str, ex.Kind]]
    rebaseline: bool
    texts: list[str | None]
    asked: tuple[int, ...]   # indexes into targets.pods of the pods asked this pass
    master: MasterHealth | None = None

    @property
    def asks(self) -> bool:
        """A request is due: a pod to ask, or a Mooncake master to probe."""
        return bool(self.asked) or self.targets.master is not None


class Scraper:
    """The scrape loop (see the module docstring).

    ``list_deployments()`` -> PDDeployment bodies; ``serving_key_of(namespace, name)`` -> the
    compat key its user-facing Service selects (:data:`ServingKeyOf`); ``list_pods(namespace)``
    -> the pods the operator made in ``namespace`` (all blocking, run in a worker thread).
    Bodies and pods are never changed in place (a changed object is another object): a
    deployment whose body, serving key and pods are the objects of the last pass keeps its
    targets (:class:`TargetsMemo`); the operator hands in its cache's projections
    (:func:`deployment_view`, :func:`pod_view`), so a pass at rest decodes nothing.
    ``on_health(health)`` (plain or async) receives each evaluated deployment;
    ``on_forget(key)`` is called for a deployment that disappeared. ``interval``,
    ``timeout`` (default ``min(5, 0.8 * interval)``) in seconds; ``concurrency``: most
    scrapes in flight. ``ports``: ``/metrics`` port per role. ``clock``: Unix time source.
    ``on_pass()`` is called after every pass, failed or not (the liveness heartbeat).
    """

    def __init__(
        self,
        *,
        list_deployments: Callable[[], list[dict[str, Any]]],
        serving_key_of: ServingKeyOf,
        list_pods: Callable[[str], list[dict[str, Any]]],
        on_health: HealthCallback | None = None,
        on_forget: Callable[[str], None] | None = None,
        metrics: OperatorMetrics | None = None,
        evaluator: SLOEvaluator | None = None,
        interval: float = 15.0,
        timeout: float | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        ports: Mapping[str, int] = METRICS_PORTS,
        clock: Callable[[], float] = time.time,
        on_pass: Callable[[], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.list_deployments = list_deployments
        self.serving_key_of = serving_key_of
        self.list_pods = list_pods
        self.on_health = on_health
        self.on_forget = on_forget
        self.metrics = metrics
        # one time slot per interval (window edges exact to half an interval)
        self.evaluator = evaluator or SLOEvaluator(resolution_s=min(5.0, interval / 2))
        # the KV transfer families (speed histogram on prefill) are read for the exporter too
        for role in SCRAPED_ROLES:
            self.evaluator.families.setdefault(role, {}).update(transfer_families(role))
        self.interval = interval
        self.timeout = timeout if timeout is not None else min(5.0, 0.8 * interval)
        self.concurrency = concurrency
        self.ports = dict(ports)
        self.clock = clock
        self.on_pass = on_pass
        self._names: dict[str, dict[str, tuple[str, ...]]] = {}   # key -> role -> asked sample names
        # (key, role, pod name) -> (pod UID, URL, FILTER_*): how that pod answers ?name[]=
        self._filter: dict[tuple[str, str, str], tuple[str | None, str, str]] = {}
        self._pods: dict[str, set[tuple[str, str]]] = {}          # key -> (role, pod) last scraped
        self._passes: dict[str, int] = {}                          # key -> evaluations so far
        # (key, role, pod name) -> (pod UID, URL, answers missed in a row, pass it is asked again at)
        self._silent: dict[tuple[str, str, str], tuple[str | None, str, int, int]] = {}
        self._pass_no = 0
        self._skipped: set[tuple[str, str, str]] = set()  # this pass' silenced pods (not asked, no error)
        # (role, id(spec), load) -> (spec, families, sample names): this pass' and the previous pass'
        self._families_memo: dict[tuple[str, int, bool], tuple[SLOSpec | None, dict[str, ex.Kind], tuple[str, ...]]] = {}
        self._families_prev: dict[tuple[str, int, bool], tuple[SLOSpec | None, dict[str, ex.Kind], tuple[str, ...]]] = {}
        self._targets = TargetsMemo()
        # key -> (targets, health) of a deployment whose last evaluation had no input (_evaluate_quiet)
        self._quiet: dict[str, tuple[DeploymentTargets, Health]] = {}
        self._eval_lock = asyncio.Lock()
        self._semaphore: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        """Scrape every ``interval`` seconds until cancelled; a failing pass is logged and retried."""
        await run_every(self.scrape_once, interval=self.interval, on_pass=self.on_pass, what="SLO scrape pass")

    async def scrape_once(self) -> list[Health]:
        """One pass over every PDDeployment; returns the healths handed to ``on_health``."""
        started = time.perf_counter()
        targets = await asyncio.to_thread(self.targets)
        self._pass_no += 1
        # keyed by the identity of the parsed specs, which live as long as their targets (TargetsMemo):
        # what this pass did not use goes
        self._families_prev, self._families_memo = self._families_memo, {}
        self._skipped.clear()
        self._semaphore = asyncio.Semaphore(self.concurrency)
        planned = [self._plan(t) for t in targets if t.serving_key]
        if any(p.asks for p in planned):
            connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=True)
            async with aiohttp.ClientSession(connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=self.timeout)) as session:
                await asyncio.gather(*(self._fetch_planned(session, p) for p in planned if p.asks))
        fetched = [(p.targets, p.texts, p.rebaseline, p.master, p.families) for p in planned]
        async with self._eval_lock:  # one thread evaluates every deployment: no thread hop per deployment
            healths = await asyncio.to_thread(lambda: [self._evaluate(*f) for f in fetched])
        published = [h for h in healths if h is not None]
        self._forget_gone({t.key for t in targets})
        if self.on_health is not None:
            for h in published:  # one after the other, as the Prometheus source does: no task per deployment
                await deliver(self.on_health, h)
        log.debug("SLO scrape pass: %d deployments, %d pods in %.3fs", len(targets),
                  sum(len(t.pods) for t in targets), time.perf_counter() - started)
        return published

    def targets(self) -> list[DeploymentTargets]:
        """Every PDDeployment's targets for this pass: the bodies, their serving keys and the pods of
        their namespaces (one ``list_pods`` per namespace, grouped once: linear in pods). Blocking."""
        bodies = self.list_deployments()
        namespaces = sorted({b["metadata"]["namespace"] for b in bodies})
        owned = pods_by_deployment({ns: self.list_pods(ns) for ns in namespaces})
        out = []
        for b in bodies:
            ns, name = b["metadata"]["namespace"], b["metadata"]["name"]
            out.append(self._targets.targets(b, owned.get((ns, name), ()), serving_key=self.serving_key_of(ns, name),
                                             ports=self.ports))
        self._targets.retain({(t.namespace, t.name) for t in out})
        return out

    def _forget_gone(self, present: set[str]) -> None:
        for key in list(self._passes):
            if key not in present:
                self.evaluator.forget(key)
                for store in (self._names, self._pods, self._passes, self._quiet):
                    store.pop(key, None)
                for k in [k for k in self._filter if k[0] == key]:
                    del self._filter[k]
                for k in [k for k in self._silent if k[0] == key]:
                    del self._silent[k]
                if self.metrics is not None:
                    self.metrics.remove(key)
                    self.metrics.kvstore.remove(key)
                if self.on_forget is not None:
                    self.on_forget(key)

    # ------------------------------------------------------------------ one deployment
    def families(self, role: str, slo_spec: SLOSpec | None, load: bool = False) -> dict[str, ex.Kind]:
        """The families read from a ``role`` pod for ``slo_spec`` (SLO and KV transfer families; with
        ``load``, the planner's load gauges ``slo.LOAD_FAMILIES`` too)."""
        out = {**self.evaluator.families_for(role, slo_spec), **transfer_families(role)}
        if load:
            out.update(LOAD_FAMILIES.get(role, {}))
        return out

    def sample_names(self, role: str, slo_spec: SLOSpec | None, load: bool = False) -> tuple[str, ...]:
        """The ``name[]`` values asked from a ``role`` pod for ``slo_spec`` (see :meth:`families`)."""
        return ex.sample_names(self.families(role, slo_spec, load))

    def filter_mode(self, key: str, pod: PodTarget) -> str:
        """How ``pod`` of deployment ``key`` answers ``?name[]=``: ``FILTER_UNKNOWN``,
        ``FILTER_WORKS`` or ``FILTER_IGNORED`` (see the module docstring, step 3)."""
        known = self._filter.get((key, pod.role, pod.name))
        if known is None or known[:2] != (pod.uid, pod.url):
            return FILTER_UNKNOWN
        return known[2]

    def _families_of(self, role: str, slo_spec: SLOSpec | None, load: bool) -> tuple[dict[str, ex.Kind], tuple[str, ...]]:
        """:meth:`families` and their sample names, computed once per parsed spec (kept while a pass uses it)."""
        memo_key = (role, id(slo_spec), load)
        got = self._families_memo.get(memo_key)
        if got is None:
            prev = self._families_prev.get(memo_key)
            if prev is not None and prev[0] is slo_spec:
                got = prev
            else:
                families = self.families(role, slo_spec, load)
                got = (slo_spec, families, ex.sample_names(families))
            self._families_memo[memo_key] = got
        return got[1], got[2]

    def silenced(self, key: str, pod: PodTarget) -> bool:
        """``pod`` answered nothing the last times it was asked and is not due again in this pass
        (see :data:`SILENT_MAX_PASSES`); a new pod UID or URL is asked at once."""
        known = self._silent.get((key, pod.role, pod.name))
        return known is not None and known[:2] == (pod.uid, pod.url) and self._pass_no < known[3]

    def _answered(self, key: str, pod: PodTarget, answered: bool) -> None:
        """Remember whether ``pod`` answered at all; a silent one is asked again after 1, 2, 4, 8 passes."""
        slot = (key, pod.role, pod.name)
        if answered:
            self._silent.pop(slot, None)
            return
        known = self._silent.get(slot)
        missed = known[2] + 1 if known is not None and known[:2] == (pod.uid, pod.url) else 1
        self._silent[slot] = (pod.uid, pod.url, missed, self._pass_no + min(SILENT_MAX_PASSES, 2 ** (missed - 1)))

    def _plan(self, t: DeploymentTargets) -> "_Planned":
        """One deployment's part of this pass before any request: its families, which pods to ask
        (not those :meth:`silenced`: they count as unanswered without a request or a task)."""
        memo = {r: self._families_of(r, t.slo_spec, t.load) for r in SCRAPED_ROLES}
        families = {r: f for r, (f, _) in memo.items()}
        names = {r: n for r, (_, n) in memo.items()}
        rebaseline = t.key in self._names and self._names[t.key] != names
        self._names[t.key] = names
        asked = []
        for i, pod in enumerate(t.pods):
            if self.silenced(t.key, pod):
                self._skipped.add((t.key, pod.role, pod.name))
            else:
                asked.append(i)
        return _Planned(targets=t, families=families, rebaseline=rebaseline, texts=[None] * len(t.pods),
                        asked=tuple(asked))

    async def _fetch_planned(self, session: aiohttp.ClientSession, p: "_Planned") -> None:
        """Fetch the pages :meth:`_plan` asks for (and probe the Mooncake master) into ``p``."""
        t = p.targets
        texts, p.master = await asyncio.gather(
            asyncio.gather(*(self.fetch(session, t.key, t.pods[i], p.families[t.pods[i].role]) for i in p.asked)),
            self._probe_master(session, t),
        )
        for i, text in zip(p.asked, texts):
            p.texts[i] = text

    async def _probe_master(self, session: aiohttp.ClientSession, t: DeploymentTargets) -> MasterHealth | None:
        assert self._semaphore is not None
        async with self._semaphore:
            return await probe_master(session, t, timeout=self.timeout)

    async def fetch(self, session: aiohttp.ClientSession, key: str, pod: PodTarget,
                    families: Mapping[str, ex.Kind]) -> str | None:
        """``pod``'s ``/metrics`` text holding ``families`` (None: no 200 answer in time).

        ``key``: the deployment (``namespace/name``). Asks with ``name[]`` (the sample names
        of ``families``) unless the pod is known to ignore it; a filtered reply without any
        sample of ``families`` is followed by an unfiltered GET, and the pod's
        :meth:`filter_mode` is updated from what the two replies prove. Without families
        (a gateway pod scraped for reachability) the page is fetched unfiltered. A filtered
        GET answered with another status than 200 is retried unfiltered too; one not answered
        at all (refused, timed out) is not. Both GETs share one slot of ``concurrency`` and
        each has ``timeout``.
        """
        assert self._semaphore is not None
        if self.silenced(key, pod):
            self._skipped.add((key, pod.role, pod.name))
            return None
        names = ex.sample_names(families) if families else ()
        mode = self.filter_mode(key, pod)
        async with self._semaphore:
            known = self._silent.get((key, pod.role, pod.name))
            if known is not None and known[:2] == (pod.uid, pod.url) and not await self._knock(pod.url):
                self._answered(key, pod, False)  # still silent: not worth an HTTP request
                return None
            if names and mode != FILTER_IGNORED:
                answered, text = await self._get(session, pod.url, names)
                self._answered(key, pod, answered)
                if not answered:   # no answer at all (refused, timed out): no second try
                    return None
                if text is not None and ex.has_samples(text, families):
                    if mode != FILTER_WORKS:
                        self._filter[(key, pod.role, pod.name)] = (pod.uid, pod.url, FILTER_WORKS)
                    return text
            answered, text = await self._get(session, pod.url, ())
            self._answered(key, pod, answered)
            if text is not None and names and mode != FILTER_IGNORED and ex.has_samples(text, families):
                log.info("scrape %s: ?name[]= answers without the asked series (as SGLang's multiprocess "
                         "/metrics does); reading the whole page of %s from now on", pod.url, pod.name)
                self._filter[(key, pod.role, pod.name)] = (pod.uid, pod.url, FILTER_IGNORED)
            return text

    async def _knock(self, url: str) -> bool:
        """Whether ``url``'s host accepts a TCP connection within the timeout (closed at once).

        A pod that answered nothing last time is knocked on before it is asked: a refused or
        timed-out connect costs a fifth of the CPU of aiohttp's request, which at rest with a
        thousand silent pods is most of a pass.
        """
        parts = urlsplit(url)
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET6 if ":" in (parts.hostname or "") else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (parts.hostname, parts.port or 80)), self.timeout)
            return True
        except (OSError, asyncio.TimeoutError):
            return False
        finally:
            sock.close()

    @staticmethod
    async def _get(session: aiohttp.ClientSession, url: str, names: Sequence[str]) -> tuple[bool, str | None]:
        """(the server answered at all, the text of a 200 answer or None)."""
        try:
            async with session.get(url, params=[("name[]", n) for n in names]) as resp:
                if resp.status != 200:
                    log.debug("scrape %s: HTTP %s", url, resp.status)
                    return True, None
                return True, await resp.text()
        except (UnicodeDecodeError, ValueError) as err:
            log.debug("scrape %s: unreadable answer: %s", url, err)
            return True, None
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            log.debug("scrape %s failed: %s", url, err)
            return False, None

    def _evaluate(self, t: DeploymentTargets, texts: Sequence[str | None], rebaseline: bool,
                  master: MasterHealth | None = None,
                  families: Mapping[str, Mapping[str, ex.Kind]] | None = None) -> Health | None:
        key = t.key
        now = self.clock()
        quiet = self._quiet.pop(key, None)
        if (quiet is not None and quiet[0] is t and not rebaseline and master is None
                and all(text is None for text in texts) and not self.evaluator.holds_data(key)):
            return self._evaluate_quiet(t, quiet[1], now)
        if rebaseline:
            self.evaluator.rebaseline(key)
        reachable = {r: 0 for r in SCRAPED_ROLES}
        seen: set[tuple[str, str]] = set()
        for pod, text in zip(t.pods, texts):
            seen.add((pod.role, pod.name))
            if text is not None:
                try:
                    wanted = (families or {}).get(pod.role) or self.families(pod.role, t.slo_spec, t.load)
                    scrape = ex.parse_exposition(text, families=wanted)
                    self.evaluator.observe_scrape(key, pod.role, pod.name, scrape, now, pod_uid=pod.uid)
                    reachable[pod.role] += 1
                    continue
                except ex.ExpositionError as err:
                    log.debug("scrape %s: %s", pod.url, err)
            if self.metrics is not None and (key, pod.role, pod.name) not in self._skipped:
                self.metrics.scrape_errors.labels(role=pod.role).inc()
        for role, pod_name in self._pods.get(key, set()) - seen:  # pods gone or no longer ready
            self.evaluator.forget(key, role=role, pod_name=pod_name)
            self._filter.pop((key, role, pod_name), None)
            self._silent.pop((key, role, pod_name), None)
        self._pods[key] = seen
        result = self.evaluator.evaluate(key, t.slo_spec or NO_SLO, now)
        if self.metrics is not None:
            if t.slo_spec is not None:
                self.metrics.publish(result)
            else:
                self.metrics.remove(key)
            transfer = transfer_summary(self.evaluator, key, now=now, window_s=result.window_seconds)
            self.metrics.kvstore.publish(key, master, transfer)
            if master is None:
                self.metrics.kvstore.clear_health(key)
        passes = self._passes[key] = self._passes.get(key, 0) + 1
        if passes < 2:  # first pass: baselines only, nothing measured yet
            return None
        health = Health(namespace=t.namespace, name=t.name, serving_key=t.serving_key, evaluated_at=now,
                        ready=dict(t.ready), reachable=reachable,
                        slo=result if t.slo_spec is not None else None, kv_transfer=result.kv_transfer,
                        kvstore=master)
        if master is None and not any(reachable.values()) and not self.evaluator.holds_data(key):
            self._quiet[key] = (t, health)
        return health

    def _evaluate_quiet(self, t: DeploymentTargets, last: Health, now: float) -> Health:
        """A deployment whose inputs did not change since its last evaluation: the same targets
        (body, serving key, pods), no page answered this pass or the last, no Mooncake master,
        and no data in the evaluator. Its evaluation and transfer figures would be the last
        ones, so they are not computed again: the last health is handed on at ``now`` (the
        scrape errors of the pods asked are still counted)."""
        if self.metrics is not None:
            for pod in t.pods:
                if (t.key, pod.role, pod.name) not in self._skipped:
                    self.metrics.scrape_errors.labels(role=pod.role).inc()
        health = last.restamped(now)
        if self.metrics is not None and health.slo is not None:
            self.metrics.publish(health.slo)
        self._passes[t.key] += 1
        self._quiet[t.key] = (t, health)
        return health
