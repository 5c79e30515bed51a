"""``--slo-source prometheus``: read every PDDeployment's SLO figures from the cluster's Prometheus.

The same shape as :class:`~sglang_pd_operator.metrics.scraper.Scraper` from the outside:
an object with an async :meth:`PrometheusSource.run` loop, built from a
``list_deployments()`` callable, that hands a
:class:`~sglang_pd_operator.metrics.scraper.Health` per deployment to ``on_health``,
calls ``on_forget(key)`` for a deployment that disappeared and ``on_pass()`` after every
pass (the liveness heartbeat). The reconcile writes the same conditions and status
fields from it as from the scraper (``reconcilers/status.py``).

Each pass (every ``interval`` seconds):

1. lists the PDDeployments (``list_deployments``), the compat key each one serves from
   (``serving_key_of``: the user-facing Service's selector in the process's cache) and,
   per namespace, the operator's pods (``list_pods``, the cache too): the serving group's
   ready pods per role are counted as the scraper counts them
   (``scraper.deployment_targets``), never read back out of status;
2. builds ONE batched set of instant queries, each over every deployment at once: the SLO
   figures the PrometheusRules record (``promql.recorded_slo``: every target percentile,
   the attainment and the four burn rates, one query), and the raw expressions nothing
   records for every deployment (``promql.window_queries`` per distinct SLO window:
   observations per targeted metric, KV transfer latency, failures and transfers, decode's
   finished requests; ``promql.targets_up`` and ``promql.newest_sample``), all evaluated
   at one instant (``time=``). The number of queries grows with the distinct windows and
   targeted metrics, never with pods or deployments;
3. per deployment: the recorded percentiles and their verdicts (``slo.target_result``),
   the recorded attainment and burn rates (the rule is their one implementation; nothing
   is recounted in memory), KV transfer latency and failures, and per role how many of
   the serving group's targets answered Prometheus' latest scrape (``up``);
4. hands each deployment's Health (``source="prometheus"``) to ``on_health``.

Never stale True: when a query fails (Prometheus unreachable, an HTTP or PromQL error,
a timeout) every deployment gets a Health with ``problem=("PrometheusUnavailable", why)``;
a deployment whose serving group has no ``up`` series gets ``("NoSeries", ...)``, one
whose newest sample is older than ``max_data_age_s`` gets ``("StaleSeries", ...)``, and one
with requests in its window but none of its recorded percentiles (its PrometheusRule is not
loaded by this Prometheus, or its group has not been evaluated since traffic began) gets
``("NoRecordedSeries", ...)``. Such
a Health carries no SLO result and no reachable pods; the status shows ``SLOMet``
Unknown with that reason.

With ``kvCache.hicache.storage.backend: mooncake`` the Mooncake master is still probed
directly (one request per such deployment, ``scraper.probe_master``), found among the
pods ``list_pods`` gave.

Authentication: an optional bearer token file (read every pass, so a rotated token is
picked up) and TLS (CA bundle, client certificate and key), e.g. from a mounted Secret
(the chart's ``slo.prometheus.secretName``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..api.v1alpha1 import SLOSpec, parse_duration
from . import promql
from .operator_metrics import OperatorMetrics
from .periodic import deliver, run_every
from .health import Health
from . import exposition as ex
from .scraper import (
    NO_SLO,
    SCRAPED_ROLES,
    DeploymentTargets,
    HealthCallback,
    ServingKeyOf,
    TargetsMemo,
    pods_by_deployment,
    probe_master,
)
from .slo import (
    PERCENTILES,
    ROLE_DECODE,
    ROLE_PREFILL,
    SLO_METRICS,
    SOURCES,
    BurnRate,
    KVTransferResult,
    RoleSummary,
    SLOResult,
    TargetResult,
    burn_windows,
    format_duration,
    target_result,
)

log = logging.getLogger(__name__)

SOURCE = "prometheus"
#: Reasons of an Unknown ``SLOMet`` from this source.
UNAVAILABLE, NO_SERIES, STALE_SERIES = "PrometheusUnavailable", "NoSeries", "StaleSeries"
NO_RECORDS = "NoRecordedSeries"
#: Queries in flight at once.
DEFAULT_CONCURRENCY = 8
NO_KV_TRANSFER = KVTransferResult(latency_seconds={p: None for p in PERCENTILES}, transfers=0.0,
                                  transfer_failures=0.0, bootstrap_failures=0.0, failures_per_second=0.0,
                                  failure_ratio=None)


class PrometheusError(RuntimeError):
    """A query got no usable answer: the message names the URL and what went wrong."""


@dataclass(frozen=True)
class PrometheusSettings:
    """Where and how to reach Prometheus' HTTP API.

    ``url``: its base URL (``http://prometheus-operated.monitoring:9090``; a path prefix
    such as ``/prometheus`` is kept). ``bearer_token_file``: a file holding a bearer token
    (sent as ``Authorization: Bearer``, read on every pass). ``ca_file``: CA bundle to
    verify an https URL; ``cert_file`` / ``key_file``: a client certificate;
    ``insecure_skip_verify``: do not verify the server's certificate (test setups only).
    Raises ValueError for a URL that is not http(s) or a key without a certificate.
    """

    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL {self.url!r} must start with http:// or https://")
        if self.key_file and not self.cert_file:
            raise ValueError("a Prometheus client key needs its certificate (cert_file)")

    def ssl_context(self) -> ssl.SSLContext | bool | None:
        """The TLS setup for aiohttp: None (defaults), False (no verification) or a context."""
        if self.insecure_skip_verify:
            return False
        if not (self.ca_file or self.cert_file):
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    def headers(self) -> dict[str, str]:
        """The request headers: the bearer token when a token file is set (read now)."""
        if not self.bearer_token_file:
            return {}
        with open(self.bearer_token_file, encoding="utf-8") as f:
            token = f.read().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


Sample = tuple[Mapping[str, str], float]


async def instant_query(session: aiohttp.ClientSession, settings: PrometheusSettings, expr: str,
                        at: float, *, timeout: float) -> list[Sample]:
    """Evaluate ``expr`` at Unix time ``at`` through ``POST /api/v1/query``: [(labels, value)].

    A scalar answer is one sample without labels. NaN values are kept (histogram_quantile
    without observations). Raises :class:`PrometheusError` on no answer, a non-200 answer,
    ``status`` other than ``success`` (the PromQL error is in the message) or a timeout.
    """
    url = settings.url.rstrip("/") + "/api/v1/query"
    # Prometheus parses durations without fractions ("1.6s" is refused): whole milliseconds
    form = {"query": expr, "time": f"{at:.3f}", "timeout": f"{max(1, round(timeout * 1000))}ms"}
    try:
        async with session.post(url, data=form, headers=settings.headers(), ssl=settings.ssl_context(),
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = None
            if resp.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
                why = (body or {}).get("error") if isinstance(body, dict) else None
                raise PrometheusError(f"{url}: HTTP {resp.status}{': ' + why if why else ''}")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        raise PrometheusError(f"{url}: {type(err).__name__}: {err}".rstrip(": ")) from err
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [({}, float(result[1]))]
    if kind != "vector":
        raise PrometheusError(f"{url}: expected an instant vector, got {kind!r} for {expr}")
    return [(r.get("metric") or {}, float(r["value"][1])) for r in result]


@dataclass(frozen=True)
class _Deployment:
    """What one pass needs of a PDDeployment: its targets as the scraper picks them (serving key, spec,
    the serving group's ready pods per role, the Mooncake master) and its SLO window in seconds."""

    targets: DeploymentTargets
    window_s: float

    @property
    def namespace(self) -> str:
        return self.targets.namespace

    @property
    def name(self) -> str:
        return self.targets.name

    @property
    def serving_key(self) -> str:
        return self.targets.serving_key or ""

    @property
    def slo_spec(self) -> SLOSpec | None:
        return self.targets.slo_spec

    @property
    def ready(self) -> Mapping[str, int]:
        return self.targets.ready

    @property
    def load(self) -> bool:
        return self.targets.load

    @property
    def key(self) -> str:
        return self.targets.key


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


class PrometheusSource:
    """The Prometheus query loop (see the module docstring).

    ``list_deployments()`` -> PDDeployment bodies; ``serving_key_of(namespace, name)`` -> the
    compat key its user-facing Service selects (None: not served yet; the deployment is
    skipped); ``list_pods(namespace)`` -> the operator's pods there (all three blocking, run
    in a worker thread; the operator hands in readers of its cache, projections that are never
    changed in place: a deployment whose inputs are the objects of the last pass keeps its
    targets, ``scraper.TargetsMemo``).
    ``prometheus``: :class:`PrometheusSettings`. ``on_health(health)`` (plain or async)
    receives each deployment's figures; ``on_forget(key)`` a deployment that disappeared;
    ``on_pass()`` is called after every pass. ``namespaces``: the namespaces the operator
    watches (None: all; a matcher on every query). ``interval``, ``timeout`` (default
    ``min(10, 0.8 * interval)``), ``max_data_age_s`` (default ``max(60, 4 * interval)``, the
    runtime's bound on a Health's age) in seconds. ``clock``: Unix time source.
    """

    def __init__(
        self,
        *,
        list_deployments: Callable[[], list[dict[str, Any]]],
        serving_key_of: ServingKeyOf,
        list_pods: Callable[[str], list[dict[str, Any]]],
        prometheus: PrometheusSettings,
        on_health: HealthCallback | None = None,
        on_forget: Callable[[str], None] | None = None,
        on_pass: Callable[[], None] | None = None,
        metrics: OperatorMetrics | None = None,
        namespaces: Sequence[str] | None = None,
        interval: float = 15.0,
        timeout: float | None = None,
        max_data_age_s: float | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.list_deployments = list_deployments
        self.serving_key_of = serving_key_of
        self.prometheus = prometheus
        self.on_health = on_health
        self.on_forget = on_forget
        self.on_pass = on_pass
        self.metrics = metrics
        self.namespaces = list(namespaces) if namespaces else None
        self.interval = interval
        self.timeout = timeout if timeout is not None else min(10.0, 0.8 * interval)
        self.max_data_age_s = max_data_age_s if max_data_age_s is not None else max(60.0, 4 * interval)
        self.concurrency = concurrency
        self.list_pods = list_pods
        self._targets = TargetsMemo()
        self.clock = clock
        self._known: set[str] = set()
        #: figures of the last pass: queries sent and seconds until the last answer
        self.last_queries = 0
        self.last_query_seconds = 0.0

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        """Query every ``interval`` seconds until cancelled; a failing pass is logged and retried."""
        await run_every(self.query_once, interval=self.interval, on_pass=self.on_pass, what="SLO pass (Prometheus)")

    def queries(self, deployments: Sequence[_Deployment]) -> dict[tuple[float | None, str], str]:
        """The batched queries for ``deployments``: (window seconds or None, name) -> PromQL.

        One :func:`promql.window_queries` set per distinct window (with the metrics any
        deployment of that window targets), the recorded SLO figures
        (:func:`promql.recorded_slo`, when a deployment has ``spec.slo``), and the
        reachability and freshness queries.
        """
        sel = promql.selector(namespaces=self.namespaces)
        targets: dict[float, set[str]] = defaultdict(set)
        for d in deployments:
            per_window = targets[d.window_s]
            per_window.update(m for m in SLO_METRICS if d.slo_spec is not None and getattr(d.slo_spec, m) is not None)
        out: dict[tuple[float | None, str], str] = {}
        for window_s, metrics in sorted(targets.items()):
            for name, expr in promql.window_queries(window_s, metrics, sel).items():
                out[(window_s, name)] = expr
        if any(d.slo_spec is not None for d in deployments):
            out[(None, "recorded")] = promql.recorded_slo(sel)
        if deployments:
            out[(None, "up")] = promql.targets_up(sel)
            out[(None, "newest")] = promql.newest_sample(sel)
        if any(d.load for d in deployments):  # the planner's load gauges (spec.autoscaling)
            for name, expr in promql.load_queries(sel).items():
                out[(None, name)] = expr
        return out

    async def query_once(self) -> list[Health]:
        """One pass over every PDDeployment; returns the healths handed to ``on_health``."""
        deployments = await asyncio.to_thread(self.deployments)
        queries = self.queries(deployments)
        now = self.clock()
        started = time.perf_counter()
        answers: dict[tuple[float | None, str], list[Sample]] = {}
        problem: tuple[str, str] | None = None
        semaphore = asyncio.Semaphore(self.concurrency)
        async with aiohttp.ClientSession() as session:
            async def ask(name: tuple[float | None, str], expr: str) -> None:
                async with semaphore:
                    answers[name] = await instant_query(session, self.prometheus, expr, now, timeout=self.timeout)

            try:
                await asyncio.gather(*(ask(n, e) for n, e in queries.items()))
            except PrometheusError as err:
                problem = (UNAVAILABLE, f"cannot read the SLO figures from Prometheus: {err}")
                log.warning("SLO pass: %s", problem[1])
            masters = await self._probe_masters(session, deployments)
        self.last_queries = len(queries)
        self.last_query_seconds = time.perf_counter() - started
        index = _Index(answers)
        healths = [self._health(d, index, now, problem, masters.get(d.key)) for d in deployments]
        self._forget_gone({d.key for d in deployments})
        if self.on_health is not None:
            for h in healths:
                await deliver(self.on_health, h)
        return healths

    def deployments(self) -> list[_Deployment]:
        """This pass's deployments with a serving group, their targets picked from the pods of their
        namespaces (one ``list_pods`` per namespace, grouped once: linear in pods). Blocking."""
        bodies = self.list_deployments()
        keyed = [(b, self.serving_key_of(b["metadata"]["namespace"], b["metadata"]["name"])) for b in bodies]
        keyed = [(b, k) for b, k in keyed if k]
        namespaces = sorted({b["metadata"]["namespace"] for b, _ in keyed})
        grouped = pods_by_deployment({ns: self.list_pods(ns) for ns in namespaces})
        out = []
        for b, key in keyed:
            meta = b["metadata"]
            t = self._targets.targets(b, grouped.get((meta["namespace"], meta["name"]), []), serving_key=key)
            out.append(_Deployment(targets=t, window_s=parse_duration((t.slo_spec or NO_SLO).window)))
        self._targets.retain({(d.targets.namespace, d.targets.name) for d in out})
        return out

    async def _probe_masters(self, session: aiohttp.ClientSession,
                             deployments: Sequence[_Deployment]) -> dict[str, Any]:
        """Mooncake master health of each deployment that uses it (found among the pods listed)."""
        wanted = [d for d in deployments if d.targets.master is not None]
        if not wanted:
            return {}
        timeout = min(5.0, 0.8 * self.interval)

        async def one(d: _Deployment) -> tuple[str, Any]:
            return d.key, await probe_master(session, d.targets, timeout=timeout)

        return dict(await asyncio.gather(*(one(d) for d in wanted)))

    def _forget_gone(self, present: set[str]) -> None:
        for key in self._known - present:
            if self.metrics is not None:
                self.metrics.remove(key)
                self.metrics.kvstore.remove(key)
            if self.on_forget is not None:
                self.on_forget(key)
        self._known = set(present)

    # ------------------------------------------------------------------ one deployment
    def _health(self, d: _Deployment, index: _Index, now: float, problem: tuple[str, str] | None,
                master: Any) -> Health:
        if self.metrics is not None:
            if master is not None:
                self.metrics.kvstore.publish(d.key, master)
            else:
                self.metrics.kvstore.clear_health(d.key)
        reachable = {r: 0 for r in SCRAPED_ROLES}
        if problem is None:
            up = index.get((None, "up"), d, **{promql.COMPAT_KEY_LABEL: d.serving_key})
            if not up:
                problem = (NO_SERIES, f"Prometheus has no series of the serving group's pods (up{{namespace="
                                      f"\"{d.namespace}\",deployment=\"{d.name}\",{promql.COMPAT_KEY_LABEL}="
                                      f"\"{d.serving_key[:12]}...\"}}): is the PDDeployment's PodMonitor selected "
                                      "by this Prometheus (podMonitorSelector / namespace selector)?")
            else:
                newest = index.value((None, "newest"), d)
                age = None if newest is None else now - newest
                if age is None or age > self.max_data_age_s:
                    problem = (STALE_SERIES, f"Prometheus' newest sample of this PDDeployment's pods is "
                                             f"{format_duration(round(age or 0))} old (more than "
                                             f"{format_duration(self.max_data_age_s)}); its scrape has stopped")
            for labels, value in up:
                if labels.get("role") in reachable and problem is None:
                    reachable[labels["role"]] += int(value)
        if problem is not None:
            if self.metrics is not None:
                self.metrics.remove(d.key)
            return Health(namespace=d.namespace, name=d.name, serving_key=d.serving_key, evaluated_at=now,
                          ready=dict(d.ready), reachable=reachable, slo=None, kv_transfer=NO_KV_TRANSFER,
                          kvstore=master, source=SOURCE, problem=problem)
        kv = self._kv_transfer(d, index)
        result = self._slo(d, index, now, kv, reachable)
        if result is None:  # requests, but no recorded figure of them
            problem = (NO_RECORDS, self._no_records(d))
            if self.metrics is not None:
                self.metrics.remove(d.key)
            return Health(namespace=d.namespace, name=d.name, serving_key=d.serving_key, evaluated_at=now,
                          ready=dict(d.ready), reachable=reachable, slo=None, kv_transfer=kv,
                          kvstore=master, source=SOURCE, problem=problem)
        if self.metrics is not None:
            if d.slo_spec is not None:
                self.metrics.publish(result)
            else:
                self.metrics.remove(d.key)
        return Health(namespace=d.namespace, name=d.name, serving_key=d.serving_key, evaluated_at=now,
                      ready=dict(d.ready), reachable=reachable, slo=result if d.slo_spec is not None else None,
                      kv_transfer=kv, kvstore=master, source=SOURCE)

    @staticmethod
    def _no_records(d: _Deployment) -> str:
        names = ", ".join(promql.recorded_name(m, p) for m in SLO_METRICS for p in PERCENTILES
                          if d.slo_spec is not None and (t := getattr(d.slo_spec, m)) is not None
                          and getattr(t, p) is not None)
        return (f"Prometheus has requests of this PDDeployment in its window but none of its recorded SLO series "
                f"({names}{{namespace=\"{d.namespace}\",deployment=\"{d.name}\"}}): is its PrometheusRule "
                "selected by this Prometheus (ruleSelector), and has its rule group been evaluated since the "
                "requests began?")

    def _slo(self, d: _Deployment, index: _Index, now: float, kv: KVTransferResult,
             reachable: Mapping[str, int] | None = None) -> SLOResult | None:
        """The SLO figures of ``d`` from its PrometheusRule's records (None: traffic, but no record)."""
        spec = d.slo_spec or NO_SLO
        w = d.window_s
        recorded = {labels.get("__name__", ""): value for labels, value in index.get((None, "recorded"), d)}
        targets: list[TargetResult] = []
        traffic = any_record = False
        for metric in SLO_METRICS:
            spec_targets = getattr(spec, metric)
            if spec_targets is None:
                continue
            seen = index.value((w, f"observations:{metric}"), d) or 0.0
            traffic = traffic or seen > 0
            for pname in PERCENTILES:
                raw = getattr(spec_targets, pname)
                if raw is None:
                    continue
                value = recorded.get(promql.recorded_name(metric, pname))
                any_record = any_record or value is not None
                measured = _finite(value) if seen > 0 else None
                targets.append(target_result(metric, pname, raw, measured, observations=seen, resolution=None,
                                             role=ROLE_DECODE, family=SOURCES[metric].family))
        if d.slo_spec is not None and traffic and not any_record:
            return None
        known = [t for t in targets if t.met is not None]
        met = None if not known else all(t.met for t in known)
        attainment = _finite(recorded.get(promql.ATTAINMENT_RECORD))
        burn = tuple(BurnRate(window=bw, value=_finite(recorded.get(promql.burn_rate_record(bw.seconds))), intervals=0)
                     for bw in burn_windows(w))
        return SLOResult(deployment=d.key, evaluated_at=now, window_seconds=w, objective=spec.objective,
                         targets=tuple(targets), met=met, no_traffic=not traffic, attainment=attainment,
                         burn_rates=burn, kv_transfer=kv,
                         roles=self._roles(d, index, reachable or {}) if d.load else {})

    @staticmethod
    def _roles(d: _Deployment, index: _Index, reachable: Mapping[str, int]) -> dict[str, RoleSummary]:
        """The serving group's load gauges per role (``promql.load_queries``), as the scraper's
        ``SLOResult.roles``: queues summed, ``token_usage`` averaged; ``pods``: targets that answered."""
        out: dict[str, RoleSummary] = {}
        for role in (ROLE_PREFILL, ROLE_DECODE):
            queues: dict[str, float] = {}
            usage = None
            for gauge in promql.LOAD_GAUGES:
                got = index.get((None, f"load:{gauge}"), d, role=role, **{promql.COMPAT_KEY_LABEL: d.serving_key})
                if not got or math.isnan(got[0][1]):
                    continue
                if gauge == ex.TOKEN_USAGE:
                    usage = got[0][1]
                else:
                    queues[gauge.removeprefix("sglang:")] = got[0][1]
            if queues or usage is not None:
                out[role] = RoleSummary(role=role, pods=reachable.get(role, 0), queues=queues,
                                        spec_accept_length=None, token_usage=usage)
        return out

    @staticmethod
    def _kv_transfer(d: _Deployment, index: _Index) -> KVTransferResult:
        w = d.window_s
        latency = {p: _finite(index.value((w, f"kv_latency:{q:g}"), d)) for p, q in PERCENTILES.items()}
        failures = {labels.get("failure"): value for labels, value in index.get((w, "kv_failures"), d)}
        transfer = failures.get(promql.FAILURE_TRANSFER, 0.0)
        bootstrap = failures.get(promql.FAILURE_BOOTSTRAP, 0.0)
        requests = index.value((w, "requests"), d) or 0.0
        return KVTransferResult(
            latency_seconds=latency, transfers=index.value((w, "kv_transfers"), d) or 0.0,
            transfer_failures=transfer, bootstrap_failures=bootstrap,
            failures_per_second=(transfer + bootstrap) / w,
            failure_ratio=(transfer + bootstrap) / requests if requests > 0 else None,
        )


class _Index:
    """The answers of one pass, indexed by query name and deployment (namespace, name)."""

    def __init__(self, answers: Mapping[tuple[float | None, str], list[Sample]]) -> None:
        self._by: dict[tuple[float | None, str], dict[tuple[str, str], list[Sample]]] = {}
        for name, samples in answers.items():
            per = self._by.setdefault(name, {})
            for labels, value in samples:
                per.setdefault((labels.get("namespace", ""), labels.get("deployment", "")), []).append((labels, value))

    def get(self, name: tuple[float | None, str], d: _Deployment, **match: str) -> list[Sample]:
        """Samples of query ``name`` for deployment ``d`` whose labels include ``match``."""
        samples = self._by.get(name, {}).get((d.namespace, d.name), [])
        return [s for s in samples if all(s[0].get(k) == v for k, v in match.items())]

    def value(self, name: tuple[float | None, str], d: _Deployment) -> float | None:
        """The one value of query ``name`` for ``d`` (None when absent)."""
        samples = self.get(name, d)
        return samples[0][1] if samples else None
