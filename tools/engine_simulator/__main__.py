"""Command line of the SGLang engine simulator.

Run ``python tools/engine_simulator --role decode --port 30000`` from the repository root
(or ``PYTHONPATH=tools python -m engine_simulator ...``). The repository root itself must
not be on ``sys.path``: its ``operator/`` folder would shadow the standard library module.

Like ``sglang.launch_server`` (``set_prometheus_multiproc_dir`` in
sglang/srt/utils/common.py, called by engine.py before any metric exists), the process
first gives prometheus_client a multiprocess directory, before prometheus_client is
imported: a fresh private directory (inside ``PROMETHEUS_MULTIPROC_DIR`` when that is
set), removed at exit. When serving, it prints one JSON line ``{"simulator": "ready",
"url": ..., "port": ..., "bootstrap_port": ...}`` and then a human one.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path


def set_multiproc_dir() -> str:
    """Point ``PROMETHEUS_MULTIPROC_DIR`` at a new private directory (removed at exit); return it.

    Must run before prometheus_client is imported in this process (it reads the variable
    once, at import). Inside an existing ``PROMETHEUS_MULTIPROC_DIR`` when one is set.
    """
    parent = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    path = tempfile.mkdtemp(prefix="engine-simulator-metrics-", dir=parent)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, True)
    return path


if __name__ == "__main__":
    if "prometheus_client" in sys.modules:
        raise SystemExit("engine simulator: prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set")
    set_multiproc_dir()

import asyncio  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402

if __package__ in (None, ""):  # run as a directory: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine_simulator.cli import parse_args
    from engine_simulator.config import SimConfig
else:
    from .cli import parse_args
    from .config import SimConfig

async def _main(cfg: SimConfig) -> None:
    if __package__ in (None, ""):
        from engine_simulator.server import serve
    else:
        from .server import serve
    running = await serve(cfg)
    print(json.dumps({"simulator": "ready", "url": running.url, "port": cfg.port, "role": cfg.role,
                      "bootstrap_port": cfg.bootstrap_port if cfg.role == "prefill" else None}), flush=True)
    print(f"engine simulator ({cfg.role}) serving {cfg.name} on {running.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.close()


def main(argv: list[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM."""
    asyncio.run(_main(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
