"""One oracle worker process: SGLang imported on an emulated GPU, answering JSON requests.

Started by :mod:`.pool` as ``python -m sglang_pd_operator.oracle.worker`` with the
accelerator's :class:`~.device.DeviceFacts` and the plugin catalog as JSON in the
environment (``SGLANG_PD_ORACLE_DEVICE``, ``SGLANG_PD_ORACLE_PLUGINS``). Before SGLang is
imported it installs the GPU emulation and the stand-in plugin distribution; then it
imports SGLang, checks that SGLang's probes see the emulated GPU, runs SGLang's
``load_plugins`` (as ``sglang.launch_server`` does first) and serves requests.

Protocol: one JSON object per line on the original stdin / stdout (the process's fd 1
is pointed at stderr so nothing SGLang prints can corrupt it). Requests carry an
``id`` and an ``op``:

- ``resolve`` {request}: :func:`.engine_side.resolve_role`; the result carries a
  ``handle`` when the role started;
- ``bootstrap`` {handles}: :func:`.engine_side.serve_bootstrap` (prefill; one resolved role
  per node of a replica, node 0 first; ``{handle}`` for one node);
- ``handshake`` {handle, address}: :func:`.engine_side.handshake` (decode);
- ``release`` {handle}: stop a bootstrap server, forget the role;
- ``ping``: liveness.

The first line written is ``{"ready": true, ...}`` or ``{"ready": false, "error"}``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from . import emulation
from .device import DeviceFacts

DEVICE_ENV = "SGLANG_PD_ORACLE_DEVICE"


def _protocol_streams():
    """(reader, writer) on the original stdin/stdout; fd 1 then goes to stderr."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return sys.stdin, os.fdopen(out_fd, "w", buffering=1)


def _start(facts: DeviceFacts, workdir: Path) -> None:
    from . import cuda_driver, kernel_standins, standin_plugins

    emulation.install(facts, workdir / "tools")
    kernel_standins.install(facts.vendor)
    if facts.vendor == "nvidia":
        cuda_driver.install(facts.name)
    plugins = json.loads(os.environ.get(standin_plugins.PLUGINS_ENV, "{}"))
    standin_plugins.install_distribution(workdir / "site", plugins)
    import sglang.srt.server_args  # noqa: F401  (after the emulation, on purpose)
    from sglang.srt.plugins import load_plugins

    emulation.verify(facts)
    load_plugins()


class Worker:
    """The request loop's state: resolved roles by handle."""

    def __init__(self) -> None:
        self.roles: dict[int, Any] = {}
        self._ids = itertools.count(1)

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Answer one request (never raises: an unexpected error is an ``error`` reply)."""
        from . import engine_side

        op = msg.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "resolve":
            result, state = engine_side.resolve_role(msg["request"])
            if state is not None:
                handle = next(self._ids)
                self.roles[handle] = state
                result["handle"] = handle
            return result
        if op == "bootstrap":
            # one handle per node of the prefill replica, node 0 first
            handles = msg.get("handles") or [msg.get("handle")]
            states = [self.roles.get(h) for h in handles]
            if any(st is None for st in states):
                return {"error": f"unknown handle among {handles!r}"}
            return engine_side.serve_bootstrap(states)
        state = self.roles.get(msg.get("handle"))
        if state is None:
            return {"error": f"unknown handle {msg.get('handle')!r}"}
        if op == "handshake":
            return engine_side.handshake(state, msg["address"])
        if op == "release":
            engine_side.close_bootstrap(self.roles.pop(msg["handle"]))
            return {"ok": True}
        return {"error": f"unknown op {op!r}"}


def main() -> int:
    """Run the worker until stdin closes."""
    reader, writer = _protocol_streams()
    facts = DeviceFacts.from_json(json.loads(os.environ[DEVICE_ENV]))
    with tempfile.TemporaryDirectory(prefix="sglang-oracle-worker-") as tmp:
        try:
            _start(facts, Path(tmp))
        except Exception as e:
            writer.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()}) + "\n")
            return 1
        import sglang

        writer.write(json.dumps({"ready": True, "device": facts.key, "sglang": sglang.__version__}) + "\n")
        worker = Worker()
        for line in reader:
            if not line.strip():
                continue
            msg = json.loads(line)
            try:
                reply = worker.handle(msg)
            except Exception as e:  # a bug of the oracle, not SGLang's verdict
                reply = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            reply["id"] = msg.get("id")
            writer.write(json.dumps(reply, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
