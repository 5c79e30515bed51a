"""Start the operator process: API client, metrics endpoint, CRD check, leader election, then kopf's loop.

Order matters: ``/metrics`` is served from the start (a standby replica answers its
liveness probe too); the CRD check (``reconcilers.crds``) refuses an older installed
schema before anything reconciles; with leader election (``leader``) kopf, and with it
every handler and the resync loop, starts only in the replica holding the Lease. kopf's
resource scanning is off: it would list and watch every CRD and namespace, which the
chart's least-privilege RBAC does not grant (the CRD check makes sure ours exists).

Kept apart from ``cli`` so that importing the command line does not import kopf's
handlers (``check`` and ``render`` must work without a cluster).
"""

from __future__ import annotations

import asyncio
import logging
import os

import kopf

from . import handlers
from .leader import LeaderSettings, run_when_leading
from .metrics.operator_metrics import OperatorMetrics
from .reconcilers.crds import ensure_crds
from .reconcilers.kube import Kube
from .reconcilers.runtime import Hooks, Runtime, api_client_from_env

log = logging.getLogger(__name__)


def _metrics_hooks(metrics: OperatorMetrics, port: int) -> Hooks:
    """Serve the operator's Prometheus metrics on ``port`` (0: no server) and return the hooks that feed them."""
    if port:
        metrics.serve(port)
    return Hooks(on_write=metrics.record_write, on_reconcile=metrics.record_reconcile)


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
    slo_interval: float = 15.0,
) -> None:
    """Run until interrupted. Watches ``namespaces`` (None: the whole cluster).

    ``crd_policy``: check | apply | skip (see ``reconcilers.crds``); raises
    ``CRDSchemaError`` when the installed CRDs are missing or older. ``leader``: run
    kopf only while holding that Lease (None: no election, a single replica).
    ``slo_interval``: seconds between SLO scrapes (``metrics/scraper.py``; 0: off).
    """
    if kubeconfig:
        # kopf logs in on its own (the kubernetes client's default loader), which reads
        # $KUBECONFIG, not our option: point it at the same file as our client
        os.environ["KUBECONFIG"] = kubeconfig
    metrics = OperatorMetrics()
    hooks = _metrics_hooks(metrics, metrics_port)
    api_client = api_client_from_env(kubeconfig)
    kube = Kube(api_client, on_write=hooks.on_write)
    ensure_crds(kube=kube, policy=crd_policy)
    handlers.RUNTIME = Runtime(kube=kube, operator_namespace=operator_namespace, hooks=hooks)
    handlers.RESYNC_SECONDS = resync
    handlers.NAMESPACES = namespaces
    handlers.SLO_INTERVAL = slo_interval
    handlers.METRICS = metrics
    log.info("sglang-pd-operator starting (namespaces: %s)", namespaces or "all")
    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True

    def run_kopf() -> None:
        asyncio.run(
            kopf.operator(
                clusterwide=namespaces is None,
                namespaces=namespaces or [],
                standalone=True,
                settings=settings,
                liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
            )
        )

    if leader is None:
        run_kopf()
    else:
        run_when_leading(api_client=api_client, settings=leader, run=run_kopf)
