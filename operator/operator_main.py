"""Start the operator process: API client, runtime, metrics endpoint, then kopf's loop.

Kept apart from ``cli`` so that importing the command line does not import kopf's
handlers (``check`` and ``render`` must work without a cluster).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from . import handlers
from .reconcilers.kube import Kube
from .reconcilers.runtime import Hooks, Runtime, api_client_from_env

log = logging.getLogger(__name__)


def _metrics_hooks(port: int) -> Hooks:
    """Install the operator's Prometheus metrics and serve them on ``port`` (0: no server)."""
    try:
        from .metrics import operator_metrics as m
    except ImportError:  # pragma: no cover - metrics package always ships
        return Hooks()
    if not hasattr(m, "serve"):
        return Hooks()
    if port:
        m.serve(port)
    return Hooks(on_write=m.record_write, on_reconcile=m.record_reconcile)


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
    hooks = _metrics_hooks(metrics_port)
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
