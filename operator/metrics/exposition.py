"""Parse one pod's Prometheus text exposition into the few SGLang / smg series we use.

The operator scrapes ``/metrics`` of every ready prefill, decode and gateway pod each
interval (``scraper``). This module turns one such text
into a :class:`Scrape`: the histograms, counters and gauges named in :data:`FAMILIES`,
each summed over every label other than ``le`` (``model_name``, ``engine_type``,
``dp_rank``, ``is_streaming``, ...) except the scheduler rank labels (:data:`RANK_LABELS`),
over which each DP shard is counted once (below). ``slo`` then subtracts consecutive
scrapes of the same pod and adds pods together.

**One DP shard, many schedulers, one count.** Every scheduler process of an engine has
its own ``SchedulerMetricsCollector`` whenever metrics are on
(``metrics_collector.py`` ``SchedulerMetricsCollector.init_new``: labels ``tp_rank``,
``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` with DP attention or DP > 1), and a request
runs on every scheduler of its DP shard: all of them without DP attention, the attention
TP x CP ranks of its DP rank with it (``runtime_context.py`` ``derive_attention_ranks``:
``tp_rank = (attn_dp_rank * attn_cp_size + attn_cp_rank) * attn_tp_size + attn_tp_rank``),
on every PP stage. Each of them records what it concludes about the request:

- a failed transfer or bootstrap: the KV poll is MIN-all-reduced over the attention-TP
  (and -CP) group (``disaggregation/utils.py`` ``poll_and_all_reduce``,
  ``poll_and_all_reduce_attn_cp_tp_group``; across PP stages ``poll_and_all_reduce_pp``,
  ``poll_and_all_reduce_prefill_pp`` and the PP consensus on finished rids), so every rank
  concludes Failed and calls ``increment_transfer_failed_reqs`` /
  ``increment_bootstrap_failed_reqs`` itself, guarded only by the engine-wide
  ``metrics_reporter.enable_metrics`` (``managers/scheduler_components/metrics_reporter.py``
  ``SchedulerMetricsReporter.__post_init__``): ``disaggregation/prefill.py``
  ``handle_inflight_transfer_failure`` and ``handle_bootstrap_failure`` (from
  ``pop_bootstrapped``), ``disaggregation/decode.py`` ``_update_handshake_waiters``,
  ``_record_transfer_failure`` and ``_handle_kv_checksum_mismatch``;
- a completed transfer: every rank's request carries that rank's collector
  (``managers/scheduler.py`` passes ``self.metrics_collector`` to every ``Req`` when
  ``metrics_reporter.enable_metrics``), and ``prefill.py``
  ``process_disagg_prefill_inflight_queue`` calls ``req_time_stats.py``
  ``compute_and_observe_kv_transfer_metrics`` with that rank's own sender's
  ``get_transfer_metric`` (its part of the KV; attention-CP ranks other than 0 skip it,
  ``is_dummy_cp_rank``): ``sglang:kv_transfer_latency_ms`` and
  ``sglang:kv_transfer_speed_gb_s`` get one observation per rank per request;
- queue gauges: logged by attention-TP rank 0 of the shard (on each PP stage), or by
  every rank with ``--enable-metrics-for-all-schedulers``
  (``SchedulerMetricsCollector.init_new`` ``current_scheduler_metrics_enabled``), each
  then showing the same requests.

In prometheus_client's multiprocess mode each rank's values stay a series of their own, so
summing over ``tp_rank`` counted a TP4 decode's one failed request four times. Series that
differ only in :data:`RANK_LABELS` are therefore one shard (:func:`group_by_shard`):
a counter counts the shard's largest value (equal on every rank whenever SGLang's
all-reduce decided; the largest also keeps a failure only a later PP stage saw, prefill
deciding a transfer per stage), a histogram or gauge the series of the shard's lowest
rank (PP stage 0, attention-TP and -CP rank 0: the rank that always logs and transfers).
Shards are summed as before (DP attention with attention TP 1: every DP rank is a shard).
The tokenizer process's families (TTFT, ITL, TPOT, e2e, ``num_requests_total``:
``TokenizerMetricsCollector`` with ``tokenizer_metric_labels``) carry no rank label and
are summed untouched.

Real SGLang does **not** answer ``/metrics?name[]=...`` with the named samples: its
endpoint is prometheus_client's ``make_asgi_app`` over a CollectorRegistry holding only a
``MultiProcessCollector`` (``sglang/srt/utils/common.py``, ``add_prometheus_middleware``),
and ``restricted_registry`` cannot see a collector without ``describe()``, so the reply is
HTTP 200 with an empty body. The scraper therefore reads whole pages from such targets
(``scraper``), and :func:`parse_exposition` first keeps only the lines of the wanted
families (:func:`select_families`, one pass with a set lookup per line) before handing them to
``prometheus_client.parser.text_string_to_metric_families``, the only parser used. A
target that does honour ``name[]`` gets asked with :func:`sample_names`.

Gauges SGLang logs per queue (``_log_gauge_queue_count``) carry, with priority scheduling
on, a total series (``priority=""``) beside one series per priority; the total is read
and the per-priority series are not added to it (:func:`parse_exposition`).

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
    ``spec_accept_length`` do not (use ``mean``). Label sets that differ only in the
    ``priority`` label are one series: its total (``priority=""``) when exposed, else
    the sum of its per-priority values; label sets that differ only in
    :data:`RANK_LABELS` are one series too, the lowest rank's (see :func:`parse_exposition`).
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
_NAMES: dict[frozenset, frozenset[str]] = {}
#: First characters of a sample line (a metric name); anything else but ``#`` and blank
#: lines means the text is not an exposition (an HTML or JSON error page, ...).
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")
#: The label that splits SGLang's queue gauges by request priority (metrics_collector.py
#: ``_log_gauge_queue_count``: the total is the series with ``priority=""``).
PRIORITY_LABEL = "priority"
#: The labels that tell apart the scheduler processes of one DP shard, in the order a
#: shard's lowest rank is picked (``SchedulerMetricsCollector.init_new``: ``tp_rank``,
#: ``pp_rank``, ``moe_ep_rank``; ``moe_ep_rank`` is derived from ``tp_rank``,
#: data_parallel_controller.py ``launch_tensor_parallel_group``). ``dp_rank`` is not one:
#: each DP rank is a shard of its own. See the module docstring.
RANK_LABELS: tuple[str, ...] = ("pp_rank", "tp_rank", "moe_ep_rank")
_RANK_SET = frozenset(RANK_LABELS)

LabelKey = tuple[tuple[str, str], ...]


def _rank_order(value: str | None) -> tuple[int, int, str]:
    """Sort key of one rank label value: absent first, then integers by value, then other text."""
    if value is None:
        return (0, 0, "")
    try:
        return (1, int(value), "")
    except ValueError:
        return (2, 0, value)


def shard_of(key: LabelKey) -> tuple[LabelKey, tuple]:
    """(shard, rank) of a series given as its sorted ``(label, value)`` pairs.

    ``shard``: the pairs without :data:`RANK_LABELS` (series of one DP shard share it);
    ``rank``: a sort key over :data:`RANK_LABELS` (``pp_rank``, then ``tp_rank``, then
    ``moe_ep_rank``; numeric values by value; a missing label sorts first).
    """
    shard = tuple(kv for kv in key if kv[0] not in _RANK_SET)
    if len(shard) == len(key):
        return shard, ()
    ranks = {k: v for k, v in key if k in _RANK_SET}
    return shard, tuple(_rank_order(ranks.get(name)) for name in RANK_LABELS)


def group_by_shard(series: Mapping[LabelKey, Any]) -> dict[LabelKey, list[Any]]:
    """The values of ``series`` (label key -> value) grouped by DP shard, lowest rank first.

    Keys are :func:`shard_of`'s shard; each list holds the values of the shard's scheduler
    ranks ordered by rank. A series without rank labels is a shard of its own (the
    tokenizer's families, smg's). See the module docstring for why SGLang's scheduler
    series must be counted once per shard.
    """
    groups: dict[LabelKey, list[tuple[tuple, Any]]] = {}
    for key, value in series.items():
        shard, rank = shard_of(key)
        groups.setdefault(shard, []).append((rank, value))
    out: dict[LabelKey, list[Any]] = {}
    for shard, members in groups.items():
        members.sort(key=lambda m: m[0])
        out[shard] = [v for _, v in members]
    return out


def _table(families: Mapping[str, Kind]) -> dict[str, tuple[str, str]]:
    key = frozenset(families.items())
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _sample_table(families)
    return table


def _comment_names(families: Mapping[str, Kind]) -> frozenset[str]:
    """Names a ``# HELP`` / ``# TYPE`` line of ``families`` may carry (family or sample names)."""
    key = frozenset(families.items())
    names = _NAMES.get(key)
    if names is None:
        names = _NAMES[key] = frozenset(_table(families)) | frozenset(families)
    return names


def _select(text: str, families: Mapping[str, Kind], *, first_sample_only: bool = False) -> list[str]:
    """The sample lines of ``families`` in ``text`` (and their HELP/TYPE lines unless
    ``first_sample_only``, which stops at the first sample). A sample's name ends at ``{``,
    else at the first space or tab. Raises :class:`ExpositionError` for a line that cannot
    be part of an exposition."""
    table, comments = _table(families), _comment_names(families)
    out: list[str] = []
    for line in text.split("\n"):
        if not line:
            continue
        head = line[0]
        if head == "#":
            if not first_sample_only and line.startswith(("# HELP ", "# TYPE ")):
                parts = line.split(None, 3)
                if len(parts) > 2 and parts[2] in comments:
                    out.append(line)
            continue
        if head not in _NAME_START:
            line = line.strip()
            if not line or line[0] == "#":
                continue
            if line[0] not in _NAME_START:
                raise ExpositionError(f"not a Prometheus text exposition: line {line[:80]!r}")
        i = line.find("{")
        if i < 0:
            i = line.find(" ")
            if i < 0:
                i = line.find("\t")
        if (line[:i] if i >= 0 else line) in table:
            out.append(line)
            if first_sample_only:
                return out
    return out


def select_families(text: str, families: Mapping[str, Kind] = FAMILIES) -> str:
    """The lines of ``text`` that belong to ``families``: their samples (the names of
    :func:`sample_names`) and their ``# HELP`` / ``# TYPE`` lines, in order, one per line.

    One pass with a set lookup per line (about 0.25 µs a line, a hundredth of what
    prometheus_client's parser takes), so a whole SGLang page (~1,000-3,000 lines of which
    the operator reads a tenth) costs little before the real parser sees what is kept. A
    line that is no part of a text exposition at all (HTML, JSON) raises
    :class:`ExpositionError`; lines of other families are not parsed.
    """
    lines = _select(text, families)
    return "\n".join(lines) + "\n" if lines else ""


def has_samples(text: str, families: Mapping[str, Kind]) -> bool:
    """True when ``text`` holds at least one sample line of ``families`` (comments do not count).

    The scraper's test of a ``name[]``-filtered reply: SGLang's empty page has none. Text
    that is not an exposition has none either (no error is raised here).
    """
    try:
        return bool(_select(text, families, first_sample_only=True))
    except ExpositionError:
        return False


def parse_exposition(
    text: str,
    *,
    families: Mapping[str, Kind] = FAMILIES,
    label_filter: Callable[[Mapping[str, str]], bool] | None = None,
) -> Scrape:
    """Parse a Prometheus text exposition (format 0.0.4, as SGLang and smg serve it).

    ``families``: which families to read (default :data:`FAMILIES`); the lines of other
    families are dropped first (:func:`select_families`), so the text may be a whole
    ``/metrics`` page (what real SGLang sends) or one already restricted with
    :func:`sample_names`. What is kept is parsed by prometheus_client's
    ``text_string_to_metric_families``, nothing else. ``label_filter``: keep only samples
    whose labels (``le`` included) it accepts, e.g. ``lambda l: l.get("model_name") ==
    "m"`` on a pod that serves several models. Histograms and counters are summed over
    every label but ``le`` (SGLang's tokenizer records each request under exactly one
    ``priority`` value, so they have no total series) and the rank labels: label sets
    that differ only in :data:`RANK_LABELS` are the schedulers of one DP shard, which all
    record the same requests (module docstring), and count once: a counter with the
    shard's largest value, a histogram with the series of the shard's lowest rank
    (:func:`group_by_shard`). A label set that lacks some ``le`` bucket gets the count of
    its next lower bucket there (see ``histogram.add``); a missing ``+Inf`` bucket is
    taken from ``_count``. Histograms without any ``_bucket`` sample are left out.
    Gauges: label sets equal but for ``priority`` form one series, whose value is its
    total series (``priority=""``, what SGLang 0.5.23's
    ``SchedulerMetricsCollector._log_gauge_queue_count`` writes beside the per-priority
    breakdown) when present, else the sum of its per-priority series; of a DP shard's
    series the lowest rank's is kept; the series are then summed (:class:`GaugeValue`).
    Raises :class:`ExpositionError` when the parser rejects the kept lines or the text is
    not an exposition at all.
    """
    table = _table(families)
    # family -> labelset key -> {"b": {le: v}, "count": v}
    hist: dict[str, dict[Any, dict]] = {}
    # counter -> labelset key -> value
    counters: dict[str, dict[Any, float]] = {}
    # gauge -> labelset without priority -> [total series value or None, sum of per-priority values]
    gauges: dict[str, dict[Any, list]] = {}
    created: dict[str, float] = {}
    text = select_families(text, families)
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
                    key = tuple(sorted(labels.items()))
                    series = counters.setdefault(name, {})
                    series[key] = series.get(key, 0.0) + value
                else:
                    priority = labels.get(PRIORITY_LABEL, "")
                    key = tuple(sorted((k, v) for k, v in labels.items() if k != PRIORITY_LABEL))
                    series = gauges.setdefault(name, {}).setdefault(key, [None, 0.0])
                    if priority == "":
                        series[0] = value if series[0] is None else series[0] + value
                    else:
                        series[1] += value
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise ExpositionError(f"cannot parse exposition: {err}") from err
    return Scrape(
        histograms={name: h for name, series in hist.items() if (h := _sum_series(_lowest_rank_histograms(series)))},
        counters={name: math.fsum(max(ranks) for ranks in group_by_shard(series).values())
                  for name, series in counters.items()},
        gauges={n: GaugeValue(sum=math.fsum(t if t is not None else p for t, p in kept), series=len(kept))
                for n, v in gauges.items() if (kept := [ranks[0] for ranks in group_by_shard(v).values()])},
        created=created,
    )


def _lowest_rank_histograms(series: Mapping[Any, dict]) -> list[dict]:
    """One label set of a histogram family per DP shard: its lowest rank's among those with buckets."""
    with_buckets = {key: s for key, s in series.items() if s["b"]}
    return [ranks[0] for ranks in group_by_shard(with_buckets).values()]


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

