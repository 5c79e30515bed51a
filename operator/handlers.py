"""kopf handlers: thin. Each one turns an event into "reconcile this PDDeployment" and returns.

- a PDDeployment event (added, modified) reconciles it;
- an event of a Deployment the operator owns reconciles its PDDeployment (status follows
  the children's readiness);
- a resync loop reconciles every PDDeployment every ``resync`` seconds (level-triggered:
  time-based rollout steps such as drain grace periods and progress deadlines, and
  recovery after API errors, do not depend on seeing an event);
- the SLO source (``metrics/sources.py``: the scraper, or with ``--slo-source prometheus``
  the Prometheus source) runs beside it every ``SLO_INTERVAL`` seconds;
  each deployment's figures go into the Runtime, and a deployment whose status-visible
  figures changed is reconciled at once (status follows within one interval).

Liveness (``liveness.py``): the resync loop, the scraper and a ticker on kopf's event
loop beat ``Runtime.heartbeats``; each reconcile is in flight there while it runs. A
frozen loop or reconcile turns ``/healthz`` on the metrics port to 503.

Only event handlers are used, never create/update/timer handlers: those make kopf add
finalizers and bookkeeping annotations to the user's object, which a GitOps replace
would drop (Dynamo #13495). Nothing here writes to the user's object besides status.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from .api.v1alpha1 import GROUP, VERSION
from .metrics.operator_metrics import OperatorMetrics
from .metrics.prometheus_source import PrometheusSettings
from .metrics.scraper import Health
from .metrics.sources import SCRAPE, make_slo_source
from .reconcilers.runtime import Runtime
from .render.labels import LABEL_DEPLOYMENT, MANAGED_BY

# KernelBuild handlers run in the same operator process (kopf registers them at import).
from . import handlers_kernelbuild  # noqa: E402,F401

log = logging.getLogger(__name__)

# Set by cli.run before kopf starts: the process-wide runtime and settings.
RUNTIME: Runtime | None = None
RESYNC_SECONDS: float = 15.0
NAMESPACES: list[str] | None = None
SLO_INTERVAL: float = 15.0  # seconds between SLO scrapes; 0 turns the scraper off
METRICS: OperatorMetrics | None = None
SLO_SOURCE: str = SCRAPE  # --slo-source: scrape | prometheus (metrics/sources.py)
PROMETHEUS: PrometheusSettings | None = None  # --prometheus-url and its credentials


def _runtime() -> Runtime:
    if RUNTIME is None:  # pragma: no cover - cli.run always sets it
        raise RuntimeError("handlers.RUNTIME is not set; start the operator with `sglang-pd-operator run`")
    return RUNTIME


#: Seconds a blocked kopf event loop may go without a tick before liveness fails.
EVENT_LOOP_MAX_AGE_S = 60.0


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """No kopf event posting (handlers log instead); start the resync loop, the SLO scraper and the loop ticker.

    kopf's API timeouts are set in ``operator_main.kopf_settings`` (before its first request).
    """
    settings.posting.enabled = False
    rt = _runtime()
    loop = asyncio.get_running_loop()
    rt.heartbeats.register("event-loop", max_age_s=EVENT_LOOP_MAX_AGE_S)
    rt.heartbeats.register("resync", max_age_s=RESYNC_SECONDS + rt.stuck_after_s)
    memo["ticker"] = loop.create_task(_tick(rt))
    memo["resync"] = loop.create_task(_resync_loop())
    if SLO_INTERVAL > 0:
        rt.heartbeats.register("slo-scraper", max_age_s=SLO_INTERVAL + rt.stuck_after_s)
        memo["scraper"] = loop.create_task(_scraper(rt).run())


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync loop, the scraper and the ticker; their heartbeats are no longer expected."""
    for name in ("resync", "scraper", "ticker"):
        task = memo.get(name)
        if task is not None:
            task.cancel()
    if RUNTIME is not None:
        for beat in ("resync", "slo-scraper", "event-loop"):
            RUNTIME.heartbeats.unregister(beat)


async def _tick(rt: Runtime) -> None:
    """Beat ``event-loop`` every second: a loop blocked by synchronous work stops beating."""
    while True:
        rt.heartbeats.beat("event-loop")
        await asyncio.sleep(1.0)


def _scraper(rt: Runtime):
    """The SLO source (``SLO_SOURCE``), reading the cluster through the runtime and reporting into it."""
    rt.health_max_age_s = max(rt.health_max_age_s, 4 * SLO_INTERVAL)

    async def on_health(health: Health) -> None:
        if rt.set_health(health):
            try:
                await asyncio.to_thread(rt.reconcile_key, health.namespace, health.name)
            except Exception as e:
                log.exception("reconcile after SLO scrape of %s failed: %s", health.key, e)

    return make_slo_source(
        SLO_SOURCE,
        list_deployments=lambda: rt.list_bodies(NAMESPACES),
        list_pods=rt.list_managed_pods,
        on_health=on_health,
        on_forget=rt.forget_health,
        metrics=METRICS,
        interval=SLO_INTERVAL,
        on_pass=lambda: rt.heartbeats.beat("slo-scraper"),
        namespaces=NAMESPACES,
        prometheus=PROMETHEUS,
    )


async def _resync_loop() -> None:
    """Reconcile every PDDeployment every ``RESYNC_SECONDS``; beats ``resync`` after each step."""
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        rt = _runtime()
        rt.heartbeats.beat("resync")
        try:
            keys = await asyncio.to_thread(rt.list_keys, NAMESPACES)
        except Exception as e:  # keep the loop alive across API hiccups
            log.warning("resync: cannot list PDDeployments: %s", e)
            continue
        rt.heartbeats.beat("resync")
        for ns, name in keys:
            try:
                await asyncio.to_thread(rt.reconcile_key, ns, name)
            except Exception as e:
                log.exception("resync: reconcile %s/%s failed: %s", ns, name, e)
            rt.heartbeats.beat("resync")


@kopf.on.event(GROUP, VERSION, "pddeployments")
def pddeployment_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """Reconcile the PDDeployment that changed (deletion: owner references collect the children)."""
    if event.get("type") == "DELETED":
        return
    _runtime().reconcile_key(namespace, name)


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
def child_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    """A child Deployment changed: reconcile its PDDeployment so status follows readiness."""
    owner = labels.get(LABEL_DEPLOYMENT)
    if owner:
        _runtime().reconcile_key(namespace, owner)
