"""Issue 16's acceptance end to end: per-role scale targets and the built-in SLO planner.

On the local control plane, a PDDeployment (Qwen3-30B-A3B with Paged Experts on L40S:
one GPU per engine pod, so 16 fit) leaves both roles' counts to their PDRoleScales. Every
engine pod gets an engine simulator with the load model (tools/engine_simulator/load.py:
one prefill forward at a time, decode steps that slow with the batch) started as the pod
appears (``SimulatorFleet``), and is Ready only once its rendered probes pass against it
(``Prober``), as a kubelet would decide. The REAL smg gateway runs on the gateway pod's
address with the operator's rendered arguments and discovers the pods through the API
server; the load comes from tools/loadgen.py ``--trace`` (open loop) through smg. The
operator runs as a process with ``--slo-interval 2``.

1. TTFT-bound step: 2 -> 15 requests/s of 8 tokens overloads the one prefill (about 12/s):
   prefill queues, decode's transfer queue fills, TTFT p90 goes over target; the planner
   scales prefill (not decode), and SLOMet is True again within :data:`MET_AGAIN_S` of the
   scale-up (stated bound: a pod's start and probes, the backlog's drain, one SLO window,
   two scrape intervals). Step down to 2/s: prefill goes back to one replica, not before
   the scale-down stabilization.
2. ITL-bound: 6 requests/s of 96 tokens are more than one decode's batch can carry (each
   step slows by a quarter per running request): its ITL grows; the planner scales decode,
   never prefill (whose queue stays short).
3. ``kubectl scale`` on the PDRoleScale moves the role; an autoscaling/v2 HPA pointed at it is
   accepted, reads its scale and selector (HPA status: currentReplicas, AbleToScale, no
   InvalidSelector) and scales it to its minReplicas; the planner steps aside for it.
4. A rollout (new compat key) in the middle of scaling keeps the count on both groups and
   every gateway selects exactly one key (the Watcher of test_rollout.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES
from opkit import OperatorProcess, condition, kapply, kget, looked, pods, wait_for
from simkit import (
    KWOK_READY,
    LOADGEN,
    Prober,
    SimulatorFleet,
    get_json,
    probe_policy,
    smg_binary,
    start_smg,
    wait_answering,
    with_address,
)
from test_rollout import Watcher

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
LBL = "pd.sglang-operator.io"
INTERVAL = 2.0
WINDOW_S = 20.0
UP_STAB_S, DOWN_STAB_S = 4.0, 20.0
TTFT_TARGET, ITL_TARGET = 0.6, 0.030
#: Stated bound: SLOMet True again at most this long after the planner's scale-up (pod start and
#: probes ~12 s, the backlog drains in a few seconds, one SLO window 20 s, two intervals 4 s).
MET_AGAIN_S = 60.0
SIM = ["--load-model", "--prefill-median", "0.08", "--prefill-sigma", "0.2", "--prefill-slots", "1",
       "--kv-transfer-ms-median", "5", "--itl-median", "0.008", "--itl-sigma", "0.1", "--itl-batch-slope", "0.25",
       "--max-running", "256", "--ttft-median", "0.05"]


@pytest.fixture(scope="module")
def op(cluster, crds, tmp_path_factory):
    o = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path_factory.mktemp("op") / "operator.log",
                        extra_args=["--slo-interval", str(INTERVAL)]).start()
    yield o
    if not o.alive():
        print(o.log_tail(80))
    o.stop()


def _doc(ns: str, name: str, *, autoscaling: dict | None = None) -> dict:
    doc = yaml.safe_load((EXAMPLES / "qwen3-30b-a3b-paged-experts.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    spec = doc["spec"]
    spec["transfer"] = {"backend": "mooncake", "forceTCP": True}  # no RDMA device per pod: 16 pods fit
    for role in ("prefill", "decode"):
        spec[role].pop("replicas", None)
    spec["gateway"]["replicas"] = 1
    spec["slo"] = {"ttft": {"p90": f"{TTFT_TARGET * 1000:.0f}ms"}, "itl": {"p90": f"{ITL_TARGET * 1000:.0f}ms"},
                   "window": f"{WINDOW_S:.0f}s"}
    if autoscaling is not None:
        spec["autoscaling"] = autoscaling
    return doc


def _status(obj, type_: str) -> str | None:
    """The status of condition ``type_`` (None before the operator wrote it)."""
    return (condition(obj, type_) or {}).get("status")


def _pdd(cluster, ns, name):
    return kget(cluster, "pdd", name, "-n", ns)


def _count(cluster, ns, name, role) -> int | None:
    obj = kget(cluster, "pdrs", f"{name}-{role}", "-n", ns)
    return None if obj is None else obj["spec"].get("replicas")


def _events(cluster, ns, name, reason):
    got = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={name},reason={reason}")
    return [e["message"] for e in (got or {}).get("items", [])]


def _load(out: Path, gateway: str, model: str, trace: str, max_tokens: int) -> subprocess.Popen:
    argv = [sys.executable, str(LOADGEN), "--url", gateway, "--model", model, "--trace", trace,
            "--max-tokens", str(max_tokens), "--completions", "--out", str(out), "--timeout", "60"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=out.parent,
                            env={"PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin"})


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _gateway(cluster, ns, name, procs) -> str:
    """smg with the operator's rendered arguments on the gateway pod's address; its URL."""
    gw = wait_for(lambda: [p for p in pods(cluster, ns, f"{LBL}/deployment={name},{LBL}/role=gateway")
                           if p["status"].get("podIP")], timeout=60, what="a gateway pod")[0]
    key = gw["metadata"]["labels"][f"{LBL}/compat-key"]
    dep = kget(cluster, "deployment", f"{name}-{key[:6]}-gateway", "-n", ns)
    args = with_address(dep["spec"]["template"]["spec"]["containers"][0]["args"], host=gw["status"]["podIP"])
    url = f"http://{gw['status']['podIP']}:{args[args.index('--port') + 1]}"
    start_smg(procs, args, kubeconfig=cluster.kubeconfig, name=f"smg-{name}")
    wait_answering([url + "/health"], timeout=30)
    return url


def _registered(gateway: str, prefill: int, decode: int) -> bool:
    stats = get_json(gateway + "/workers")["stats"]
    return stats["prefill_count"] == prefill and stats["decode_count"] == decode


def test_planner_scales_the_role_the_signals_point_to(cluster, op, ns, procs, tmp_path):
    if smg_binary() is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed")
    name = "auto"
    policy = probe_policy(ns, role=("prefill", "decode"))
    kapply(cluster, policy)
    time.sleep(2)  # the admission chain picks a new policy up within about a second
    doc = _doc(ns, name, autoscaling={"prefill": {"minReplicas": 1, "maxReplicas": 3},
                                      "decode": {"minReplicas": 1, "maxReplicas": 3}, "maxGPUs": 8,
                                      "scaleUpStabilization": f"{UP_STAB_S:.0f}s",
                                      "scaleDownStabilization": f"{DOWN_STAB_S:.0f}s"})
    model, served = doc["spec"]["model"]["name"], doc["spec"]["model"]["servedModelName"]
    timeline: list[str] = []
    t_start = time.monotonic()

    def note(text: str) -> None:
        timeline.append(f"{time.monotonic() - t_start:6.1f}s {text}")
        print(timeline[-1], flush=True)

    try:
        with SimulatorFleet(cluster.api_client(), procs, ns, name, model=model, served_model_name=served,
                            extra=SIM), Prober(cluster.api_client(), ns):
            kapply(cluster, doc)
            wait_for(lambda: (o := _pdd(cluster, ns, name)) and _status(o, "Ready") == "True",
                     timeout=120, what="Ready")
            assert (_count(cluster, ns, name, "prefill"), _count(cluster, ns, name, "decode")) == (1, 1)
            gateway = _gateway(cluster, ns, name, procs)
            wait_for(lambda: _registered(gateway, 1, 1), timeout=60, what="smg registered 1 prefill + 1 decode")
            note("ready: 1 prefill, 1 decode")

            # ---- 1. TTFT-bound step up
            load = _load(tmp_path / "step.json", gateway, served, "0:2,20:2,20:15,400:15", 8)
            try:
                wait_for(lambda: _status(_pdd(cluster, ns, name), "SLOMet") == "True", timeout=60,
                         what="SLOMet True at 2 req/s")
                note("SLOMet True at 2 req/s")
                obj = wait_for(lambda: (o := _pdd(cluster, ns, name)) and _status(o, "SLOMet") == "False"
                               and o, timeout=60, interval=0.5, what="SLOMet False after the step")
                note(f"SLOMet False: {condition(obj, 'SLOMet')['message']}")
                wait_for(lambda: (_count(cluster, ns, name, "prefill") or 0) >= 2, timeout=60, interval=0.5,
                         what="the planner scales prefill")
                t_scaled = time.monotonic()
                obj = _pdd(cluster, ns, name)
                note(f"prefill scaled to {_count(cluster, ns, name, 'prefill')}: "
                     f"{obj['status']['autoscaling'].get('lastDecision')}")
                assert _count(cluster, ns, name, "decode") == 1, "a TTFT breach from prefill queueing scaled decode"
                scaled = _events(cluster, ns, name, "PlannerScaled")
                assert scaled and "prefill 1 ->" in scaled[0] and "ttft p90" in scaled[0], scaled
                wait_for(lambda: _status(_pdd(cluster, ns, name), "SLOMet") == "True",
                         timeout=MET_AGAIN_S + 30, interval=0.5, what="SLOMet True again")
                met_again = time.monotonic() - t_scaled
                note(f"SLOMet True again {met_again:.1f}s after the scale-up (bound {MET_AGAIN_S:.0f}s)")
                assert met_again <= MET_AGAIN_S
                assert _count(cluster, ns, name, "decode") == 1
            finally:
                _stop(load)
            peak_prefill = _count(cluster, ns, name, "prefill")

            # ---- 1b. step down: back to one prefill, after the stabilization window
            t_down = time.monotonic()
            load = _load(tmp_path / "down.json", gateway, served, "0:2,400:2", 8)
            try:
                wait_for(lambda: _count(cluster, ns, name, "prefill") == 1, timeout=DOWN_STAB_S * peak_prefill + 90,
                         interval=0.5, what="prefill back to 1")
                down_after = time.monotonic() - t_down
                note(f"prefill back to 1 {down_after:.1f}s after the step down "
                     f"(scale-down stabilization {DOWN_STAB_S:.0f}s)")
                assert down_after >= DOWN_STAB_S
                assert _count(cluster, ns, name, "decode") == 1
            finally:
                _stop(load)

            # ---- 2. ITL-bound: decode scales, prefill does not
            wait_for(lambda: _registered(gateway, 1, 1), timeout=60, what="smg lists 1 prefill + 1 decode")
            load = _load(tmp_path / "itl.json", gateway, served, "0:6,400:6", 96)
            prefill_seen = set()
            try:
                def decode_scaled():
                    prefill_seen.add(_count(cluster, ns, name, "prefill"))
                    return (_count(cluster, ns, name, "decode") or 0) >= 2

                wait_for(decode_scaled, timeout=120, interval=0.5, what="the planner scales decode")
                obj = _pdd(cluster, ns, name)
                note(f"decode scaled to {_count(cluster, ns, name, 'decode')}: "
                     f"{obj['status']['autoscaling'].get('lastDecision')}")
                assert "decode 1 ->" in obj["status"]["autoscaling"]["lastDecision"]
                assert "itl p90" in obj["status"]["autoscaling"]["lastDecision"]
                wait_for(lambda: _status(_pdd(cluster, ns, name), "SLOMet") == "True",
                         timeout=MET_AGAIN_S + 30, interval=0.5, what="SLOMet True with more decode")
                prefill_seen.add(_count(cluster, ns, name, "prefill"))
                note(f"SLOMet True with decode {_count(cluster, ns, name, 'decode')}, prefill {prefill_seen}")
                assert prefill_seen == {1}, f"an ITL-bound load scaled prefill: {prefill_seen}"
            finally:
                _stop(load)
            obj = _pdd(cluster, ns, name)
            assert obj["status"]["autoscaling"]["planner"] == "Active"
            used, budget = obj["status"]["autoscaling"]["gpus"].split("/")
            assert int(used) <= int(budget)
    finally:
        print("\n".join(["timeline:", *timeline]))
        for reason in ("PlannerScaled", "PlannerBlocked"):
            for message in _events(cluster, ns, name, reason):
                print(f"event {reason}: {message}")
        print("status.autoscaling:", json.dumps((_pdd(cluster, ns, name) or {}).get("status", {}).get("autoscaling"),
                                                indent=1))
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)


def test_kubectl_scale_and_an_hpa_drive_the_per_role_object(cluster, op, ns):
    name = "manual"
    kapply(cluster, _doc(ns, name, autoscaling={"decode": {"minReplicas": 1, "maxReplicas": 4}}))
    wait_for(lambda: (o := _pdd(cluster, ns, name)) and _status(o, "Ready") == "True", timeout=90,
             what="Ready")
    scale = kget(cluster, "pdrs", f"{name}-prefill", "-n", ns)
    assert scale["spec"]["replicas"] == 1
    wait_for(lambda: (kget(cluster, "pdrs", f"{name}-prefill", "-n", ns).get("status") or {}).get("selector"),
             timeout=30, what="status.selector")
    scale = kget(cluster, "pdrs", f"{name}-prefill", "-n", ns)
    assert scale["status"]["selector"] == f"{LBL}/deployment={name},{LBL}/role=prefill"
    assert scale["status"]["controller"] == "none" and scale["metadata"]["ownerReferences"][0]["kind"] == "PDDeployment"
    key = _pdd(cluster, ns, name)["status"]["compatKey"]

    # kubectl scale (the /scale subresource) moves the role's Deployment and its status
    cluster.kubectl("scale", "pdrs", f"{name}-prefill", "-n", ns, "--replicas=3")
    wait_for(lambda: kget(cluster, "deployment", f"{name}-{key[:6]}-prefill", "-n", ns)["spec"]["replicas"] == 3,
             timeout=30, what="the prefill Deployment at 3")
    wait_for(lambda: (o := kget(cluster, "pdrs", f"{name}-prefill", "-n", ns)) and o["status"]["replicas"] == 3
             and o["status"]["readyReplicas"] == 3, timeout=60, what="PDRoleScale status 3/3")
    obj = wait_for(lambda: (o := _pdd(cluster, ns, name)) and o["status"]["prefill"]["replicas"] == "3/3" and o,
                   timeout=60, what="status.prefill 3/3")
    assert obj["status"]["autoscaling"]["prefill"] == {"replicas": 3, "controller": "none"}
    raw = json.loads(cluster.kubectl("get", "--raw",
                                     f"/apis/{LBL}/v1alpha1/namespaces/{ns}/pdrolescales/{name}-prefill/scale").stdout)
    assert raw["spec"]["replicas"] == 3 and raw["status"]["selector"] == scale["status"]["selector"]

    # an HPA on decode: accepted, reads the scale and selector, scales to its minReplicas; the planner steps aside
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": f"{name}-decode", "namespace": ns},
           "spec": {"scaleTargetRef": {"apiVersion": f"{LBL}/v1alpha1", "kind": "PDRoleScale", "name": f"{name}-decode"},
                    "minReplicas": 2, "maxReplicas": 4,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": 80}}}]}}
    kapply(cluster, hpa)

    def hpa_read_the_scale():
        h = kget(cluster, "hpa", f"{name}-decode", "-n", ns) or {}
        conds = {c["type"]: c for c in (h.get("status") or {}).get("conditions") or []}
        return h if conds.get("AbleToScale", {}).get("status") == "True" and "ScalingActive" in conds else None

    h = wait_for(hpa_read_the_scale, timeout=90, what="the HPA's conditions")
    conds = {c["type"]: c for c in h["status"]["conditions"]}
    print("HPA status:", json.dumps(h["status"], indent=1))
    assert conds["AbleToScale"]["reason"] in ("SucceededGetScale", "ReadyForNewScale", "SucceededRescale")
    assert conds["ScalingActive"]["reason"] != "InvalidSelector", conds["ScalingActive"]
    wait_for(lambda: _count(cluster, ns, name, "decode") == 2, timeout=60, what="the HPA scales decode to 2")
    h = wait_for(lambda: (x := kget(cluster, "hpa", f"{name}-decode", "-n", ns)) and
                 x["status"].get("currentReplicas") == 2 and x, timeout=60, what="HPA currentReplicas 2")
    wait_for(lambda: kget(cluster, "deployment", f"{name}-{key[:6]}-decode", "-n", ns)["spec"]["replicas"] == 2,
             timeout=30, what="the decode Deployment at 2")
    obj = wait_for(lambda: (o := _pdd(cluster, ns, name)) and
                   (o["status"].get("autoscaling") or {}).get("planner") == "StepsAside" and o,
                   timeout=60, what="the planner steps aside")
    assert obj["status"]["autoscaling"]["decode"]["controller"] == f"HorizontalPodAutoscaler/{name}-decode"
    assert _events(cluster, ns, name, "PlannerStepsAside")
    wait_for(lambda: kget(cluster, "pdrs", f"{name}-decode", "-n", ns)["status"]["controller"]
             == f"HorizontalPodAutoscaler/{name}-decode", timeout=30, what="PDRoleScale status.controller")
    managers = {m["manager"] for m in kget(cluster, "pdrs", f"{name}-decode", "-n", ns, "--show-managed-fields")
                ["metadata"]["managedFields"]}
    print("decode PDRoleScale field managers:", managers)
    cluster.kubectl("delete", "hpa", f"{name}-decode", "-n", ns)


def test_a_rollout_in_the_middle_of_scaling_keeps_the_count_and_one_key_per_gateway(cluster, op, ns):
    name = "roll"
    doc = _doc(ns, name)
    doc["spec"]["rollout"] = {"drainGracePeriod": "3s"}
    kapply(cluster, doc)
    old = wait_for(lambda: (o := _pdd(cluster, ns, name)) and _status(o, "Ready") == "True"
                   and o["status"]["compatKey"], timeout=90, what="Ready")
    cluster.kubectl("scale", "pdrs", f"{name}-decode", "-n", ns, "--replicas=2")
    wait_for(lambda: _pdd(cluster, ns, name)["status"]["decode"]["replicas"] == "2/2", timeout=60, what="decode 2/2")
    # the new group's engine pods start NotReady (kwok leaves readiness to us), so the rollout stays
    # Surging while the count changes; the serving group's pods are made Ready as they come
    policy = probe_policy(ns, role=("prefill", "decode"))
    kapply(cluster, policy)
    time.sleep(2)
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(cluster.api_client())

    def release(key: str) -> None:
        for p in core.list_namespaced_pod(ns, label_selector=f"{LBL}/compat-key={key}").items:
            if (p.metadata.annotations or {}).get(KWOK_READY) == "false":
                core.patch_namespaced_pod(p.metadata.name, ns, {"metadata": {"annotations": {KWOK_READY: "true"}}})

    try:
        with Watcher(cluster.api_client(), ns, name=name) as watcher:
            doc["spec"]["runtime"]["image"] = "lmsysorg/sglang:v0.5.23-cu129-post1"
            kapply(cluster, doc)
            new = wait_for(lambda: (o := _pdd(cluster, ns, name)) and o["status"]["rollout"]["phase"] == "Surging"
                           and o["status"]["rollout"]["targetKey"], timeout=60, what="Surging")
            assert new != old
            cluster.kubectl("scale", "pdrs", f"{name}-decode", "-n", ns, "--replicas=3")
            # both groups get the count: the serving one through /scale, the new one rendered with it
            for key in (old, new):
                wait_for(lambda k=key: kget(cluster, "deployment", f"{name}-{k[:6]}-decode", "-n", ns)["spec"]["replicas"]
                         == 3, timeout=30, what=f"group {key[:6]} decode at 3")
            release(old)
            wait_for(lambda: watcher.samples and watcher.samples[-1].ready.get(old), timeout=30,
                     what="the serving group Ready at 3")
            assert _pdd(cluster, ns, name)["status"]["rollout"]["servingKey"] == old
            release(new)
            obj = wait_for(lambda: (o := _pdd(cluster, ns, name)) and o["status"]["rollout"]["phase"] == "Complete"
                           and o["status"]["compatKey"] == new and _status(o, "Ready") == "True" and o,
                           timeout=120, what="rollout Complete")
            wait_for(lambda: set(watcher.samples[-1].ready) == {new}, timeout=30, what="old group gone")
    finally:
        for obj_ in policy:
            cluster.kubectl("delete", obj_["kind"].lower(), obj_["metadata"]["name"], "--wait=false", check=False)
    assert obj["status"]["decode"]["replicas"] == "3/3" and _count(cluster, ns, name, "decode") == 3
    assert kget(cluster, "pdrs", f"{name}-decode", "-n", ns)["status"]["replicas"] == 3
    for s in watcher.samples:  # no gateway ever pairs two keys
        for gw, keys in s.gateways.items():
            assert len(keys) == 1 and gw.split("-")[-2] == next(iter(keys))[:6], (gw, keys)
    keys = [s.service_key for s in watcher.samples]
    assert set(keys) == {old, new} and keys.index(new) > 0
    first_new = watcher.samples[keys.index(new)]
    assert first_new.ready.get(new), "the Service moved to a group that was not Ready"
    assert keys[keys.index(new):] == [new] * (len(keys) - keys.index(new)), "the Service went back"


def test_handing_a_serving_role_to_its_pdrolescale_keeps_its_count(cluster, op, ns):
    name = "handover"
    doc = _doc(ns, name)
    doc["spec"]["prefill"]["replicas"], doc["spec"]["decode"]["replicas"] = 1, 3
    kapply(cluster, doc)
    wait_for(lambda: (o := _pdd(cluster, ns, name)) and _status(o, "Ready") == "True", timeout=90, what="Ready")
    key = _pdd(cluster, ns, name)["status"]["compatKey"]
    before = {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={name},{LBL}/role=decode")}
    assert len(before) == 3 and kget(cluster, "pdrs", f"{name}-decode", "-n", ns) is None
    del doc["spec"]["decode"]["replicas"]  # hand decode to kubectl scale / an HPA
    kapply(cluster, doc)
    wait_for(lambda: _count(cluster, ns, name, "decode") is not None, timeout=30, what="the decode PDRoleScale")
    assert _count(cluster, ns, name, "decode") == 3, "the PDRoleScale must start at the serving count"
    looked(op, "PDDeployment", ns, name, more=3)  # three more reconciles: nothing scales down
    assert kget(cluster, "deployment", f"{name}-{key[:6]}-decode", "-n", ns)["spec"]["replicas"] == 3
    after = {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={name},{LBL}/role=decode")}
    assert after == before, "a decode pod was deleted by the handover"
