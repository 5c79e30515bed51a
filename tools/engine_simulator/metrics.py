"""SGLang 0.5.23's Prometheus metrics, as the simulator records and serves them.

Names, types, label names and default bucket boundaries are those of
``sglang/srt/observability/metrics_collector.py`` in sglang 0.5.23:

- ``TokenizerMetricsCollector`` labels: ``model_name``, ``engine_type`` (prefill |
  decode | unified); TTFT, e2e and TPOT add ``is_streaming``; ITL has no extra label.
  Under PD, a prefill server records neither TTFT, ITL nor TPOT.
- ``SchedulerMetricsCollector`` labels: ``model_name``, ``engine_type``, ``tp_rank``,
  ``pp_rank``, ``moe_ep_rank`` and ``dp_rank`` when DP attention is on; one series per
  DP rank. Its gauges use ``multiprocess_mode="mostrecent"`` as SGLang's do.

Storage and serving are SGLang's too: prometheus_client's **multiprocess mode** (values in
mmap files under ``PROMETHEUS_MULTIPROC_DIR``, which must be set before prometheus_client
is first imported in the process; the simulator's ``__main__`` does it as SGLang's
``set_prometheus_multiproc_dir`` does) and, for ``/metrics``, a ``CollectorRegistry``
holding only a ``MultiProcessCollector`` (SGLang's ``add_prometheus_middleware``). So the
page has no ``*_created`` series and ``?name[]=`` selects nothing, exactly as on SGLang.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
KV_LATENCY_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
KV_SPEED_BUCKETS = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_BOOTSTRAP_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500)
PROMPT_TOKENS_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000,
                         9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000,
                         40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000,
                         1000000, 1100000)


def engine_type(role: str) -> str:
    """SGLang's ``engine_type`` label for a role (DisaggregationMode.to_engine_type)."""
    return {"prefill": "prefill", "decode": "decode"}.get(role, "unified")


def multiprocess_mode_active() -> bool:
    """True when this process's prometheus_client stores values in ``PROMETHEUS_MULTIPROC_DIR``."""
    return bool(getattr(values.ValueClass, "_multiprocess", False)) and bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class EngineMetrics:
    """The instruments of one simulated engine and the registry ``/metrics`` serves.

    ``dp_size`` > 1 makes scheduler series carry ``dp_rank`` 0..dp_size-1 (as SGLang does
    with DP attention); ``tp_size`` is reported as ``tp_rank`` 0 only (SGLang logs
    scheduler gauges from attention-TP rank 0; the failure counters and KV transfer
    histograms it records on every rank of a DP shard are written for rank 0 alone, the one
    series per shard the operator reads: ``exposition.group_by_shard``). Instruments are registered nowhere (in
    multiprocess mode the mmap files are the store); ``registry`` is a
    ``CollectorRegistry`` with a ``MultiProcessCollector`` over ``PROMETHEUS_MULTIPROC_DIR``,
    what SGLang serves. One simulator per process (the directory is the process's).
    Raises RuntimeError when the process is not in prometheus_client multiprocess mode.
    """

    def __init__(self, *, model_name: str, role: str, dp_size: int = 1) -> None:
        if not multiprocess_mode_active():
            raise RuntimeError(
                "the engine simulator records metrics in prometheus_client multiprocess mode, as SGLang does: "
                "set PROMETHEUS_MULTIPROC_DIR before prometheus_client is imported (run it as its own process: "
                "python tools/engine_simulator, or engine_simulator.process.start_process)")
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry)
        self.role = role
        et = engine_type(role)
        self.tok_labels = {"model_name": model_name, "engine_type": et}
        tl = list(self.tok_labels)
        r = None  # registered nowhere: the multiprocess files are read by self.registry
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              tl + ["is_streaming"], buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             tl, buckets=ITL_BUCKETS, registry=r)
        self.tpot = Histogram("sglang:request_time_per_output_token_seconds",
                              "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                              "(completion_tokens - 1).", tl + ["is_streaming"], buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds",
                             "Histogram of End-to-end request latency in seconds", tl + ["is_streaming"],
                             buckets=E2E_BUCKETS, registry=r)
        self.prompt_tokens_hist = Histogram("sglang:prompt_tokens_histogram", "Histogram of prompt token length.",
                                            tl, buckets=PROMPT_TOKENS_BUCKETS, registry=r)
        self.generation_tokens_hist = Histogram("sglang:generation_tokens_histogram",
                                                "Histogram of generation token length.", tl,
                                                buckets=PROMPT_TOKENS_BUCKETS, registry=r)
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                                     tl + ["is_streaming"], registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         tl + ["is_streaming"], registry=r)
        self.requests = Counter("sglang:num_requests_total", "Number of requests processed.",
                                tl + ["is_streaming"], registry=r)
        self.aborted = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.", tl, registry=r)

        self.sched_label_sets = []
        for dp in range(dp_size):
            labels = {"model_name": model_name, "engine_type": et, "tp_rank": "0", "pp_rank": "0",
                      "moe_ep_rank": "0"}
            if dp_size > 1:
                labels["dp_rank"] = str(dp)
            self.sched_label_sets.append(labels)
        sl = list(self.sched_label_sets[0])

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, sl, registry=r, multiprocess_mode="mostrecent")

        self.num_running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.spec_accept_length = gauge("sglang:spec_accept_length", "The average acceptance length of "
                                        "speculative decoding.")
        self.prefill_bootstrap_queue = gauge("sglang:num_prefill_bootstrap_queue_reqs",
                                             "The number of requests in the prefill bootstrap queue.")
        self.prefill_inflight_queue = gauge("sglang:num_prefill_inflight_queue_reqs",
                                            "The number of requests in the prefill inflight queue.")
        self.decode_prealloc_queue = gauge("sglang:num_decode_prealloc_queue_reqs",
                                           "The number of requests in the decode prealloc queue.")
        self.decode_transfer_queue = gauge("sglang:num_decode_transfer_queue_reqs",
                                           "The number of requests in the decode transfer queue.")
        self.kv_transfer_speed = Histogram("sglang:kv_transfer_speed_gb_s", "The transfer speed of the KV cache "
                                           "in GB/s.", sl, buckets=KV_SPEED_BUCKETS, registry=r)
        self.kv_transfer_latency = Histogram("sglang:kv_transfer_latency_ms", "The transfer latency of the KV "
                                             "cache in ms.", sl, buckets=KV_LATENCY_MS_BUCKETS, registry=r)
        self.kv_transfer_bootstrap = Histogram("sglang:kv_transfer_bootstrap_ms", "Bootstrap time in ms.", sl,
                                               buckets=KV_BOOTSTRAP_MS_BUCKETS, registry=r)
        self.bootstrap_failed = Counter("sglang:num_bootstrap_failed_reqs_total",
                                        "The number of bootstrap failed requests.", sl, registry=r)
        self.transfer_failed = Counter("sglang:num_transfer_failed_reqs_total",
                                       "The number of transfer failed requests.", sl, registry=r)
        for labels in self.sched_label_sets:  # SGLang sets every gauge at each log interval
            for g in (self.num_running, self.num_queue, self.gen_throughput, self.token_usage, self.cache_hit_rate,
                      self.spec_accept_length, self.prefill_bootstrap_queue, self.prefill_inflight_queue,
                      self.decode_prealloc_queue, self.decode_transfer_queue):
                g.labels(**labels).set(0)
            self.bootstrap_failed.labels(**labels)
            self.transfer_failed.labels(**labels)

    def sched(self, i: int = 0) -> dict[str, str]:
        """Scheduler labels of DP rank ``i`` (modulo dp_size)."""
        return self.sched_label_sets[i % len(self.sched_label_sets)]

    def stream_labels(self, stream: bool) -> dict[str, str]:
        """Tokenizer labels plus ``is_streaming``."""
        return {**self.tok_labels, "is_streaming": "true" if stream else "false"}
