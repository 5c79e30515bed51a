"""The rendered PrometheusRule checked and evaluated by the REAL promtool (Prometheus 3.16).

``promtool check rules`` parses every expression with Prometheus' own PromQL parser and
validates the rule file; ``promtool test rules`` evaluates the recording rules and alerts
on synthetic series. The second test also checks that our Python ``histogram_quantile``
gives the value Prometheus computes for the same buckets.

promtool is built from hack/promtool/go.mod by hack/promtool/build_promtool.py into a
cache (minutes on a cold Go cache, once per machine); set PROMTOOL to a prebuilt binary to
skip that. Skipped when neither Go nor PROMTOOL is available.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import promql
from sglang_pd_operator.metrics.histogram import INF, histogram_quantile
from sglang_pd_operator.metrics.monitoring import prometheus_rule_spec, render_monitoring

pytestmark = [pytest.mark.contract, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def promtool() -> Path:
    if not os.environ.get("PROMTOOL") and not shutil.which("go"):
        pytest.skip("neither PROMTOOL nor a Go toolchain is available to build promtool")
    spec = importlib.util.spec_from_file_location("build_promtool", ROOT / "hack" / "promtool" / "build_promtool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ensure_promtool(log=lambda line: print(line, flush=True))


SPECS = {
    "full": SLOSpec(ttft={"p50": "300ms", "p90": "800ms", "p99": "2s"}, itl={"p90": "40ms", "p99": "100ms"},
                    e2e={"p90": "30s"}, perUserSpeed={"p90": 20, "p50": 35.5}, window="5m", objective=0.99),
    "ttft-only": SLOSpec(ttft={"p90": "1.5s"}, window="10m", objective=0.995),
    "speed-only-short-window": SLOSpec(perUserSpeed={"p99": 8}, window="30s", objective=0.9),
}


def write_rules(tmp_path: Path, spec: SLOSpec, name: str = "dsv41", namespace: str = "team-a",
                load: bool = False) -> Path:
    objs = render_monitoring(name=name, namespace=namespace, slo_spec=spec, load=load,
                             pod_selector={"app.kubernetes.io/instance": name}, role_label="pd.sglang-operator.io/role")
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


@pytest.mark.parametrize("case", sorted(SPECS))
def test_promtool_check_rules_accepts_the_rendered_rule(promtool, tmp_path, case):
    rules = write_rules(tmp_path, SPECS[case])
    proc = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = sum(len(g["rules"]) for g in yaml.safe_load(rules.read_text())["groups"])
    assert f"SUCCESS: {n} rules found" in proc.stdout


def test_promtool_rejects_a_broken_expression(promtool, tmp_path):
    spec = prometheus_rule_spec(name="d", namespace="n", slo_spec=SPECS["ttft-only"])
    spec["groups"][0]["rules"][0]["expr"] = "histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m]))"  # no ')'
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0


def test_promtool_evaluates_percentiles_and_fires_the_fast_burn_alert(promtool, tmp_path):
    spec = SLOSpec(ttft={"p90": "800ms"}, window="5m", objective=0.99)
    rules = write_rules(tmp_path, spec, name="d", namespace="ns")
    sel = 'namespace="ns",deployment="d",role="decode",pod="decode-0"'
    # per-minute increments of the cumulative buckets: p90 rank 18 of 20 falls in (0.6, 0.8]
    increments = {"0.1": 2, "0.2": 6, "0.4": 14, "0.6": 17, "0.8": 20, "1": 20, "+Inf": 20}
    bounds = [INF if le == "+Inf" else float(le) for le in increments]
    expected_p90 = histogram_quantile(0.9, bounds, list(increments.values()))
    assert expected_p90 == pytest.approx(0.6 + 0.2 / 3)
    slow = {"0.1": 0, "0.2": 0, "0.4": 0, "0.6": 0, "0.8": 0, "1": 0, "2": 20, "+Inf": 20}   # all 1..2 s
    series = [{"series": f'sglang:time_to_first_token_seconds_bucket{{{sel},le="{le}"}}', "values": f"0+{inc}x120"}
              for le, inc in increments.items()]
    slow_sel = sel.replace('deployment="d"', 'deployment="slow"')
    series += [{"series": f'sglang:time_to_first_token_seconds_bucket{{{slow_sel},le="{le}"}}',
                "values": f"0+{inc}x120"} for le, inc in slow.items()]
    series += [{"series": f"sglang:e2e_request_latency_seconds_count{{{s}}}", "values": "0+20x120"}
               for s in (sel, slow_sel)]
    (tmp_path / "slow").mkdir()
    slow_rules = write_rules(tmp_path / "slow", spec, name="slow", namespace="ns")
    test = {
        "rule_files": [str(rules), str(slow_rules)],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": 'sglang_pd:ttft_seconds:p90{deployment="d"}', "eval_time": "20m",
                 "exp_samples": [{"labels": 'sglang_pd:ttft_seconds:p90{namespace="ns",deployment="d"}',
                                  "value": expected_p90}]},
                {"expr": "sglang_pd:slo_window_bad", "eval_time": "20m",
                 "exp_samples": [{"labels": 'sglang_pd:slo_window_bad{namespace="ns",deployment="d"}', "value": 0},
                                 {"labels": 'sglang_pd:slo_window_bad{namespace="ns",deployment="slow"}',
                                  "value": 1}]},
                # the attainment the Prometheus source reads (good evaluations over the window)
                {"expr": "sglang_pd:slo_attainment_ratio", "eval_time": "20m",
                 "exp_samples": [{"labels": 'sglang_pd:slo_attainment_ratio{namespace="ns",deployment="d"}',
                                  "value": 1},
                                 {"labels": 'sglang_pd:slo_attainment_ratio{namespace="ns",deployment="slow"}',
                                  "value": 0}]},
                # --slo-source prometheus reads every SLO record of both in one query: per deployment
                # the target's percentile, the attainment and the four burn rates
                {"expr": "count by (deployment) (" + promql.recorded_slo(promql.selector(namespace="ns")) + ")",
                 "eval_time": "20m",
                 "exp_samples": [{"labels": '{deployment="d"}', "value": 6},
                                 {"labels": '{deployment="slow"}', "value": 6}]},
            ],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "SGLangPDErrorBudgetBurnFast", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "slo_alert": "page", "namespace": "ns",
                                   "deployment": "slow"},
                    "exp_annotations": {
                        "summary": "PDDeployment ns/slow is burning its latency error budget",
                        "description": "Burn rate over 1h and 5m is above 14.4x (objective 0.99, window 5m); "
                                       "see the SLOMet condition of the PDDeployment."},
                }]},
            ],
        }],
    }
    run_rule_test(promtool, tmp_path, test)


def test_promtool_counts_a_kv_failure_once_per_dp_shard(promtool, tmp_path):
    """SGLang counts a failed request on every scheduler of its DP shard (operator/metrics/
    exposition.py): a TP4 decode shows 4 rank series. The recording rule must count each
    failure once, and a pod with only transfer failures (no bootstrap series at all, as
    SGLang creates a series at its first increment) must still fire the alert."""
    spec = SLOSpec(ttft={"p90": "800ms"}, window="5m", objective=0.99)
    rules = write_rules(tmp_path, spec, name="d", namespace="ns")
    base = 'namespace="ns",deployment="d",role="decode",pod="decode-0",engine_type="decode",pp_rank="0"'
    series = [{"series": f'sglang:num_transfer_failed_reqs_total{{{base},tp_rank="{r}",moe_ep_rank="{r}"}}',
               "values": "0+1x30"} for r in range(4)]  # one failed request a minute, seen by 4 ranks
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": "sglang_pd:kv_transfer_failures:increase5m", "eval_time": "20m",
                 "exp_samples": [{"labels": 'sglang_pd:kv_transfer_failures:increase5m'
                                            '{namespace="ns",deployment="d",failure="transfer"}', "value": 5}]},
                # what --slo-source prometheus asks: the same expression over every deployment
                {"expr": promql.kv_failures(300, ""), "eval_time": "20m",
                 "exp_samples": [{"labels": '{namespace="ns",deployment="d",failure="transfer"}', "value": 5}]},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "SGLangPDKVTransferFailing", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "namespace": "ns", "deployment": "d"},
                    "exp_annotations": {
                        "summary": "PDDeployment ns/d: KV cache transfers are failing",
                        "description": "sglang:num_transfer_failed_reqs_total or sglang:num_bootstrap_failed_reqs_total "
                                       "increased on prefill or decode pods; check the transfer backend and IB devices."},
                }]},
            ],
        }],
    }
    run_rule_test(promtool, tmp_path, test)


def test_promtool_evaluates_the_planners_load_gauges_once_per_shard(promtool, tmp_path):
    """spec.autoscaling's recording rules (promql.role_load): a TP2 prefill's waiting queue logged by both
    ranks counts once, a queue with priority scheduling counts its total (priority=""), not total +
    per-priority series, two pods add up, the KV pool fill is averaged; the operator's batched query
    gives the same per (deployment, compat_key, role)."""
    spec = SLOSpec(ttft={"p90": "800ms"}, window="5m", objective=0.99)
    rules = write_rules(tmp_path, spec, name="d", namespace="ns", load=True)
    pre = 'namespace="ns",deployment="d",role="prefill",compat_key="k1",engine_type="prefill",pp_rank="0"'
    dec = 'namespace="ns",deployment="d",role="decode",compat_key="k1",engine_type="decode",pp_rank="0"'
    series = [
        *({"series": f'sglang:num_queue_reqs{{{pre},pod="p0",tp_rank="{r}",moe_ep_rank="{r}"}}', "values": "5x10"}
          for r in range(2)),
        {"series": f'sglang:num_queue_reqs{{{pre},pod="p1",tp_rank="0",moe_ep_rank="0"}}', "values": "2x10"},
        {"series": f'sglang:num_decode_prealloc_queue_reqs{{{dec},pod="d0",tp_rank="0",moe_ep_rank="0",priority=""}}',
         "values": "3x10"},
        {"series": f'sglang:num_decode_prealloc_queue_reqs{{{dec},pod="d0",tp_rank="0",moe_ep_rank="0",priority="1"}}',
         "values": "2x10"},
        {"series": f'sglang:token_usage{{{dec},pod="d0",tp_rank="0",moe_ep_rank="0"}}', "values": "0.2x10"},
        {"series": f'sglang:token_usage{{{dec},pod="d1",tp_rank="0",moe_ep_rank="0"}}', "values": "0.6x10"},
    ]
    group = 'namespace="ns",deployment="d",compat_key="k1"'
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": "sglang_pd:role_num_queue_reqs", "eval_time": "5m", "exp_samples": [
                    {"labels": f'sglang_pd:role_num_queue_reqs{{{group},role="prefill"}}', "value": 7}]},
                {"expr": "sglang_pd:role_num_decode_prealloc_queue_reqs", "eval_time": "5m", "exp_samples": [
                    {"labels": f'sglang_pd:role_num_decode_prealloc_queue_reqs{{{group},role="decode"}}', "value": 3}]},
                {"expr": "sglang_pd:role_token_usage", "eval_time": "5m", "exp_samples": [
                    {"labels": f'sglang_pd:role_token_usage{{{group},role="decode"}}', "value": 0.4}]},
                {"expr": promql.role_load("sglang:num_queue_reqs", ""), "eval_time": "5m", "exp_samples": [
                    {"labels": f'{{{group},role="prefill"}}', "value": 7}]},
            ],
        }],
    }
    run_rule_test(promtool, tmp_path, test)


def run_rule_test(promtool: Path, tmp_path: Path, test: dict) -> None:
    """``promtool test rules`` on ``test`` (a rule test file as a dict); fails with promtool's output."""
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([str(promtool), "test", "rules", str(test_file)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def dashboard_exprs() -> list[str]:
    import json

    dash = json.loads((ROOT / "charts" / "sglang-pd-operator" / "dashboards" / "sglang-pd-slo.json").read_text())
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))
    walk(dash["panels"])
    return exprs


def test_dashboard_queries_parse(promtool):
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    for expr in exprs:
        concrete = (expr.replace("$namespace", "team-a").replace("$deployment", "dsv41")
                    .replace("$__rate_interval", "1m"))
        proc = subprocess.run([str(promtool), "--experimental", "promql", "format", concrete],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, (expr, proc.stderr)
