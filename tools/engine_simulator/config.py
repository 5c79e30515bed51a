"""What an engine simulator is started with (no prometheus_client import here).

Kept apart from ``server`` so that a process can build a :class:`SimConfig` (and the
command line of one, ``cli.config_to_argv``) without importing prometheus_client: the
simulator's metrics live in prometheus_client's multiprocess mode, which is chosen when
prometheus_client is first imported in a process (see ``metrics``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

SGLANG_VERSION = "0.5.23"
MODES = ("normal", "slow", "fail", "kv_fail")


@dataclass
class LogNormal:
    """A lognormal latency: ``median`` seconds, shape ``sigma`` (0 = always the median)."""

    median: float
    sigma: float = 0.0

    def draw(self, rng: random.Random, factor: float = 1.0) -> float:
        """One value in seconds, scaled by ``factor``."""
        if self.sigma <= 0:
            return self.median * factor
        return rng.lognormvariate(math.log(self.median), self.sigma) * factor


@dataclass
class SimConfig:
    """Everything a simulator is started with (also the ``/get_server_info`` source).

    ``role``: prefill | decode | aggregated. ``ttft``: time to first token on decode /
    aggregated (includes the prefill and KV transfer under PD); ``prefill``: the prefill
    time a prefill server spends before answering; ``itl``: time per output token.
    ``default_max_tokens``: output length when the request does not say;
    ``max_output_tokens`` caps it. ``kv_transfer_ms``: KV transfer latency the prefill
    records. ``slow_factor``: latency multiplier in slow mode. ``seed``: RNG seed.
    ``bootstrap_delay``: seconds after the HTTP server starts before a prefill opens its
    bootstrap port (a real prefill starts its bootstrap server separately; sglang #23430).
    ``load_model``: queues and batches make latency grow with load (``load``):
    ``prefill_slots`` prefill forwards at once, ``max_running`` requests decode holds KV
    for, ``itl_batch_slope`` the ITL growth per extra running request, ``bootstrap_timeout``
    seconds a prefill waits for decode's handshake (and decode for the KV).
    """

    role: str = "aggregated"
    host: str = "127.0.0.1"
    port: int = 30000
    model: str = "simulated/model"
    served_model_name: str | None = None
    bootstrap_port: int = 8998
    ttft: LogNormal = field(default_factory=lambda: LogNormal(0.15, 0.3))
    prefill: LogNormal = field(default_factory=lambda: LogNormal(0.1, 0.3))
    itl: LogNormal = field(default_factory=lambda: LogNormal(0.01, 0.2))
    kv_transfer_ms: LogNormal = field(default_factory=lambda: LogNormal(8.0, 0.4))
    default_max_tokens: int = 16
    max_output_tokens: int = 256
    slow_factor: float = 5.0
    seed: int = 0
    dp_size: int = 1
    tp_size: int = 1
    context_length: int = 32768
    spec_accept_length: float = 0.0
    mode: str = "normal"
    bootstrap_delay: float = 0.0
    load_model: bool = False
    prefill_slots: int = 1
    max_running: int = 64
    itl_batch_slope: float = 0.0
    bootstrap_timeout: float = 60.0

    @property
    def name(self) -> str:
        """The served model name (``--served-model-name`` or the model path)."""
        return self.served_model_name or self.model
