"""Replicas spanning nodes (issue 14): render, kernel gate, observe and status, the reconcile without LWS.

No cluster: the examples ``dsv41-flash-gb300-wide-ep.yaml`` (DEP64 decode on 16 nodes, a
single-node prefill: the mix) and ``dsv41-flash-gb300-multi-node.yaml`` (both roles
across nodes) are planned and rendered; LeaderWorkerSets with the status LWS writes are
observed through an in-memory stand-in of ``Kube``. The e2e tests
(tests/e2e/test_multinode.py) run the same against a real API server and the real LWS
controller.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers import EXAMPLES, MemoryKube, load_example

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api import lws
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.runtime.controller import Controller, LoopSettings
from sglang_pd_operator.kernelbuild.gate import KernelGateState, apply_kernel_gate, gate_objects
from sglang_pd_operator.kernelbuild.inputs import kernel_build_inputs
from sglang_pd_operator.metrics.scraper import deployment_targets
from sglang_pd_operator.oracle.judge import expand_refs, pod_launches
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.planning.rollout import RolloutDecision
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.runtime.cache import ObjectCache, watched_kind
from sglang_pd_operator.reconcilers.kube import Kube
from sglang_pd_operator.reconcilers.observe import lws_state, observe
from sglang_pd_operator.reconcilers.runtime import KernelBuildRuntime, Runtime
from sglang_pd_operator.render import render_all
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render.engine import memory_request_bytes, split_config
from sglang_pd_operator.render.gateway import gateway_args
from sglang_pd_operator.render.multinode import WAIT_FOR_LEADER

WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"
MULTI_NODE = EXAMPLES / "dsv41-flash-gb300-multi-node.yaml"
OWNER = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment", "name": "x", "uid": "u1"}


def _plan(catalog, path=WIDE_EP, doc: dict | None = None):
    plan = build_plan(parse_pddeployment(doc or load_example(path)), catalog)
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def _objects(plan) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render_all(plan, owner=OWNER)}


def _name(plan, role: str) -> str:
    return L.group_object_name(plan.name, plan.compat_key, role)


# --------------------------------------------------------------------------- render


def test_a_multi_node_role_is_one_leader_worker_set_and_a_single_node_role_keeps_its_deployment(catalog):
    plan = _plan(catalog)
    objs = _objects(plan)
    lws_obj = objs[(lws.KIND, _name(plan, "decode"))]
    assert (lws.KIND, _name(plan, "prefill")) not in objs and ("Deployment", _name(plan, "decode")) not in objs
    assert objs[("Deployment", _name(plan, "prefill"))]["spec"]["replicas"] == 1
    spec = lws_obj["spec"]
    assert lws_obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert spec["replicas"] == 1  # the role's replicas are groups
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["leaderWorkerTemplate"]["size"] == 16
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate",
                                       "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0}}
    assert lws_obj["metadata"]["labels"][L.LABEL_ROLE] == "decode"
    assert lws_obj["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_leader_and_worker_templates_differ_in_the_readiness_probe_only(catalog):
    plan = _plan(catalog, MULTI_NODE)
    objs = _objects(plan)
    for role in ("prefill", "decode"):
        lwt = objs[(lws.KIND, _name(plan, role))]["spec"]["leaderWorkerTemplate"]
        leader, worker = copy.deepcopy(lwt["leaderTemplate"]), copy.deepcopy(lwt["workerTemplate"])
        lp = leader["spec"]["containers"][0].pop("readinessProbe")
        wp = worker["spec"]["containers"][0].pop("readinessProbe")
        assert leader == worker, role
        assert wp["httpGet"]["path"] == "/health"  # the worker's stand-in opens once its schedulers are ready
        if role == "prefill":  # the leader runs the bootstrap server: the combined exec probe
            assert "exec" in lp and str(plan.spec.disaggregation.bootstrapPort) in lp["exec"]["command"]
        else:
            assert lp == wp


def test_every_rank_runs_the_same_arguments_with_its_own_node_rank(catalog):
    plan = _plan(catalog, MULTI_NODE)
    objs = _objects(plan)
    lwt = objs[(lws.KIND, _name(plan, "prefill"))]["spec"]["leaderWorkerTemplate"]
    container = lwt["workerTemplate"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):20000"
    env = {e["name"]: e for e in container["env"]}
    assert env["SGLANG_HOST_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # the config file holds what needs no expansion; the kubelet expands $(VAR) in args only
    config, cli = split_config(list(plan.prefill.command.args))
    assert config["nnodes"] == 2 and "node-rank" not in config and "dist-init-addr" not in config
    assert "--node-rank" in cli
    # one GPU per rank: the node's 4 GPUs per pod, and the NIC mapping of all 4 on every rank
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    # each GPU its own NUMA-local NIC (the catalog's GB300 rails), in the one template every rank runs
    assert config["disaggregation-ib-device"] == '{"0":"mlx5_0","1":"mlx5_1","2":"mlx5_2","3":"mlx5_3"}'
    # the same bootstrap port everywhere (only node 0 listens on it)
    port = str(plan.spec.disaggregation.bootstrapPort)
    for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        assert t["metadata"]["annotations"][L.ANNOTATION_BOOTSTRAP_PORT] == port
        assert t["spec"]["initContainers"][0]["name"] == WAIT_FOR_LEADER


def test_the_oracle_expands_each_pod_like_the_kubelet(catalog):
    assert expand_refs("$(A):1 $$(A) $(B) $x", {"A": "h"}) == "h:1 $(A) $(B) $x"
    plan = _plan(catalog, MULTI_NODE)
    pods = pod_launches(plan, plan.decode)
    assert len(pods) == 4
    for k, pod in enumerate(pods):
        args = pod["args"]
        assert args[args.index("--node-rank") + 1] == str(k)
        assert args[args.index("--dist-init-addr") + 1] == "127.0.0.1:20000"
        assert pod["env"]["SGLANG_HOST_IP"] == f"127.0.0.{k + 1}"
    assert len(pod_launches(plan, _plan(catalog).prefill)) == 1


def test_the_group_service_publishes_not_ready_pods_under_the_lws_name(catalog):
    plan = _plan(catalog)
    objs = _objects(plan)
    svc = objs[("Service", _name(plan, "decode"))]
    assert svc["spec"]["publishNotReadyAddresses"] is True and svc["spec"]["clusterIP"] == "None"
    assert "publishNotReadyAddresses" not in objs[("Service", _name(plan, "prefill"))]["spec"]
    # LWS creates the subdomain Service as its controller when it finds none: ours claims no control
    assert svc["metadata"]["ownerReferences"][0]["controller"] is False
    assert objs[("Service", _name(plan, "prefill"))]["metadata"]["ownerReferences"][0]["controller"] is True
    # and comes before the LeaderWorkerSet, so LWS finds it
    order = [(o["kind"], o["metadata"]["name"]) for o in render_all(plan, owner=OWNER)]
    assert order.index(("Service", _name(plan, "decode"))) < order.index((lws.KIND, _name(plan, "decode")))


def test_the_gateway_selects_leaders_of_multi_node_roles_only(catalog):
    plan = _plan(catalog)
    args = gateway_args(plan)
    prefill = args[args.index("--prefill-selector") + 1:args.index("--decode-selector")]
    decode = args[args.index("--decode-selector") + 1:args.index("--policy")]
    assert "leaderworkerset.sigs.k8s.io/worker-index=0" in decode
    assert not any("worker-index" in s for s in prefill)  # a single-node prefill: every pod serves


def test_pods_are_sized_per_node_and_kernel_builds_per_pod(catalog):
    plan = _plan(catalog)
    objs = _objects(plan)
    decode = memory_request_bytes(objs[(lws.KIND, _name(plan, "decode"))])
    prefill = memory_request_bytes(objs[("Deployment", _name(plan, "prefill"))])
    assert decode == prefill  # 4 GPUs on each pod of either role
    build = kernel_build_inputs(plan, "decode")
    assert build.spec.gpus == 4
    assert "--node-rank" not in build.spec.args and "--dist-init-addr" not in build.spec.args
    assert "--nnodes" in build.spec.args


def test_the_kernel_gate_mounts_the_cache_in_leader_and_workers_or_holds_the_groups_at_zero(catalog):
    plan = _plan(catalog)
    obj = _objects(plan)[(lws.KIND, _name(plan, "decode"))]
    ready = KernelGateState(role="decode", mode="auto", state="Ready", build_name="b", pvc_name="pvc",
                            path="p/q", digest="d1", complete=True)
    mounted = apply_kernel_gate(obj, ready)
    for t in lws.pod_templates(mounted):
        assert {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": "pvc", "readOnly": True}} \
            in t["spec"]["volumes"]
        assert t["metadata"]["annotations"]["pd.sglang-operator.io/kernel-cache-digest"] == "d1"
    blocked = KernelGateState(role="decode", mode="auto", state="Building", build_name="b")
    (held,) = gate_objects([obj], {"decode": blocked})
    assert held["spec"]["replicas"] == 0


def test_a_change_of_nodes_starts_a_new_group_and_single_node_keys_are_unchanged(catalog):
    doc = load_example(MULTI_NODE)
    key = _plan(catalog, doc=doc).compat_key
    doc["spec"]["decode"]["parallelism"] = {"tp": 32, "dp": 32, "ep": 32, "dpAttention": True, "nodes": 8}
    assert _plan(catalog, doc=doc).compat_key != key
    single = load_example(EXAMPLES / "dsv41-flash-gb300-throughput-dep.yaml")
    assert "nodes" not in _plan(catalog, doc=single).decode.compat_inputs["pairShape"]["decode"]


# --------------------------------------------------------------------------- observe and status


def _pod(name: str, labels: dict, *, ready: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "status": {"phase": "Running", "podIP": "127.0.0.9",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _with_status(obj: dict, **status: Any) -> dict:
    obj = copy.deepcopy(obj)
    obj["metadata"]["generation"] = 1
    obj["status"] = {"observedGeneration": 1, **status}
    return obj


def _group(plan, *, ready_groups: int, ready_pods: int) -> MemoryKube:
    objs = _objects(plan)
    decode = _with_status(objs[(lws.KIND, _name(plan, "decode"))], replicas=1, readyReplicas=ready_groups,
                          updatedReplicas=1)
    prefill = _with_status(objs[("Deployment", _name(plan, "prefill"))], replicas=1, readyReplicas=1,
                           updatedReplicas=1, availableReplicas=1)
    labels = dict(decode["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"])
    pods = [_pod(f"d-{i}", {**labels, lws.LABEL_WORKER_INDEX: str(i), lws.LABEL_GROUP_INDEX: "0"}, ready=i < ready_pods)
            for i in range(16)]
    for i, pod in enumerate(pods):
        pod["spec"] = {"nodeName": f"gb300-{i}"}
    # GB300: the group's IMEX channels come from its ComputeDomain, every node of it Ready (issue 27)
    domain = _with_status(objs[(cd.KIND, cd.group_domain_name(_name(plan, "decode"), 0))], status="Ready",
                          nodes=[{"name": f"gb300-{i}", "cliqueID": "c.0", "index": i, "status": "Ready"}
                                 for i in range(16)])
    return MemoryKube([decode, prefill, domain, *pods])


def test_a_replica_is_ready_only_when_its_whole_group_is_and_pods_are_counted(catalog):
    plan = _plan(catalog)
    state = lws_state(_group(plan, ready_groups=1, ready_pods=16).objects[(lws.KIND, _name(plan, "decode"))])
    assert (state.desired, state.ready, state.pods_per_replica, state.gpus_per_pod) == (1, 1, 16, 64)
    for ready_groups, ready_pods in ((0, 15), (1, 16)):
        kube = _group(plan, ready_groups=ready_groups, ready_pods=ready_pods)
        obs = observe(kube, name=plan.name, namespace=plan.namespace, lws_served=True, cd_served=True)
        decode = obs.groups[plan.compat_key].workloads["decode"]
        assert decode.ready_all is bool(ready_groups)
        assert (decode.pods_ready, decode.pods_total) == (ready_pods, 16)
        decision = RolloutDecision(serving_key=plan.compat_key, apply_target=True, target_to_zero=False,
                                   delete_keys=(), phase="Complete", phase_started=0.0, draining_key=None,
                                   drain_started=None, message="")
        status = S.valid_status(previous={}, generation=1, problems=[], observed=obs, decision=decision,
                                target_key=plan.compat_key, kv_layouts={}, attention_backends={}, endpoint="e",
                                now=0.0)
        assert status["decode"]["replicas"] == f"{ready_groups}/1"
        assert status["decode"]["pods"] == f"{ready_pods}/16" and status["decode"]["nodesPerReplica"] == 16
        assert status["prefill"]["nodesPerReplica"] == 1
    # without the LWS API nothing of it is listed (the kind does not exist)
    assert "decode" not in observe(kube, name=plan.name, namespace=plan.namespace).groups[plan.compat_key].workloads


def test_every_rank_of_the_serving_group_is_scraped(catalog):
    plan = _plan(catalog)
    kube = _group(plan, ready_groups=1, ready_pods=16)
    pods = [o for (k, _), o in kube.objects.items() if k == "Pod"]
    body = {"metadata": {"name": plan.name, "namespace": plan.namespace}}
    targets = deployment_targets(body, pods, serving_key=plan.compat_key)
    assert len([t for t in targets.pods if t.role == "decode"]) == 16  # workers export their schedulers' metrics


def _body(path=WIDE_EP) -> dict:
    doc = load_example(path)
    doc["metadata"].update(uid="u1", generation=1)
    return doc


def test_without_lws_a_multi_node_spec_creates_nothing_and_says_what_to_install(catalog):
    kube = MemoryKube()
    outcome = P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, lws_served=False)
    assert outcome.valid and kube.applied == []
    conds = {c["type"]: c for c in kube.status[-1]["conditions"]}
    assert conds["Valid"]["status"] == "True"
    for t in ("Reconciled", "Ready", "Progressing"):
        assert (conds[t]["status"], conds[t]["reason"]) == ("False", "LeaderWorkerSetMissing")
    message = conds["Reconciled"]["message"]
    assert "leaderworkerset.x-k8s.io/v1" in message and "v0.9.0" in message and "decode nodes 16" in message
    assert [r for r, _ in kube.events] == ["LeaderWorkerSetMissing"]
    # the next reconcile writes nothing new and warns no more
    body = _body()
    body["status"] = kube.status[-1]
    writes = kube.total_writes
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1010.0, lws_served=False)
    assert kube.total_writes == writes and len(kube.events) == 1


def test_with_lws_the_group_is_applied_and_a_single_node_spec_needs_none(catalog):
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, lws_served=True, cd_served=True)
    assert lws.KIND in {o["kind"] for o in kube.applied}
    single = MemoryKube()
    P.reconcile(kube=single, body=_body(EXAMPLES / "dsv41-flash-gb300-throughput-dep.yaml"), catalog=catalog,
                now=1000.0, lws_served=False)
    assert {o["kind"] for o in single.applied} >= {"Deployment", "Service", "ConfigMap"}


def _controller() -> tuple[Controller, Kube, Runtime]:
    """The control loop on a Kube with an object cache and no API server."""
    kube = Kube(api_client=None, cache=ObjectCache())  # type: ignore[arg-type]
    runtime = Runtime(kube=kube)
    kbs = KernelBuildRuntime(kube=kube, catalog=runtime.catalog, in_use=lambda ns: None)
    return Controller(runtime=runtime, kernelbuilds=kbs, kube=kube, settings=LoopSettings()), kube, runtime


def test_the_loop_lists_an_optional_kind_only_while_it_is_served(monkeypatch):
    c, kube, runtime = _controller()
    watched = watched_kind(lws.API_VERSION, lws.KIND)
    assert watched is not None and watched.optional
    watched_lists = []
    monkeypatch.setattr(kube, "list_kind", lambda w, ns, listed=None: watched_lists.append(w.kind) or [])
    monkeypatch.setattr(runtime, "kinds_served", lambda av: frozenset())
    assert c.sync_kind(watched) == [] and watched_lists == []
    assert not kube.cache.synced(lws.API_VERSION, lws.KIND)
    monkeypatch.setattr(runtime, "kinds_served", lambda av: frozenset({lws.KIND}))
    c.sync_kind(watched)
    assert watched_lists == [lws.KIND] and kube.cache.synced(lws.API_VERSION, lws.KIND)


@pytest.mark.parametrize("path", [WIDE_EP, MULTI_NODE], ids=["wide-ep", "multi-node"])
def test_multi_node_examples_fit_the_name_limit(path):
    from sglang_pd_operator.api.crd import MAX_MULTI_NODE_NAME_LENGTH

    assert len(load_example(path)["metadata"]["name"]) <= MAX_MULTI_NODE_NAME_LENGTH


def test_a_leader_worker_set_event_queues_its_pddeployment(catalog):
    c, _, _ = _controller()
    plan = _plan(catalog)
    obj = _with_status(_objects(plan)[(lws.KIND, _name(plan, "decode"))], replicas=1, readyReplicas=0)
    obj["metadata"].update(namespace="inference", resourceVersion="7")
    watched = watched_kind(lws.API_VERSION, lws.KIND)
    assert c.observe(watched, {"type": "ADDED", "object": obj}) == [("PDDeployment", "inference", plan.name)]
    obj["metadata"]["resourceVersion"], obj["status"]["readyReplicas"] = "8", 1  # the group turned Ready
    assert c.observe(watched, {"type": "MODIFIED", "object": obj}) == [("PDDeployment", "inference", plan.name)]


def test_a_kind_that_appears_after_start_is_listed_and_watched_and_every_pddeployment_queued(monkeypatch):
    c, kube, runtime = _controller()
    served = frozenset()
    monkeypatch.setattr(runtime, "kinds_served", lambda av: served)
    monkeypatch.setattr(kube, "list_kind", lambda w, ns, listed=None: [])
    c.cache.upsert({"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
                    "metadata": {"name": "d", "namespace": "ns", "uid": "u", "resourceVersion": "1"}})
    c._poll_unwatched(now=100.0)
    assert c.queue.get(timeout=0) is None  # not served: nothing to do
    served = frozenset({lws.KIND})
    c._poll_unwatched(now=105.0)
    assert c.queue.get(timeout=0) is None  # the next poll is due 10 s after the last one
    c._poll_unwatched(now=111.0)
    assert c.queue.get(timeout=0) == ("PDDeployment", "ns", "d")
    assert kube.cache.synced(lws.API_VERSION, lws.KIND)
