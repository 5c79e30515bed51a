"""The chart's own PrometheusRule (``prometheusRule.enabled``) checked and evaluated by the REAL promtool.

Liveness means stuck, not busy (issue 29, item 2): ``SGLangPDOperatorReconcileStuck`` fires
when a reconcile has been in flight past the bound (``sglang_pd_operator_reconcile_longest_running_seconds``),
and a long backlog whose workers progress (``..._queue_oldest_age_seconds`` high, the longest
reconcile short) raises only the ``SGLangPDOperatorQueueBacklog`` warning. The series are
the operator's own metric names (``metrics/operator_metrics.py``), so a renamed metric
fails here. promtool as in ``test_promql.py``.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml
from helpers import ROOT, load_script
from test_promql import promtool  # noqa: F401 (the fixture)

from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics

pytestmark = [pytest.mark.contract, pytest.mark.timeout(900)]

cc = load_script(ROOT / "hack" / "chart_check.py", "chart_check")
JOB = "pd-sglang-pd-operator-metrics"  # the chart's metrics Service for release "pd" (what a ServiceMonitor's job is)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    objs = cc.helm_template(sets=["prometheusRule.enabled=true", "prometheusRule.stuckAfterSeconds=180",
                                  "prometheusRule.backlogSeconds=600"])
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "operator-rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def test_the_rules_name_metrics_the_operator_exports(rules):
    exported = {m.name for m in OperatorMetrics().registry.collect()}
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for rule in group["rules"]:
            names = {n for n in exported if n in rule["expr"]}
            assert names, f"{rule['alert']}: no metric of the operator in {rule['expr']}"


def test_promtool_check_rules_accepts_the_chart_rule(promtool, rules):  # noqa: F811
    proc = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_hung_reconcile_pages_and_a_progressing_backlog_only_warns(promtool, rules, tmp_path):  # noqa: F811
    hung = f'job="{JOB}",namespace="ops",pod="op-hung"'
    busy = f'job="{JOB}",namespace="ops",pod="op-busy"'
    series = [
        # op-hung: one reconcile in flight from minute 6 on, growing 60 s a minute; a short queue
        {"series": f"sglang_pd_operator_reconcile_longest_running_seconds{{{hung}}}", "values": "0x5 0+60x40"},
        {"series": f"sglang_pd_operator_queue_oldest_age_seconds{{{hung}}}", "values": "0x45"},
        # op-busy: a catalog change queued everything: the oldest key waits 20 minutes and
        # more, while no reconcile runs longer than a few seconds
        {"series": f"sglang_pd_operator_reconcile_longest_running_seconds{{{busy}}}", "values": "2x45"},
        {"series": f"sglang_pd_operator_queue_oldest_age_seconds{{{busy}}}", "values": "0+60x45"},
    ]
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "7m", "alertname": "SGLangPDOperatorReconcileStuck", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "SGLangPDOperatorReconcileStuck", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "namespace": "ops", "pod": "op-hung"},
                    "exp_annotations": {
                        "summary": "sglang-pd-operator op-hung has a reconcile stuck",
                        "description": "A reconcile has run for 6m 0s (bound 180s); the liveness probe restarts "
                                       "the pod."}}]},
                {"eval_time": "12m", "alertname": "SGLangPDOperatorQueueBacklog", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "SGLangPDOperatorQueueBacklog", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": "ops", "pod": "op-busy"},
                    "exp_annotations": {
                        "summary": "sglang-pd-operator op-busy is behind",
                        "description": "The oldest queued key has waited 25m 0s (more than 600s) while workers "
                                       "make progress; raise operator.workers if it lasts."}}]},
            ],
        }],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
