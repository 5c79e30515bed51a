"""The heap trim after a burst of reconciles (operator/runtime/heap.py): when it is due, and the libc call."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from sglang_pd_operator.runtime.heap import TrimPolicy, settle_heap, trim_heap


def test_due_once_a_burst_is_over_and_the_queue_idle():
    policy = TrimPolicy(after_reconciles=3, min_interval_s=60.0)
    for _ in range(3):
        policy.reconciled()
    assert not policy.due(now=100.0, idle=False)  # still busy: wait for the burst to end
    assert policy.due(now=101.0, idle=True)
    assert not policy.due(now=102.0, idle=True)  # the count starts again


def test_not_for_a_trickle_nor_twice_within_the_interval():
    policy = TrimPolicy(after_reconciles=3, min_interval_s=60.0)
    policy.reconciled()
    policy.reconciled()
    assert not policy.due(now=0.0, idle=True)  # two reconciles are no burst (the resync's steady trickle)
    policy.reconciled()
    assert policy.due(now=0.0, idle=True)
    for _ in range(10):
        policy.reconciled()
    assert not policy.due(now=59.0, idle=True)
    assert policy.due(now=60.0, idle=True)


def test_due_after_a_trickle_too_once_the_refreeze_interval_passed():
    """The frozen objects' cyclic garbage is collected at least every max_interval_s while anything reconciles."""
    policy = TrimPolicy(after_reconciles=100, min_interval_s=60.0, max_interval_s=600.0)
    assert policy.due(now=0.0, idle=True) is False  # nothing reconciled yet
    policy._last = 0.0
    policy.reconciled()
    assert not policy.due(now=599.0, idle=True)
    assert not policy.due(now=600.0, idle=False)
    assert policy.due(now=600.0, idle=True)
    assert not policy.due(now=1300.0, idle=True)  # nothing reconciled since: nothing to do


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_settle_heap_freezes_the_survivors_and_collects_what_died_in_a_cycle_since():
    try:
        kept, dropped = _Node(), _Node()
        gone = weakref.ref(dropped)
        settle_heap()
        assert gc.get_freeze_count() > 0  # the survivors left the collector's generations
        del dropped
        gc.collect()
        assert gone() is not None  # frozen: a full collection does not walk it
        settle_heap()
        assert gone() is None and kept.me is kept  # the next settle collects it; the living stay
    finally:
        gc.unfreeze()


def _rss_mb() -> float:
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim (/proc)")
def test_trim_heap_gives_freed_blocks_back():
    blocks = [bytes(2000) + bytes([i % 256]) for i in range(20000)]  # 40 MB of malloc blocks (> pymalloc's 512 B)
    kept = blocks[::50]  # a few survivors pin the heap's top, as the cache's entries do
    del blocks
    before = _rss_mb()
    assert trim_heap() is True
    assert _rss_mb() < before - 20, "glibc kept the freed blocks"
    assert len(kept) == 400


_ARENAS_CHILD = """
import ctypes, sys, threading
from sglang_pd_operator.runtime.heap import limit_arenas
if sys.argv[1] == "limit":
    assert limit_arenas(2)
hold, gate = [], threading.Barrier(8)
def work():
    gate.wait()
    hold.append([bytes(1000 + i) for i in range(2000)])  # malloc'd blocks (> pymalloc's 512 B)
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena n:" block per arena, on stderr
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("mode", ["limit", "default"])
def test_limit_arenas_caps_glibcs_arenas_for_allocating_threads(mode):
    """Eight threads that allocate at once get arenas of their own by default (glibc: up to eight
    per core); capped, they share two."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.run([sys.executable, "-c", _ARENAS_CHILD, mode], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    arenas = proc.stderr.count("Arena ")
    if mode == "limit":
        assert 1 <= arenas <= 2, proc.stderr
    else:
        assert arenas > 2, proc.stderr  # what the cap prevents
