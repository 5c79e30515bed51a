"""Stopping runs: one by its state file, or every stale run in the registry.

Only processes recorded in a run's state and still matching their record are signalled
(``procs.stop``); the run's pod network lease is released and its etcd data deleted,
its logs are kept for reading.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from sglang_pd_operator_dev.cluster import components, netalloc, paths, procs, state

Log = Callable[[str], None]


def stop_run(run_dir: Path, *, log: Log = print, quiet: bool = False,
             grace_s: float = 10.0) -> list[procs.ProcessRecord]:
    """Stop the processes recorded in ``run_dir`` (newest first) and release its network.

    Only processes that still match their record (pid + start time + executable) are
    signalled. Marks the state "stopped", deletes etcd's data, keeps logs. Returns the
    records that were stopped. A directory without state is a no-op.
    """
    run_dir = Path(run_dir).resolve()
    st = state.load(run_dir)
    if st is None:
        return []
    stopped = procs.stop(list(reversed(st.processes)), grace_s=grace_s)
    if stopped and not quiet:
        log("cluster: stopped " + ", ".join(f"{r.name} (pid {r.pid})" for r in stopped))
    state.save(st.with_(phase="stopped"))
    netalloc.release_pod_network(lease_dir=paths.cache_root() / "pod-networks", run_dir=run_dir)
    state.unregister(registry=paths.cache_root() / "runs", run_dir=run_dir)
    shutil.rmtree(components.Layout(run_dir=run_dir).etcd_data, ignore_errors=True)
    return stopped


def sweep_stale_runs(*, log: Log = print) -> list[Path]:
    """Clean every registered run that is stale (crashed harness, dead component).

    Returns the run directories cleaned. Live runs (another test session, a detached
    cluster) are left alone.
    """
    cleaned = []
    for run_dir in state.registered_runs(paths.cache_root() / "runs"):
        st = state.load(run_dir)
        if st is None:
            continue
        reason = state.why_not_live(st)
        if reason and st.phase != "stopped":
            clean_stale(st, reason=reason, log=log)
            cleaned.append(run_dir)
    return cleaned


def clean_stale(st: state.RunState, *, reason: str, log: Log) -> None:
    """Say why the run is stale, name the leftover processes, and stop them."""
    survivors = state.surviving(st)
    log(f"cluster: found a stale run in {st.run_dir} ({reason}); cleaning it")
    if survivors:
        log("cluster: stopping leftover processes it started: "
            + ", ".join(f"{r.name} (pid {r.pid})" for r in survivors))
    stop_run(Path(st.run_dir), log=log, quiet=True)
