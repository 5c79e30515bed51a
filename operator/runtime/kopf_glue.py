"""kopf handlers: thin. Every watch event goes to the control loop; nothing is reconciled here.

One event handler per watched kind (``cache.py`` ``WATCHED``: PDDeployments,
KernelBuilds, and the children the operator makes, which the API server selects by the
``app.kubernetes.io/managed-by`` label: ``main.kopf_settings`` sets the
selectors) hands the event to :meth:`~sglang_pd_operator.runtime.controller.Controller.observe`,
which updates the shared cache and queues the keys it concerns. The startup handler
starts the loop (``memo.controller``, set by ``main``: no module globals; it runs
the SLO source of ``--slo-source``, ``metrics/sources.py``), and a ticker that beats the
``event-loop`` liveness heartbeat; cleanup stops both.

Only event handlers are used, never create/update/timer handlers: those make kopf add
finalizers and bookkeeping annotations to the user's object, which a GitOps replace
would drop (Dynamo #13495). Nothing here writes to the user's object.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from .cache import WATCHED, WatchedKind

#: Seconds a blocked kopf event loop may go without a tick before liveness fails.
EVENT_LOOP_MAX_AGE_S = 60.0


@kopf.on.startup()
async def start_loop(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Fill the cache and start the control loop (in threads), then the event-loop ticker.

    kopf posts no events of its own (the reconcilers write the Events users read). kopf
    starts its watches after this returns, so the loop's first view is complete.
    """
    settings.posting.enabled = False
    controller = memo.controller
    await asyncio.to_thread(controller.start)
    controller.heartbeats.register("event-loop", max_age_s=EVENT_LOOP_MAX_AGE_S)
    memo.ticker = asyncio.get_running_loop().create_task(_tick(controller.heartbeats))


@kopf.on.cleanup()
async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
    """Stop the ticker and the control loop (a reconcile in flight finishes first)."""
    ticker = memo.get("ticker")
    if ticker is not None:
        ticker.cancel()
    memo.controller.heartbeats.unregister("event-loop")
    await asyncio.to_thread(memo.controller.stop)


async def _tick(heartbeats: Any) -> None:
    """Beat ``event-loop`` every second: a loop blocked by synchronous work stops beating."""
    while True:
        heartbeats.beat("event-loop")
        await asyncio.sleep(1.0)


def _observer(watched: WatchedKind):
    async def observe(event: dict[str, Any], memo: kopf.Memo, **_: Any) -> None:
        memo.controller.observe(watched, event)

    observe.__doc__ = f"A {watched.kind} changed: update the cache, queue what it concerns."
    observe.__name__ = observe.__qualname__ = f"observe_{watched.plural}"
    return observe


for _watched in WATCHED:
    kopf.on.event(_watched.group, _watched.version, _watched.plural, id=f"observe-{_watched.plural}")(
        _observer(_watched))
