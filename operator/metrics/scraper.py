"""Scrape every PDDeployment's engine and gateway pods each interval and evaluate its SLO.

The operator process runs one :class:`Scraper` on kopf's event loop (started by the
startup handler in ``handlers.py``, stopped on cleanup). Every ``interval`` seconds it:

1. lists the PDDeployments and, per namespace, the pods the operator made (two LIST
   calls through functions the operator hands in; this module never imports the
   reconcilers);
2. picks, per PDDeployment, the *serving* group's ready pods (``status.rollout.
   servingKey``) with a pod IP: prefill and decode on the SGLang port (30000), the gateway
   on smg's ``--prometheus-port`` (29000) — :func:`deployment_targets`, pure;
3. GETs ``http://<podIP>:<port>/metrics?name[]=...`` asking only for the samples the
   evaluator reads for that role and spec (``exposition.sample_names`` of
   ``SLOEvaluator.families_for``), at most ``concurrency`` requests in flight, each with
   ``timeout`` seconds; a pod that does not answer 200 in time, or whose text does not
   parse, is a scrape error (``sglang_pd_operator_scrape_errors_total{role}``) and is
   not *reachable*;
4. feeds the texts to the :class:`~sglang_pd_operator.metrics.slo.SLOEvaluator` and
   evaluates the deployment (its ``spec.slo``, or only KV transfer health without one),
   in a worker thread so that parsing does not stall kopf's event loop; publishes the
   result to :class:`~sglang_pd_operator.metrics.operator_metrics.OperatorMetrics`
   (deployments with ``spec.slo`` only);
5. hands a :class:`Health` per deployment (the SLO result, per-role ready and reachable
   pod counts, KV transfer figures) to ``on_health``; the operator keeps it in its
   Runtime, and the reconcile writes it into status (``SLOMet``, ``status.slo``,
   ``Degraded`` NoPrefill / KVTransferFailing).

A deployment's first pass only takes baselines (the increase since a pod's previous
scrape is what counts), so ``on_health`` is called from its second pass on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import ValidationError

from ..api.v1alpha1 import SLOSpec
from ..planning.engine_args import ENGINE_PORT
from ..render import labels as L
from ..render.gateway import GATEWAY_METRICS_PORT
from . import exposition as ex
from .operator_metrics import OperatorMetrics
from .slo import ROLE_DECODE, ROLE_GATEWAY, ROLE_PREFILL, KVTransferResult, SLOEvaluator, SLOResult

log = logging.getLogger(__name__)

SCRAPED_ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_GATEWAY)
#: Port of ``/metrics`` per role: SGLang serves it on its HTTP port (``--enable-metrics``),
#: smg on ``--prometheus-port``.
METRICS_PORTS: Mapping[str, int] = {ROLE_PREFILL: ENGINE_PORT, ROLE_DECODE: ENGINE_PORT,
                                    ROLE_GATEWAY: GATEWAY_METRICS_PORT}
DEFAULT_CONCURRENCY = 32
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
class DeploymentTargets:
    """What to scrape for one PDDeployment in this interval.

    ``serving_key``: the compat key of the group the user-facing Service selects (None
    before the first reconcile wrote it). ``slo_spec``: the parsed ``spec.slo`` (None when
    unset or invalid). ``pods``: the serving group's ready pods with an IP; ``ready``:
    their number per role.
    """

    namespace: str
    name: str
    serving_key: str | None
    slo_spec: SLOSpec | None
    pods: tuple[PodTarget, ...] = ()
    ready: Mapping[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``namespace/name``, the evaluator's and the metrics' key."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Health:
    """What the latest scrape of one PDDeployment found (handed to ``on_health``).

    ``evaluated_at``: Unix time. ``ready`` / ``reachable``: per role (prefill, decode,
    gateway), the serving group's ready pods and how many of them answered ``/metrics``.
    ``slo``: the evaluation of ``spec.slo`` (None without one). ``kv_transfer``: KV
    transfer latency and failures over the SLO window (5m without ``spec.slo``).
    """

    namespace: str
    name: str
    serving_key: str | None
    evaluated_at: float
    ready: Mapping[str, int]
    reachable: Mapping[str, int]
    slo: SLOResult | None
    kv_transfer: KVTransferResult

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def serving_key(body: Mapping[str, Any]) -> str | None:
    """The compat key the PDDeployment serves from, as its last reconcile wrote it."""
    status = body.get("status") or {}
    return (status.get("rollout") or {}).get("servingKey") or status.get("compatKey")


def slo_spec_of(body: Mapping[str, Any]) -> SLOSpec | None:
    """``spec.slo`` parsed, or None when unset or invalid (the reconcile reports an invalid spec)."""
    raw = (body.get("spec") or {}).get("slo")
    if not raw:
        return None
    try:
        return SLOSpec.model_validate(raw)
    except ValidationError:
        return None


def deployment_targets(
    body: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, ports: Mapping[str, int] = METRICS_PORTS
) -> DeploymentTargets:
    """The pods to scrape for the PDDeployment ``body`` among ``pods`` (of its namespace), pure.

    Only the serving group's pods (labels ``deployment`` = its name, ``compat-key`` = the
    serving key, ``role`` prefill | decode | gateway) that are Running, Ready and have an
    IP; ``ports``: the ``/metrics`` port per role.
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    key = serving_key(body)
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
    return DeploymentTargets(namespace=namespace, name=name, serving_key=key, slo_spec=slo_spec_of(body),
                             pods=tuple(targets), ready=ready)


HealthCallback = Callable[[Health], Awaitable[None] | None]


class Scraper:
    """The scrape loop (see the module docstring).

    ``list_deployments()`` -> PDDeployment bodies; ``list_pods(namespace)`` -> the pods the
    operator made in ``namespace`` (both blocking, run in a worker thread).
    ``on_health(health)`` (plain or async) receives each evaluated deployment;
    ``on_forget(key)`` is called for a deployment that disappeared. ``interval``,
    ``timeout`` (default ``min(5, 0.8 * interval)``) in seconds; ``concurrency``: most
    scrapes in flight. ``ports``: ``/metrics`` port per role. ``clock``: Unix time source.
    """

    def __init__(
        self,
        *,
        list_deployments: Callable[[], list[dict[str, Any]]],
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
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.list_deployments = list_deployments
        self.list_pods = list_pods
        self.on_health = on_health
        self.on_forget = on_forget
        self.metrics = metrics
        # one time slot per interval (window edges exact to half an interval)
        self.evaluator = evaluator or SLOEvaluator(resolution_s=min(5.0, interval / 2))
        self.interval = interval
        self.timeout = timeout if timeout is not None else min(5.0, 0.8 * interval)
        self.concurrency = concurrency
        self.ports = dict(ports)
        self.clock = clock
        self._names: dict[str, dict[str, tuple[str, ...]]] = {}   # key -> role -> asked sample names
        self._pods: dict[str, set[tuple[str, str]]] = {}          # key -> (role, pod) last scraped
        self._passes: dict[str, int] = {}                          # key -> evaluations so far
        self._eval_lock = asyncio.Lock()
        self._semaphore: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        """Scrape every ``interval`` seconds until cancelled; a failing pass is logged and retried."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            try:
                await self.scrape_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("SLO scrape pass failed")
            next_at += self.interval
            delay = next_at - loop.time()
            if delay < 0:
                log.warning("SLO scrape pass took %.1fs, longer than the %.1fs interval", self.interval - delay,
                            self.interval)
                next_at = loop.time()
                delay = 0
            await asyncio.sleep(delay)

    async def scrape_once(self) -> list[Health]:
        """One pass over every PDDeployment; returns the healths handed to ``on_health``."""
        started = time.perf_counter()
        bodies = await asyncio.to_thread(self.list_deployments)
        namespaces = sorted({b["metadata"]["namespace"] for b in bodies})
        pod_lists = await asyncio.gather(*(asyncio.to_thread(self.list_pods, ns) for ns in namespaces))
        pods_by_ns = dict(zip(namespaces, pod_lists))
        targets = [deployment_targets(b, pods_by_ns[b["metadata"]["namespace"]], ports=self.ports) for b in bodies]
        self._semaphore = asyncio.Semaphore(self.concurrency)
        connector = aiohttp.TCPConnector(limit=self.concurrency, force_close=True)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout)) as session:
            healths = await asyncio.gather(*(self._deployment(session, t) for t in targets if t.serving_key))
        published = [h for h in healths if h is not None]
        self._forget_gone({t.key for t in targets})
        if self.on_health is not None:
            await asyncio.gather(*(self._deliver(h) for h in published))
        log.debug("SLO scrape pass: %d deployments, %d pods in %.3fs", len(targets),
                  sum(len(t.pods) for t in targets), time.perf_counter() - started)
        return published

    async def _deliver(self, health: Health) -> None:
        try:
            result = self.on_health(health)  # type: ignore[misc]
            if asyncio.iscoroutine(result):
                await result
        except Exception:
            log.exception("on_health for %s failed", health.key)

    def _forget_gone(self, present: set[str]) -> None:
        for key in list(self._passes):
            if key not in present:
                self.evaluator.forget(key)
                for store in (self._names, self._pods, self._passes):
                    store.pop(key, None)
                if self.metrics is not None:
                    self.metrics.remove(key)
                if self.on_forget is not None:
                    self.on_forget(key)

    # ------------------------------------------------------------------ one deployment
    def sample_names(self, role: str, slo_spec: SLOSpec | None) -> tuple[str, ...]:
        """The ``name[]`` values asked from a ``role`` pod for ``slo_spec``."""
        return ex.sample_names(self.evaluator.families_for(role, slo_spec))

    async def _deployment(self, session: aiohttp.ClientSession, t: DeploymentTargets) -> Health | None:
        names = {r: self.sample_names(r, t.slo_spec) for r in SCRAPED_ROLES}
        rebaseline = t.key in self._names and self._names[t.key] != names
        self._names[t.key] = names
        texts = await asyncio.gather(*(self._fetch(session, p, names[p.role]) for p in t.pods))
        async with self._eval_lock:  # the evaluator is used by one thread at a time
            return await asyncio.to_thread(self._evaluate, t, texts, rebaseline)

    async def _fetch(self, session: aiohttp.ClientSession, pod: PodTarget, names: tuple[str, ...]) -> str | None:
        assert self._semaphore is not None
        async with self._semaphore:
            try:
                async with session.get(pod.url, params=[("name[]", n) for n in names]) as resp:
                    if resp.status != 200:
                        log.debug("scrape %s: HTTP %s", pod.url, resp.status)
                        return None
                    return await resp.text()
            except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError, ValueError) as err:
                log.debug("scrape %s failed: %s", pod.url, err)
                return None

    def _evaluate(self, t: DeploymentTargets, texts: Sequence[str | None], rebaseline: bool) -> Health | None:
        key = t.key
        if rebaseline:
            self.evaluator.rebaseline(key)
        now = self.clock()
        reachable = {r: 0 for r in SCRAPED_ROLES}
        seen: set[tuple[str, str]] = set()
        for pod, text in zip(t.pods, texts):
            seen.add((pod.role, pod.name))
            if text is not None:
                try:
                    self.evaluator.observe(key, pod.role, pod.name, text, now, pod_uid=pod.uid)
                    reachable[pod.role] += 1
                    continue
                except ex.ExpositionError as err:
                    log.debug("scrape %s: %s", pod.url, err)
            if self.metrics is not None:
                self.metrics.scrape_errors.labels(role=pod.role).inc()
        for role, pod_name in self._pods.get(key, set()) - seen:  # pods gone or no longer ready
            self.evaluator.forget(key, role=role, pod_name=pod_name)
        self._pods[key] = seen
        result = self.evaluator.evaluate(key, t.slo_spec or NO_SLO, now)
        if self.metrics is not None:
            if t.slo_spec is not None:
                self.metrics.publish(result)
            else:
                self.metrics.remove(key)
        passes = self._passes[key] = self._passes.get(key, 0) + 1
        if passes < 2:  # first pass: baselines only, nothing measured yet
            return None
        return Health(namespace=t.namespace, name=t.name, serving_key=t.serving_key, evaluated_at=now,
                      ready=dict(t.ready), reachable=reachable,
                      slo=result if t.slo_spec is not None else None, kv_transfer=result.kv_transfer)
