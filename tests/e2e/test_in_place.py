"""In-place updates (a change that keeps the compat key) and prefill readiness, end to end.

Each test is one of issue 15's "tried as a new user would" findings, replayed against the
dev cluster with the operator as a separate process:

- an in-place config change must leave the ConfigMap the old pods mount as it was, until
  the last pod of the old template is gone;
- a prefill ``nodeSelector`` typo keeps the key, so the group updates in place; the only
  working prefill pod must keep serving while its replacement cannot schedule, the
  progress deadline must fire, and status must not call it "creating the first group";
- ``kvLayout.compressed: fp4`` on H200, which SGLang ignores, must not restart any engine;
- nor must an edit of an SLO target (the decode engines keep their histogram buckets);
- a prefill pod must not be Ready, nor registered by the real smg gateway, while its
  bootstrap port is closed. kwok does not run probes, so the pod's readiness comes from
  :class:`simkit.Prober`, which runs the probe the operator rendered (as the kubelet
  would) against an engine simulator bound to the pod IP that opens its bootstrap port
  late; a MutatingAdmissionPolicy hands the test's prefill pods to the prober.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers import EXAMPLES, load_example
from opkit import condition, kapply, kget, looked, pods, wait_for
from simkit import (
    KWOK_READY,
    Prober,
    answers,
    get_json,
    probe_policy,
    smg_binary,
    start_simulator,
    start_smg,
    wait_answering,
    with_address,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
LBL = "pd.sglang-operator.io"
NAME = "dsv41-flash"


def _doc(ns: str, *, example=None, rollout=None, **roles) -> dict:
    doc = load_example(example) if example else load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    for role in ("prefill", "decode", "gateway"):
        doc["spec"][role]["replicas"] = 1
    if rollout:
        doc["spec"]["rollout"] = rollout
    for role, extra in roles.items():
        doc["spec"][role].update(extra)
    return doc


def _pdd(cluster, ns):
    return kget(cluster, "pdd", NAME, "-n", ns) or {}


def _ready(cluster, ns):
    obj = _pdd(cluster, ns)
    c = condition(obj, "Ready")
    gen = obj.get("metadata", {}).get("generation")
    return obj if c and c["status"] == "True" and (obj.get("status") or {}).get("observedGeneration") == gen else None


def _pod_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _engine_uids(cluster, ns) -> dict[str, set[str]]:
    return {r: {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/role={r}")} for r in ("prefill", "decode")}


def test_in_place_change_that_cannot_schedule_keeps_the_only_prefill_serving(cluster, operator, ns):
    rollout = {"progressDeadline": "10s"}
    good = _doc(ns, rollout=rollout)
    kapply(cluster, good)
    key = wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")["status"]["compatKey"]
    (serving,) = pods(cluster, ns, f"{LBL}/role=prefill")
    uid = serving["metadata"]["uid"]

    # the typo: a node label no pool has; nodeSelector is not a compat input, so the group updates in place
    typo = _doc(ns, rollout=rollout, prefill={"nodeSelector": {f"{LBL}/node-pool": "gb300-typo"}})
    gone: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # the serving prefill pod must stay, and stay Ready, the whole time
        while not stop.is_set():
            found = [p for p in pods(cluster, ns, f"{LBL}/role=prefill") if p["metadata"]["uid"] == uid]
            if not found or not _pod_ready(found[0]) or found[0]["metadata"].get("deletionTimestamp"):
                gone.append(f"{time.monotonic():.1f}: {'deleted' if not found else 'not Ready or terminating'}")
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        kapply(cluster, typo)
        dep = f"{NAME}-{key[:6]}-prefill"
        wait_for(lambda: (d := kget(cluster, "deployment", dep, "-n", ns)) and d["spec"]["template"]["spec"]["nodeSelector"]
                 .get(f"{LBL}/node-pool") == "gb300-typo" and d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"],
                 timeout=30, what="the operator to apply the typo in place")
        # proof the Deployment controller acted on the new template: its surge pod exists (Pending: no node has the label)
        wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=prefill")
                          if (p["spec"].get("nodeSelector") or {}).get(f"{LBL}/node-pool") == "gb300-typo"],
                 timeout=30, what="the Deployment controller's surge pod of the new template")
        assert not gone, f"the only ready prefill pod went away before its replacement was Ready: {gone[:5]}"
        updating = wait_for(
            lambda: (o := _pdd(cluster, ns)) and (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]
            and (o["status"].get("rollout") or {}).get("phase") in ("Updating", "Failed") and o,
            timeout=30, what="an in-place update in status",
        )
        prog = condition(updating, "Progressing")
        assert "creating the first group" not in prog["message"], prog
        # the surge pod is Pending: status says it exists on the new template and is not available
        wait_for(lambda: "prefill: 1/1 on the new template, 1 of an older one still running, 1/2 available"
                 in condition(_pdd(cluster, ns), "Progressing")["message"],
                 timeout=30, what="the in-place update's line to count the Pending surge pod as not available")
        assert updating["status"]["compatKey"] == key
        failed = wait_for(
            lambda: (o := _pdd(cluster, ns)) and (o.get("status") or {}).get("rollout", {}).get("phase") == "Failed" and o,
            timeout=60, what="the progress deadline to fire for the in-place update",
        )
        prog, deg = condition(failed, "Progressing"), condition(failed, "Degraded")
        assert (prog["status"], prog["reason"]) == ("False", "ProgressDeadlineExceeded"), prog
        assert (deg["status"], deg["reason"]) == ("True", "ProgressDeadlineExceeded"), deg
        assert "cannot be scheduled" in prog["message"] and "older pods keep serving" in prog["message"], prog["message"]
        warnings = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},type=Warning")
        assert any(e["reason"] == "ProgressDeadlineExceeded" for e in warnings["items"])
        # the fix (back to the working selector) completes with the same pod still serving
        kapply(cluster, good)
        wait_for(lambda: (o := _ready(cluster, ns)) and o["status"]["rollout"]["phase"] == "Complete" and o,
                 timeout=60, what="Complete after the fix")
    finally:
        stop.set()
        watcher.join(timeout=10)
    assert not gone, f"the only ready prefill pod went away during the in-place update: {gone[:5]}"
    assert {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/role=prefill")} == {uid}


def _config_map_of(cluster, ns, deployment: str) -> str:
    tmpl = kget(cluster, "deployment", deployment, "-n", ns)["spec"]["template"]
    (name,) = [v["configMap"]["name"] for v in tmpl["spec"]["volumes"] if "configMap" in v]
    return name


def test_an_in_place_config_change_never_rewrites_the_config_old_pods_mount(cluster, operator, ns):
    """A fresh user's finding (issue 25): an in-place update rewrote the role's one ConfigMap while
    the old pods mounted it, so an old pod that restarted mid-update ran the new config. Now the
    new config is a second, immutable ConfigMap; the old one stays, unchanged, while a pod of the
    old template remains (here the surge pod cannot schedule), and is pruned once none does."""
    kapply(cluster, _doc(ns))
    key = wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")["status"]["compatKey"]
    dep = f"{NAME}-{key[:6]}-prefill"
    old_cm = _config_map_of(cluster, ns, dep)
    old_data = kget(cluster, "configmap", old_cm, "-n", ns)["data"]
    (old_pod,) = pods(cluster, ns, f"{LBL}/role=prefill")

    # a config change that keeps the key, with a node label no pool has: the surge pod stays Pending
    edited = _doc(ns, prefill={"nodeSelector": {f"{LBL}/node-pool": "gb300-typo"}})
    edited["spec"]["prefill"]["extraArgs"] = [*edited["spec"]["prefill"].get("extraArgs", []),
                                              "--max-running-requests", "64"]
    kapply(cluster, edited)
    new_cm = wait_for(lambda: (c := _config_map_of(cluster, ns, dep)) != old_cm and c, timeout=30,
                      what="the prefill template to mount a new ConfigMap")
    wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=prefill") if p["metadata"]["uid"] != old_pod["metadata"]["uid"]],
             timeout=30, what="the surge pod of the new template")
    looked(operator, "PDDeployment", ns, NAME, more=2)  # the operator reconciled with both pods there
    assert "max-running-requests: 64" in kget(cluster, "configmap", new_cm, "-n", ns)["data"]["config.yaml"]
    still = kget(cluster, "configmap", old_cm, "-n", ns)
    assert still is not None, "the ConfigMap the old pod mounts was deleted while that pod runs"
    assert still["data"] == old_data, "the ConfigMap the old pod mounts was rewritten"
    assert old_pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/role=prefill")}

    # the fix of the typo keeps the config change: the update completes, the old pod goes, then its ConfigMap
    fixed = _doc(ns)
    fixed["spec"]["prefill"]["extraArgs"] = edited["spec"]["prefill"]["extraArgs"]
    kapply(cluster, fixed)
    wait_for(lambda: (o := _ready(cluster, ns)) and o["status"]["rollout"]["phase"] == "Complete" and o,
             timeout=90, what="Complete after the fix")
    wait_for(lambda: kget(cluster, "configmap", old_cm, "-n", ns) is None, timeout=60,
             what="the old config's ConfigMap pruned once no pod of the old template remains")
    group = kget(cluster, "configmaps", "-n", ns, "-l", f"{LBL}/deployment={NAME},{LBL}/role=prefill")["items"]
    assert [c["metadata"]["name"] for c in group] == [_config_map_of(cluster, ns, dep)]


def _engine_templates(cluster, ns) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]
            for d in kget(cluster, "deployments", "-n", ns, "-l", f"{LBL}/deployment={NAME}")["items"]}


def _replica_sets(cluster, ns) -> set[str]:
    return {r["metadata"]["name"] for r in kget(cluster, "replicasets", "-n", ns)["items"]}


def test_change_sglang_ignores_restarts_no_engine(cluster, operator, ns):
    doc = _doc(ns, example=EXAMPLES / "dsv41-flash-h200-flashmla.yaml")
    kapply(cluster, doc)
    wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    before = _engine_uids(cluster, ns)
    # a Deployment's generation moves with its annotations too (the group's record of the
    # generation it was rendered from is rewritten): what restarts an engine is its pod template
    deps = _engine_templates(cluster, ns)
    replica_sets = _replica_sets(cluster, ns)
    doc["spec"]["kvLayout"]["compressed"] = "fp4"  # SGLang drops it on H200: the main KV cache is v4
    kapply(cluster, doc)
    obj = wait_for(lambda: (o := _ready(cluster, ns)) and o["metadata"]["generation"] > 1 and o,
                   timeout=60, what="the new generation Ready")
    assert any(p["field"] == "spec.kvLayout.compressed" and p["severity"] == "warning" for p in obj["status"]["problems"])
    looked(operator, "PDDeployment", ns, NAME, more=2)  # a restart would show by now
    assert _engine_templates(cluster, ns) == deps, "a pod template changed for a setting SGLang ignores"
    assert _replica_sets(cluster, ns) == replica_sets, "a new ReplicaSet was made for a setting SGLang ignores"
    assert _engine_uids(cluster, ns) == before, "engine pods were replaced for a setting SGLang ignores"


def test_an_slo_target_edit_restarts_no_engine(cluster, operator, ns):
    """A fresh user's finding (issue 25): editing only an SLO target restarted every decode engine,
    because each target is a histogram boundary in the engines' launch flags. Now the engines keep
    their buckets and status says whose targets they follow."""
    doc = _doc(ns, example=EXAMPLES / "dsv41-flash-h200-flashmla.yaml")
    kapply(cluster, doc)
    wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    before, deps, replica_sets = _engine_uids(cluster, ns), _engine_templates(cluster, ns), _replica_sets(cluster, ns)
    doc["spec"]["slo"]["ttft"] = {"p90": "700ms"}
    kapply(cluster, doc)
    obj = wait_for(lambda: (o := _ready(cluster, ns)) and o["metadata"]["generation"] > 1 and o,
                   timeout=60, what="the new generation Ready")
    held = [p for p in obj["status"].get("problems") or [] if p.get("rule") == "slo_buckets_held"]
    assert held and held[0]["field"] == "spec.slo" and "generation 1" in held[0]["message"], obj["status"].get("problems")
    looked(operator, "PDDeployment", ns, NAME, more=2)  # a restart would show by now
    assert _engine_templates(cluster, ns) == deps, "a pod template changed for an SLO target"
    assert _replica_sets(cluster, ns) == replica_sets
    assert _engine_uids(cluster, ns) == before, "engine pods were replaced for an SLO target"


def test_prefill_is_not_ready_nor_registered_until_its_bootstrap_port_listens(cluster, operator, ns, procs):
    if smg_binary() is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed: PATH, $SMG_BIN, .venv/bin, /tmp/contract-venv/bin")
    policy = probe_policy(ns, role="prefill")
    kapply(cluster, policy)
    try:
        _run_late_bootstrap(cluster, ns, procs)
    finally:
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)


def _run_late_bootstrap(cluster, ns, procs) -> None:
    delay = 20.0
    time.sleep(2)  # the API server's admission chain picks up a new policy within about a second
    kapply(cluster, _doc(ns))
    prefill = wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=prefill") if p["status"].get("podIP")],
                       timeout=60, what="a prefill pod with an IP")[0]
    assert prefill["metadata"]["annotations"].get(KWOK_READY) == "false", "the MutatingAdmissionPolicy did not apply"
    decode = wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=decode") if _pod_ready(p)],
                      timeout=60, what="a Ready decode pod")[0]
    model = _doc(ns)["spec"]["model"]
    start_simulator(procs, decode, model=model["name"], served_model_name=model["servedModelName"])
    start_simulator(procs, prefill, model=model["name"], served_model_name=model["servedModelName"],
                    extra=["--bootstrap-delay", str(delay)])
    opened_at = time.monotonic() + delay
    ip = prefill["status"]["podIP"]
    boot = prefill["metadata"]["annotations"]["sglang.ai/bootstrap-port"]
    wait_answering([f"http://{ip}:30000/health", f"http://{decode['status']['podIP']}:30000/health"])

    gw = wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=gateway") if p["status"].get("podIP")],
                  timeout=60, what="a gateway pod")[0]
    key = gw["metadata"]["labels"][f"{LBL}/compat-key"]
    dep = kget(cluster, "deployment", f"{NAME}-{key[:6]}-gateway", "-n", ns)
    args = with_address(dep["spec"]["template"]["spec"]["containers"][0]["args"], host=gw["status"]["podIP"])
    gateway = f"http://{gw['status']['podIP']}:{args[args.index('--port') + 1]}"

    with Prober(cluster.api_client(), ns) as prober:
        start_smg(procs, args, kubeconfig=cluster.kubeconfig)
        wait_answering([gateway + "/health"], timeout=30)
        samples, decode_seen = 0, False
        while time.monotonic() < opened_at - 1.5:  # the bootstrap port is closed: /health answers all along
            (pod,) = [p for p in pods(cluster, ns, f"{LBL}/role=prefill") if p["metadata"]["uid"] == prefill["metadata"]["uid"]]
            workers = get_json(gateway + "/workers")["workers"]
            assert answers(f"http://{ip}:30000/health")
            assert not answers(f"http://{ip}:{boot}/health")
            assert not _pod_ready(pod), f"prefill Ready while its bootstrap port is closed; probes: {prober.history[-3:]}"
            assert not [w for w in workers if w.get("worker_type") == "prefill"], (
                f"smg registered the prefill while its bootstrap port is closed: {workers}")
            decode_seen = decode_seen or any(w.get("worker_type") == "decode" for w in workers)
            samples += 1
            time.sleep(0.5)
        assert samples >= 5
        print(f"{samples} samples while the bootstrap port was closed; smg listed the decode: {decode_seen}")
        failed = [h for h in prober.history if h[2] == "readinessProbe" and not h[3]]
        assert failed and f":{boot}/health" in failed[-1][4], prober.history
        # once it listens: Ready within a probe period, then registered by smg
        wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/role=prefill") if _pod_ready(p)],
                 timeout=delay + 15, what="the prefill pod Ready once its bootstrap port listens")
        ready_at = time.monotonic()
        wait_for(lambda: [w for w in get_json(gateway + "/workers")["workers"] if w.get("worker_type") == "prefill"],
                 timeout=30, what="smg to register the prefill")
        registered_at = time.monotonic()
        assert ready_at >= opened_at
        print(f"prefill Ready at most {ready_at - opened_at:.1f}s after its bootstrap port opened; "
              f"smg registered it {registered_at - ready_at:.1f}s after that")
        wait_for(lambda: _ready(cluster, ns), timeout=30, what="the PDDeployment Ready")
