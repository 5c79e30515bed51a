"""The PromQL expressions behind a PDDeployment's SLO figures: one place for the rule and the operator (pure).

Two readers use these builders, so that what Prometheus records and what the operator
asks can never disagree:

- ``monitoring.prometheus_rule_spec`` renders the PrometheusRule's recording rules with a
  selector for one deployment (``namespace="ns",deployment="name"``);
- ``prometheus_source.PrometheusSource`` (``--slo-source prometheus``) asks the same
  expressions once per interval with a selector for *every* deployment it watches (no
  ``deployment`` matcher), grouped by ``namespace, deployment`` (:data:`GROUP`): one
  query per expression and window, however many pods and deployments there are.

The series are the ones the PodMonitor (``monitoring.render_monitoring``) gives: SGLang's
and smg's own names with the labels ``namespace``, ``pod`` (Prometheus Operator),
``deployment``, ``role`` and ``compat_key`` (relabeled from pod labels).

What each expression measures, against the scraper's evaluator (``slo.SLOEvaluator``):

- a target percentile: ``histogram_quantile(q, sum by (namespace, deployment, le)
  (rate(<family>_bucket{role="decode"}[W])))`` — the same buckets summed over pods and
  every other label, over the same window; Prometheus' ``rate`` extrapolates to the window
  edges, which scales every bucket alike and leaves the quantile as it is. Per-user speed
  is ``1 /`` the TPOT percentile (docs/slo.md section 3).
- observations in the window: ``increase(<family>_count)`` summed the same way;
- KV transfer latency (prefill, ms -> s), transfers, and the transfer / bootstrap failure
  counters: every scheduler rank of a DP shard records the same requests (exposition.py,
  "one count per DP shard"), so the rank labels (:data:`exposition.RANK_LABELS`) are first
  reduced with ``max without (...)``: a counter counts its shard's largest value (as the
  scraper does); a latency histogram takes per bucket the largest cumulative count over
  the shard's ranks (the scraper takes the lowest rank's series, which PromQL cannot
  name; the two are equal when the ranks agree, and both count each request once);
- decode's finished requests (``sglang:num_requests_total``), the failure ratio's
  denominator;
- targets Prometheus scrapes and how many answered: ``up`` by group and role, and the
  newest ``up`` sample (how old Prometheus' figures are).

Durations are rendered with ``slo.format_duration`` (``5m``, ``30s``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.slo import PERCENTILES, ROLE_DECODE, ROLE_PREFILL, SOURCES, format_duration

#: Prefix of every series the PrometheusRule records (``monitoring.prometheus_rule_spec``).
RECORD_PREFIX = "sglang_pd"
#: spec.slo field -> the recorded name part of its percentiles.
RECORDED_METRICS: Mapping[str, str] = {
    "ttft": "ttft_seconds",
    "itl": "itl_seconds",
    "e2e": "e2e_seconds",
    "perUserSpeed": "per_user_speed_tokens_per_second",
}
#: Recorded 0/1 per rule evaluation with traffic: 1 when a target was missed.
WINDOW_BAD_RECORD = f"{RECORD_PREFIX}:slo_window_bad"
#: Recorded share of the rule's evaluations over the window that met every target.
ATTAINMENT_RECORD = f"{RECORD_PREFIX}:slo_attainment_ratio"

#: Labels every figure is grouped by: one result per PDDeployment.
GROUP = ("namespace", "deployment")
#: The label the PodMonitor copies the pod's compat-key label into (the serving group).
COMPAT_KEY_LABEL = "compat_key"
#: Labels of the reachability figures: per group and role.
TARGET_GROUP = (*GROUP, COMPAT_KEY_LABEL, "role")
#: Tag of the ``failure`` label on the KV failure figure.
FAILURE_TRANSFER, FAILURE_BOOTSTRAP = "transfer", "bootstrap"
_FAILURE_COUNTERS = ((ex.TRANSFER_FAILED, FAILURE_TRANSFER), (ex.BOOTSTRAP_FAILED, FAILURE_BOOTSTRAP))


def selector(*, namespace: str | None = None, deployment: str | None = None, role: str | None = None,
             namespaces: Iterable[str] | None = None) -> str:
    """A label matcher list without braces, e.g. ``namespace="ns",deployment="d",role="decode"``.

    ``namespace`` / ``deployment``: one deployment (the rule's selector); ``namespaces``:
    a set of namespaces as an anchored regex (the operator's selector when it watches only
    some namespaces; None or empty: every namespace). Values are quoted for PromQL.
    """
    parts = []
    if namespace is not None:
        parts.append(f"namespace={_quote(namespace)}")
    elif namespaces:
        parts.append("namespace=~" + _quote("|".join(sorted(_regex_escape(n) for n in namespaces))))
    if deployment is not None:
        parts.append(f"deployment={_quote(deployment)}")
    if role is not None:
        parts.append(f"role={_quote(role)}")
    return ",".join(parts)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _regex_escape(value: str) -> str:
    # Kubernetes names are [a-z0-9.-]; escape the one regex metacharacter they can hold
    return value.replace(".", "\\.")


def _with(sel: str, extra: str) -> str:
    return ",".join(p for p in (sel, extra) if p)


def _by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def target_quantile(metric: str, q: float, window_s: float, sel: str) -> str:
    """One target's percentile over the window: ``metric`` a ``spec.slo`` field (``ttft``,
    ``itl``, ``e2e``, ``perUserSpeed``), ``q`` in (0, 1), ``sel`` a :func:`selector` without
    the role (decode is added). Seconds, or tokens/s for ``perUserSpeed``; NaN without
    observations. Raises KeyError for an unknown metric."""
    family = SOURCES[metric].family
    expr = (f"histogram_quantile({q:g}, sum by ({_by((*GROUP, 'le'))}) "
            f"(rate({family}_bucket{{{_with(sel, f'role={_quote(ROLE_DECODE)}')}}}[{format_duration(window_s)}])))")
    return f"1 / {expr}" if metric == "perUserSpeed" else expr


def observations(metric: str, window_s: float, sel: str) -> str:
    """Observations of ``metric``'s source histogram on decode over the window (requests; tokens for ITL)."""
    family = SOURCES[metric].family
    return (f"sum by ({_by(GROUP)}) (increase({family}_count{{{_with(sel, f'role={_quote(ROLE_DECODE)}')}}}"
            f"[{format_duration(window_s)}]))")


def traffic(window_s: float, sel: str) -> str:
    """1 series per deployment whose decode finished a request in the window (e2e histogram count)."""
    return (f"sum by ({_by(GROUP)}) (rate({ex.E2E}_count{{{_with(sel, f'role={_quote(ROLE_DECODE)}')}}}"
            f"[{format_duration(window_s)}])) > 0")


def kv_failures(window_s: float, sel: str) -> str:
    """Transfer and bootstrap failures on prefill and decode over the window, one count per DP
    shard, as series labelled ``failure="transfer"`` / ``"bootstrap"``.

    The two counters are tagged and joined with ``or``: SGLang creates each series at its
    first increment only, and ``+`` would drop a pod that has one of them.
    """
    w = format_duration(window_s)
    tagged = " or ".join(
        f'label_replace(increase({counter}{{{sel}}}[{w}]), "failure", "{tag}", "", "")'
        for counter, tag in _FAILURE_COUNTERS
    )
    return f"sum by ({_by((*GROUP, 'failure'))}) (max without ({_by(ex.RANK_LABELS)}) ({tagged}))"


def kv_latency(q: float, window_s: float, sel: str) -> str:
    """KV transfer latency percentile on prefill over the window, in SECONDS (SGLang records ms)."""
    prefill = _with(sel, f"role={_quote(ROLE_PREFILL)}")
    return (f"histogram_quantile({q:g}, sum by ({_by((*GROUP, 'le'))}) (max without ({_by(ex.RANK_LABELS)}) "
            f"(rate({ex.KV_TRANSFER_LATENCY_MS}_bucket{{{prefill}}}[{format_duration(window_s)}])))) / 1000")


def kv_transfers(window_s: float, sel: str) -> str:
    """Requests whose KV moved over the window (prefill's KV latency histogram count, once per shard)."""
    prefill = _with(sel, f"role={_quote(ROLE_PREFILL)}")
    return (f"sum by ({_by(GROUP)}) (max without ({_by(ex.RANK_LABELS)}) "
            f"(increase({ex.KV_TRANSFER_LATENCY_MS}_count{{{prefill}}}[{format_duration(window_s)}])))")


def finished_requests(window_s: float, sel: str) -> str:
    """Requests decode finished over the window (``sglang:num_requests_total``)."""
    decode = _with(sel, f"role={_quote(ROLE_DECODE)}")
    return f"sum by ({_by(GROUP)}) (increase({ex.REQUESTS}{{{decode}}}[{format_duration(window_s)}]))"


def targets_up(sel: str) -> str:
    """Scrape targets that answered Prometheus' latest scrape, per deployment, group and role."""
    return f"sum by ({_by(TARGET_GROUP)}) (up{{{sel}}})"


def newest_sample(sel: str) -> str:
    """Unix time of Prometheus' newest ``up`` sample per deployment (how old its figures are)."""
    return f"max by ({_by(GROUP)}) (timestamp(up{{{sel}}}))"


#: The planner's load gauges (``slo.LOAD_FAMILIES``) -> how series add up: queues and the batch
#: are summed over pods and DP shards; the KV pool fill is averaged.
LOAD_GAUGES: Mapping[str, str] = {
    ex.RUNNING_REQS: "sum", ex.QUEUE_REQS: "sum", ex.TOKEN_USAGE: "avg",
    ex.PREFILL_BOOTSTRAP_QUEUE: "sum", ex.PREFILL_INFLIGHT_QUEUE: "sum",
    ex.DECODE_PREALLOC_QUEUE: "sum", ex.DECODE_TRANSFER_QUEUE: "sum",
}


def role_load(gauge: str, sel: str) -> str:
    """One load gauge of prefill and decode, per deployment, compat group and role (the planner's signal).

    The scheduler rank labels are reduced first (``max without``: a DP shard's ranks log the
    same value, as the scraper reads one series per shard); ``priority=""`` keeps the total
    of a queue gauge under priority scheduling (SGLang's ``_log_gauge_queue_count`` writes it
    there, and the matcher also selects series without a priority label). Queues and the
    batch are summed over pods and shards, ``token_usage`` averaged. Raises KeyError for a
    gauge not in :data:`LOAD_GAUGES`.
    """
    agg = LOAD_GAUGES[gauge]
    inner = _with(sel, f'role=~"{ROLE_PREFILL}|{ROLE_DECODE}",priority=""')
    return f"{agg} by ({_by(TARGET_GROUP)}) (max without ({_by(ex.RANK_LABELS)}) ({gauge}{{{inner}}}))"


def load_queries(sel: str) -> dict[str, str]:
    """Every planner load expression, by name ``load:<gauge>`` (asked once per interval when a
    deployment has ``spec.autoscaling``; recorded by its PrometheusRule as ``sglang_pd:role_<gauge>``)."""
    return {f"load:{g}": role_load(g, sel) for g in LOAD_GAUGES}


def window_queries(window_s: float, metrics: Iterable[str], sel: str) -> dict[str, str]:
    """The raw expressions the operator asks for deployments sharing one SLO window, by name.

    ``metrics``: the ``spec.slo`` metrics targeted by at least one of them. Names:
    ``observations:<metric>``, ``kv_latency:<q>``, ``kv_failures``, ``kv_transfers``,
    ``requests``. The target percentiles, attainment and burn rates are not among them:
    the Prometheus source reads those from the PrometheusRule's records
    (:func:`recorded_slo`).
    """
    out: dict[str, str] = {}
    for metric in sorted(set(metrics)):
        out[f"observations:{metric}"] = observations(metric, window_s, sel)
    for q in PERCENTILES.values():
        out[f"kv_latency:{q:g}"] = kv_latency(q, window_s, sel)
    out["kv_failures"] = kv_failures(window_s, sel)
    out["kv_transfers"] = kv_transfers(window_s, sel)
    out["requests"] = finished_requests(window_s, sel)
    return out


def recorded_name(metric: str, percentile: str) -> str:
    """Recording-rule name of one target, e.g. ``sglang_pd:ttft_seconds:p90``; KeyError for an unknown metric."""
    return f"{RECORD_PREFIX}:{RECORDED_METRICS[metric]}:{percentile}"


def burn_rate_record(seconds: float) -> str:
    """Recording-rule name of the error-budget burn rate over ``seconds``, e.g. ``..._burn_rate:1h``."""
    return f"{RECORD_PREFIX}:slo_error_budget_burn_rate:{format_duration(seconds)}"


def recorded_slo(sel: str) -> str:
    """Every SLO figure the PrometheusRules record, in ONE instant query: each target percentile
    (:func:`recorded_name`), the attainment (:data:`ATTAINMENT_RECORD`) and the burn rates
    (:func:`burn_rate_record`) of every deployment ``sel`` selects, each sample labelled with its
    ``__name__``, ``namespace`` and ``deployment``. What ``--slo-source prometheus`` reads instead of
    recomputing them (the rule is the one implementation)."""
    percentiles = "|".join(RECORDED_METRICS.values())
    names = (f"{RECORD_PREFIX}:({percentiles}):p[0-9]+|{RECORD_PREFIX}:slo_error_budget_burn_rate:.+"
             f"|{ATTAINMENT_RECORD}")
    return "{" + _with(f"__name__=~{_quote(names)}", sel) + "}"
