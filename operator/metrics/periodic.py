"""One loop shape for both SLO sources: run a pass every ``interval`` seconds, on schedule.

:class:`~sglang_pd_operator.metrics.scraper.Scraper` and
:class:`~sglang_pd_operator.metrics.prometheus_source.PrometheusSource` each measure once per
interval; this module holds the part they share (keeping to the schedule, logging a pass that
failed or overran, the liveness beat after every pass), so the two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


async def run_every(
    pass_once: Callable[[], Awaitable[Any]], *, interval: float, on_pass: Callable[[], None] | None, what: str
) -> None:
    """Await ``pass_once()`` every ``interval`` seconds until cancelled.

    Passes start on a fixed schedule (a pass that took 2 s of a 15 s interval is followed
    by 13 s of sleep). A pass that raises is logged with its traceback and the loop goes on;
    a pass that overruns the interval is logged and the next one starts at once (the
    schedule restarts from then, no burst of catch-up passes). ``on_pass`` (the liveness
    heartbeat) is called after every pass, failed or not. ``what`` names the pass in log
    lines ("SLO scrape pass"). Raises only ``asyncio.CancelledError``.
    """
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        try:
            await pass_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed", what)
        if on_pass is not None:
            on_pass()
        next_at += interval
        delay = next_at - loop.time()
        if delay < 0:
            log.warning("%s took %.1fs, longer than the %.1fs interval", what, interval - delay, interval)
            next_at, delay = loop.time(), 0.0
        await asyncio.sleep(delay)


async def deliver(on_health: Callable[[Any], Any], health: Any) -> None:
    """Hand one pass's ``health`` (a :class:`~sglang_pd_operator.metrics.health.Health`) to ``on_health``.

    ``on_health`` may be a plain function or a coroutine function (it is awaited then). An
    exception it raises is logged with the deployment's key and swallowed: one deployment's
    failed status write must not stop the pass delivering the others'. Returns None.
    """
    try:
        result = on_health(health)
        if asyncio.iscoroutine(result):
            await result
    except Exception:
        log.exception("on_health for %s failed", getattr(health, "key", health))
