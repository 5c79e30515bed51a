"""The operator end to end on the local control plane: apply, scale, roll, refuse, delete, restart.

The operator runs as a separate process (``sglang-pd-operator run``) against the real
kube-apiserver; kwok runs the pods on fake GB300 nodes. Time limits are generous bounds
for "converges", not performance assertions.
"""

from __future__ import annotations

import signal
import time

import pytest
import yaml
from helpers import GB300_EXAMPLE, load_example, with_fields
from opkit import (
    OperatorProcess,
    children,
    condition,
    kapply,
    kget,
    looked,
    model_store,
    pods,
    ready_now,
    wait_for,
)

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield op
    if not op.alive():
        print(op.log_tail())
    op.stop()


def _pdd(cluster, ns_, name=NAME):
    return kget(cluster, "pddeployment", name, "-n", ns_)


def _ready(cluster, ns_, name=NAME):
    return ready_now(_pdd(cluster, ns_, name))


def _spec(ns_, **changes):
    doc = load_example()
    doc["metadata"]["namespace"] = ns_
    with_fields(doc, changes)
    return doc


def _deployments(cluster, ns_, name=NAME):
    got = kget(cluster, "deployments", "-n", ns_, "-l", f"{LBL}/deployment={name}") or {"items": []}
    return {d["metadata"]["name"]: d for d in got["items"]}


def test_gb300_example_converges_scales_rolls_and_is_deleted(cluster, operator):
    """kubectl apply -f examples/<gb300>.yaml, exactly as a user would."""
    ns_ = "inference"
    cluster.kubectl("create", "namespace", ns_, check=False)
    kapply(cluster, model_store(ns_))
    start = time.monotonic()
    cluster.kubectl("apply", "-f", str(GB300_EXAMPLE))

    obj = wait_for(lambda: _ready(cluster, ns_), timeout=60, what="Ready=True at observedGeneration")
    print(f"GB300 example Ready after {time.monotonic() - start:.1f}s")
    key = obj["status"]["compatKey"]
    g = key[:6]
    kids = children(cluster, ns_, NAME)
    assert kids["deployments"] == sorted([f"{NAME}-{g}-prefill", f"{NAME}-{g}-decode", f"{NAME}-{g}-gateway"])
    # one immutable ConfigMap per role, named after its config's content (render/engine.py config_map_name)
    assert [c.rsplit("-", 1)[0] for c in kids["configmaps"]] == sorted([f"{NAME}-{g}-decode-config",
                                                                        f"{NAME}-{g}-prefill-config"])
    assert kids["services"] == sorted([NAME, f"{NAME}-{g}-prefill", f"{NAME}-{g}-decode"])
    assert kids["serviceaccounts"] == kids["roles"] == kids["rolebindings"] == [f"{NAME}-gateway"]
    st = obj["status"]
    assert st["prefill"]["replicas"] == "1/1" and st["decode"]["replicas"] == "2/2"
    assert st["kvLayout"] == "v41,c1:v41_fp4,c2:v41_fp4" and st["decode"]["attentionBackend"] == "flashmla_mega"
    assert st["gateway"]["endpoint"] == f"http://{NAME}.{ns_}.svc:8000"
    engine = pods(cluster, ns_, f"{LBL}/deployment={NAME},{LBL}/role in (prefill,decode)")
    assert len(engine) == 3
    for p in engine:
        node = kget(cluster, "node", p["spec"]["nodeName"])
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GB300"
        assert p["metadata"]["labels"][f"{LBL}/compat-key"] == key
    printed = cluster.kubectl("get", "pdd", "-n", ns_).stdout
    print(printed)
    assert "True" in printed and "1/1" in printed and "v41,c1:v41_fp4,c2:v41_fp4" in printed

    # scale decode 2 -> 3: same group, prefill untouched
    prefill_uid = {p["metadata"]["uid"] for p in pods(cluster, ns_, f"{LBL}/role=prefill")}
    cluster.kubectl("patch", "pdd", NAME, "-n", ns_, "--type=merge", "-p", '{"spec":{"decode":{"replicas":3}}}')
    obj = wait_for(
        lambda: (o := _ready(cluster, ns_)) and o["status"]["decode"]["replicas"] == "3/3" and o,
        timeout=60,
        what="decode 3/3",
    )
    assert obj["status"]["compatKey"] == key
    assert {p["metadata"]["uid"] for p in pods(cluster, ns_, f"{LBL}/role=prefill")} == prefill_uid
    # down to 1 so a second group fits beside this one in the GB300 pool the e2e tests share
    cluster.kubectl("patch", "pdd", NAME, "-n", ns_, "--type=merge", "-p", '{"spec":{"decode":{"replicas":1}}}')
    wait_for(lambda: (o := _ready(cluster, ns_)) and o["status"]["decode"]["replicas"] == "1/1", timeout=60, what="decode 1/1")

    # an edit that changes the KV layout rolls both roles into a new group; the old one goes
    patch = '{"spec":{"kvLayout":{"attentionBackend":"flashmla","layout":"v4"}}}'
    cluster.kubectl("patch", "pdd", NAME, "-n", ns_, "--type=merge", "-p", patch)
    obj = wait_for(
        lambda: (o := _ready(cluster, ns_)) and o["status"]["compatKey"] != key and o["status"]["rollout"]["phase"] in ("Complete", "Draining") and o,
        timeout=90,
        what="new group Ready",
    )
    new_key = obj["status"]["compatKey"]
    assert obj["status"]["kvLayout"] == "v4,c1:v4,c2:v4"
    wait_for(
        lambda: set(_deployments(cluster, ns_)) == {f"{NAME}-{new_key[:6]}-{c}" for c in ("prefill", "decode", "gateway")},
        timeout=120,
        what="old group deleted after draining",
    )
    wait_for(
        lambda: {p["metadata"]["labels"][f"{LBL}/compat-key"] for p in pods(cluster, ns_, f"{LBL}/deployment={NAME}")} == {new_key},
        timeout=60,
        what="only pods of the new group remain",
    )

    # deleting the PDDeployment removes every child (owner references, garbage collector)
    cluster.kubectl("delete", "pdd", NAME, "-n", ns_)
    wait_for(lambda: not any(children(cluster, ns_, NAME).values()), timeout=60, what="children garbage-collected")
    wait_for(lambda: not pods(cluster, ns_, f"{LBL}/deployment={NAME}"), timeout=60, what="pods gone")
    # a reconcile that raced the deletion (its status write answers 404) is "gone", not an error
    assert f"reconcile {ns_}/{NAME} failed" not in operator.log_path.read_text(errors="replace")


def test_schema_refuses_bad_objects_naming_the_field(cluster, crds, ns):
    bad_page = _spec(ns, **{"kvLayout.pageSize": 0})
    res = kapply(cluster, bad_page, check=False)
    assert res.returncode != 0 and "spec.kvLayout.pageSize" in res.stderr, res.stderr
    bad_plugin = _spec(ns, **{"kernels.plugin": "sgl-foo"})
    res = kapply(cluster, bad_plugin, check=False)
    assert res.returncode != 0 and "spec.kernels.plugin" in res.stderr and "sgl-nvidia-mega" in res.stderr, res.stderr
    trtllm = _spec(ns, **{"kvLayout.attentionBackend": "trtllm"})
    res = kapply(cluster, trtllm, check=False)
    assert res.returncode != 0 and "trtllm does not support PD" in res.stderr, res.stderr
    paged = _spec(ns, **{"pagedExperts": {"residentExperts": 32}})
    del paged["spec"]["speculative"], paged["spec"]["kernels"]
    res = kapply(cluster, paged, check=False)
    assert res.returncode != 0 and "spec.pagedExperts" in res.stderr and "single GPU" in res.stderr, res.stderr
    unknown_field = _spec(ns, **{"decode.replica": 2})
    res = kapply(cluster, unknown_field, check=False)
    assert res.returncode != 0 and "replica" in res.stderr, res.stderr
    assert _pdd(cluster, ns) is None


# Objects only the CRD (schema + CEL) refuses; the offline check must refuse the same field.
CRD_ONLY_REFUSALS = [
    ("spec.model.source", {"model.source": {"pvc": {"claimName": "model-store"}, "hub": {}}}),
    ("spec.prefill.parallelism.dpAttention", {"prefill.parallelism": {"tp": 4, "dpAttention": True}}),
    ("spec.speculative.numDraftTokens", {"speculative": {"algorithm": "DSPARK", "blockSize": 5, "numDraftTokens": 5}}),
    ("spec.speculative.blockSize", {"speculative": {"algorithm": "EAGLE", "blockSize": 3}}),
    ("spec.slo.ttft", {"slo": {"ttft": {}, "window": "5m"}}),
    ("spec.engram.placement", {"decode.parallelism": {"tp": 1}}),
    # per-role overrides are checked by the CRD as the spec-wide fields are
    ("spec.decode.parallelism.tp", {"decode.pagedExperts": {"residentExperts": 26}, "decode.parallelism": {"tp": 2}}),
    ("spec.speculative", {"decode.pagedExperts": {"residentExperts": 26}}),
    ("spec.decode.kvLayout.attentionBackend", {"decode.kvLayout": {"attentionBackend": "trtllm"}}),
]


@pytest.mark.parametrize("field, changes", CRD_ONLY_REFUSALS, ids=[f for f, _ in CRD_ONLY_REFUSALS])
def test_offline_check_refuses_what_the_api_server_refuses(cluster, crds, ns, field, changes):
    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator.planning.plan import plan_object

    doc = _spec(ns, **changes)
    res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert res.returncode != 0 and field.rsplit(".", 1)[-1] in res.stderr, res.stderr
    plan, problems = plan_object(doc, load_catalog())
    assert (plan is None or not plan.valid) and field in {p.field for p in problems if p.severity == "error"}, problems


def test_offline_check_reads_the_envelope_and_numbers_as_the_api_server_does(cluster, crds, ns):
    """Unknown top-level and metadata fields are refused by both; a whole float for an
    integer (``tp: 4.0``) is accepted by both; a null field is refused by ``check`` as a
    server-side apply refuses it, although a client-side ``kubectl apply`` prunes it
    (stricter by design: tests/e2e/crd_stricter_by_design.yaml)."""
    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator.planning.plan import plan_object

    for where, doc in (("specs", {**_spec(ns), "specs": {}}),
                       ("metadata.label", {**_spec(ns), "metadata": {**_spec(ns)["metadata"], "label": {"a": "b"}}})):
        res = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
        assert res.returncode != 0 and where.rsplit(".", 1)[-1] in res.stderr, res.stderr
        plan, problems = plan_object(doc, load_catalog())
        assert plan is None and where in {p.field for p in problems}, problems
    lenient = _spec(ns, **{"decode.parallelism": {"tp": 4.0}})
    res = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(lenient), check=False)
    assert res.returncode == 0, res.stderr
    plan, problems = plan_object(lenient, load_catalog())
    assert plan is not None and plan.valid, problems
    null = _spec(ns, **{"gateway.image": None})
    client_side = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(null), check=False)
    server_side = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-", input=yaml.safe_dump(null),
                                  check=False)
    assert client_side.returncode == 0, client_side.stderr  # kubectl prunes the null before sending
    assert server_side.returncode != 0 and "image" in server_side.stderr, server_side.stderr
    plan, problems = plan_object(null, load_catalog())
    refused = {p.field: p for p in problems if p.severity == "error"}
    assert (plan is None or not plan.valid) and "spec.gateway.image" in refused, problems
    assert "must not be null" in refused["spec.gateway.image"].message and refused["spec.gateway.image"].fix


def test_cross_field_problem_is_refused_by_the_operator_without_children(cluster, operator, ns):
    # DeepSeek-V4.1 with DSpark: DEP prefill with TP decode -> attention TP 1 vs 4
    doc = _spec(ns, **{"prefill.parallelism": {"tp": 4, "dp": 4, "ep": 4, "dpAttention": True}})
    kapply(cluster, doc)
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and condition(o, "Valid") and o, timeout=30, what="Valid condition")
    valid, ready = condition(obj, "Valid"), condition(obj, "Ready")
    assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
    assert "spec.decode.parallelism" in valid["message"] and "attention TP" in valid["message"]
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert any(p["field"] == "spec.decode.parallelism" for p in obj["status"]["problems"])
    events = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},type=Warning")
    assert any(e["reason"] == "InvalidSpec" for e in events["items"])
    looked(operator, "PDDeployment", ns, NAME, more=2)
    assert not any(children(cluster, ns, NAME).values())


def test_invalid_update_leaves_the_serving_group_untouched_and_fixing_it_recovers(cluster, operator, ns):
    kapply(cluster, _spec(ns, **{"decode.replicas": 1}))
    obj = wait_for(lambda: _ready(cluster, ns), timeout=60, what="Ready")
    gen = obj["metadata"]["generation"]
    before = {n: (d["metadata"]["resourceVersion"], d["metadata"]["generation"]) for n, d in _deployments(cluster, ns).items()}
    pod_uids = sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME}"))
    # plugin on a TP size it does not serve, and a mismatched page via decode kvLayout override
    bad = _spec(ns, **{"decode.replicas": 1, "decode.parallelism": {"tp": 2}})
    kapply(cluster, bad)
    obj = wait_for(
        lambda: (o := _pdd(cluster, ns)) and (c := condition(o, "Valid")) and c["status"] == "False" and o,
        timeout=30,
        what="Valid=False",
    )
    fields = {p["field"] for p in obj["status"]["problems"] if p["severity"] == "error"}
    assert {"spec.decode.parallelism.tp", "spec.decode.parallelism"} <= fields, fields
    # status speaks for the refused generation: not Ready, while the old group keeps serving
    ready = condition(obj, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec" and ready["observedGeneration"] > gen
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert f"of generation {gen} still serves" in ready["message"], ready["message"]
    looked(operator, "PDDeployment", ns, NAME, more=2)
    after = {n: (d["metadata"]["resourceVersion"], d["metadata"]["generation"]) for n, d in _deployments(cluster, ns).items()}
    assert after == before
    assert sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME}")) == pod_uids
    # fix it: back to the valid spec, no manual steps
    kapply(cluster, _spec(ns, **{"decode.replicas": 1}))
    obj = wait_for(
        lambda: (o := _ready(cluster, ns)) and condition(o, "Valid")["status"] == "True" and o, timeout=30, what="recovered"
    )
    assert obj["metadata"]["generation"] > gen


def test_restart_mid_reconcile_converges_without_duplicates_and_second_reconcile_writes_nothing(cluster, operator, ns, tmp_path):
    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator.reconcilers.kube import Kube
    from sglang_pd_operator.reconcilers.pddeployment import reconcile

    operator.stop()  # releases the Lease: op1 leads (else it would wait behind the module's operator)
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op1.log").start()
    try:
        kapply(cluster, _spec(ns, **{"decode.replicas": 1}))
        wait_for(lambda: _deployments(cluster, ns), timeout=30, interval=0.05, what="first child Deployment")
        op.kill(signal.SIGKILL)  # mid-reconcile: some children exist, status not yet written
        partial = set(_deployments(cluster, ns))
        op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op2.log").start()
        obj = wait_for(lambda: _ready(cluster, ns), timeout=60, what="Ready after restart")  # op2 waits out op1's Lease
    finally:
        op.stop()
        operator.start()
    key = obj["status"]["compatKey"]
    deps = set(_deployments(cluster, ns))
    assert partial <= deps
    assert deps == {f"{NAME}-{key[:6]}-{c}" for c in ("prefill", "decode", "gateway")}
    assert len(pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=decode")) == 1

    # with the operator stopped, reconcile twice in-process: both converge with zero writes
    kube = Kube(cluster.api_client())
    catalog = load_catalog()
    for _ in range(2):
        body = kget(cluster, "pddeployment", NAME, "-n", ns)
        outcome = reconcile(kube=kube, body=body, catalog=catalog)
        assert outcome.valid and outcome.writes == 0, dict(kube.writes)
