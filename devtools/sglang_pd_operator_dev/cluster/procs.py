"""Start, recognise and stop the processes of a dev cluster, and only those.

Every component runs in its own session (process group), logs to one file, and is
recorded as a :class:`ProcessRecord`: pid plus the kernel's start time of that pid (and
the boot id and executable). A pid is ours only if all of these still match, so a pid the
kernel recycled for some unrelated process is never signalled. Linux only (reads /proc).

``spawn(..., die_with_parent=True)`` also asks the kernel to SIGKILL the child when the
harness dies (PR_SET_PDEATHSIG), so even a SIGKILLed pytest leaves no component behind;
detached clusters (``up --detach``) skip that and are stopped by ``down``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRecord:
    """A process this harness started.

    ``start_ticks`` is field 22 of /proc/<pid>/stat (clock ticks after boot), ``boot_id``
    the kernel's boot id at spawn, ``exe`` the argv[0] it was started with, ``log`` the
    file its stdout and stderr go to.
    """

    name: str
    pid: int
    start_ticks: int
    boot_id: str
    exe: str
    log: str

    def for_storage(self) -> dict:
        return asdict(self)

    @classmethod
    def from_storage(cls, data: Mapping) -> ProcessRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def boot_id() -> str:
    """The kernel's boot id (changes at every reboot, so old pids can never match)."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None if there is no pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()  # field 3 (state) is index 0


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks after boot, None when it does not exist."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def is_running(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie."""
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """argv of ``pid`` ([] when gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [p.decode(errors="replace") for p in raw.split(b"\0") if p]


def is_ours(record: ProcessRecord) -> bool:
    """True when ``record.pid`` is still the very process that was recorded, alive."""
    if not is_running(record.pid):
        return False
    if record.boot_id != boot_id() or start_ticks(record.pid) != record.start_ticks:
        return False
    argv = cmdline(record.pid)
    return bool(argv) and argv[0] == record.exe


def tie_to_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """For ``preexec_fn``: the kernel sends ``sig`` to this child when the thread that
    spawned it dies; ``parent`` is the spawner's pid (``os.getpid()`` before the fork).

    SIGKILL by default: components all get the signal at once, etcd would exit first and
    kube-apiserver's graceful shutdown would then hang without its storage.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def spawn(*, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, die_with_parent: bool = True) -> tuple[subprocess.Popen, ProcessRecord]:
    """Start ``argv`` in a new session with output appended to ``log_path``.

    Returns the Popen (to poll for an early exit) and the record to store. Raises
    OSError when the executable cannot be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    parent = os.getpid()
    with open(log_path, "ab") as log:
        log.write(f"==> {time.strftime('%H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            preexec_fn=(lambda: tie_to_parent(parent)) if die_with_parent else None,
        )
    ticks = start_ticks(proc.pid)
    record = ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks or -1, boot_id=boot_id(),
                           exe=str(argv[0]), log=str(log_path))
    return proc, record


def _reap(pid: int) -> bool | None:
    """Collect ``pid`` if it is our child and has exited (so it is not left a zombie).

    True: reaped now; False: our child, still running; None: not our child (or gone).
    """
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return done == pid


def _signal(record: ProcessRecord, sig: int) -> None:
    try:
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(records: Iterable[ProcessRecord], *, grace_s: float = 10.0) -> list[ProcessRecord]:
    """Stop every record that is still ours, one after the other, in the given order.

    Each gets SIGTERM and up to ``grace_s`` seconds to exit, then SIGKILL; the next one is
    only signalled after that (a kube-apiserver shuts down cleanly only while its etcd is
    still up). Records whose pid is gone or belongs to another process now are skipped,
    never signalled. Returns the records that were signalled.
    """
    targets = [r for r in records if is_ours(r)]
    for record in targets:
        _signal(record, signal.SIGTERM)
        if not _wait_gone(record, timeout_s=grace_s):
            _signal(record, signal.SIGKILL)
            _wait_gone(record, timeout_s=2.0)
    return targets


def _wait_gone(record: ProcessRecord, *, timeout_s: float) -> bool:
    """Wait until ``record`` has exited; if it is our child, until it is reaped too (an
    exiting process drops its cmdline before it turns zombie, so "not ours any more" is
    not yet "gone")."""
    deadline = time.monotonic() + timeout_s
    while True:
        reaped = _reap(record.pid)
        if reaped or (reaped is None and not is_ours(record)):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def log_tail(path: Path | str, *, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when missing)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])
