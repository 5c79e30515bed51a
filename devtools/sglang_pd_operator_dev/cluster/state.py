"""The state file of a run directory, and the rule that says whether a run is live.

``<run_dir>/state.json`` records who owns the run (the harness pid and its start time),
whether it was detached, the ports and pod network it uses, and every process it started
(``procs.ProcessRecord``). It is rewritten atomically after each change, so a crash at any
point leaves a file that the next ``up`` can act on:

- a run is **live** when it is not stopped and either its owner (an attached harness)
  is still running, or, detached, all of its components still run;
- otherwise it is **stale**: its surviving processes (still matching their records) are
  stopped and the directory is reused.

A small registry (``<cache>/runs/``) lists run directories, so the test fixture can find
and clean stale runs of earlier sessions that crashed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from sglang_pd_operator_dev.cluster import procs

STATE_FILE = "state.json"
#: Marks a directory as made by this harness (only such directories are ever wiped).
MARKER_FILE = ".sglang-pd-dev-cluster"
_VERSION = 1


@dataclass(frozen=True)
class RunState:
    """Everything a later ``down``/``status``/``up`` needs to know about a run."""

    run_dir: str
    owner_pid: int
    owner_start_ticks: int
    boot_id: str
    detached: bool
    phase: str  # "starting" | "ready" | "stopped"
    created_at: float
    kubeconfig: str = ""
    bin_dir: str = ""
    server: str = ""
    pod_network: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    processes: tuple[procs.ProcessRecord, ...] = ()

    @classmethod
    def new(cls, *, run_dir: Path, detached: bool) -> RunState:
        """A fresh "starting" state owned by the calling process."""
        me = os.getpid()
        return cls(run_dir=str(run_dir.resolve()), owner_pid=me,
                   owner_start_ticks=procs.start_ticks(me) or -1, boot_id=procs.boot_id(),
                   detached=detached, phase="starting", created_at=time.time())

    def with_process(self, record: procs.ProcessRecord) -> RunState:
        return replace(self, processes=self.processes + (record,))

    def with_(self, **changes) -> RunState:
        return replace(self, **changes)

    def for_storage(self) -> dict:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "processes"}
        data["processes"] = [p.for_storage() for p in self.processes]
        data["version"] = _VERSION
        return data

    @classmethod
    def from_storage(cls, data: dict) -> RunState:
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "processes"}
        fields["processes"] = tuple(procs.ProcessRecord.from_storage(p)
                                    for p in data.get("processes", []))
        return cls(**fields)


def state_path(run_dir: Path) -> Path:
    return run_dir / STATE_FILE


def load(run_dir: Path) -> RunState | None:
    """The run's state, or None when there is no (readable) state file."""
    try:
        return RunState.from_storage(json.loads(state_path(run_dir).read_text()))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def save(state: RunState) -> RunState:
    """Write ``state`` atomically to its run directory; returns it for chaining."""
    path = state_path(Path(state.run_dir))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.for_storage(), indent=2))
    os.replace(tmp, path)
    return state


def owner_alive(state: RunState) -> bool:
    """True when the harness process that owns the run is still that same process."""
    if state.boot_id != procs.boot_id() or not procs.is_running(state.owner_pid):
        return False
    return procs.start_ticks(state.owner_pid) == state.owner_start_ticks


def surviving(state: RunState) -> list[procs.ProcessRecord]:
    """Recorded processes that are still running as the very process recorded."""
    return [r for r in state.processes if procs.is_ours(r)]


def why_not_live(state: RunState) -> str | None:
    """None when the run is live; else a short reason why it is stale."""
    if state.phase == "stopped":
        return "it was stopped"
    dead = [r.name for r in state.processes if not procs.is_ours(r)]
    if state.detached:
        if state.phase == "starting" and not owner_alive(state):
            return f"the harness (pid {state.owner_pid}) died while starting it"
        return f"{', '.join(dead)} exited" if dead else None
    if owner_alive(state):
        return None
    return f"its harness (pid {state.owner_pid}) is gone"


def is_live_dir(run_dir: Path) -> bool:
    """Liveness of the run in ``run_dir`` (False when it has no state)."""
    state = load(run_dir)
    return state is not None and why_not_live(state) is None


def register(*, registry: Path, run_dir: Path) -> None:
    """Add ``run_dir`` to the registry of runs (idempotent)."""
    registry.mkdir(parents=True, exist_ok=True)
    resolved = str(run_dir.resolve())
    entry = registry / hashlib.sha256(resolved.encode()).hexdigest()[:20]
    entry.write_text(resolved)


def unregister(*, registry: Path, run_dir: Path) -> None:
    resolved = str(run_dir.resolve())
    (registry / hashlib.sha256(resolved.encode()).hexdigest()[:20]).unlink(missing_ok=True)


def registered_runs(registry: Path) -> list[Path]:
    """Run directories in the registry (entries whose directory vanished are dropped)."""
    runs = []
    for entry in sorted(registry.glob("*")) if registry.is_dir() else []:
        try:
            run_dir = Path(entry.read_text().strip())
        except OSError:
            continue
        if run_dir.is_dir():
            runs.append(run_dir)
        else:
            entry.unlink(missing_ok=True)
    return runs
