"""PodMonitor and PrometheusRule only where the Prometheus Operator's CRDs exist.

Without the monitoring.coreos.com kinds the operator renders and writes nothing of them
(its own write counter has no PodMonitor / PrometheusRule); once the two CRDs are
installed (minimal stand-ins in tests/e2e/fixtures/, open schema) it applies both,
owned by the PDDeployment; removing ``spec.slo`` deletes the rule, deleting the
PDDeployment lets the garbage collector take the PodMonitor. The CRDs are removed at the
end so other tests see a cluster without them.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import load_example
from opkit import OperatorProcess, condition, kapply, kget, looked, model_store, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
FIXTURES = Path(__file__).parent / "fixtures"
MONITORING_CRDS = [FIXTURES / "monitoring.coreos.com_podmonitors.yaml",
                   FIXTURES / "monitoring.coreos.com_prometheusrules.yaml"]
NAME = "mon-e2e"


@pytest.fixture
def ns(cluster, crds):
    name = f"e2e-mon-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    kapply(cluster, model_store(name))
    yield name
    cluster.kubectl("delete", "pddeployments", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "pv", f"model-store-{name}", "--wait=false", check=False)
    for crd in MONITORING_CRDS:
        cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=false", check=False)


def _writes(op: OperatorProcess) -> str:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith("sglang_pd_operator_api_writes_total"))


def test_monitoring_objects_follow_the_prometheus_operator_crds(cluster, ns, tmp_path):
    for crd in MONITORING_CRDS:  # a leftover from an interrupted run
        cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=true", check=False)
    started = time.monotonic()
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 1
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log").start()
    try:
        kapply(cluster, doc)
        obj = wait_for(lambda: (o := kget(cluster, "pddeployment", NAME, "-n", ns))
                       and (c := condition(o, "Ready")) and c["status"] == "True" and o, timeout=90, what="Ready")
        looked(op, "PDDeployment", ns, NAME, more=2)  # still nothing of the monitoring kinds
        assert cluster.kubectl("get", "podmonitors", "-n", ns, check=False).returncode != 0  # kind unknown
        writes = _writes(op)
        assert 'kind="Deployment"' in writes and "PodMonitor" not in writes and "PrometheusRule" not in writes

        for crd in MONITORING_CRDS:
            cluster.kubectl("apply", "--server-side", "-f", str(crd))
        cluster.kubectl("wait", "--for=condition=Established", "crd/podmonitors.monitoring.coreos.com",
                        "crd/prometheusrules.monitoring.coreos.com", "--timeout=60s")
        t_crds = time.monotonic()
        pm = wait_for(lambda: kget(cluster, "podmonitor", NAME, "-n", ns), timeout=40, what="PodMonitor")
        rule = wait_for(lambda: kget(cluster, "prometheusrule", NAME, "-n", ns), timeout=10, what="PrometheusRule")
        print(f"PodMonitor and PrometheusRule {time.monotonic() - t_crds:.1f}s after the CRDs were installed")
        uid = obj["metadata"]["uid"]
        for o in (pm, rule):
            (ref,) = o["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("PDDeployment", NAME, uid, True)
        assert pm["spec"]["selector"]["matchLabels"] == {"pd.sglang-operator.io/deployment": NAME,
                                                         "app.kubernetes.io/managed-by": "sglang-pd-operator"}
        assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["http", "metrics"]
        records = {r.get("record") for g in rule["spec"]["groups"] for r in g["rules"]}
        assert {"sglang_pd:ttft_seconds:p90", "sglang_pd:itl_seconds:p90"} <= records
        # unchanged: applied once, not every resync
        before = _writes(op)
        looked(op, "PDDeployment", ns, NAME, more=2)
        assert _writes(op) == before

        # spec.slo removed: the rule goes, the PodMonitor stays
        cluster.kubectl("patch", "pdd", NAME, "-n", ns, "--type=merge", "-p", '{"spec":{"slo":null}}')
        wait_for(lambda: kget(cluster, "prometheusrule", NAME, "-n", ns) is None, timeout=30, what="rule deleted")
        assert kget(cluster, "podmonitor", NAME, "-n", ns) is not None
    finally:
        op.stop()
    # the PDDeployment goes: the garbage collector takes its PodMonitor
    cluster.kubectl("delete", "pdd", NAME, "-n", ns)
    wait_for(lambda: kget(cluster, "podmonitor", NAME, "-n", ns) is None, timeout=60, what="PodMonitor collected")
    print(f"test took {time.monotonic() - started:.1f}s")
