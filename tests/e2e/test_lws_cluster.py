"""The real LeaderWorkerSet controller in the dev cluster (issue 14, item 1).

A plain LeaderWorkerSet (size 4, 2 replicas, RecreateGroupOnPodRestart) on the fake GB300
nodes: the controller creates the leader StatefulSet, one worker StatefulSet per group and
the headless Service; its pod webhook, served on 127.0.0.1 with a certificate from the
harness CA, injects LWS_LEADER_ADDRESS / LWS_GROUP_SIZE / LWS_WORKER_INDEX and the
worker-index label; kwok runs every pod; the leader address resolves (``poddns``) to the
leader pod's IP; deleting one worker pod recreates its whole group and leaves the other
alone; and with the controller stopped, only LWS objects are refused. Waits are bounded.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess

import pytest
import yaml
from kubernetes import client as k8s
from opkit import wait_for

from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster import state, supervise

pytestmark = pytest.mark.e2e

LWS = "leaderworkerset.sigs.k8s.io"
NAME = "engine"
SIZE, REPLICAS = 4, 2


def leaderworkerset(name: str = NAME) -> dict:
    pod = {"spec": {"nodeSelector": {"pd.sglang-operator.io/accelerator": "gb300"},
                    "containers": [{"name": "engine", "image": "example.invalid/engine:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name},
            "spec": {"replicas": REPLICAS, "leaderWorkerTemplate": {
                "size": SIZE, "restartPolicy": "RecreateGroupOnPodRestart", "workerTemplate": pod}}}


def apply(cluster, namespace: str, obj: dict, *, check: bool = True) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=check)


def lws_pods(core, namespace: str, name: str = NAME) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"{LWS}/name={name}").items


def ready(pod) -> bool:
    return (pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []))


def all_running(core, namespace: str, name: str = NAME):
    pods = lws_pods(core, namespace, name)
    return len(pods) == SIZE * REPLICAS and all(ready(p) for p in pods) and pods


def groups(pods) -> dict[str, dict[str, str]]:
    """group index -> {pod name: uid}."""
    found: dict[str, dict[str, str]] = {}
    for pod in pods:
        found.setdefault(pod.metadata.labels[f"{LWS}/group-index"], {})[pod.metadata.name] = pod.metadata.uid
    return found


def test_leaderworkerset_groups_run_on_kwok_and_a_worker_loss_recreates_its_group(cluster, namespace):
    core, apps = k8s.CoreV1Api(cluster.api_client()), k8s.AppsV1Api(cluster.api_client())
    apply(cluster, namespace, leaderworkerset())
    pods = wait_for(lambda: all_running(core, namespace), timeout=90, what="8 LWS pods Running and Ready")

    # the controller's objects: leader StatefulSet, a worker StatefulSet per group owned by
    # its leader pod, the headless Service the leader address lives under
    leader_sts = apps.read_namespaced_stateful_set(NAME, namespace)
    assert leader_sts.spec.replicas == REPLICAS
    for group in range(REPLICAS):
        workers = apps.read_namespaced_stateful_set(f"{NAME}-{group}", namespace)
        assert workers.spec.replicas == SIZE - 1
        assert [(o.kind, o.name) for o in workers.metadata.owner_references] == [("Pod", f"{NAME}-{group}")]
    service = core.read_namespaced_service(NAME, namespace)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses

    # the pod webhook's work on every pod: labels and env
    network = ipaddress.ip_network(cluster.pod_network)
    by_name = {p.metadata.name: p for p in pods}
    nodes = set()
    for pod in pods:
        labels = pod.metadata.labels
        group, index = labels[f"{LWS}/group-index"], labels[f"{LWS}/worker-index"]
        expected_name = f"{NAME}-{group}" if index == "0" else f"{NAME}-{group}-{index}"
        assert pod.metadata.name == expected_name
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        leader_address = f"{NAME}-{group}.{NAME}.{namespace}"
        assert env == {"LWS_LEADER_ADDRESS": leader_address, "LWS_GROUP_SIZE": str(SIZE),
                       "LWS_WORKER_INDEX": index}, pod.metadata.name
        assert ipaddress.ip_address(pod.status.pod_ip) in network
        # no cluster DNS here: the name resolves from the API server's pods and Service
        assert cluster.resolve_pod_dns(leader_address, namespace=namespace) == by_name[f"{NAME}-{group}"].status.pod_ip
        nodes.add(pod.spec.node_name)
    assert len(nodes) == SIZE * REPLICAS, "one 4-GPU GB300 node per rank"
    assert wait_for(lambda: (o := json.loads(cluster.kubectl("get", "lws", NAME, "-n", namespace, "-o", "json").stdout))
                    .get("status", {}).get("readyReplicas") == REPLICAS and o, timeout=90, what="LWS readyReplicas 2")

    # RecreateGroupOnPodRestart: losing one worker of group 1 recreates all of group 1
    before = groups(pods)
    core.delete_namespaced_pod(f"{NAME}-1-2", namespace)

    def recreated():
        now = all_running(core, namespace)
        if not now:
            return None
        after = groups(now)
        fresh = set(after["1"].values()) & set(before["1"].values())
        return after if not fresh else None

    after = wait_for(recreated, timeout=90, what="group 1 recreated (every pod new) and Ready")
    assert after["0"] == before["0"], "group 0 was touched"
    assert sorted(after["1"]) == sorted(before["1"])


def test_a_stopped_lws_controller_refuses_only_lws_objects(cluster, namespace):
    core, apps = k8s.CoreV1Api(cluster.api_client()), k8s.AppsV1Api(cluster.api_client())
    assert devcluster.stop_lws_controller(cluster.run_dir)
    try:
        status = supervise.run_status(cluster.run_dir)
        assert status["lws"]["running"] is False and status["lws"]["serving"] is False
        assert status["stale_because"] is None, "a deliberately stopped controller leaves the run live"
        # a plain Deployment still schedules and runs: no webhook gates non-LWS pods
        plain = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "plain"},
                 "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "plain"}},
                          "template": {"metadata": {"labels": {"app": "plain"}},
                                       "spec": {"containers": [{"name": "c", "image": "example.invalid/c:1"}]}}}}
        apply(cluster, namespace, plain)
        wait_for(lambda: (apps.read_namespaced_deployment("plain", namespace).status.available_replicas or 0) == 2,
                 timeout=90, what="the plain Deployment Available with the LWS controller stopped")
        # a LeaderWorkerSet is refused (failurePolicy Fail): never admitted without defaulting
        refused = apply(cluster, namespace, leaderworkerset(), check=False)
        assert refused.returncode != 0 and "mleaderworkerset.kb.io" in refused.stderr, refused.stderr
    finally:
        devcluster.start_lws_controller(cluster.run_dir)
    assert supervise.run_status(cluster.run_dir)["lws"]["serving"]
    apply(cluster, namespace, leaderworkerset())
    wait_for(lambda: all_running(core, namespace), timeout=90, what="LWS pods Running after the controller restarted")


def test_a_cluster_without_lws_has_no_crds_webhooks_or_controller(tmp_path):
    """``start_cluster(lws=False)`` (``up --no-lws``): the cluster a test of "LWS is not
    installed" needs."""
    running = devcluster.start_cluster(run_dir=tmp_path / "run", lws=False, log=lambda line: None)
    try:
        st = state.load(running.run_dir)
        # the ComputeDomain stand-in is independent of LWS (imex_channels=True by default)
        assert [p.name for p in st.processes] == ["etcd", "kube-apiserver", "kube-controller-manager",
                                                  "kube-scheduler", "kwok", "imex-standin"]
        assert "lws-controller" not in [p.name for p in st.processes]
        missing = running.kubectl("get", "crd", "leaderworkersets.leaderworkerset.x-k8s.io", check=False)
        assert missing.returncode != 0 and "NotFound" in missing.stderr
        hooks = running.kubectl("get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-o", "name")
        assert "lws-" not in hooks.stdout
        assert "lws" not in supervise.run_status(running.run_dir)
    finally:
        running.stop(log=lambda line: None)
