"""Start the operator process: API client, runtime, metrics endpoint, then kopf's loop.

Kept apart from ``cli`` so that importing the command line does not import kopf's
handlers (``check`` and ``render`` must work without a cluster).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from . import handlers
from .metrics.operator_metrics import OperatorMetrics
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
) -> None:
    """Run until interrupted. Watches ``namespaces`` (None: the whole cluster)."""
    metrics = OperatorMetrics()
    hooks = _metrics_hooks(metrics, metrics_port)
    kube = Kube(api_client_from_env(kubeconfig), on_write=hooks.on_write)
    handlers.RUNTIME = Runtime(kube=kube, operator_namespace=operator_namespace, hooks=hooks)
    handlers.RESYNC_SECONDS = resync
    handlers.NAMESPACES = namespaces
    log.info("sglang-pd-operator starting (namespaces: %s)", namespaces or "all")
    asyncio.run(
        kopf.operator(
            clusterwide=namespaces is None,
            namespaces=namespaces or [],
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        )
    )
