"""KernelBuild end to end on the local control plane: a build Job on a GB300 fake node, success, reuse, failure and retry.

The operator runs as a process against the real kube-apiserver; kwok runs the build pod
on a fake GB300 node and completes it (or fails it: annotation
``pd.sglang-operator.io/kwok-fail``). kwok runs no containers, so the builder's result —
which a real kubelet copies from the container's ``/dev/termination-log`` into the pod
status — is SIMULATED by the test: it runs the real builder on this machine with the
request the operator rendered into the cluster (its GPU commands swapped for the
``standin`` recipe's, inputs hash kept, so no GPU is needed), and writes that builder's
termination-log text into the pod's
``status.containerStatuses[0].state.terminated.message`` with a status patch. Everything
else (scheduling on the accelerator, Job completion and failure, retries, status) is
the real operator against the real API server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import load_example
from opkit import OperatorProcess, cache_pv, condition, kapply, kget, looked, pods, wait_for

from sglang_pd_operator.api.kernelbuild import parse_kernelbuild
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild.inputs import ResolvedBuild, kernel_build_inputs
from sglang_pd_operator.kernelbuild.render import build_request
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator_dev.kernelbuild.recipe import STANDIN, standin_recipe

pytestmark = pytest.mark.e2e

LBL = "pd.sglang-operator.io"
@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path_factory.mktemp("kb-operator") / "operator.log")
    op.start()
    yield op
    print(op.log_tail(80))
    op.stop()


def build_manifest(namespace: str, role: str = "decode", **spec_changes) -> dict:
    """The KernelBuild of the GB300 example's ``role``, as kernels.cache: auto would create it (recipe sglang-cuda)."""
    doc = load_example()
    doc["metadata"]["namespace"] = namespace
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    obj = kernel_build_inputs(plan, role).manifest(namespace, auto=False)
    obj["spec"].update(spec_changes)
    return obj


def _kb(cluster, ns_, name):
    return kget(cluster, "kernelbuild", name, "-n", ns_)


def _status(cluster, ns_, name):
    return ((_kb(cluster, ns_, name) or {}).get("status")) or {}


def _build_pods(cluster, ns_, name, phase=None):
    got = pods(cluster, ns_, f"{LBL}/kernelbuild={name}")
    return [p for p in got if phase is None or p["status"].get("phase") == phase]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_builder_like_the_pod(cluster, ns_: str, kb_name: str, tmp: Path) -> str:
    """Run the real builder here on the request the operator put into the cluster; return its termination-log text.

    Changes to the request: the loopback port (30000 in the pod, a free one here) and, for a
    GPU recipe (sglang-cuda: DeepGEMM, a real server), the commands of the ``standin``
    recipe for the same flags; the inputs hash stays, so the result is the one the
    operator expects.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    cms = kget(cluster, "configmaps", "-n", ns_, "-l", f"{LBL}/kernelbuild={kb_name}")["items"]
    request = json.loads(cms[0]["data"]["request.json"])
    if request["recipe"] != STANDIN:
        kb = parse_kernelbuild(_kb(cluster, ns_, kb_name))
        standin = ResolvedBuild(recipe_name=STANDIN, recipe=standin_recipe(), plugin_version=None, vendor=None)
        swapped = build_request(name=kb_name, spec=kb.spec, resolved=standin, input_hash=request["inputHash"])
        request.update({k: swapped[k] for k in ("steps", "expect", "forbid", "writable")})
    port = str(_free_port())
    request["port"] = int(port)
    for step in request["steps"]:
        argv = step["argv"]
        step["argv"] = [port if i > 0 and argv[i - 1] == "--port" else a for i, a in enumerate(argv)]
    (tmp / "request.json").write_text(json.dumps(request))
    term = tmp / "termination-log"
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_pd_operator.kernelbuild.builder", "--request", str(tmp / "request.json"),
         "--work-dir", str(tmp / "work"), "--volume", str(tmp / "volume"), "--termination-log", str(term)],
        capture_output=True, text=True, timeout=120, cwd="/", env={**os.environ, "PYTHONSAFEPATH": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return term.read_text()


def write_termination_message(cluster, ns_: str, pod: dict, message: str) -> None:
    """What kubelet does with the container's /dev/termination-log (simulated: kwok runs no containers)."""
    patch = [{"op": "add", "path": "/status/containerStatuses/0/state/terminated/message", "value": message}]
    cluster.kubectl(
        "patch",
        "pod",
        pod["metadata"]["name"],
        "-n",
        ns_,
        "--subresource=status",
        "--type=json",
        "-p",
        json.dumps(patch),
    )


def test_build_job_runs_on_gb300_and_status_records_the_digest(cluster, operator, ns, tmp_path):
    obj = build_manifest(ns)
    name = obj["metadata"]["name"]
    kapply(cluster, cache_pv(ns, f"{name}-cache"))
    start = time.monotonic()
    kapply(cluster, obj)

    # the operator creates the cache PVC, the request and attempt 1's Job; kwok runs and completes its pod
    done = wait_for(lambda: _build_pods(cluster, ns, name, "Succeeded"), timeout=60, what="build pod Succeeded")
    pod = done[0]
    node = kget(cluster, "node", pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GB300"
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["image"] == obj["spec"]["runtime"]["image"]
    pvc = kget(cluster, "pvc", f"{name}-cache", "-n", ns)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["status"]["phase"] == "Bound"
    jobs = kget(cluster, "jobs", "-n", ns, "-l", f"{LBL}/kernelbuild={name}")["items"]
    assert [j["metadata"]["name"] for j in jobs] == [
        f"{name}-{obj['metadata']['labels'][f'{LBL}/kernel-inputs'][:6]}-1"
    ]

    request = json.loads(
        kget(cluster, "configmap", f"{jobs[0]['metadata']['name'][:-2]}-request", "-n", ns)["data"]["request.json"]
    )
    assert [st["name"] for st in request["steps"]] == ["deep-gemm", "warm-up", "verify"]
    assert (
        request["steps"][0]["argv"][1:3] == ["-m", "sglang.compile_deep_gemm"]
        and "--enable-nvidia-megakernel" in request["steps"][0]["argv"]
    )

    # completed without a result yet: still building, waiting for the builder's word
    wait_for(lambda: condition(_kb(cluster, ns, name), "Building") and
             condition(_kb(cluster, ns, name), "Building")["reason"] == "AwaitingResult",
             timeout=60, what="AwaitingResult")  # fmt: skip

    # the builder's result, as kubelet would publish it (simulated, see the module docstring)
    message = run_builder_like_the_pod(cluster, ns, name, tmp_path)
    write_termination_message(cluster, ns, pod, message)
    result = json.loads(message)

    st = wait_for(
        lambda: (s := _status(cluster, ns, name)).get("phase") == "Succeeded" and s, timeout=60, what="Succeeded"
    )
    print(f"KernelBuild {name} Succeeded {time.monotonic() - start:.1f}s after apply")
    assert st["digest"] == result["digest"] and st["path"] == result["path"] and st["pvcName"] == f"{name}-cache"
    assert st["sizeBytes"] == result["sizeBytes"] and st["durationSeconds"] == result["durationSeconds"]
    assert st["complete"] is True and st["inputHash"] == obj["metadata"]["labels"][f"{LBL}/kernel-inputs"]
    assert st["inputs"]["accelerator"] == "gb300" and st["inputs"]["role"] == "decode" and st["attempts"] == 1
    assert condition(_kb(cluster, ns, name), "Ready")["status"] == "True"
    printed = cluster.kubectl("get", "kb", "-n", ns).stdout
    print(printed)
    assert "Succeeded" in printed and "gb300" in printed

    # equal inputs: applying it again (or a spec edit outside the inputs) reuses the finished build
    kapply(cluster, {**obj, "spec": {**obj["spec"], "retry": {"maxAttempts": 5}}})
    looked(operator, "KernelBuild", ns, name, more=3)
    assert len(kget(cluster, "jobs", "-n", ns, "-l", f"{LBL}/kernelbuild={name}")["items"]) == 1
    assert _status(cluster, ns, name)["digest"] == result["digest"]


def test_failed_build_is_failed_with_retry_then_recovers_after_a_fix(cluster, operator, ns, tmp_path):
    obj = build_manifest(
        ns, role="prefill",
        podAnnotations={f"{LBL}/kwok-fail": "true"},
        retry={"maxAttempts": 2, "backoff": "4s", "maxBackoff": "4s"},
    )  # fmt: skip
    name = obj["metadata"]["name"]
    kapply(cluster, cache_pv(ns, f"{name}-cache"))
    kapply(cluster, obj)

    # attempt 1 fails (kwok fails the pod, the Job fails): Failed, with the next attempt scheduled
    st = wait_for(lambda: (s := _status(cluster, ns, name)).get("phase") == "Failed" and s.get("nextRetryAt") and s,
                  timeout=60, what="Failed with a retry scheduled")  # fmt: skip
    assert st["failedAttempts"] == 1 and st["lastFailure"]["attempt"] == 1 and not st["retriesExhausted"]
    assert condition(_kb(cluster, ns, name), "Ready")["reason"] == "RetryScheduled"
    print(f"after attempt 1: {st['message']}")

    # attempt 2 starts after the backoff and fails too: no attempt left for this generation
    st = wait_for(
        lambda: (s := _status(cluster, ns, name)).get("retriesExhausted") and s, timeout=90, what="retries exhausted"
    )
    assert (
        st["phase"] == "Failed" and st["failedAttempts"] == 2 and st["attempts"] == 2 and st.get("nextRetryAt") is None
    )
    assert "2 of 2 attempts failed" in st["message"]
    events = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={name}")["items"]
    reasons = {e["reason"] for e in events}
    assert {"BuildFailed", "Retrying", "RetriesExhausted"} <= reasons, reasons
    looked(operator, "KernelBuild", ns, name, more=3)
    jobs = kget(cluster, "jobs", "-n", ns, "-l", f"{LBL}/kernelbuild={name}")["items"]
    assert sorted(int(j["metadata"]["labels"][f"{LBL}/attempt"]) for j in jobs) == [1, 2], "no third attempt"

    # the fix (a spec edit: a new generation) grants a fresh budget; attempt 3 succeeds
    cluster.kubectl("patch", "kernelbuild", name, "-n", ns, "--type=json",
                    "-p", json.dumps([{"op": "remove", "path": "/spec/podAnnotations"}]))  # fmt: skip
    pod = wait_for(
        lambda: next((p for p in _build_pods(cluster, ns, name, "Succeeded")
                      if p["metadata"]["labels"].get(f"{LBL}/attempt") == "3"), None),
        timeout=60, what="attempt 3 pod Succeeded",
    )  # fmt: skip
    write_termination_message(cluster, ns, pod, run_builder_like_the_pod(cluster, ns, name, tmp_path))
    st = wait_for(
        lambda: (s := _status(cluster, ns, name)).get("phase") == "Succeeded" and s, timeout=60, what="Succeeded"
    )
    assert st["attempts"] == 3 and st["digest"].startswith("sha256:")
    remaining = sorted(
        j["metadata"]["name"] for j in kget(cluster, "jobs", "-n", ns, "-l", f"{LBL}/kernelbuild={name}")["items"]
    )
    assert all(not n.endswith(("-1", "-2")) for n in remaining) or len(remaining) <= 2


def test_invalid_build_is_refused_in_status(cluster, operator, ns):
    obj = build_manifest(ns, recipe="no-such-recipe")
    kapply(cluster, obj)
    name = obj["metadata"]["name"]
    st = wait_for(lambda: (s := _status(cluster, ns, name)).get("phase") == "Failed" and s, timeout=60, what="Failed")
    assert "spec.recipe" in st["message"] and not kget(cluster, "jobs", "-n", ns)["items"]


def test_pddeployment_with_cache_auto_waits_for_its_builds(cluster, operator, ns, tmp_path):
    """Acceptance: kernels.cache auto -> one KernelBuild per distinct role input, roles wait, then mount the cache."""
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["kernels"] = {**doc["spec"]["kernels"], "cache": "auto"}
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    names = {r: kernel_build_inputs(plan, r).name for r in ("prefill", "decode")}
    for n in names.values():
        kapply(cluster, cache_pv(ns, f"{n}-cache"))
    kapply(cluster, doc)
    for n in names.values():
        wait_for(lambda n=n: _kb(cluster, ns, n), timeout=60, what=f"KernelBuild {n} created")
    pdd = wait_for(lambda: (o := kget(cluster, "pddeployment", doc["metadata"]["name"], "-n", ns)) and
                   any(c.get("reason") == "WaitingForKernels" for c in o.get("status", {}).get("conditions", [])) and o,
                   timeout=60, what="WaitingForKernels")  # fmt: skip
    assert pdd
    for role, n in names.items():
        pod = wait_for(lambda n=n: (_build_pods(cluster, ns, n, "Succeeded") or [None])[0], timeout=60, what=f"{n} pod")
        write_termination_message(cluster, ns, pod, run_builder_like_the_pod(cluster, ns, n, tmp_path / role))
    deps = wait_for(
        lambda: [d for d in (kget(cluster, "deployments", "-n", ns, "-l", f"{LBL}/deployment={doc['metadata']['name']}")
                             or {"items": []})["items"]
                 if d["metadata"]["labels"].get(f"{LBL}/role") in ("prefill", "decode") and d["spec"].get("replicas")],
        timeout=90, what="engine Deployments scaled up",
    )  # fmt: skip
    for d in deps:
        pod = d["spec"]["template"]["spec"]
        cache = next(v for v in pod["volumes"] if v["name"] == "kernel-cache")
        assert cache["persistentVolumeClaim"]["readOnly"] is True
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["SGLANG_CRASH_ON_JIT_COMPILE"] == "1" and env["SGLANG_JIT_CACHE_DIR"] == "/var/cache/sglang/jit"
