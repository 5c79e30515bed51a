"""The control loop at work on a real API server (issue 15, items 1, 2 and 4).

- Unrelated objects never reach the operator: its in-memory view
  (``sglang_pd_operator_cache_objects``) holds exactly the pods and Deployments it made,
  while pods and a Deployment without its label run beside them and churn.
- At rest the operator writes nothing, even while unrelated pods come and go.
- An edit reaches status within seconds (the watch queues the key; a resync period of
  300 s plays no part), and the work queue drains (depth 0) afterwards.

Bounds here are "works at all" bounds for a busy 2-core runner; the figures are measured
by ``benchmarks/bench_scale.py``.
"""

from __future__ import annotations

import time

import pytest
from helpers import EXAMPLES, load_example
from opkit import OperatorProcess, kapply, kget, operator_metrics, pods, ready_now, reconciles, wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = EXAMPLES / "qwen3-30b-a3b-paged-experts.yaml"
MANAGED = "app.kubernetes.io/managed-by=sglang-pd-operator"


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    # the default resync period: nothing in this module may depend on a periodic pass
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, resync=300.0,
                         log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield op
    if not op.alive():
        print(op.log_tail())
    op.stop()


def _unrelated_pod(ns: str, i: int, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"unrelated-{i}", "namespace": ns, "labels": {"app": "unrelated"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


def _sample(metrics: dict, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def test_unrelated_objects_never_reach_the_operator_and_rest_writes_nothing(cluster, operator, ns):
    doc = load_example(EXAMPLE)
    doc["metadata"]["namespace"] = ns
    doc["spec"]["decode"]["replicas"] = 1
    kapply(cluster, doc)
    name = doc["metadata"]["name"]
    wait_for(lambda: ready_now(kget(cluster, "pddeployment", name, "-n", ns)), timeout=120, what="Ready")

    node = kget(cluster, "nodes", "-l", "pd.sglang-operator.io/accelerator=l40s")["items"][0]["metadata"]["name"]
    kapply(cluster, [_unrelated_pod(ns, i, node) for i in range(40)])
    kapply(cluster, {"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "unrelated", "namespace": ns},
                     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "unrelated-dep"}},
                              "template": {"metadata": {"labels": {"app": "unrelated-dep"}},
                                           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}}})
    wait_for(lambda: len(pods(cluster, ns, "app=unrelated")) == 40, timeout=60, what="unrelated pods exist")

    def views_match():
        m = operator_metrics(operator)
        ours = len((kget(cluster, "pods", "-A", "-l", MANAGED) or {"items": []})["items"])
        deps = len((kget(cluster, "deployments", "-A", "-l", MANAGED) or {"items": []})["items"])
        got = (_sample(m, "sglang_pd_operator_cache_objects", kind="Pod"),
               _sample(m, "sglang_pd_operator_cache_objects", kind="Deployment"))
        return got if got == (ours, deps) else None

    pods_cached, deployments_cached = wait_for(views_match, timeout=30, what="the cache holds exactly our objects")
    assert pods_cached >= 3 and deployments_cached >= 3

    # at rest: unrelated churn, no write by the operator. The rest begins once the scraper's first
    # figures are in status (its second pass, ~2 intervals after Ready: a status write) and the queue drained
    wait_for(lambda: ((kget(cluster, "pddeployment", name, "-n", ns) or {}).get("status", {}).get("scrape") or {})
             .get("measuredAt"), timeout=90, what="the scraper's first figures in status")
    wait_for(lambda: _sample(operator_metrics(operator), "sglang_pd_operator_queue_depth") == 0,
             timeout=30, what="the work queue drains")
    def written() -> dict:
        return {labels: v for (n, labels), v in operator_metrics(operator).items()
                if n == "sglang_pd_operator_api_writes_total"}

    writes = written()
    cluster.kubectl("delete", "pods", "-n", ns, "-l", "app=unrelated", "--wait=false")
    kapply(cluster, [_unrelated_pod(ns, 100 + i, node) for i in range(20)])
    wait_for(lambda: len(pods(cluster, ns, "app=unrelated")) == 20, timeout=60, what="the unrelated churn is done")
    # proof the operator looked after the churn (resync 300 s here: none is due): a label of no concern on a
    # child queues the key like any change of a child; the reconcile finds nothing to write
    child = kget(cluster, "configmaps", "-n", ns, "-l", f"pd.sglang-operator.io/deployment={name}")["items"][0]
    looks = reconciles(operator, "PDDeployment", ns, name)  # before the poke: its reconcile may be done at once
    cluster.kubectl("label", "configmap", child["metadata"]["name"], "-n", ns, "poke=1", "--overwrite")
    wait_for(lambda: reconciles(operator, "PDDeployment", ns, name) > looks, timeout=60,
             what="the operator's reconcile after the poke")
    after = written()
    assert after == writes, f"writes at rest: {after} (before: {writes})\n{operator.log_tail(40)}"
    assert views_match()

    # an edit reaches status at once (not at the next resync, 300 s away)
    started = time.monotonic()
    cluster.kubectl("patch", "pddeployment", name, "-n", ns, "--type=merge",
                    "-p", '{"spec":{"gateway":{"replicas":2}}}')
    obj = wait_for(lambda: (o := kget(cluster, "pddeployment", name, "-n", ns))
                   and o["status"].get("observedGeneration") == o["metadata"]["generation"] and o,
                   timeout=30, what="status of the new generation")
    reaction = time.monotonic() - started
    assert obj["status"]["gateway"]["desired"] == 2
    assert reaction < 15, reaction
    wait_for(lambda: _sample(operator_metrics(operator), "sglang_pd_operator_queue_depth") == 0,
             timeout=30, what="the work queue drains")
    cluster.kubectl("delete", "deployment", "unrelated", "-n", ns, "--wait=false")
    cluster.kubectl("delete", "pods", "-n", ns, "-l", "app=unrelated", "--wait=false")
