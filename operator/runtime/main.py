"""Start the operator process: API client, metrics endpoint, CRD check, leader election, then kopf's loop.

Order matters: ``/metrics`` and ``/healthz`` (``liveness.py``) are served from the start
on the metrics port (a standby replica answers its liveness probe too); the CRD check (``reconcilers.crds``) refuses an older installed
schema before anything reconciles; with leader election (``leader``) kopf, and with it
every handler and the control loop (``controller.py``), starts only in the replica
holding the Lease. kopf's resource scanning is off: it would list and watch every CRD and
namespace, which the chart's least-privilege RBAC does not grant (the CRD check makes
sure ours exists). Each child kind is watched by the loop's own reflectors
(``informer.py``) with a server-side label selector, so unrelated objects never reach
the process; the watches have an API client of their own (own connection pool).

Configuration reaches the handlers through kopf's ``memo`` (``memo.controller``), not
module globals.

Every API call has a timeout: our client's through ``reconcilers.kube.with_timeouts``,
kopf's through :func:`kopf_settings`; a watch stream silent for longer than
``informer.WATCH_READ_S`` is dropped and resumed.

Kept apart from ``cli`` so that importing the command line does not import kopf's
handlers (``check`` and ``render`` must work without a cluster).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from ..api.v1alpha1 import API_VERSION
from ..metrics.operator_metrics import OperatorMetrics
from ..metrics.prometheus_source import PrometheusSettings
from ..reconcilers.crds import ensure_crds
from ..reconcilers.kube import ApiTimeouts, Kube
from ..reconcilers.runtime import Hooks, KernelBuildRuntime, Runtime, api_client_from_env
from ..reconcilers.sglang_gate import OracleClient, OracleSettings, VerdictBook
from . import kopf_glue  # noqa: F401  (registers the kopf handlers)
from .cache import WATCHED, ObjectCache
from .controller import PDDEPLOYMENT, Controller, LoopSettings
from .heap import limit_arenas
from .informer import WATCH_SERVER_TIMEOUT_S
from .leader import LeaderSettings, default_identity, refuse_if_led, run_when_leading
from .liveness import DEFAULT_STUCK_AFTER_S, Heartbeats

log = logging.getLogger(__name__)

def _metrics_hooks(metrics: OperatorMetrics, port: int, heartbeats: Heartbeats) -> Hooks:
    """Serve ``/metrics`` and ``/healthz`` on ``port`` (0: no server) and return the hooks that feed the metrics."""
    if port:
        metrics.serve(port, heartbeats=heartbeats)
    return Hooks(on_write=metrics.record_write, on_reconcile=metrics.record_reconcile)


def kopf_settings(timeouts: ApiTimeouts) -> kopf.OperatorSettings:
    """kopf's settings: no resource scanning, no events of its own, a timeout on every request kopf sends.

    kopf watches nothing (``kopf_glue.py``: the loop's reflectors do, ``informer.py``); what
    kopf would send still has ``networking.connect_timeout`` = ``timeouts.connect`` and
    ``request_timeout`` = 60 s (the API server's own limit), and watch timeouts bounded
    like the reflectors' (``informer.WATCH_SERVER_TIMEOUT_S``).
    """
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.enabled = False
    settings.networking.connect_timeout = timeouts.connect
    settings.networking.request_timeout = 60
    settings.watching.connect_timeout = timeouts.connect
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_S
    settings.watching.client_timeout = WATCH_SERVER_TIMEOUT_S + 30
    return settings


def run_operator(
    *,
    kubeconfig: str | None,
    namespaces: list[str] | None,
    operator_namespace: str | None,
    resync: float,
    metrics_port: int,
    liveness_port: int,
    crd_policy: str = "check",
    leader: LeaderSettings | None = None,
    unelected_lease: LeaderSettings | None = None,
    slo_interval: float = 15.0,
    timeouts: ApiTimeouts | None = None,
    stuck_after: float = DEFAULT_STUCK_AFTER_S,
    workers: int = 4,
    slo_status_period: float = 60.0,
    slo_source: str = "scrape",
    prometheus: PrometheusSettings | None = None,
    oracle_url: str | None = None,
    oracle_policy: str = "wait",
    oracle_max_wait_s: float = 300.0,
    default_queue: str | None = None,
) -> None:
    """Run until interrupted. Watches ``namespaces`` (None: the whole cluster).

    ``crd_policy``: check | apply | skip (see ``reconcilers.crds``); raises
    ``CRDSchemaError`` when the installed CRDs are missing or older. ``leader``: run
    kopf only while holding that Lease (None: no election, a single replica; then
    ``unelected_lease``, when given, is checked first and ``leader.AnotherLeader`` raised
    while another process holds it).
    ``slo_interval``: seconds between SLO scrapes (``metrics/scraper.py``; 0: off).
    ``slo_source``: ``scrape`` or ``prometheus`` (``metrics/sources.py``), the latter reading
    ``prometheus``.
    ``timeouts``: connect/read timeouts of every API call (default ``ApiTimeouts()``).
    ``stuck_after``: seconds after which a reconcile or a loop step counts as stuck and
    ``/healthz`` answers 503. ``resync``: seconds in which every object is reconciled once
    (spread over the period); ``workers``: reconcile threads; ``slo_status_period``: least
    seconds between status writes that only move SLO figures (see ``controller.py``).
    ``oracle_url``: the SGLang oracle service every new generation waits for
    (``reconcilers.sglang_gate``), with the defaults of ``spec.oracle``: ``oracle_policy``
    (wait | rulesOnly) and ``oracle_max_wait_s``; None: the rules alone.
    ``default_queue``: the Kueue LocalQueue of PDDeployments without ``spec.scheduling.queueName``
    (``--default-queue-name``; None: none), handed to every reconcile (``Runtime.default_queue``).
    """
    if not log.isEnabledFor(logging.DEBUG):
        # kopf logs every handler call at INFO ("Handler 'observe-pods' succeeded."): one line
        # per watch event of every child is noise and CPU at scale; its warnings and errors stay
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if kubeconfig:
        # kopf logs in on its own (the kubernetes client's default loader), which reads
        # $KUBECONFIG, not our option: point it at the same file as our client
        os.environ["KUBECONFIG"] = kubeconfig
    limit_arenas()  # before any thread allocates (heap.py)
    timeouts = timeouts or ApiTimeouts()
    metrics = OperatorMetrics()
    heartbeats = Heartbeats()
    hooks = _metrics_hooks(metrics, metrics_port, heartbeats)
    api_client = api_client_from_env(kubeconfig, timeouts=timeouts)
    kube = Kube(api_client, on_write=hooks.on_write, cache=ObjectCache())
    ensure_crds(kube=kube, policy=crd_policy)
    book = VerdictBook(client=OracleClient(oracle_url)) if oracle_url else None
    runtime = Runtime(kube=kube, operator_namespace=operator_namespace, hooks=hooks,
                      oracle=OracleSettings(book=book, default_policy=oracle_policy,
                                            default_max_wait_s=oracle_max_wait_s) if book else None,
                      default_queue=default_queue)
    kernelbuilds = KernelBuildRuntime(
        kube=kube, catalog=runtime.catalog,
        in_use=lambda ns: runtime.builds_in_use(ns, _deployments_in(kube.cache, ns)))
    # the watches' own client: a pool with a connection per long-lived stream, apart from the reconciles'
    watch_client = api_client_from_env(kubeconfig, timeouts=timeouts,
                                       pool_maxsize=len(WATCHED) * max(1, len(namespaces or [])) + 2)
    controller = Controller(
        watch_client=watch_client,
        runtime=runtime, kernelbuilds=kernelbuilds, kube=kube, metrics=metrics, heartbeats=heartbeats,
        settings=LoopSettings(workers=workers, resync_s=resync, slo_interval_s=slo_interval,
                              slo_status_period_s=slo_status_period, stuck_after_s=stuck_after,
                              namespaces=tuple(namespaces) if namespaces else None,
                              slo_source=slo_source, prometheus=prometheus))
    if book is not None:  # an answer queues the deployments that wait for it
        book.on_answer = lambda ns, name: controller.trigger((PDDEPLOYMENT, ns, name))
        log.info("SGLang's verdict comes from the oracle service at %s (default policy %s, at most %.0f s)",
                 oracle_url, oracle_policy, oracle_max_wait_s)
    if default_queue:
        log.info("PDDeployments without spec.scheduling.queueName are queued through Kueue LocalQueue %s "
                 "(--default-queue-name; groups created from now on)", default_queue)
    log.info("sglang-pd-operator starting (namespaces: %s)", namespaces or "all")
    settings = kopf_settings(timeouts)

    def run_kopf() -> None:
        asyncio.run(
            kopf.operator(
                clusterwide=namespaces is None,
                namespaces=namespaces or [],
                standalone=True,
                # kopf would name itself after getpass.getuser(), which raises KeyError for a
                # uid without a passwd entry: the image runs as 65532, which has none
                # (found by `hack/images.sh smoke operator`, issue 28)
                identity=leader.identity if leader else default_identity(),  # kopf: Identity = NewType(str)
                settings=settings,
                memo=kopf.Memo(controller=controller),
                liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
            )
        )

    if leader is None:
        if unelected_lease is not None:
            refuse_if_led(api_client=api_client, settings=unelected_lease)
        log.warning("leader election is off (--no-leader-elect): this process reconciles as if it were the only "
                    "operator of the cluster; a second one would reconcile every object too")
        run_kopf()
    else:
        heartbeats.register("leader-election", max_age_s=stuck_after)
        # its own client (own connection pool): a renewal never waits behind, or on a
        # connection left half-open by, a reconcile's calls
        lease_client = api_client_from_env(kubeconfig, timeouts=timeouts)
        run_when_leading(api_client=lease_client, settings=leader, run=run_kopf,
                         on_read=lambda: heartbeats.beat("leader-election"))


def _deployments_in(cache: ObjectCache | None, namespace: str) -> list[str]:
    """Names of the PDDeployments of ``namespace`` the cache holds."""
    return [name for ns, name, _ in (cache.keys(API_VERSION, "PDDeployment") if cache else []) if ns == namespace]
