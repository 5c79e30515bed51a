"""SGLang 0.5.23's own metrics code in an engine's process layout, for contract tests and benchmarks.

Not a simulator: every metric is created and recorded by SGLang's collectors
(``sglang/srt/observability/metrics_collector.py``: ``TokenizerMetricsCollector`` and
``SchedulerMetricsCollector``) and served by SGLang's ``add_prometheus_middleware``
(``sglang/srt/utils/common.py``) on a FastAPI app run by uvicorn, exactly the pieces a
real ``python -m sglang.launch_server --enable-metrics`` uses. Only the model, the GPU and
the request flow are missing: the caller says what to record (a TTFT, a failed KV
transfer, a queue depth) and the collector methods SGLang's tokenizer manager and
schedulers call are called with it.

Process layout (what ``sglang/srt/entrypoints/engine.py`` builds):

- the **main process** runs with ``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory
  before prometheus_client is imported (so every value lives there; it also calls
  SGLang's ``set_prometheus_multiproc_dir()``, as engine.py does), publishes the
  parsed server args as role ``tokenizer``, creates the ``TokenizerMetricsCollector``
  with ``tokenizer_metric_labels()`` and the ``--bucket-*`` flags (tokenizer_manager.py
  ``init_metric_collector_watchdog``), and serves ``/metrics`` on loopback;
- one **scheduler process** per TP rank (spawned, as the engine does), each publishing
  role ``scheduler`` with the placement SGLang's launchers compute
  (``spawn_world_rank``; with DP attention the DP rank of
  ``compute_dp_attention_world_info``, as data_parallel_controller.py does) and creating
  its collector with ``SchedulerMetricsCollector.init_new``. With ``--attn-dp-size 4
  --tp-size 4`` there are four, labelled ``tp_rank`` 0..3 and ``dp_rank`` 0..3.

One request runs on every scheduler of its DP shard (all the schedulers without DP
attention), and each of them records what it concludes about it with its own collector:
a failed KV transfer or bootstrap, a completed transfer. ``MetricsEngine.requests_*``
record like that (on every rank of :meth:`MetricsEngine.shard_ranks`); ``transfer_failed``
and the other per-rank methods record on one scheduler only.

Server args are parsed by the real ``prepare_server_args`` and resolved by the real
pipeline (``publish`` runs ``resolve_once``), against a tiny model directory written by
:func:`write_tiny_model` (a ``config.json`` only: resolution reads the HF config; no
weight is loaded) with ``--device cpu``.

Needs the contract extras: sglang==0.5.23 (CPU install, requirements/contract.txt),
fastapi and uvicorn. Use :class:`MetricsEngine` from a process that must not itself be
in multiprocess mode (pytest, a benchmark): everything SGLang runs happens in children.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: A LlamaForCausalLM ``config.json`` small enough to resolve server args on a CPU.
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "torch_dtype": "float32",
}

#: Scheduler queue gauges SGLang logs with ``_log_gauge_queue_count`` (a total series
#: under ``priority=""`` plus one per priority with priority scheduling on), keyed by the
#: ``SchedulerStats`` field.
QUEUE_COUNT_STATS = (
    "num_running_reqs", "num_queue_reqs", "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs", "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
)


def write_tiny_model(directory: str | os.PathLike) -> str:
    """Write :data:`TINY_MODEL_CONFIG` as ``<directory>/config.json``; return the directory path."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
    return str(path)


def engine_argv(model_dir: str, *, role: str, tp: int = 4, attn_dp: int = 4, priority: bool = True,
                served_model_name: str = "sim/model", extra: Sequence[str] = ()) -> list[str]:
    """A launch command (without ``python -m sglang.launch_server``) for a metrics engine.

    ``role``: ``prefill`` | ``decode`` | ``null`` (aggregated); ``tp`` / ``attn_dp``: the
    ``--tp-size`` and ``--attn-dp-size`` (1: no DP attention); ``priority`` adds
    ``--enable-priority-scheduling``; ``extra``: more flags (e.g. the operator's
    ``--bucket-*`` flags).
    """
    argv = ["--model-path", model_dir, "--served-model-name", served_model_name, "--device", "cpu",
            "--skip-tokenizer-init", "--enable-metrics", "--tp-size", str(tp),
            "--disaggregation-mode", role]
    if attn_dp > 1:
        argv += ["--attn-dp-size", str(attn_dp)]
    if priority:
        argv += ["--enable-priority-scheduling"]
    return argv + list(extra)


# ------------------------------------------------------------------ child processes
def _parse(argv: Sequence[str]):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(list(argv))


def _scheduler_main(conn, argv: Sequence[str], tp_rank: int) -> None:
    """One scheduler process: publish its placement, create its collector, obey ``conn``."""
    import logging

    logging.disable(logging.WARNING)
    server_args = _parse(argv)
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info
    from sglang.srt.observability.metrics_collector import (
        QueueCount,
        SchedulerMetricsCollector,
        SchedulerStats,
    )
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, get_schedule, publish, spawn_world_rank

    dp_rank = None
    if server_args.attn_dp_size > 1 or (server_args.dp_size > 1 and server_args.enable_dp_attention):
        # data_parallel_controller.py launch_tensor_parallel_group: the DP rank of a TP rank
        _, _, dp_rank, _ = compute_dp_attention_world_info(
            tp_rank, server_args.tp_size, max(server_args.attn_dp_size, server_args.dp_size), 1)
    publish(server_args, role="scheduler",
            ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0),
                             dp_rank=dp_rank, gpu_id=None))
    ctx = SchedulerMetricsCollector.init_new(
        server_args=server_args, enable_priority_scheduling=get_schedule().enable_priority_scheduling,
        enable_lora=False, enable_hierarchical_cache=False)
    collector = ctx.collector
    parallel = get_parallel()
    conn.send(("ready", {"tp_rank": parallel.tp_rank, "dp_rank": parallel.dp_rank,
                         "attn_tp_rank": parallel.attn_tp_rank, "labels": dict(collector.labels),
                         "logs_stats": ctx.current_scheduler_metrics_enabled}))
    while True:
        cmd, kw = conn.recv()
        if cmd == "stop":
            conn.send(("ok", None))
            return
        if cmd == "log_stats":
            # metrics_reporter.py: only the stats-logging rank (attention TP rank 0) logs.
            if ctx.current_scheduler_metrics_enabled:
                stats = SchedulerStats()
                fill = kw.pop("_fill_seed", None)
                if fill is not None:  # every numeric stat a value (benchmarks: a busy engine's page)
                    import dataclasses
                    import random

                    rng = random.Random(fill)
                    for f in dataclasses.fields(SchedulerStats):
                        current = getattr(stats, f.name)
                        if isinstance(current, QueueCount):
                            total = rng.randint(0, 64)
                            setattr(stats, f.name, QueueCount(total=total, by_priority=(
                                {0: total // 2, 1: total - total // 2}
                                if get_schedule().enable_priority_scheduling else None)))
                        elif isinstance(current, bool):
                            continue
                        elif isinstance(current, (int, float)):
                            setattr(stats, f.name, type(current)(rng.random() * 1000))
                for name, value in kw.items():
                    if name in QUEUE_COUNT_STATS:
                        total, by_priority = value
                        value = QueueCount(total=total, by_priority=by_priority)
                    setattr(stats, name, value)
                collector.log_stats(stats)
        elif cmd == "transfer_failed":
            for _ in range(kw["n"]):
                collector.increment_transfer_failed_reqs()
        elif cmd == "bootstrap_failed":
            for _ in range(kw["n"]):
                collector.increment_bootstrap_failed_reqs()
        elif cmd == "call":  # any other collector method, by name (benchmarks fill whole pages)
            getattr(collector, kw["method"])(*kw.get("args", ()), **kw.get("kwargs", {}))
        elif cmd == "kv_transfer":
            for latency_ms in kw["latencies_ms"]:
                collector.observe_kv_transfer_metrics(latency_ms=latency_ms, total_mb=kw.get("total_mb", 64.0),
                                                      speed_gb_s=kw.get("total_mb", 64.0) / 1024 / (latency_ms / 1000))
        else:
            conn.send(("error", f"unknown scheduler command {cmd!r}"))
            continue
        conn.send(("ok", None))


def _record_tokenizer(collector, base_labels: Mapping[str, str], cmd: str, kw: Mapping[str, Any]) -> None:
    """What tokenizer_manager.py ``collect_metrics`` calls, per request (see there)."""
    for req in kw["requests"]:
        labels = dict(base_labels)
        if req.get("priority") is not None and "priority" in labels:
            labels["priority"] = str(req["priority"])
        stream = bool(req.get("stream", True))
        if cmd != "requests":
            raise ValueError(f"unknown tokenizer command {cmd!r}")
        if req.get("ttft") is not None:
            collector.observe_time_to_first_token(labels, req["ttft"], stream=stream)
        gaps = req.get("itl") or []
        for gap in gaps:
            collector.observe_inter_token_latency(labels, gap, 1)
        if req.get("finished", True):
            tokens = len(gaps) + 1
            tpot = (sum(gaps) / len(gaps)) if gaps else None
            collector.observe_one_finished_request(
                labels, req.get("prompt_tokens", 100), tokens, 0,
                req.get("e2e", (req.get("ttft") or 0.0) + sum(gaps)), False,
                is_streaming=stream, time_per_output_token=tpot)


def _engine_main(conn, argv: Sequence[str], host: str) -> None:
    """The main process: tokenizer collector, scheduler children, /metrics over uvicorn."""
    import logging

    logging.disable(logging.WARNING)
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()  # as engine.py does (the caller already set the directory, see launch)
    from prometheus_client import values

    if not getattr(values.ValueClass, "_multiprocess", False):
        raise RuntimeError("prometheus_client is not in multiprocess mode in the engine's main process")
    server_args = _parse(argv)
    from sglang.srt.runtime_context import get_observability, publish

    publish(server_args, role="tokenizer")
    schedulers = []
    ctx = mp.get_context("spawn")
    for tp_rank in range(server_args.tp_size):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_scheduler_main, args=(child, list(argv), tp_rank), daemon=True)
        proc.start()
        schedulers.append((proc, parent))
    from fastapi import FastAPI

    from sglang.srt.observability.metrics_collector import TokenizerMetricsCollector, tokenizer_metric_labels
    from sglang.srt.utils.common import add_prometheus_middleware

    obs = get_observability()
    collector = TokenizerMetricsCollector(
        server_args=server_args, labels=tokenizer_metric_labels(),
        bucket_time_to_first_token=obs.bucket_time_to_first_token,
        bucket_e2e_request_latency=obs.bucket_e2e_request_latency,
        bucket_inter_token_latency=obs.bucket_inter_token_latency)
    ranks = [parent.recv()[1] for _, parent in schedulers]
    app = FastAPI()
    add_prometheus_middleware(app)
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="off"))

    def commands() -> None:
        while not server.started:
            time.sleep(0.01)
        conn.send(("ready", {"port": sock.getsockname()[1], "schedulers": ranks,
                             "multiproc_dir": os.environ["PROMETHEUS_MULTIPROC_DIR"],
                             "tokenizer_labels": dict(collector.labels)}))
        while True:
            try:
                target, cmd, kw = conn.recv()
            except EOFError:
                target, cmd, kw = "all", "stop", {}
            try:
                if cmd == "stop":
                    for proc, parent in schedulers:
                        parent.send(("stop", {}))
                        parent.recv()
                        proc.join(5)
                    server.should_exit = True
                    conn.send(("ok", None))
                    return
                if target == "tokenizer" and cmd == "call":
                    getattr(collector, kw["method"])(*kw.get("args", ()), **kw.get("kwargs", {}))
                elif target == "tokenizer":
                    _record_tokenizer(collector, collector.labels, cmd, kw)
                else:
                    ranks_to = range(len(schedulers)) if target == "all" else [int(target)]
                    for r in ranks_to:
                        schedulers[r][1].send((cmd, kw))
                        status, detail = schedulers[r][1].recv()
                        if status != "ok":
                            raise RuntimeError(detail)
                conn.send(("ok", None))
            except Exception as err:  # reported to the caller, who raises it
                conn.send(("error", f"{type(err).__name__}: {err}"))

    threading.Thread(target=commands, daemon=True).start()
    server.run(sockets=[sock])


# ------------------------------------------------------------------ the caller's handle
class MetricsEngine:
    """A running metrics engine (see the module docstring); use as a context manager.

    ``argv``: the launch command (:func:`engine_argv`). After :meth:`start`: ``url`` is
    ``http://<host>:<port>/metrics``, ``schedulers`` one dict per TP rank (``tp_rank``,
    ``dp_rank``, ``attn_tp_rank``, ``labels``, ``logs_stats``), ``tokenizer_labels``.
    Recording methods block until every process involved has recorded. Raises
    RuntimeError when a process reports an error or does not start within ``timeout``
    seconds (300 by default: every rank imports torch and SGLang; the contract tests start
    three engines, ten processes, at once, which took over 120 s on a busy 2-core runner).
    """

    def __init__(self, argv: Sequence[str], *, host: str = "127.0.0.1", timeout: float = 300.0) -> None:
        self.argv = list(argv)
        self.host = host
        self.timeout = timeout
        self._proc = None
        self._conn = None
        self._dir: str | None = None
        self.url = ""
        self.port = 0
        self.schedulers: list[dict[str, Any]] = []
        self.tokenizer_labels: dict[str, str] = {}
        self.multiproc_dir = ""

    def start(self) -> "MetricsEngine":
        """Spawn the main process (which spawns the schedulers); wait until /metrics serves."""
        return self.launch().wait_ready()

    def launch(self) -> "MetricsEngine":
        """Spawn the main process without waiting (start several engines, then :meth:`wait_ready`)."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        env_keep = {k: os.environ.get(k) for k in ("PROMETHEUS_MULTIPROC_DIR", "PYTHONSAFEPATH")}
        # A fresh directory in the child's environment from its first instruction on: a spawned
        # child imports the caller's main module (which may import prometheus_client) before
        # the target runs, and prometheus_client picks its mode at import.
        self._dir = tempfile.mkdtemp(prefix="sglang-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self._dir
        os.environ["PYTHONSAFEPATH"] = "1"   # the children must never import the repo's operator/
        try:
            self._proc = ctx.Process(target=_engine_main, args=(child, self.argv, self.host), daemon=False)
            self._proc.start()
        finally:
            for k, v in env_keep.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        self._conn = parent
        return self

    def wait_ready(self) -> "MetricsEngine":
        """Wait until the launched engine serves /metrics (RuntimeError after ``timeout``)."""
        parent = self._conn
        assert parent is not None, "launch() first"
        if not parent.poll(self.timeout):
            self.close()
            raise RuntimeError(f"the SGLang metrics engine did not start within {self.timeout:.0f}s")
        status, info = parent.recv()
        if status != "ready":
            raise RuntimeError(f"the SGLang metrics engine failed: {info}")
        self.port = info["port"]
        self.url = f"http://{self.host}:{self.port}/metrics"
        self.schedulers = info["schedulers"]
        self.tokenizer_labels = info["tokenizer_labels"]
        self.multiproc_dir = info["multiproc_dir"]
        return self

    def _call(self, target: str, cmd: str, **kw: Any) -> None:
        assert self._conn is not None, "start() first"
        self._conn.send((target, cmd, kw))
        if not self._conn.poll(self.timeout):
            raise RuntimeError(f"the SGLang metrics engine did not answer {cmd!r}")
        status, detail = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"the SGLang metrics engine failed {cmd!r}: {detail}")

    # -- what SGLang's tokenizer manager records (decode / aggregated servers)
    def requests(self, requests: Sequence[Mapping[str, Any]]) -> None:
        """Record finished requests as tokenizer_manager.py ``collect_metrics`` does.

        Each: ``ttft`` (s, None: not observed, as on PD prefill), ``itl`` (list of gaps,
        s, one token each), ``stream`` (default True), ``priority`` (int or None),
        ``prompt_tokens``, ``e2e`` (s), ``finished`` (default True).
        """
        self._call("tokenizer", "requests", requests=[dict(r) for r in requests])

    # -- what SGLang's schedulers record
    def log_stats(self, rank: int | str = "all", **stats: Any) -> None:
        """``SchedulerMetricsCollector.log_stats`` on ``rank`` (``"all"``: every TP rank;
        only stats-logging ranks log, as in metrics_reporter.py). ``stats``: SchedulerStats
        fields; queue fields (:data:`QUEUE_COUNT_STATS`) as ``(total, {priority: n})``;
        ``_fill_seed=N`` first gives every numeric field a random value (seeded)."""
        self._call(str(rank), "log_stats", **stats)

    def transfer_failed(self, rank: int, n: int = 1) -> None:
        """``increment_transfer_failed_reqs`` ``n`` times on TP rank ``rank``."""
        self._call(str(rank), "transfer_failed", n=n)

    def bootstrap_failed(self, rank: int, n: int = 1) -> None:
        """``increment_bootstrap_failed_reqs`` ``n`` times on TP rank ``rank``."""
        self._call(str(rank), "bootstrap_failed", n=n)

    def kv_transfer(self, rank: int, latencies_ms: Sequence[float], total_mb: float = 64.0) -> None:
        """``observe_kv_transfer_metrics`` once per latency (ms) on TP rank ``rank``."""
        self._call(str(rank), "kv_transfer", latencies_ms=list(latencies_ms), total_mb=total_mb)

    # -- what SGLang's schedulers record for one request, on every rank that handles it
    def shard_ranks(self, dp_rank: int | None = None) -> list[int]:
        """The TP ranks of the scheduler processes that handle the requests of DP shard ``dp_rank``.

        With DP attention a request goes to one DP rank, and every scheduler of that rank's
        attention group (its attention-TP x attention-CP ranks, ``tp_rank // (attn_tp_size *
        attn_cp_size)`` = ``dp_rank``: runtime_context.py ``derive_attention_ranks``) runs
        it; without DP attention every scheduler of the engine does (``dp_rank`` None).
        Raises ValueError for a ``dp_rank`` no scheduler has.
        """
        ranks = [s["tp_rank"] for s in self.schedulers if s["dp_rank"] == dp_rank]
        if not ranks:
            raise ValueError(f"no scheduler has dp_rank {dp_rank!r} "
                             f"(engine dp ranks: {sorted({str(s['dp_rank']) for s in self.schedulers})})")
        return ranks

    def requests_transfer_failed(self, n: int = 1, *, dp_rank: int | None = None) -> None:
        """``n`` requests of DP shard ``dp_rank`` whose KV transfer failed, recorded as SGLang does.

        The poll of a transfer is MIN-all-reduced over the attention-TP (and -CP) group
        (disaggregation/utils.py ``poll_and_all_reduce`` / ``poll_and_all_reduce_attn_cp_tp_group``),
        so every rank of the group concludes the request Failed and calls
        ``increment_transfer_failed_reqs`` itself, guarded by the global
        ``metrics_reporter.enable_metrics`` (prefill.py ``handle_inflight_transfer_failure``,
        decode.py ``_record_transfer_failure``): one increment per rank of :meth:`shard_ranks`.
        """
        for rank in self.shard_ranks(dp_rank):
            self.transfer_failed(rank, n)

    def requests_bootstrap_failed(self, n: int = 1, *, dp_rank: int | None = None) -> None:
        """``n`` requests of DP shard ``dp_rank`` whose bootstrap failed, recorded as SGLang does:
        ``increment_bootstrap_failed_reqs`` on every rank of :meth:`shard_ranks` (prefill.py
        ``handle_bootstrap_failure`` after ``pop_bootstrapped``'s all-reduced poll, decode.py
        ``_update_handshake_waiters``)."""
        for rank in self.shard_ranks(dp_rank):
            self.bootstrap_failed(rank, n)

    def requests_kv_transferred(self, latencies_ms: Sequence[float], *, dp_rank: int | None = None,
                                total_mb: float = 64.0) -> None:
        """One request of DP shard ``dp_rank`` per latency (ms) whose KV transfer completed, as
        SGLang records it: every rank of :meth:`shard_ranks` concludes the request and calls
        ``observe_kv_transfer_metrics`` for its own part of the KV (prefill.py
        ``process_disagg_prefill_inflight_queue`` -> req_time_stats.py
        ``compute_and_observe_kv_transfer_metrics``, with the rank's own sender's
        ``get_transfer_metric``; an attention-CP rank other than 0 skips it unless every CP rank
        transfers, ``is_dummy_cp_rank``). Here each rank observes the same latency and size."""
        for rank in self.shard_ranks(dp_rank):
            self.kv_transfer(rank, latencies_ms, total_mb=total_mb)

    def call(self, target: int | str, method: str, *args: Any, **kwargs: Any) -> None:
        """Call collector ``method`` with plain arguments on ``target``: a TP rank, ``"all"``
        schedulers, or ``"tokenizer"`` (e.g. ``observe_queue_time``, ``emit_startup_time``)."""
        self._call(str(target), "call", method=method, args=list(args), kwargs=dict(kwargs))

    def close(self) -> None:
        """Stop the schedulers and the server; kill what does not stop within 10 s."""
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("all", "stop", {}))
                if self._conn.poll(10):
                    self._conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        if self._proc is not None:
            self._proc.join(10)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
        self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "MetricsEngine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def tiny_model_dir() -> str:
    """A temporary directory holding the tiny model config (removed at interpreter exit)."""
    tmp = tempfile.TemporaryDirectory(prefix="sglang-metrics-model-")
    _KEEP.append(tmp)
    return write_tiny_model(tmp.name)


_KEEP: list[tempfile.TemporaryDirectory] = []
