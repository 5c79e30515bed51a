"""SGLang engine simulator: a stand-in for an SGLang 0.5.23 server where no GPU exists.

Not part of the operator package. Run ``python tools/engine_simulator --role decode
--host 127.100.0.5 --port 30000`` from the repository root (``--help`` lists the
latency options); import it as ``engine_simulator`` with ``tools/`` on ``sys.path``.
``process.start_process(SimConfig(...))`` starts one as its own process (tests),
``server.EngineSimulator`` is the aiohttp application and ``server.serve`` starts it in a
running event loop of a process in prometheus_client multiprocess mode (the CLI's), and
``metrics.EngineMetrics`` holds SGLang's metric names, labels and buckets.

Importing the package imports no prometheus_client (``server`` and ``metrics`` are
loaded on first use): the simulator's process must set ``PROMETHEUS_MULTIPROC_DIR``
first, as SGLang's launcher does.
"""

from __future__ import annotations

from typing import Any

from .cli import config_to_argv, parse_args
from .config import LogNormal, SimConfig
from .process import SimulatorProcess, start_process

__all__ = ["EngineSimulator", "LogNormal", "RunningSimulator", "SimConfig", "SimulatorProcess", "config_to_argv",
           "parse_args", "serve", "start_process"]


def __getattr__(name: str) -> Any:
    if name in ("EngineSimulator", "RunningSimulator", "serve"):
        from . import server

        return getattr(server, name)
    raise AttributeError(name)
