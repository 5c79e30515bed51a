"""The simulator's command line: flags <-> :class:`~engine_simulator.config.SimConfig`.

No prometheus_client import here (see ``config``): ``process.start_process`` builds a
command line with :func:`config_to_argv` in a process that is not the simulator's.
"""

from __future__ import annotations

import argparse

from .config import MODES, LogNormal, SimConfig


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python tools/engine_simulator``."""
    p = argparse.ArgumentParser(prog="python tools/engine_simulator",
                                description="SGLang 0.5.23 engine simulator (no GPU, no model).")
    p.add_argument("--role", choices=["prefill", "decode", "aggregated"], default="aggregated")
    p.add_argument("--host", default="127.0.0.1", help="address to bind, e.g. a loopback pod IP 127.100.0.5")
    p.add_argument("--port", type=int, default=30000, help="HTTP port (0: any free port, printed when ready)")
    p.add_argument("--model", default="simulated/model", help="model path reported by /get_model_info")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--bootstrap-port", type=int, default=8998,
                   help="prefill: bootstrap port to listen on (-1: do not listen; 0: any free port); "
                        "reported in /server_info")
    p.add_argument("--bootstrap-delay", type=float, default=0.0,
                   help="prefill: open the bootstrap port this many seconds after the HTTP port "
                        "(/health answers meanwhile, as SGLang's does)")
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
    p.add_argument("--mode", choices=list(MODES), default="normal")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dp-size", type=int, default=1, help="DP ranks: scheduler series get dp_rank labels")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--spec-accept-length", type=float, default=0.0)
    p.add_argument("--load-model", action="store_true",
                   help="queues and batches make latency grow with load (engine_simulator/load.py)")
    p.add_argument("--prefill-slots", type=int, default=1, help="load model: prefill forwards at once")
    p.add_argument("--max-running", type=int, default=64, help="load model: requests decode holds KV for")
    p.add_argument("--itl-batch-slope", type=float, default=0.0,
                   help="load model: a decode step takes ITL x (1 + slope x (running - 1))")
    p.add_argument("--bootstrap-timeout", type=float, default=60.0,
                   help="load model: seconds prefill waits for decode's handshake (and decode for the KV)")
    return p


def parse_args(argv: list[str] | None = None) -> SimConfig:
    """Flags -> :class:`SimConfig`. Latencies are in seconds (KV transfer in ms).

    Exits (argparse) on an unknown flag or a bad value."""
    a = build_parser().parse_args(argv)
    return SimConfig(
        role=a.role, host=a.host, port=a.port, model=a.model, served_model_name=a.served_model_name,
        bootstrap_port=a.bootstrap_port, ttft=LogNormal(a.ttft_median, a.ttft_sigma),
        prefill=LogNormal(a.prefill_median, a.prefill_sigma), itl=LogNormal(a.itl_median, a.itl_sigma),
        kv_transfer_ms=LogNormal(a.kv_transfer_ms_median, a.kv_transfer_ms_sigma),
        default_max_tokens=a.default_max_tokens, max_output_tokens=a.max_output_tokens,
        slow_factor=a.slow_factor, seed=a.seed, dp_size=a.dp_size, tp_size=a.tp_size,
        spec_accept_length=a.spec_accept_length, mode=a.mode, bootstrap_delay=a.bootstrap_delay,
        load_model=a.load_model, prefill_slots=a.prefill_slots, max_running=a.max_running,
        itl_batch_slope=a.itl_batch_slope, bootstrap_timeout=a.bootstrap_timeout,
    )


def config_to_argv(c: SimConfig) -> list[str]:
    """The flags that :func:`parse_args` turns back into ``c`` (``context_length`` has no flag
    and keeps its default)."""
    argv = ["--role", c.role, "--host", c.host, "--port", str(c.port), "--model", c.model,
            "--bootstrap-port", str(c.bootstrap_port),
            "--ttft-median", repr(c.ttft.median), "--ttft-sigma", repr(c.ttft.sigma),
            "--prefill-median", repr(c.prefill.median), "--prefill-sigma", repr(c.prefill.sigma),
            "--itl-median", repr(c.itl.median), "--itl-sigma", repr(c.itl.sigma),
            "--kv-transfer-ms-median", repr(c.kv_transfer_ms.median),
            "--kv-transfer-ms-sigma", repr(c.kv_transfer_ms.sigma),
            "--default-max-tokens", str(c.default_max_tokens), "--max-output-tokens", str(c.max_output_tokens),
            "--slow-factor", repr(c.slow_factor), "--mode", c.mode, "--seed", str(c.seed),
            "--dp-size", str(c.dp_size), "--tp-size", str(c.tp_size),
            "--spec-accept-length", repr(c.spec_accept_length), "--bootstrap-delay", repr(c.bootstrap_delay),
            "--prefill-slots", str(c.prefill_slots), "--max-running", str(c.max_running),
            "--itl-batch-slope", repr(c.itl_batch_slope), "--bootstrap-timeout", repr(c.bootstrap_timeout)]
    if c.load_model:
        argv.append("--load-model")
    if c.served_model_name is not None:
        argv += ["--served-model-name", c.served_model_name]
    return argv
