"""Oracle worker processes, one per emulated accelerator, and the JSON-lines calls to them.

SGLang decides at import time which GPU it runs on, so each accelerator of the catalog
gets its own worker process (:mod:`.worker`), started on first use and kept for the next
spec. :class:`WorkerPool` starts them with a clean environment (no ``SGLANG_*``
variable of the caller leaks into a verdict), the accelerator's device facts and the
plugin catalog, and closes the least recently used one beyond ``max_workers``.

A worker that dies or does not answer within ``timeout`` seconds raises
:class:`OracleError` with the tail of its stderr; the pool forgets it and starts a new
one on the next call.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from ..catalog import Catalog
from .device import device_facts
from .stages import IMPORT_TIME_ENV
from .worker import DEVICE_ENV

PLUGINS_ENV = "SGLANG_PD_ORACLE_PLUGINS"
#: Variables of the caller's environment a worker keeps; everything else is dropped.
KEEP_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "LD_LIBRARY_PATH")
DEFAULT_TIMEOUT_S = 180.0


class OracleError(RuntimeError):
    """The oracle itself failed (a worker did not start, crashed or timed out): no verdict."""


class WorkerProcess:
    """One running worker: a subprocess speaking JSON lines."""

    def __init__(self, *, key: str, env: dict[str, str], python: str, timeout: float) -> None:
        self.key = key
        self.timeout = timeout
        self._ids = 0
        self._lock = threading.Lock()
        self._cwd = tempfile.mkdtemp(prefix="sglang-oracle-")
        self._stderr_path = Path(self._cwd) / "stderr.log"
        self._stderr = open(self._stderr_path, "w")
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_pd_operator.oracle.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=env, cwd=self._cwd, text=True, bufsize=1,
        )  # fmt: skip
        ready = self._read_line(timeout=max(timeout, 300.0))
        if not ready.get("ready"):
            self.close()
            raise OracleError(f"oracle worker for {key} did not start: {ready.get('error')}\n{ready.get('traceback', '')}")
        self.info = ready

    def stderr_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the worker wrote to stderr."""
        try:
            return "\n".join(self._stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.close()
                raise OracleError(f"oracle worker for {self.key} did not answer in {timeout:.0f} s\n{self.stderr_tail()}")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.poll()
            self.close()
            raise OracleError(f"oracle worker for {self.key} exited (code {code})\n{self.stderr_tail()}")
        return json.loads(line)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and wait for its reply; raises :class:`OracleError` on an oracle failure."""
        with self._lock:
            self._ids += 1
            msg = {"id": self._ids, "op": op, **fields}
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(json.dumps(msg) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                self.close()
                raise OracleError(f"oracle worker for {self.key} is gone: {e}\n{self.stderr_tail()}") from e
            reply = self._read_line(self.timeout)
        if "error" in reply:
            raise OracleError(f"oracle worker for {self.key} failed on {op}: {reply['error']}\n{reply.get('traceback', '')}")
        return reply

    @property
    def alive(self) -> bool:
        """The process is still running."""
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop the process (closing stdin ends its loop; kill after 5 s)."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


class WorkerPool:
    """Workers keyed by accelerator name; model directories written once per model.

    ``catalog`` gives each accelerator's device facts and the plugin catalog;
    ``python`` is the interpreter that has sglang installed (default: this one).
    """

    def __init__(self, *, catalog: Catalog, python: str | None = None, max_workers: int = 4,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.catalog = catalog
        self.python = python or sys.executable
        self.max_workers = max_workers
        self.timeout = timeout
        self._workers: collections.OrderedDict[str, WorkerProcess] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._models = tempfile.TemporaryDirectory(prefix="sglang-oracle-models-")
        self.started_s: list[float] = []

    def _env(self, accelerator: str) -> dict[str, str]:
        acc = self.catalog.accelerator(accelerator)
        if acc is None:
            raise OracleError(f"accelerator {accelerator!r} is not in the catalog")
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env["PYTHONSAFEPATH"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env["HF_HUB_OFFLINE"] = "1"  # no network: a hub id fails at once (an indeterminate verdict)
        env[DEVICE_ENV] = json.dumps(device_facts(acc).to_json())
        env[PLUGINS_ENV] = json.dumps({k: v.model_dump(mode="json") for k, v in self.catalog.plugins.items()})
        return env

    def worker(self, accelerator: str, import_env: Mapping[str, str] | None = None) -> WorkerProcess:
        """The running worker emulating ``accelerator`` (started now when there is none).

        ``import_env``: a role's values of the variables SGLang reads when it is imported
        (stages.IMPORT_TIME_ENV, e.g. ``SGLANG_USE_AITER``, booleans: read as true or false); a
        worker imports SGLang once, so each set of values gets its own worker, keyed
        ``<accelerator> NAME=true|false ...``.
        """
        # both variables are booleans SGLang parses (get_bool_env_var): "1", "true" and "True" share a worker
        extra = {k: "true" if v.strip().lower() in ("1", "true", "yes", "y") else "false"
                 for k, v in sorted((import_env or {}).items()) if k in IMPORT_TIME_ENV}
        key = " ".join([accelerator, *(f"{k}={v}" for k, v in extra.items())])
        with self._lock:
            w = self._workers.get(key)
            if w is not None and w.alive:
                self._workers.move_to_end(key)
                return w
            while len(self._workers) >= self.max_workers:
                _, old = self._workers.popitem(last=False)
                old.close()
            t0 = time.monotonic()
            w = WorkerProcess(key=key, env={**self._env(accelerator), **extra}, python=self.python,
                              timeout=self.timeout)
            self.started_s.append(time.monotonic() - t0)
            self._workers[key] = w
            return w

    def model_dir(self, name: str, config: dict[str, Any]) -> str:
        """A directory holding ``config`` as the model's config.json (written once per model)."""
        path = Path(self._models.name) / name.replace("/", "--")
        with self._lock:  # callers judge specs from several threads (the differential)
            if not path.is_dir():
                path.mkdir(parents=True)
                (path / "config.json").write_text(json.dumps(config, indent=1))
        return str(path)

    def close(self) -> None:
        """Stop every worker and remove the model directories."""
        with self._lock:
            for w in self._workers.values():
                w.close()
            self._workers.clear()
        self._models.cleanup()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
