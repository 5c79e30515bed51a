"""Prometheus Operator objects for a PDDeployment: a PodMonitor and a PrometheusRule (pure).

For clusters that run the Prometheus Operator (the reconciler renders these only when
the ``podmonitors.monitoring.coreos.com`` and ``prometheusrules.monitoring.coreos.com``
CRDs exist). They let Prometheus compute the same figures as the operator's own
``slo`` module:

- the PodMonitor scrapes ``/metrics`` of the engine pods (SGLang's HTTP port) and of the
  gateway pods (smg's ``--prometheus-port``), each endpoint kept to its roles, and labels every series with
  ``deployment`` (the PDDeployment name) and ``role`` (from a pod label); the Prometheus
  Operator adds ``namespace`` and ``pod`` itself;
- the PrometheusRule records, per deployment, each targeted percentile (the expressions
  come from ``promql``, which ``--slo-source prometheus`` queries too) as
  ``histogram_quantile(q, sum by (namespace, deployment, le) (rate(<metric>_bucket
  {role="decode"}[window])))`` (speed as 1 / the TPOT percentile), a 0/1 "window bad"
  series, burn rates over the four windows of ``slo.burn_windows`` and the two
  multi-window alerts, plus a KV-transfer-failure alert.

The expressions are checked by ``promtool check rules`` in tests/contract/test_promql.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sglang_pd_operator.api.v1alpha1 import SLOSpec, parse_duration
from sglang_pd_operator.metrics import promql
from sglang_pd_operator.metrics.slo import (
    PERCENTILES,
    ROLE_AGGREGATED,
    ROLE_DECODE,
    ROLE_GATEWAY,
    ROLE_PREFILL,
    burn_windows,
    format_duration,
)

MONITORING_API_VERSION = "monitoring.coreos.com/v1"
RECORD_PREFIX = promql.RECORD_PREFIX
_SLO_METRICS = promql.RECORDED_METRICS  # spec field -> recorded name part (the expressions: promql.py)


def _label_to_meta(key: str) -> str:
    """Pod label key -> the Prometheus service-discovery meta label holding its value."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


recorded_name = promql.recorded_name


def render_monitoring(
    *,
    name: str,
    namespace: str,
    slo_spec: SLOSpec | None,
    pod_selector: Mapping[str, str],
    role_label: str,
    compat_key_label: str | None = None,
    engine_port: str = "http",
    gateway_port: str = "metrics",
    scrape_interval: str = "15s",
    labels: Mapping[str, str] | None = None,
    owner_references: list[dict] | None = None,
    load: bool = False,
) -> list[dict]:
    """The PodMonitor and (when ``slo_spec`` is set) PrometheusRule of one PDDeployment.

    ``pod_selector``: matchLabels selecting this deployment's engine AND gateway pods.
    ``role_label``: pod label whose value is the role (prefill | decode | aggregated |
    gateway); copied to the ``role`` series label. ``engine_port`` / ``gateway_port``:
    container port NAMES serving /metrics on engine and gateway pods (a pod without the
    named port is simply not scraped on that endpoint). ``labels`` go on both objects'
    metadata (the Prometheus Operator's ruleSelector / podMonitorSelector match them).
    ``load``: the deployment has ``spec.autoscaling``; the rule also records the planner's
    load gauges (``promql.load_queries``).
    Returns plain dicts, PodMonitor first. Raises ValueError for a bad duration.
    """
    meta_labels = dict(labels or {})
    relabel = [
        {"action": "replace", "targetLabel": "deployment", "replacement": name},
        {"action": "replace", "sourceLabels": [_label_to_meta(role_label)], "targetLabel": "role"},
    ]
    if compat_key_label:
        relabel.append({"action": "replace", "sourceLabels": [_label_to_meta(compat_key_label)],
                        "targetLabel": promql.COMPAT_KEY_LABEL})

    def endpoint(port: str, roles: str) -> dict:
        # both ports may share a name across pod kinds (the gateway's API port is "http"
        # too): keep each endpoint to the roles that serve /metrics on it
        keep = {"action": "keep", "sourceLabels": [_label_to_meta(role_label)], "regex": roles}
        return {"port": port, "path": "/metrics", "interval": scrape_interval, "relabelings": [keep, *relabel]}

    metadata = {"name": name, "namespace": namespace, "labels": meta_labels}
    if owner_references:
        metadata["ownerReferences"] = owner_references
    pod_monitor = {
        "apiVersion": MONITORING_API_VERSION,
        "kind": "PodMonitor",
        "metadata": dict(metadata),
        "spec": {
            "selector": {"matchLabels": dict(pod_selector)},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [endpoint(engine_port, f"{ROLE_PREFILL}|{ROLE_DECODE}|{ROLE_AGGREGATED}"),
                                    endpoint(gateway_port, ROLE_GATEWAY)],
        },
    }
    objects = [pod_monitor]
    if slo_spec is not None:
        objects.append({
            "apiVersion": MONITORING_API_VERSION,
            "kind": "PrometheusRule",
            "metadata": dict(metadata),
            "spec": prometheus_rule_spec(name=name, namespace=namespace, slo_spec=slo_spec, load=load),
        })
    return objects


def prometheus_rule_spec(*, name: str, namespace: str, slo_spec: SLOSpec, load: bool = False) -> dict:
    """``spec`` of the PrometheusRule: ``{"groups": [...]}``, also a valid promtool rules file.

    Recording group ``<namespace>.<name>.sglang-pd-slo`` and alert group
    ``<namespace>.<name>.sglang-pd-slo-alerts``, both evaluated every tenth of the window,
    clamped to 15s..1m.
    Alerts: ``SGLangPDErrorBudgetBurnFast`` (page: 12W and W above 14.4),
    ``SGLangPDErrorBudgetBurnSlow`` (ticket: 72W and 6W above 6),
    ``SGLangPDKVTransferFailing`` (any transfer/bootstrap failure over W, for W).
    With ``load`` (``spec.autoscaling``) also ``sglang_pd:role_<gauge>`` for each of the
    planner's load gauges (``promql.role_load``: per compat group and role).
    """
    window_s = parse_duration(slo_spec.window)
    w = format_duration(window_s)
    dsel = promql.selector(namespace=namespace, deployment=name)
    records: list[dict] = []
    bad_terms: list[str] = []
    for metric in _SLO_METRICS:
        targets = getattr(slo_spec, metric)
        if targets is None:
            continue
        for pname, q in PERCENTILES.items():
            raw = getattr(targets, pname)
            if raw is None:
                continue
            rec = recorded_name(metric, pname)
            records.append({"record": rec, "expr": promql.target_quantile(metric, q, window_s, dsel)})
            if metric == "perUserSpeed":
                bad_terms.append(f"({rec}{{{dsel}}} < bool {float(raw):g})")
            else:
                bad_terms.append(f"({rec}{{{dsel}}} > bool {parse_duration(raw):g})")
    bad = promql.WINDOW_BAD_RECORD
    budget = 1.0 - slo_spec.objective
    if bad_terms:
        records.append({
            "record": bad,
            "expr": (f"clamp_max({' + '.join(bad_terms)}, 1) and on (namespace, deployment) "
                     f"({promql.traffic(window_s, dsel)})"),
        })
        # good evaluations / evaluations with traffic over the window (the scraper's attainment)
        records.append({"record": promql.ATTAINMENT_RECORD, "expr": f"1 - avg_over_time({bad}{{{dsel}}}[{w}])"})
        for bw in burn_windows(window_s):
            records.append({
                "record": promql.burn_rate_record(bw.seconds),
                "expr": f"avg_over_time({bad}{{{dsel}}}[{format_duration(bw.seconds)}]) / {budget:g}",
            })
    # one count per DP shard, transfer and bootstrap failures as label failure=... (promql.kv_failures)
    records.append({"record": f"{RECORD_PREFIX}:kv_transfer_failures:increase{w}",
                    "expr": promql.kv_failures(window_s, dsel)})
    for pname, q in PERCENTILES.items():
        records.append({
            "record": f"{RECORD_PREFIX}:kv_transfer_latency_seconds:{pname}",
            "expr": promql.kv_latency(q, window_s, dsel),
        })
    if load:
        for query, expr in promql.load_queries(dsel).items():
            gauge = query.removeprefix("load:").removeprefix("sglang:")
            records.append({"record": f"{RECORD_PREFIX}:role_{gauge}", "expr": expr})
    alerts: list[dict] = []
    if bad_terms:
        for pair, alert, severity in (("page", "SGLangPDErrorBudgetBurnFast", "critical"),
                                      ("ticket", "SGLangPDErrorBudgetBurnSlow", "warning")):
            wins = [bw for bw in burn_windows(window_s) if bw.pair == pair]
            cond = " and ".join(
                f"{RECORD_PREFIX}:slo_error_budget_burn_rate:{format_duration(bw.seconds)}{{{dsel}}} > {bw.threshold:g}"
                for bw in sorted(wins, key=lambda b: -b.seconds))
            long_w = format_duration(max(bw.seconds for bw in wins))
            short_w = format_duration(min(bw.seconds for bw in wins))
            alerts.append({
                "alert": alert,
                "expr": cond,
                "for": "2m" if pair == "page" else "15m",
                "labels": {"severity": severity, "slo_alert": pair},
                "annotations": {
                    "summary": f"PDDeployment {namespace}/{name} is burning its latency error budget",
                    "description": (f"Burn rate over {long_w} and {short_w} is above "
                                    f"{wins[0].threshold:g}x (objective {slo_spec.objective:g}, window {w}); "
                                    "see the SLOMet condition of the PDDeployment."),
                },
            })
    alerts.append({
        "alert": "SGLangPDKVTransferFailing",
        "expr": f"sum by (namespace, deployment) ({RECORD_PREFIX}:kv_transfer_failures:increase{w}{{{dsel}}}) > 0",
        "for": w,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"PDDeployment {namespace}/{name}: KV cache transfers are failing",
            "description": "sglang:num_transfer_failed_reqs_total or sglang:num_bootstrap_failed_reqs_total "
                           "increased on prefill or decode pods; check the transfer backend and IB devices.",
        },
    })
    interval = format_duration(min(60.0, max(15.0, window_s / 10)))
    return {"groups": [
        {"name": f"{namespace}.{name}.sglang-pd-slo", "interval": interval, "rules": records},
        {"name": f"{namespace}.{name}.sglang-pd-slo-alerts", "interval": interval, "rules": alerts},
    ]}
