"""Parse one pod's Prometheus text exposition into the few SGLang / smg series we use.

The operator scrapes ``/metrics`` of every ready prefill, decode and gateway pod each
interval (``scraper``). This module turns one such text
into a :class:`Scrape`: the histograms, counters and gauges named in :data:`FAMILIES`,
each summed over every label other than ``le`` (``model_name``, ``engine_type``,
``tp_rank``, ``dp_rank``, ``is_streaming``, ...). ``slo`` then subtracts consecutive
scrapes of the same pod and adds pods together.

The scraper asks each pod only for the samples it reads (``/metrics?name[]=...``, see
:func:`sample_names`; SGLang's prometheus_client endpoint honours it) and the text is
parsed with ``prometheus_client.parser.text_string_to_metric_families`` alone. A target
that ignores ``name[]`` (smg's Rust exporter) sends everything; the extra families are
parsed and dropped, which costs time but changes nothing.

Metric names, types, labels and bucket layouts are those of SGLang 0.5.23
(``sglang/srt/observability/metrics_collector.py``: ``TokenizerMetricsCollector`` for the
request latency histograms, ``SchedulerMetricsCollector`` for queues, speculative
decoding and PD transfer) and of smg 1.13.0 (``smg_*`` on the gateway's
``--prometheus-port``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sglang_pd_operator.metrics.histogram import INF, Histogram, add


class Kind(str, Enum):
    """Prometheus metric type of a family we read."""

    HISTOGRAM = "histogram"
    COUNTER = "counter"
    GAUGE = "gauge"


# ----------------------------------------------------------------- SGLang 0.5.23 names
#: Time to first token, seconds. Recorded by the tokenizer manager of every server that
#: is not a PD prefill server (tokenizer_manager.py ``collect_metrics``: "PD prefill
#: workers never observe TTFT"), i.e. under PD by decode, measured from the moment decode
#: received the request (smg sends it to prefill and decode at once) to its first token.
TTFT = "sglang:time_to_first_token_seconds"
#: Inter-token latency, seconds per token (decode / aggregated servers only).
ITL = "sglang:inter_token_latency_seconds"
#: End-to-end request latency, seconds. Prefill servers record it too (for their part of
#: the request only), so the SLO reads it from decode.
E2E = "sglang:e2e_request_latency_seconds"
#: Per-request time per output token, seconds: (finished - first token) / (tokens - 1).
#: Not recorded by PD prefill servers, nor for aborted requests. Its reciprocal is the
#: per-user generation speed (see ``slo``).
TPOT = "sglang:request_time_per_output_token_seconds"
#: KV cache transfer latency per request, MILLISECONDS (prefill side, disaggregation/prefill.py).
KV_TRANSFER_LATENCY_MS = "sglang:kv_transfer_latency_ms"
#: KV cache transfer speed per request, GB/s (prefill side). A histogram in 0.5.23.
KV_TRANSFER_SPEED_GB_S = "sglang:kv_transfer_speed_gb_s"
TRANSFER_FAILED = "sglang:num_transfer_failed_reqs_total"
BOOTSTRAP_FAILED = "sglang:num_bootstrap_failed_reqs_total"
REQUESTS = "sglang:num_requests_total"
ABORTED = "sglang:num_aborted_requests_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
RUNNING_REQS = "sglang:num_running_reqs"
QUEUE_REQS = "sglang:num_queue_reqs"
PREFILL_BOOTSTRAP_QUEUE = "sglang:num_prefill_bootstrap_queue_reqs"
PREFILL_INFLIGHT_QUEUE = "sglang:num_prefill_inflight_queue_reqs"
DECODE_PREALLOC_QUEUE = "sglang:num_decode_prealloc_queue_reqs"
DECODE_TRANSFER_QUEUE = "sglang:num_decode_transfer_queue_reqs"
GEN_THROUGHPUT = "sglang:gen_throughput"
TOKEN_USAGE = "sglang:token_usage"

# ------------------------------------------------------------------- smg 1.13.0 names
#: Gateway-side PD TTFT, seconds: "prefill dispatch to the first decode token (the decode
#: response head on the HTTP router)". Coarse buckets (0.25, 0.5, 1, 2.5, 5, ...), so the
#: SLO does not use it by default (see ``slo.GATEWAY_TTFT_SOURCE``). smg 1.13's
#: ``smg_router_ttft_seconds`` / ``smg_router_tpot_seconds`` stay empty on the HTTP PD router.
SMG_TTFT = "smg_pd_ttft_seconds"

#: Default buckets (upper bounds, ``+Inf`` excluded) of SGLang 0.5.23's
#: TokenizerMetricsCollector; ``--bucket-*`` server flags can change them, which the
#: parser does not mind (it reads whatever ``le`` values are exposed).
SGLANG_BUCKETS: Mapping[str, tuple[float, ...]] = {
    TTFT: (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400),
    E2E: (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
          1200, 1800, 2400),
    ITL: (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
          0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000),
    KV_TRANSFER_LATENCY_MS: (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
    KV_TRANSFER_SPEED_GB_S: (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400),
}
SGLANG_BUCKETS = {**SGLANG_BUCKETS, TPOT: SGLANG_BUCKETS[ITL]}  # same list in 0.5.23

#: Every family this module names, with its type: the default of ``parse_exposition``
#: (pass ``families`` to read others, e.g. ``{KV_TRANSFER_SPEED_GB_S: Kind.HISTOGRAM}``).
#: The SLO evaluator reads a subset per role (``slo.SLOEvaluator.families_for``).
FAMILIES: Mapping[str, Kind] = {
    TTFT: Kind.HISTOGRAM, ITL: Kind.HISTOGRAM, E2E: Kind.HISTOGRAM, TPOT: Kind.HISTOGRAM,
    KV_TRANSFER_LATENCY_MS: Kind.HISTOGRAM,
    SMG_TTFT: Kind.HISTOGRAM,
    TRANSFER_FAILED: Kind.COUNTER, BOOTSTRAP_FAILED: Kind.COUNTER, REQUESTS: Kind.COUNTER,
    ABORTED: Kind.COUNTER, GENERATION_TOKENS: Kind.COUNTER,
    SPEC_ACCEPT_LENGTH: Kind.GAUGE, RUNNING_REQS: Kind.GAUGE, QUEUE_REQS: Kind.GAUGE,
    PREFILL_BOOTSTRAP_QUEUE: Kind.GAUGE, PREFILL_INFLIGHT_QUEUE: Kind.GAUGE,
    DECODE_PREALLOC_QUEUE: Kind.GAUGE, DECODE_TRANSFER_QUEUE: Kind.GAUGE,
    GEN_THROUGHPUT: Kind.GAUGE, TOKEN_USAGE: Kind.GAUGE,
}


class ExpositionError(ValueError):
    """The text is not Prometheus text exposition (the parser's message is kept)."""


@dataclass(frozen=True, slots=True)
class GaugeValue:
    """A gauge summed over its label sets: ``sum`` of the values and ``series`` count.

    Queue depths add up across DP ranks (use ``sum``); ratios such as
    ``spec_accept_length`` do not (use ``mean``).
    """

    sum: float
    series: int

    @property
    def mean(self) -> float | None:
        """Average over the label sets, None when there were none."""
        return self.sum / self.series if self.series else None


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one pod's ``/metrics`` said about the wanted families, summed over labels.

    ``histograms``: family name -> cumulative :class:`Histogram` (units of the metric).
    ``counters``: ``*_total`` name -> value. ``gauges``: name -> :class:`GaugeValue`.
    ``created``: family name -> the oldest ``*_created`` timestamp (Unix seconds) among its
    label sets, when the target exposes them; a later value than in the previous scrape
    means the process restarted (a counter reset even if the counts did not go down).
    """

    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    counters: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, GaugeValue] = field(default_factory=dict)
    created: Mapping[str, float] = field(default_factory=dict)


def sample_names(families: Mapping[str, Kind] = FAMILIES) -> tuple[str, ...]:
    """The sample names to ask a target for (``/metrics?name[]=...``), sorted.

    SGLang serves ``/metrics`` with prometheus_client's ``make_asgi_app``
    (``sglang/srt/utils/common.py``, ``add_prometheus_middleware``), which answers only the
    samples named by repeated ``name[]`` query parameters (``RestrictedRegistry``), so the
    operator receives the few hundred lines it reads instead of every series the pod has.
    Histograms: ``_bucket`` and ``_count`` (``_sum`` is never used); counters: the
    ``_total`` sample; both also ``_created``, which real SGLang (multiprocess mode) does
    not expose but a target with created series uses to mark a restart. Gauges: the name.
    """
    return tuple(sorted(_sample_table(families)))


def _sample_table(families: Mapping[str, Kind]) -> dict[str, tuple[str, str]]:
    """Sample name -> (family, part) for every sample name the operator reads."""
    table: dict[str, tuple[str, str]] = {}
    for name, kind in families.items():
        if kind is Kind.HISTOGRAM:
            for part in ("bucket", "count", "created"):
                table[f"{name}_{part}"] = (name, part)
        elif kind is Kind.COUNTER:
            table[name] = (name, "value")
            base = name[: -len("_total")] if name.endswith("_total") else name
            table[f"{base}_created"] = (name, "created")
        else:
            table[name] = (name, "value")
    return table


_TABLES: dict[frozenset, dict[str, tuple[str, str]]] = {}


def _table(families: Mapping[str, Kind]) -> dict[str, tuple[str, str]]:
    key = frozenset(families.items())
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _sample_table(families)
    return table


def parse_exposition(
    text: str,
    *,
    families: Mapping[str, Kind] = FAMILIES,
    label_filter: Callable[[Mapping[str, str]], bool] | None = None,
) -> Scrape:
    """Parse a Prometheus text exposition (format 0.0.4, as SGLang and smg serve it).

    Parsing is prometheus_client's ``text_string_to_metric_families``, nothing else.
    ``families``: which families to read (default :data:`FAMILIES`); samples of others are
    ignored, so the text may be a whole ``/metrics`` page or one already restricted with
    :func:`sample_names` (what the scraper asks for). ``label_filter``: keep only samples
    whose labels (``le`` included) it accepts, e.g. ``lambda l: l.get("model_name") ==
    "m"`` on a pod that serves several models. Histograms are summed over every label but
    ``le``; a label set that lacks some ``le`` bucket gets the count of its next lower
    bucket there (see ``histogram.add``); a missing ``+Inf`` bucket is taken from
    ``_count``. Histograms without any ``_bucket`` sample are left out. Raises
    :class:`ExpositionError` when the parser rejects the text.
    """
    table = _table(families)
    # family -> labelset key -> {"b": {le: v}, "count": v}
    hist: dict[str, dict[Any, dict]] = {}
    counters: dict[str, float] = {}
    gauges: dict[str, list[float]] = {}
    created: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for sample in fam.samples:
                entry = table.get(sample.name)
                if entry is None:
                    continue
                labels = sample.labels
                if label_filter is not None and not label_filter(labels):
                    continue
                name, part = entry
                value = sample.value
                if part == "created":
                    prev = created.get(name)
                    created[name] = value if prev is None else min(prev, value)
                    continue
                kind = families[name]
                if kind is Kind.HISTOGRAM:
                    key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                    series = hist.setdefault(name, {}).setdefault(key, {"b": {}})
                    if part == "bucket":
                        le = labels.get("le")
                        if le is not None:
                            series["b"][float(le)] = value
                    else:
                        series[part] = value
                elif kind is Kind.COUNTER:
                    counters[name] = counters.get(name, 0.0) + value
                else:
                    gauges.setdefault(name, []).append(value)
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise ExpositionError(f"cannot parse exposition: {err}") from err
    return Scrape(
        histograms={name: h for name, series in hist.items() if (h := _sum_series(series.values()))},
        counters=counters,
        gauges={n: GaugeValue(sum=math.fsum(v), series=len(v)) for n, v in gauges.items()},
        created=created,
    )


def _sum_series(series: Iterable[dict]) -> Histogram | None:
    """Add the label sets of one histogram family (see ``parse_exposition``)."""
    parts: list[Histogram] = []
    for s in series:
        buckets: dict[float, float] = s["b"]
        if not buckets:
            continue
        if INF not in buckets:
            buckets[INF] = s.get("count", max(buckets.values()))
        bounds = tuple(sorted(buckets))
        parts.append(Histogram(bounds=bounds, counts=tuple(buckets[b] for b in bounds),
                               count=s.get("count", buckets[INF])))
    if not parts:
        return None
    total = add(parts)
    assert total is not None
    return total

