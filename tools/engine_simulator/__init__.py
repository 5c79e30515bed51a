"""SGLang engine simulator: a stand-in for an SGLang 0.5.23 server where no GPU exists.

Not part of the operator package. Run ``python tools/engine_simulator --role decode
--host 127.100.0.5 --port 30000`` from the repository root (``--help`` lists the
latency options); import it as ``engine_simulator`` with ``tools/`` on ``sys.path``.
``server.EngineSimulator`` is the aiohttp application, ``server.serve(SimConfig(...))``
starts one inside an existing event loop (tests), and
``metrics.EngineMetrics`` holds SGLang's metric names, labels and buckets.
"""

from .server import EngineSimulator, LogNormal, RunningSimulator, SimConfig, serve

__all__ = ["EngineSimulator", "LogNormal", "RunningSimulator", "SimConfig", "serve"]
