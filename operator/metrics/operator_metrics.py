"""The operator's own Prometheus metrics: reconcile health and the SLO figures it measured.

Everything lives in one dedicated ``CollectorRegistry`` (:attr:`OperatorMetrics.registry`)
so the operator's ``/metrics`` serves exactly these series and nothing a library
registered globally. Serve it with ``prometheus_client.start_http_server(port,
registry=metrics.registry)`` or ``generate_latest(metrics.registry)`` in an existing
web app.

Reconcile metrics are ordinary instruments the reconciler updates. SLO metrics come
from the latest :class:`~sglang_pd_operator.metrics.slo.SLOResult` of each deployment,
published with :meth:`OperatorMetrics.publish`; a custom collector renders them at
scrape time, so a deleted deployment disappears as soon as :meth:`OperatorMetrics.remove`
is called (no stale label sets).

Names follow Prometheus conventions: ``sglang_pd_operator_`` prefix, base units
(seconds, ratios 0..1, tokens per second), ``_total`` only on counters. Label
``target`` is the spec field (``ttft``, ``itl``, ``e2e``, ``perUserSpeed``) and
``percentile`` is ``p50`` | ``p90`` | ``p99``; ``role`` is the role the figure was read
from (decode for request latencies under PD, prefill for KV transfer latency).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..runtime.liveness import Heartbeats, healthz
from ..runtime.workqueue import QueueStats
from sglang_pd_operator.metrics.kvstore import KVStoreCollector
from sglang_pd_operator.metrics.slo import UNIT_SECONDS, SLOResult, format_duration

PREFIX = "sglang_pd_operator"
#: ``result`` of ``sglang_pd_operator_reconciles_total``: a worker reconciled the object; a resync
#: found its inputs unchanged and skipped it (``runtime/controller.py`` ``InputLedger``).
RECONCILED, UNCHANGED = "reconciled", "unchanged"

#: Reconcile duration buckets, seconds: a no-op pass takes milliseconds, a pass that
#: applies a dozen objects through server-side apply can take several seconds.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def split_key(deployment_key: str) -> tuple[str, str]:
    """``namespace/name`` -> (namespace, name); a key without ``/`` has namespace ``""``."""
    namespace, _, name = deployment_key.rpartition("/")
    return namespace, name


class _SLOCollector(Collector):
    """Renders the published SLO results as gauge families at scrape time."""

    def __init__(self, owner: OperatorMetrics) -> None:
        self._owner = owner

    def describe(self):  # no pre-registration checks needed for dynamic families
        return []

    def collect(self):
        results = self._owner.results()
        dl = ["namespace", "deployment"]
        tl = dl + ["role", "target", "percentile"]
        measured_s = GaugeMetricFamily(f"{PREFIX}_slo_measured_seconds",
                                       "Measured latency percentile over the SLO window, seconds.", labels=tl)
        target_s = GaugeMetricFamily(f"{PREFIX}_slo_target_seconds",
                                     "Latency target from spec.slo, seconds.", labels=tl)
        measured_tps = GaugeMetricFamily(f"{PREFIX}_slo_measured_tokens_per_second",
                                         "Measured per-user generation speed percentile (output tokens/s per "
                                         "request, the reciprocal of SGLang's per-request TPOT).", labels=tl)
        target_tps = GaugeMetricFamily(f"{PREFIX}_slo_target_tokens_per_second",
                                       "Per-user generation speed target from spec.slo, tokens/s.", labels=tl)
        target_met = GaugeMetricFamily(f"{PREFIX}_slo_target_met",
                                       "1 when the target is met over the window, 0 when missed; absent "
                                       "when unknown.", labels=tl)
        observations = GaugeMetricFamily(f"{PREFIX}_slo_window_observations",
                                         "Observations the percentile is computed from: requests in the window "
                                         "(tokens for ITL).", labels=tl)
        met = GaugeMetricFamily(f"{PREFIX}_slo_met",
                                "1 when every SLO target is met, 0 when one is missed; absent when unknown "
                                "(no traffic).", labels=dl)
        no_traffic = GaugeMetricFamily(f"{PREFIX}_slo_no_traffic",
                                       "1 when no request finished in the SLO window.", labels=dl)
        attainment = GaugeMetricFamily(f"{PREFIX}_slo_attainment_ratio",
                                       "Fraction of evaluation intervals in the window that met every target.",
                                       labels=dl)
        objective = GaugeMetricFamily(f"{PREFIX}_slo_objective_ratio",
                                      "spec.slo.objective: the fraction of intervals that must be good.",
                                      labels=dl)
        window = GaugeMetricFamily(f"{PREFIX}_slo_window_seconds", "spec.slo.window, seconds.", labels=dl)
        burn = GaugeMetricFamily(f"{PREFIX}_slo_error_budget_burn_rate",
                                 "Error budget burn rate (bad-interval fraction / (1 - objective)) over the "
                                 "short and long window of the page and ticket pairs.",
                                 labels=dl + ["alert", "window", "duration"])
        kv_latency = GaugeMetricFamily(f"{PREFIX}_kv_transfer_latency_seconds",
                                       "KV cache transfer latency percentile over the window (prefill pods), "
                                       "seconds.", labels=dl + ["role", "percentile"])
        kv_failures = GaugeMetricFamily(f"{PREFIX}_kv_transfer_failures_per_second",
                                        "KV transfer + bootstrap failures per second over the window "
                                        "(prefill and decode pods).", labels=dl)
        kv_ratio = GaugeMetricFamily(f"{PREFIX}_kv_transfer_failure_ratio",
                                     "KV transfer + bootstrap failures per request finished by decode over "
                                     "the window.", labels=dl)
        queue = GaugeMetricFamily(f"{PREFIX}_role_queue_requests",
                                  "Requests in each SGLang queue, summed over the role's pods (latest scrape).",
                                  labels=dl + ["role", "queue"])
        pods = GaugeMetricFamily(f"{PREFIX}_role_scraped_pods",
                                 "Pods of the role scraped within the window.", labels=dl + ["role"])
        accept = GaugeMetricFamily(f"{PREFIX}_spec_accept_length",
                                   "Mean speculative decoding accept length over the role's pods.",
                                   labels=dl + ["role"])
        for key, r in results.items():
            ns, name = split_key(key)
            d = [ns, name]
            for t in r.targets:
                labels = d + [t.source_role or "", t.metric, t.percentile]
                if t.unit == UNIT_SECONDS:
                    target_s.add_metric(labels, t.target)
                    if t.measured is not None:
                        measured_s.add_metric(labels, t.measured)
                else:
                    target_tps.add_metric(labels, t.target)
                    if t.measured is not None:
                        measured_tps.add_metric(labels, t.measured)
                if t.met is not None:
                    target_met.add_metric(labels, 1.0 if t.met else 0.0)
                observations.add_metric(labels, t.observations)
            if r.met is not None:
                met.add_metric(d, 1.0 if r.met else 0.0)
            no_traffic.add_metric(d, 1.0 if r.no_traffic else 0.0)
            if r.attainment is not None:
                attainment.add_metric(d, r.attainment)
            objective.add_metric(d, r.objective)
            window.add_metric(d, r.window_seconds)
            for b in r.burn_rates:
                if b.value is not None:
                    burn.add_metric(d + [b.window.pair, b.window.length, format_duration(b.window.seconds)],
                                    b.value)
            for p, v in r.kv_transfer.latency_seconds.items():
                if v is not None:
                    kv_latency.add_metric(d + ["prefill", p], v)
            kv_failures.add_metric(d, r.kv_transfer.failures_per_second)
            if r.kv_transfer.failure_ratio is not None:
                kv_ratio.add_metric(d, r.kv_transfer.failure_ratio)
            for role, summary in r.roles.items():
                pods.add_metric(d + [role], summary.pods)
                for qname, v in summary.queues.items():
                    queue.add_metric(d + [role, qname], v)
                if summary.spec_accept_length is not None:
                    accept.add_metric(d + [role], summary.spec_accept_length)
        yield from (measured_s, target_s, measured_tps, target_tps, target_met, observations, met, no_traffic,
                    attainment, objective, window, burn, kv_latency, kv_failures, kv_ratio, queue, pods, accept)


class OperatorMetrics:
    """All operator metrics in a dedicated registry (see the module docstring).

    Reconcile instruments (label ``kind`` is the custom resource kind, e.g. PDDeployment):

    - ``sglang_pd_operator_reconcile_duration_seconds`` histogram; use :meth:`time_reconcile`.
    - ``sglang_pd_operator_reconcile_errors_total{kind,reason}`` counter.
    - ``sglang_pd_operator_queue_depth`` gauge: keys (PDDeployments and KernelBuilds) ready
      for a reconcile and waiting for a worker; ``..._queue_delayed`` keys waiting for their time
      (a retry, a drain grace period); ``..._queue_oldest_age_seconds`` how long the oldest
      ready key has waited; ``..._queue_retries_total{kind}`` failed reconciles queued again;
      ``..._reconcile_longest_running_seconds`` how long the longest reconcile in flight has
      run (a hung worker grows it; a backlog does not).
    - ``sglang_pd_operator_cache_objects{kind}`` gauge: objects of each watched kind in the
      operator's in-memory view (only what the label selectors let through).
    - ``sglang_pd_operator_resync_pass_seconds`` gauge: how long the last finished resync
      period took from its start until every key it queued was reconciled (at most the
      period when the loop keeps up: keys are spread over it; more means it falls behind);
      ``..._resync_lag_seconds`` the longest a key of that period waited from its due time
      until its reconcile finished (the queue wait plus one reconcile when it keeps up).
    - ``sglang_pd_operator_scrape_errors_total{role}`` counter: failed pod scrapes.
    - ``sglang_pd_operator_api_writes_total{verb,kind}`` counter: every write to the API
      server (apply, delete, patch-status, create Event); flat while specs are unchanged.
    - ``sglang_pd_operator_reconciles_total{kind,namespace,name,result}`` counter: the loop's
      looks at each object (what a test waits on before it says "nothing happened"):
      ``result="reconciled"`` a reconcile a worker finished, ``result="unchanged"`` a resync
      that found the object's inputs unchanged since its last reconcile and skipped it.
    - ``sglang_pd_operator_watch_lists_total{kind,reason}`` counter: LISTs of a watched kind
      (``start``; ``gone``: its watch met 410 Gone; ``appeared``: served since the start).

    :attr:`kvstore` (a :class:`~sglang_pd_operator.metrics.kvstore.KVStoreCollector` in the
    same registry) exports each Mooncake master's figures (``sglang_pd_kvstore_*``) and the
    KV transfer speed (``sglang_pd_kv_transfer_speed_gb_s``); the scraper publishes to it.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds", "Time spent in one reconcile pass, seconds.",
            ["kind"], buckets=RECONCILE_BUCKETS, registry=self.registry)
        self.reconcile_errors = Counter(
            f"{PREFIX}_reconcile_errors_total", "Reconcile passes that ended in an error.",
            ["kind", "reason"], registry=self.registry)
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth", "Keys ready for a reconcile, waiting for a worker.", registry=self.registry)
        self.queue_delayed = Gauge(
            f"{PREFIX}_queue_delayed", "Keys waiting for their time (retry backoff, rollout steps).",
            registry=self.registry)
        self.queue_oldest_age = Gauge(
            f"{PREFIX}_queue_oldest_age_seconds", "Seconds the longest-waiting ready key has waited.",
            registry=self.registry)
        self.queue_retries = Counter(
            f"{PREFIX}_queue_retries_total", "Failed reconciles queued again with backoff.", ["kind"],
            registry=self.registry)
        self.reconciles = Counter(
            f"{PREFIX}_reconciles_total",
            "Times the loop took up an object: result=reconciled, a worker finished a reconcile (any outcome); "
            "result=unchanged, a resync found its inputs unchanged since its last reconcile and skipped it "
            "(the series go when the object does).",
            ["kind", "namespace", "name", "result"], registry=self.registry)
        self.reconcile_longest_running = Gauge(
            f"{PREFIX}_reconcile_longest_running_seconds",
            "Seconds the longest reconcile in flight has run (0 when none runs).", registry=self.registry)
        self.cache_objects = Gauge(
            f"{PREFIX}_cache_objects", "Objects of each watched kind in the operator's in-memory view.", ["kind"],
            registry=self.registry)
        self.resync_pass = Gauge(
            f"{PREFIX}_resync_pass_seconds",
            "Seconds from the start of the last finished resync period until every key it queued was reconciled.",
            registry=self.registry)
        self.resync_lag = Gauge(
            f"{PREFIX}_resync_lag_seconds",
            "Longest wait of a key of the last finished resync period, from its due time until its reconcile finished.",
            registry=self.registry)
        self.scrape_errors = Counter(
            f"{PREFIX}_scrape_errors_total", "Engine or gateway /metrics scrapes that failed.",
            ["role"], registry=self.registry)
        self.api_writes = Counter(
            f"{PREFIX}_api_writes_total", "Write requests the operator sent to the API server.",
            ["verb", "kind"], registry=self.registry)
        self.watch_lists = Counter(
            f"{PREFIX}_watch_lists_total",
            "LISTs of a watched kind: at start, after a watch's 410 Gone, for a kind served since the start.",
            ["kind", "reason"], registry=self.registry)
        self._results: dict[str, SLOResult] = {}
        self._lock = threading.Lock()
        self.registry.register(_SLOCollector(self))
        self.kvstore = KVStoreCollector()
        self.registry.register(self.kvstore)

    @contextmanager
    def time_reconcile(self, kind: str) -> Iterator[None]:
        """Time the block into the duration histogram; an exception also counts an error
        (reason = the exception's class name) and is re-raised."""
        with self.reconcile_duration.labels(kind=kind).time():
            try:
                yield
            except Exception as err:
                self.reconcile_errors.labels(kind=kind, reason=type(err).__name__).inc()
                raise

    def record_write(self, verb: str, kind: str) -> None:
        """Count one write request (``Kube``'s ``on_write`` hook)."""
        self.api_writes.labels(verb=verb, kind=kind).inc()

    def record_queue(self, stats: QueueStats, *, resync_pass_s: float | None = None,
                     resync_lag_s: float | None = None, longest_running_s: float = 0.0) -> None:
        """Export a work queue snapshot (``workqueue.QueueStats``), the last finished resync period's
        pass duration and lag (seconds; None: no period finished yet) and how long the
        longest reconcile in flight has run (seconds; 0: none)."""
        self.reconcile_longest_running.set(longest_running_s)
        self.queue_depth.set(stats.depth)
        self.queue_delayed.set(stats.delayed)
        self.queue_oldest_age.set(stats.oldest_age_s)
        if resync_pass_s is not None:
            self.resync_pass.set(resync_pass_s)
        if resync_lag_s is not None:
            self.resync_lag.set(resync_lag_s)

    def record_cache(self, counts: dict[str, int]) -> None:
        """Export how many objects of each watched kind the cache holds."""
        for kind, n in counts.items():
            self.cache_objects.labels(kind=kind).set(n)

    def record_key(self, kind: str, namespace: str, name: str, *, result: str = RECONCILED) -> None:
        """Count one look at one object: a reconcile a worker finished (``RECONCILED``), or a resync
        skipped because its inputs did not change (``UNCHANGED``)."""
        self.reconciles.labels(kind=kind, namespace=namespace, name=name, result=result).inc()

    def forget_key(self, kind: str, namespace: str, name: str) -> None:
        """Drop the reconcile counters of an object that was deleted."""
        for result in (RECONCILED, UNCHANGED):
            try:
                self.reconciles.remove(kind, namespace, name, result)
            except KeyError:
                pass

    def record_list(self, kind: str, reason: str) -> None:
        """Count one LIST of a watched kind (``runtime/informer.py``; reason ``start``, ``gone``, ``appeared``)."""
        self.watch_lists.labels(kind=kind, reason=reason).inc()

    def record_retry(self, kind: str) -> None:
        """Count one failed reconcile of ``kind`` queued again."""
        self.queue_retries.labels(kind=kind).inc()

    def record_reconcile(self, namespace: str, name: str, seconds: float, ok: bool) -> None:
        """Record one reconcile pass (``Runtime``'s ``on_reconcile`` hook)."""
        self.reconcile_duration.labels(kind="PDDeployment").observe(seconds)
        if not ok:
            self.reconcile_errors.labels(kind="PDDeployment", reason="Exception").inc()

    def serve(self, port: int, addr: str = "0.0.0.0", *, heartbeats: Heartbeats | None = None) -> int:
        """Serve ``/metrics`` (and, with ``heartbeats``, ``/healthz``) on ``addr:port`` from a daemon thread.

        ``/healthz`` is :func:`sglang_pd_operator.runtime.liveness.healthz`: 200, or 503 naming each
        stuck loop. Returns the bound port (``port`` 0 picks a free one). Raises
        ``OSError`` when the port is taken.
        """
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        metrics_app = make_wsgi_app(self.registry)

        def app(environ, start_response):
            if heartbeats is not None and environ.get("PATH_INFO") == "/healthz":
                code, body = healthz(heartbeats)
                start_response(f"{code} {'OK' if code == 200 else 'Service Unavailable'}",
                               [("Content-Type", "text/plain; charset=utf-8")])
                return [body.encode()]
            return metrics_app(environ, start_response)

        class Quiet(WSGIRequestHandler):
            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

        server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=Quiet)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
        return server.server_port

    def publish(self, result: SLOResult) -> None:
        """Make ``result`` the exported SLO state of its deployment (replaces the previous)."""
        with self._lock:
            self._results[result.deployment] = result

    def remove(self, deployment_key: str) -> None:
        """Stop exporting a deployment's SLO series (it was deleted)."""
        with self._lock:
            self._results.pop(deployment_key, None)

    def results(self) -> dict[str, SLOResult]:
        """A copy of the published results, by deployment key."""
        with self._lock:
            return dict(self._results)
