"""Command line of the SGLang engine simulator.

Run ``python tools/engine_simulator --role decode --port 30000`` from the repository root
(or ``PYTHONPATH=tools python -m engine_simulator ...``). The repository root itself must
not be on ``sys.path``: its ``operator/`` folder would shadow the standard library module.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a directory: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine_simulator.server import LogNormal, SimConfig, serve
else:
    from .server import LogNormal, SimConfig, serve


def parse_args(argv: list[str] | None = None) -> SimConfig:
    """Flags -> :class:`SimConfig`. Latencies are in seconds (KV transfer in ms)."""
    p = argparse.ArgumentParser(prog="python tools/engine_simulator",
                                description="SGLang 0.5.23 engine simulator (no GPU, no model).")
    p.add_argument("--role", choices=["prefill", "decode", "aggregated"], default="aggregated")
    p.add_argument("--host", default="127.0.0.1", help="address to bind, e.g. a loopback pod IP 127.100.0.5")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--model", default="simulated/model", help="model path reported by /get_model_info")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--bootstrap-port", type=int, default=8998,
                   help="prefill: bootstrap port to listen on (-1: do not listen); reported in /server_info")
    p.add_argument("--ttft-median", type=float, default=0.15, help="decode/aggregated TTFT median, s")
    p.add_argument("--ttft-sigma", type=float, default=0.3, help="lognormal sigma of TTFT")
    p.add_argument("--prefill-median", type=float, default=0.1, help="prefill time median on a prefill server, s")
    p.add_argument("--prefill-sigma", type=float, default=0.3)
    p.add_argument("--itl-median", type=float, default=0.01, help="inter-token latency median, s")
    p.add_argument("--itl-sigma", type=float, default=0.2)
    p.add_argument("--kv-transfer-ms-median", type=float, default=8.0)
    p.add_argument("--kv-transfer-ms-sigma", type=float, default=0.4)
    p.add_argument("--default-max-tokens", type=int, default=16)
    p.add_argument("--max-output-tokens", type=int, default=256)
    p.add_argument("--slow-factor", type=float, default=5.0, help="latency multiplier in slow mode")
    p.add_argument("--mode", choices=["normal", "slow", "fail", "kv_fail"], default="normal")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp-size", type=int, default=1, help="DP ranks: scheduler series get dp_rank labels")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--spec-accept-length", type=float, default=0.0)
    p.add_argument("--expose-created", action="store_true",
                   help="emit *_created series (real SGLang, in multiprocess mode, does not)")
    a = p.parse_args(argv)
    cfg = SimConfig(
        role=a.role, host=a.host, port=a.port, model=a.model, served_model_name=a.served_model_name,
        bootstrap_port=a.bootstrap_port, ttft=LogNormal(a.ttft_median, a.ttft_sigma),
        prefill=LogNormal(a.prefill_median, a.prefill_sigma), itl=LogNormal(a.itl_median, a.itl_sigma),
        kv_transfer_ms=LogNormal(a.kv_transfer_ms_median, a.kv_transfer_ms_sigma),
        default_max_tokens=a.default_max_tokens, max_output_tokens=a.max_output_tokens,
        slow_factor=a.slow_factor, seed=a.seed, dp_size=a.dp_size, tp_size=a.tp_size,
        spec_accept_length=a.spec_accept_length, expose_created=a.expose_created, mode=a.mode,
    )
    return cfg


async def _main(cfg: SimConfig) -> None:
    running = await serve(cfg)
    print(f"engine simulator ({cfg.role}) serving {cfg.name} on http://{cfg.host}:{cfg.port}", flush=True)
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
