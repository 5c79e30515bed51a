"""kopf's part: the process's lifecycle (startup, signals, cleanup, the liveness endpoint), no watch.

The watches are the control loop's own (``informer.py``: client-go's reflector semantics,
a re-list that reports deletions, one LIST per kind at start), so kopf registers no
resource handler and watches nothing. The startup handler starts the loop
(``memo.controller``, set by ``main``: no module globals; it runs the SLO source of
``--slo-source``, ``metrics/sources.py``) and a ticker that beats the ``event-loop``
liveness heartbeat; cleanup stops both.

No create/update/timer handlers either: those make kopf add finalizers and bookkeeping
annotations to the user's object, which a GitOps replace would drop (Dynamo #13495).
Nothing here writes to the user's object.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

#: Seconds a blocked kopf event loop may go without a tick before liveness fails.
EVENT_LOOP_MAX_AGE_S = 60.0


@kopf.on.startup()
async def start_loop(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Fill the cache and start the control loop (in threads), then the event-loop ticker.

    kopf posts no events of its own (the reconcilers write the Events users read). The
    loop's first view is complete before any reconcile (``Controller.start``).
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
