"""Give the heap's free memory back to the operating system after a burst of reconciles.

A burst (a thousand PDDeployments applied at once, a resync of every key after a restart)
parses and renders tens of thousands of objects in several threads. CPython frees them,
but glibc's malloc keeps most freed blocks in its arenas (one per thread that allocated)
instead of returning them: the process' RSS at rest stays near its peak. ``malloc_trim(0)``
returns every free page of every arena (glibc >= 2.8 releases pages inside the heap too,
not only at its top), the call Dask's workers make for the same reason.

The arenas themselves are capped too (:func:`limit_arenas`, glibc's ``M_ARENA_MAX``, what
``MALLOC_ARENA_MAX=2`` sets from the environment): by default glibc gives up to eight
arenas per core to the threads that allocate (the loop runs about twenty: workers, one
reflector per watched kind, the ticker, the scraper, kopf, the servers), and each keeps
the free memory its thread left behind; CPython allocates under its GIL, so the threads
gain nothing from arenas of their own.

The same moment moves what survived the burst out of the cyclic garbage collector's
generations (:func:`settle_heap`: ``gc.collect()``, then ``gc.freeze()``): the view, the
modules and every other long-lived object are a few hundred thousand containers, and a
full collection walks them all (about 120 ms at N = 1,000 on this machine), which the
allocations of each SLO pass trigger every few passes. Frozen objects are still freed by
their reference counts; one that dies inside a reference cycle waits for the next settle,
when the frozen objects are collected once more before they are frozen again (at the end
of each burst, and at least every :data:`REFREEZE_S` while anything reconciles).

Pure policy (:class:`TrimPolicy`) apart from the libc calls (:func:`trim_heap`,
:func:`limit_arenas`); the control loop (``controller.py``) asks the policy once per tick.
Measured by benchmarks/bench_scale.py (docs/scale.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Reconciles since the last trim that make a burst worth trimming after.
TRIM_AFTER_RECONCILES = 200
#: Least seconds between two trims.
TRIM_MIN_INTERVAL_S = 60.0
#: Most seconds between two settles (:func:`settle_heap`) while anything reconciles, burst or not.
REFREEZE_S = 600.0

_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet; None: no glibc


def _malloc_trim():
    global _libc
    if _libc is False:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else None
        except OSError:
            _libc = None
    return _libc.malloc_trim if _libc else None


#: glibc malloc arenas the operator process may use (``limit_arenas``).
ARENA_MAX = 2
#: ``mallopt`` parameter number of the arena cap (glibc's malloc.h: ``#define M_ARENA_MAX -8``).
M_ARENA_MAX = -8


def limit_arenas(n: int = ARENA_MAX) -> bool:
    """Cap glibc's malloc arenas at ``n`` (``mallopt(M_ARENA_MAX, n)``; see the module docstring).

    Call it before the process starts threads: arenas made earlier stay. An explicit
    ``MALLOC_ARENA_MAX`` in the environment wins (nothing is done). True when the cap was set;
    False without glibc (musl, macOS) or when glibc refused. Never raises.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    _malloc_trim()  # looks glibc up
    if not _libc or not hasattr(_libc, "mallopt"):
        return False
    try:
        return bool(_libc.mallopt(M_ARENA_MAX, n))
    except Exception as e:  # noqa: BLE001 - an optimisation must never stop the start
        log.debug("mallopt(M_ARENA_MAX) failed: %s", e)
        return False


def trim_heap() -> bool:
    """Return the heap's free pages to the OS (glibc ``malloc_trim(0)``).

    True when glibc released memory, False when it had none to release or the C library
    is not glibc (musl, macOS: nothing is done). Never raises.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    try:
        return bool(trim(0))
    except Exception as e:  # noqa: BLE001 - an optimisation must never stop the loop
        log.debug("malloc_trim failed: %s", e)
        return False


def settle_heap() -> bool:
    """After a burst: collect the cyclic garbage (the objects frozen last time included), freeze
    every survivor out of the collector's generations (``gc.freeze``), then :func:`trim_heap`.

    Returns what :func:`trim_heap` returns. Never raises.
    """
    try:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    except Exception as e:  # noqa: BLE001 - an optimisation must never stop the loop
        log.debug("gc freeze failed: %s", e)
    return trim_heap()


@dataclass
class TrimPolicy:
    """When to settle the heap (:func:`settle_heap`): after at least ``after_reconciles`` reconciles
    since the last time, once the work queue is idle (nothing ready, nothing in a worker), at
    most every ``min_interval_s`` seconds; and when idle after any reconcile once
    ``max_interval_s`` passed since the last settle (the frozen objects' cyclic garbage is
    collected that often).
    Not thread-safe: one caller (the loop's ticker).

    ``reconciled()`` counts a finished reconcile (workers call it under the controller's lock).
    """

    after_reconciles: int = TRIM_AFTER_RECONCILES
    min_interval_s: float = TRIM_MIN_INTERVAL_S
    max_interval_s: float = REFREEZE_S
    _count: int = 0
    _last: float = field(default=-1e18)

    def reconciled(self) -> None:
        """One more reconcile finished."""
        self._count += 1

    def due(self, *, now: float, idle: bool) -> bool:
        """True when a trim is due now (``now``: monotonic seconds; ``idle``: the queue has nothing
        ready and nothing in flight); the caller then trims, and the count starts again."""
        since = now - self._last
        burst = self._count >= self.after_reconciles and since >= self.min_interval_s
        refreeze = self._count > 0 and self._last > -1e18 and since >= self.max_interval_s  # a settle before
        if not idle or not (burst or refreeze):
            return False
        self._count, self._last = 0, now
        return True
