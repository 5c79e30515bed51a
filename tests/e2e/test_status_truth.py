"""Status that never lies (issue 15, item 5), end to end on the local control plane.

Each test is one "tried as a new user would" finding of the issue, done the way a user
(or a GitOps tool) meets it:

- an invalid update: ``kubectl get pdd`` shows READY False for the refused generation,
  ``observedGeneration`` advances to it, and Ready's message says which group of which
  generation still serves (its pods untouched);
- an API server that refuses the operator's Deployments (a real ValidatingAdmissionPolicy
  and binding in the test's namespace, no webhook server): a ``Reconciled`` condition
  names the call and the policy's answer, one Warning event ``ReconcileError`` however
  often the reconcile retries, and removing the policy converges;
- every status the operator writes during an in-place change (decode scaled) is one
  consistent set: never Ready=False with Progressing=False/Complete (every written
  version is read from a watch, not sampled);
- a serving pod that is deleted and comes back (its replacement waits while the GPU
  nodes are cordoned, so status sees the group not Ready) is not a rollout: no
  RolloutComplete event;
- a stopped scraper (the operator restarted with ``--slo-interval 0``): SLOMet turns
  Unknown after the bounded age, and the last figures leave status;
- ``spec.slo.window`` above its maximum is refused by the API server, naming the field.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers import load_example, with_fields
from kubernetes import client as k8s
from kubernetes import watch
from opkit import OperatorProcess, condition, kapply, kget, looked, operator_process, pods, ready_now, wait_for

from sglang_pd_operator.api.v1alpha1 import GROUP, VERSION

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NAME = "truth"
LBL = "pd.sglang-operator.io"


@pytest.fixture(scope="module")
def operator(cluster, crds, tmp_path_factory):
    yield from operator_process(cluster, tmp_path_factory.mktemp("operator"))


def _spec(ns, **changes):
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 1
    return with_fields(doc, changes)


def _pdd(cluster, ns):
    return kget(cluster, "pddeployment", NAME, "-n", ns)


def _ready(cluster, ns):
    return ready_now(_pdd(cluster, ns))


def _events(cluster, ns, reason):
    got = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},reason={reason}")
    return (got or {}).get("items", [])


def _printed_ready(cluster, ns) -> str:
    """The READY column of plain ``kubectl get pdd`` (the CRD's printer columns)."""
    lines = cluster.kubectl("get", "pdd", NAME, "-n", ns).stdout.splitlines()
    header, row = lines[0].split(), lines[1].split()
    return row[header.index("READY")]


class StatusWatch:
    """Every status version the API server stores for the PDDeployment, from a watch."""

    def __init__(self, cluster, ns):
        self.api = k8s.CustomObjectsApi(cluster.api_client())
        self.ns = ns
        self.versions: list[dict] = []
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            for ev in self._w.stream(self.api.list_namespaced_custom_object, GROUP, VERSION, self.ns, "pddeployments",
                                     field_selector=f"metadata.name={NAME}", timeout_seconds=240):
                obj = ev["object"]
                self.versions.append({"rv": obj["metadata"].get("resourceVersion"), "status": obj.get("status") or {},
                                      "generation": obj["metadata"].get("generation")})
        except Exception as e:  # the watch ends with the test
            self.versions.append({"error": repr(e)})

    def __enter__(self):
        self._thread.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self._w.stop()

    def conditions(self):
        for v in self.versions:
            if "status" in v:
                yield v, {c["type"]: c for c in v["status"].get("conditions") or []}


# ---------------------------------------------------------------------------------- 1.
def test_invalid_update_turns_ready_false_for_the_refused_generation(cluster, operator, ns):
    kapply(cluster, _spec(ns))
    obj = wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    gen, key = obj["metadata"]["generation"], obj["status"]["compatKey"]
    assert _printed_ready(cluster, ns) == "True"
    uids = sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME}"))

    kapply(cluster, _spec(ns, **{"decode.parallelism": {"tp": 2}}))  # DSpark: attention TP 4 vs 2 -> refused
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and (c := condition(o, "Valid")) and c["status"] == "False"
                   and o, timeout=30, what="Valid=False")
    new_gen = obj["metadata"]["generation"]
    assert new_gen > gen
    # status speaks for the refused generation, and says so
    assert obj["status"]["observedGeneration"] == new_gen
    ready = condition(obj, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec" and ready["observedGeneration"] == new_gen
    assert f"group {key[:6]} of generation {gen} still serves" in ready["message"], ready["message"]
    progressing = condition(obj, "Progressing")
    assert progressing["status"] == "False" and progressing["reason"] == "InvalidSpec"
    assert _printed_ready(cluster, ns) == "False"
    assert obj["status"]["rollout"]["servingKey"] == key
    # the serving pods are untouched after the operator looked at it twice more
    looked(operator, "PDDeployment", ns, NAME, more=2)
    assert sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/deployment={NAME}")) == uids

    kapply(cluster, _spec(ns))  # fixed: Ready again for the newest generation
    obj = wait_for(lambda: _ready(cluster, ns), timeout=60, what="Ready after the fix")
    assert obj["metadata"]["generation"] > new_gen and _printed_ready(cluster, ns) == "True"


# ---------------------------------------------------------------------------------- 2.
def _deny_policy(ns: str) -> list[dict]:
    name = f"e2e-deny-engines-{ns}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                                    "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
            "validations": [{
                "expression": "!has(object.metadata.labels) || !('app.kubernetes.io/managed-by' in object.metadata.labels)"
                              " || object.metadata.labels['app.kubernetes.io/managed-by'] != 'sglang-pd-operator'",
                "message": "e2e platform policy: no inference engines in this namespace",
            }],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}},
    }
    return [policy, binding]


def _denied_now(cluster, ns) -> bool:
    probe = {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "probe", "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "sglang-pd-operator"}},
             "spec": {"selector": {"matchLabels": {"a": "b"}},
                      "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    res = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
    return res.returncode != 0 and "no inference engines" in res.stderr


def test_an_admission_denial_becomes_a_condition_and_one_warning_event(cluster, operator, ns):
    objs = _deny_policy(ns)
    kapply(cluster, objs)
    try:
        wait_for(lambda: _denied_now(cluster, ns), timeout=30, what="the policy denies operator Deployments")
        kapply(cluster, _spec(ns))
        obj = wait_for(lambda: (o := _pdd(cluster, ns)) and (c := condition(o, "Reconciled")) and c["status"] == "False"
                       and o, timeout=30, what="Reconciled=False")
        rec = condition(obj, "Reconciled")
        print("Reconciled:", rec)
        assert rec["reason"] == "AdmissionDenied"
        assert "apply Deployment" in rec["message"] and f"{ns}/{NAME}-" in rec["message"]
        assert "ValidatingAdmissionPolicy" in rec["message"] and "no inference engines" in rec["message"]
        gen = obj["metadata"]["generation"]
        assert rec["observedGeneration"] == gen and obj["status"]["observedGeneration"] == gen
        ready = condition(obj, "Ready")
        assert ready["status"] == "False" and ready["reason"] == "ReconcileError"
        assert condition(obj, "Progressing")["status"] == "False"
        events = wait_for(lambda: _events(cluster, ns, "ReconcileError"), timeout=10, what="Warning event")
        assert events[0]["type"] == "Warning" and "no inference engines" in events[0]["message"]
        looked(operator, "PDDeployment", ns, NAME, more=4)  # four more reconciles retry and fail the same way
        assert len(_events(cluster, ns, "ReconcileError")) == 1, [e["message"] for e in _events(cluster, ns, "ReconcileError")]
        assert "reconcile failed (AdmissionDenied)" in operator.log_path.read_text(errors="replace")
    finally:
        for o in objs[::-1]:
            cluster.kubectl("delete", o["kind"], o["metadata"]["name"], "--ignore-not-found", check=False)
    obj = wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready once the policy is gone")
    assert condition(obj, "Reconciled")["status"] == "True"


# ---------------------------------------------------------------------------------- 3.
def test_every_written_status_is_one_consistent_set_during_an_in_place_change(cluster, operator, ns):
    kapply(cluster, _spec(ns))
    obj = wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    key = obj["status"]["compatKey"]
    with StatusWatch(cluster, ns) as seen:
        kapply(cluster, _spec(ns, **{"decode.replicas": 2}))  # same compat key: the decode Deployment scales in place
        obj = wait_for(lambda: (o := _ready(cluster, ns)) and o["status"]["decode"]["replicas"] == "2/2" and o,
                       timeout=90, what="decode 2/2")
        looked(operator, "PDDeployment", ns, NAME, more=2)  # whatever it writes after 2/2 is seen too
    assert obj["status"]["compatKey"] == key
    written = list(seen.conditions())
    assert len(written) >= 2, seen.versions
    bad = [(v["rv"], c["Ready"]["status"], c["Progressing"]["reason"], c["Progressing"]["message"])
           for v, c in written if "Ready" in c and "Progressing" in c
           and c["Ready"]["status"] == "False" and c["Progressing"]["status"] == "False"
           and c["Progressing"]["reason"] == "Complete"]
    assert not bad, f"status said Ready=False and Progressing=False/Complete in one write: {bad}"
    # the change was seen as progressing while decode scaled (status did not stay green)
    assert any(c["Ready"]["status"] == "False" for v, c in written if "Ready" in c and v["generation"] > 1), \
        [(v["rv"], c.get("Ready", {}).get("status")) for v, c in written]


# ---------------------------------------------------------------------------------- 4.
def test_a_recovering_pod_fires_no_rollout_complete(cluster, operator, ns):
    kapply(cluster, _spec(ns))
    wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    wait_for(lambda: _events(cluster, ns, "RolloutComplete"), timeout=10, what="the first group's RolloutComplete")
    before = len(_events(cluster, ns, "RolloutComplete"))
    (decode,) = pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=decode")
    # the GB300 nodes cordoned (maintenance): the deleted pod's replacement waits until they come back
    gb300 = "nvidia.com/gpu.product=NVIDIA-GB300"
    with StatusWatch(cluster, ns) as seen:
        cluster.kubectl("cordon", "-l", gb300)
        try:
            cluster.kubectl("delete", "pod", decode["metadata"]["name"], "-n", ns, "--wait=false")
            wait_for(lambda: any(c.get("Ready", {}).get("status") == "False" for _, c in seen.conditions()),
                     timeout=30, what="status noticed the missing decode pod")
        finally:
            cluster.kubectl("uncordon", "-l", gb300)
        wait_for(lambda: (p := pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=decode"))
                 and p[0]["metadata"]["uid"] != decode["metadata"]["uid"], timeout=30, what="a new decode pod")
        wait_for(lambda: _ready(cluster, ns), timeout=60, what="Ready again")
        looked(operator, "PDDeployment", ns, NAME, more=2)
    events = _events(cluster, ns, "RolloutComplete")
    assert len(events) == before, [e["message"] for e in events]


def test_a_role_scaled_to_zero_reads_scaled_to_zero_not_a_surge_that_never_ends(cluster, operator, ns):
    kapply(cluster, _spec(ns))
    wait_for(lambda: _ready(cluster, ns), timeout=90, what="Ready")
    kapply(cluster, _spec(ns, **{"decode.replicas": 0}))

    def parked():
        o = _pdd(cluster, ns)
        c = {k["type"]: k for k in (o or {}).get("status", {}).get("conditions", [])}
        return (o["status"].get("observedGeneration") == o["metadata"]["generation"]
                and (c.get("Ready") or {}).get("reason") == "ScaledToZero" and c)

    conds = wait_for(parked, timeout=60, what="Ready False/ScaledToZero")
    assert conds["Ready"]["status"] == "False" and "decode scaled to 0 replicas" in conds["Ready"]["message"]
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == ("False", "Complete")
    assert pods(cluster, ns, f"{LBL}/deployment={NAME},{LBL}/role=prefill"), "prefill was not asked to stop"
    looked(operator, "PDDeployment", ns, NAME, more=2)  # it stays so (no surge, no deadline)
    assert (_pdd(cluster, ns)["status"]["rollout"]["phase"]) == "Complete"
    kapply(cluster, _spec(ns))
    wait_for(lambda: _ready(cluster, ns), timeout=60, what="Ready again at decode 1")


# ---------------------------------------------------------------------------------- 5.
def test_a_stopped_scraper_turns_slo_met_unknown(cluster, operator, ns, tmp_path):
    doc = _spec(ns, **{"slo": {"ttft": {"p90": "800ms"}, "window": "30s"}})
    operator.stop()  # the module's operator (with its scraper) must not write status beside ours; frees the Lease
    try:
        _stopped_scraper(cluster, ns, doc, tmp_path)
    finally:
        operator.start()


def _stopped_scraper(cluster, ns, doc, tmp_path):
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op1.log",
                         extra_args=["--slo-interval", "2"]).start()
    try:
        kapply(cluster, doc)
        obj = wait_for(lambda: (o := _ready(cluster, ns)) and o["status"].get("scrape") and condition(o, "SLOMet")
                       and o, timeout=90, what="Ready with SLO figures")
    finally:
        op.stop()
    assert obj["status"].get("slo"), obj["status"]
    # the scraper stops: the same operator without it (--slo-interval 0)
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op2.log",
                         extra_args=["--slo-interval", "0"]).start()
    try:
        t0 = time.monotonic()
        obj = wait_for(lambda: (o := _pdd(cluster, ns)) and condition(o, "SLOMet")["reason"] == "NoRecentMeasurement"
                       and o, timeout=100, interval=1, what="SLOMet Unknown/NoRecentMeasurement")
        print(f"SLOMet Unknown {time.monotonic() - t0:.0f}s after the restart: {condition(obj, 'SLOMet')['message']}")
    except BaseException:
        print(op.log_tail())
        raise
    finally:
        op.stop()
    assert condition(obj, "SLOMet")["status"] == "Unknown"
    left = {k: obj["status"][k] for k in ("slo", "scrape") if k in obj["status"]}
    assert not left, f"stale figures kept beside SLOMet Unknown: {left}"
    assert condition(obj, "Ready")["status"] == "True"  # the engines serve; only the measurement is gone


# ---------------------------------------------------------------------------------- 6.
def test_slo_window_above_the_maximum_is_refused_by_the_api_server(cluster, crds, ns):
    res = kapply(cluster, _spec(ns, **{"slo": {"ttft": {"p90": "800ms"}, "window": "24h"}}), check=False)
    assert res.returncode != 0, res.stdout
    assert "spec.slo.window" in res.stderr and "at most 1h" in res.stderr, res.stderr
    res = kapply(cluster, _spec(ns, **{"slo": {"ttft": {"p90": "800ms"}, "window": "1h"}}), check=False)
    assert res.returncode == 0, res.stderr
