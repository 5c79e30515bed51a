"""The REAL smg 1.13.0 gateway discovers exactly one PDDeployment's prefill and decode pods.

Issue 3's acceptance: run on CPU with ``--discovery-provider kubernetes`` against the
local API server, smg lists the prefill and decode pods of the deployment (with the
bootstrap port from the ``sglang.ai/bootstrap-port`` annotation) and no pod of another
deployment or compat key. smg lists a worker in ``/workers`` only after the worker
answered its registration probes, so every engine pod — of both deployments — gets an
engine simulator bound to its kwok pod IP (a loopback address) and port 30000: a pod of
the other deployment would be registered if smg's selectors matched it.

smg runs with exactly the arguments the operator rendered into the gateway Deployment
(checked equal to ``render.gateway.gateway_args(plan)``); only ``--host`` and
``--prometheus-host`` change, to the gateway pod's IP (the ports are the rendered ones,
free on that loopback address). Skipped only when the smg binary is not installed.
"""

from __future__ import annotations

import json
import time

import pytest
from helpers import EXAMPLES, load_example
from opkit import OperatorProcess, condition, kapply, kget, pods, wait_for
from simkit import (
    BOOTSTRAP_ANNOTATION,
    get_json,
    post_json,
    smg_binary,
    start_simulator,
    start_smg,
    wait_answering,
    with_address,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
LBL = "pd.sglang-operator.io"


@pytest.fixture(scope="module")
def smg():
    path = smg_binary()
    if path is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed: PATH, $SMG_BIN, .venv/bin, /tmp/contract-venv/bin")
    return path


def _doc(ns: str, name: str, example: str) -> dict:
    doc = load_example(EXAMPLES / example)
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 1
    return doc


def _ready(cluster, ns: str, name: str):
    obj = kget(cluster, "pddeployment", name, "-n", ns)
    c = condition(obj, "Ready")
    return obj if c and c["status"] == "True" and c.get("observedGeneration") == obj["metadata"]["generation"] else None


def test_real_smg_discovers_exactly_its_deployments_prefill_and_decode(cluster, smg, ns, procs, tmp_path):
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator.planning.plan import build_plan
    from sglang_pd_operator.render.gateway import gateway_args

    started = time.monotonic()
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log").start()
    try:
        # the deployment under test (GB300 example, 1 prefill + 1 decode) and another one in
        # the same namespace with another name and compat key (the H200 example)
        kapply(cluster, [_doc(ns, "gw-a", "dsv41-flash-gb300-low-latency.yaml"),
                         _doc(ns, "gw-b", "dsv41-flash-h200-flashmla.yaml")])
        a = wait_for(lambda: _ready(cluster, ns, "gw-a"), timeout=90, what="gw-a Ready")
        b = wait_for(lambda: _ready(cluster, ns, "gw-b"), timeout=90, what="gw-b Ready")
    finally:
        op.stop()
    assert a["status"]["compatKey"] != b["status"]["compatKey"]
    spec = a["spec"]["model"]
    engine = {d: pods(cluster, ns, f"{LBL}/deployment={d},{LBL}/role in (prefill,decode)") for d in ("gw-a", "gw-b")}
    assert sorted(p["metadata"]["labels"][f"{LBL}/role"] for p in engine["gw-a"]) == ["decode", "prefill"]
    assert len(engine["gw-b"]) == 2
    for p in engine["gw-a"] + engine["gw-b"]:
        start_simulator(procs, p, model=spec["name"], served_model_name=spec["servedModelName"],
                        extra=["--ttft-median", "0.05", "--itl-median", "0.005"])
    wait_answering([f"http://{p['status']['podIP']}:30000/health" for p in engine["gw-a"] + engine["gw-b"]])

    # exactly the arguments the operator rendered for gw-a's gateway
    key = a["status"]["compatKey"]
    gw_dep = kget(cluster, "deployment", f"gw-a-{key[:6]}-gateway", "-n", ns)
    rendered = gw_dep["spec"]["template"]["spec"]["containers"][0]["args"]
    plan = build_plan(parse_pddeployment(a), load_catalog())
    assert rendered == gateway_args(plan)
    (gw_pod,) = pods(cluster, ns, f"{LBL}/deployment=gw-a,{LBL}/role=gateway")
    gw_ip = gw_pod["status"]["podIP"]
    args = with_address(rendered, host=gw_ip)
    assert [x for x in args if x != gw_ip] == [x for x in rendered if x != "0.0.0.0"]
    port = int(args[args.index("--port") + 1])
    gateway = f"http://{gw_ip}:{port}"
    start_smg(procs, args, kubeconfig=cluster.kubeconfig)
    wait_answering([gateway + "/health"], timeout=30)

    want = {f"http://{p['status']['podIP']}:30000": p for p in engine["gw-a"]}
    others = {f"http://{p['status']['podIP']}:30000" for p in engine["gw-b"]}

    def registered():
        workers = get_json(gateway + "/workers")["workers"]
        ready = [w for w in workers if w.get("is_healthy") and w.get("status") == "ready"]
        return workers if {w["url"] for w in ready} >= set(want) else None

    wait_for(registered, timeout=60, what="smg to register gw-a's prefill and decode")
    time.sleep(3)  # gw-b's simulators answer too: give smg time to (wrongly) pick them up
    workers = get_json(gateway + "/workers")
    urls = {w["url"] for w in workers["workers"]}
    assert urls == set(want), (urls, set(want), procs.log("smg"))
    assert not urls & others
    assert workers["stats"]["prefill_count"] == 1 and workers["stats"]["decode_count"] == 1
    for w in workers["workers"]:
        p = want[w["url"]]
        role = p["metadata"]["labels"][f"{LBL}/role"]
        assert w["worker_type"] == role
        if role == "prefill":
            assert w["bootstrap_port"] == int(p["metadata"]["annotations"][BOOTSTRAP_ANNOTATION])

    # a chat completion routed through smg to gw-a's prefill + decode simulators
    status, body = post_json(gateway + "/v1/chat/completions", {
        "model": spec["servedModelName"], "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == " tok0 tok1 tok2 tok3"
    for p in engine["gw-a"]:
        state = get_json(f"http://{p['status']['podIP']}:30000/simulator/state")
        assert state["finished"] == 1, (p["metadata"]["name"], state["finished"])
    for p in engine["gw-b"]:
        assert get_json(f"http://{p['status']['podIP']}:30000/simulator/state")["finished"] == 0
    print(f"smg registered gw-a's {sorted(urls)}; test took {time.monotonic() - started:.1f}s")
