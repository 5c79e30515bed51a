"""Start an engine simulator as its own process (what tests and benchmarks use).

The simulator's metrics live in prometheus_client's multiprocess mode, as SGLang's do
(``metrics``), which a process chooses once, when prometheus_client is first imported. A
test process has normally imported it already in the ordinary mode, so a simulator always
runs in a child process: ``python -P tools/engine_simulator <flags>`` with
``PROMETHEUS_MULTIPROC_DIR`` removed from its environment (the child makes its own, as
SGLang's launcher does). Nothing here imports prometheus_client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path

from .cli import config_to_argv
from .config import SimConfig

SIMULATOR_DIR = Path(__file__).resolve().parent


@dataclasses.dataclass
class SimulatorProcess:
    """A running simulator process: ``config`` (with the ports it bound), ``url``
    (``http://host:port``), ``proc`` (the asyncio subprocess)."""

    config: SimConfig
    url: str
    proc: asyncio.subprocess.Process

    async def close(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the process."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def start_process(config: SimConfig, *, timeout: float = 30.0,
                        stderr_path: str | os.PathLike | None = None) -> SimulatorProcess:
    """Start ``python -P tools/engine_simulator`` for ``config`` and wait until it serves.

    Port 0 (HTTP, and the prefill bootstrap port) picks free ports; the returned
    ``config`` is a copy carrying the bound ones. ``stderr_path``: where the child's
    stderr goes (default: inherited). Raises RuntimeError when the process exits or does
    not report ready within ``timeout`` seconds.
    """
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PYTHONSAFEPATH"] = "1"   # the repository root's operator/ must not shadow the stdlib
    stderr = open(stderr_path, "ab") if stderr_path is not None else None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", str(SIMULATOR_DIR), *config_to_argv(config),
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    finally:
        if stderr is not None:
            stderr.close()
    assert proc.stdout is not None
    try:
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            if not line:
                raise RuntimeError(f"engine simulator exited ({await proc.wait()}) before it served")
            try:
                ready = json.loads(line)
            except ValueError:
                continue
            if isinstance(ready, dict) and ready.get("simulator") == "ready":
                break
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    bound = dataclasses.replace(config, port=int(ready["port"]))
    if ready.get("bootstrap_port") is not None:
        bound.bootstrap_port = int(ready["bootstrap_port"])
    # keep reading stdout so the child never blocks on a full pipe
    asyncio.get_running_loop().create_task(_drain(proc.stdout))
    return SimulatorProcess(config=bound, url=ready["url"], proc=proc)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
