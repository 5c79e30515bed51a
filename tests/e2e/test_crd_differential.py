"""The CRD differential in CI (issue 26): 2,000 generated specs, check vs the real kube-apiserver vs the operator's reconcile.

See tests/e2e/crd_differential.py for the generation and the three judges. Targets: no
crash of ``check`` or of the operator's reconcile; no spec that ``check`` accepts and the API
server refuses; no spec both accept whose rendered child the API server refuses (every
child dry-run applied); every spec ``check`` refuses and the API server accepts explained by
a class of tests/e2e/crd_stricter_by_design.yaml. A sample also goes through ``kubectl
apply --server-side --dry-run=server`` itself, whose verdict must equal the direct call's.
``SGLANG_PD_CRD_DIFF_N`` changes the count (at least 2,000 in CI);
benchmarks/bench_crd_differential.py runs 10,000 and prints the same matrix.
"""

from __future__ import annotations

import copy
import os
import uuid

import pytest

import crd_differential as diff

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SEED = 26000
N = int(os.environ.get("SGLANG_PD_CRD_DIFF_N", "2000"))


@pytest.fixture(scope="module")
def diff_namespace(cluster, crds):
    name = f"crd-diff-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def monitoring_crds(cluster):
    """The Prometheus Operator's PodMonitor and PrometheusRule CRDs for this module (removed after it)."""
    installed = diff.install_monitoring_crds(cluster)
    yield
    if installed:
        diff.remove_monitoring_crds(cluster)


def test_check_the_api_server_and_the_operator_agree_on_generated_specs(cluster, catalog, diff_namespace,
                                                                      monitoring_crds, cluster_log):
    matrix = diff.run(api_client=cluster.api_client(), namespace=diff_namespace, catalog=catalog, n=N,
                      seed_value=SEED, batch=diff.BATCH,
                      on_batch=lambda m: print(f"  {m.total} specs, {m.seconds:.0f} s", flush=True))
    cluster_log(matrix.render())  # in the CI log too, where pytest -q keeps a passing test's output
    # the reconcile is told what the dev cluster serves, as the operator's discovery tells it
    assert matrix.served == diff.Served(lws=True, cd=True, monitoring=True), matrix.render()
    assert matrix.bad() == {}, matrix.render()
    # both verdicts and the reconcile were exercised
    assert matrix.cells["both accept, every child accepted"] >= N // 20, matrix.render()
    assert matrix.cells["both refuse"] >= N // 4 and matrix.children >= N // 5, matrix.render()
    assert matrix.cells["API server gave no verdict"] == 0, matrix.render()
    # every kind of child was really sent with dryRun=All: the multi-node examples' LeaderWorkerSets and
    # ComputeDomains (GB300 IMEX) too, and the Prometheus Operator's objects
    for kind in ("Deployment", "Service", "ConfigMap", "LeaderWorkerSet", "ComputeDomain", "PodMonitor",
                 "PrometheusRule"):
        assert matrix.kinds[kind] > 0, (kind, matrix.render())


def test_kubectl_gives_the_verdict_of_the_direct_call(cluster, diff_namespace):
    """The bulk run calls the API server directly; kubectl apply --server-side --dry-run=server agrees on a sample."""
    api = cluster.api_client()
    seen = {True: 0, False: 0}
    for i, doc in enumerate(diff.generate(60, seed_value=SEED + 900)):
        v = diff.Verdict(index=i)
        diff.api_verdict(api, diff_namespace, doc, v)
        ok, stderr = diff.kubectl_verdict(cluster, diff_namespace, doc)
        assert v.api_ok is ok, (i, v.api_message, stderr)
        seen[ok] += 1
    assert seen[True] and seen[False], seen


def test_a_nel_is_folded_by_server_side_apply_and_refused_by_check(cluster, catalog, diff_namespace):
    """The stricter-by-design class the 10,000-spec run found (seed 26009 #149): the API server
    decodes an apply patch as YAML, where NEL (U+0085) is a line break folded into a space, so
    it accepts "x\\x85y" as "x y"; check refuses the value as written. If the API server stops
    folding, it refuses too and this class must leave crd_stricter_by_design.yaml."""
    doc = copy.deepcopy(diff.examples()[0])
    doc["metadata"] = {"name": diff.NAME}
    doc["spec"]["model"]["servedModelName"] = "served\x85model"
    v = diff.Verdict(index=0)
    diff.check_verdict(doc, catalog, v)
    diff.api_verdict(cluster.api_client(), diff_namespace, doc, v)
    assert (v.check_ok, v.api_ok) == (False, True), (v.check_first, v.api_message)
    assert v.check_fields == ("spec.model.servedModelName",), v.check_first
    assert diff.classify(v, diff.stricter_classes()) == "a NEL (U+0085) that server-side apply turns into a space"
    # the same value with a character nothing folds (BEL) is refused by both
    doc["spec"]["model"]["servedModelName"] = "served\x07model"
    w = diff.Verdict(index=1)
    diff.check_verdict(doc, catalog, w)
    diff.api_verdict(cluster.api_client(), diff_namespace, doc, w)
    assert (w.check_ok, w.api_ok) == (False, False), (w.check_first, w.api_message)


def _set_deadline(spec):
    spec["rollout"] = {**(spec.get("rollout") or {}), "progressDeadline": "99999999999999h"}


def _set_65_node_selector_entries(spec):
    spec["prefill"]["nodeSelector"] = {f"k{i}.example.com/x": "v" for i in range(65)}


def _set_escaping_path(spec):
    spec["model"]["source"] = {"pvc": {"claimName": "model-store", "path": "/../../../etc/shadow"}}


def _set_image_with_space(spec):
    spec["runtime"]["image"] = "lmsysorg/sglang:v0.5.23 cu130"


def _set_served_name(value):
    def edit(spec):
        spec["model"]["servedModelName"] = value
    return edit


def _set_env(value):
    def edit(spec):
        spec["decode"]["env"] = [{"name": "GREETING", "value": value}]
    return edit


#: The five hostile specs of issue 26, as the issue found them (check accepted every one), with the
#: field each is refused on: the NUL and the right-to-left override each in servedModelName and in an env value.
HOSTILE = [
    ("progressDeadline 99999999999999h", _set_deadline, "spec.rollout.progressDeadline"),
    ("65 nodeSelector entries", _set_65_node_selector_entries, "spec.prefill.nodeSelector"),
    ("PVC path /../../../etc/shadow", _set_escaping_path, "spec.model.source.pvc.path"),
    ("an image with a space", _set_image_with_space, "spec.runtime.image"),
    ("NUL in servedModelName", _set_served_name("deepseek\x00v4"), "spec.model.servedModelName"),
    ("RLO in servedModelName", _set_served_name("deepseek\u202e4v"), "spec.model.servedModelName"),
    ("NUL in an env value", _set_env("hello\x00world"), "spec.decode.env[0].value"),
    ("RLO in an env value", _set_env("hello\u202edlrow"), "spec.decode.env[0].value"),
]


@pytest.mark.parametrize("what, edit, field", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_the_hostile_specs_of_the_issue_are_refused_by_the_api_server_and_by_check(cluster, catalog, diff_namespace,
                                                                                  what, edit, field):
    """Issue 26's five hostile specs (found by hand, before the differential: no seed reproduces them),
    each applied to the real API server (server-side apply dry run, strict, as kubectl sends it) and given
    to check: both refuse it, and both name the field. The example itself passes both (the control)."""
    doc = copy.deepcopy(diff.examples()[0])  # dsv41-flash-gb300-low-latency.yaml
    doc["metadata"] = {"name": diff.NAME}
    control = diff.Verdict(index=0)
    diff.check_verdict(doc, catalog, control)
    diff.api_verdict(cluster.api_client(), diff_namespace, doc, control)
    assert (control.check_ok, control.api_ok) == (True, True), (control.check_first, control.api_message)

    edit(doc["spec"])
    v = diff.Verdict(index=1)
    diff.check_verdict(doc, catalog, v)
    diff.api_verdict(cluster.api_client(), diff_namespace, doc, v)
    assert v.check_ok is False and field in v.check_fields, (what, v.check_first)
    assert v.api_ok is False, (what, v.api_message)
    assert field in v.api_message, (what, v.api_message)


def _spec_of_bytes(size: int) -> dict:
    """The low-latency example with decode env values that make its spec exactly ``size`` bytes as recorded."""
    from sglang_pd_operator.planning.size import record_bytes

    doc = copy.deepcopy(diff.examples()[0])
    doc["metadata"] = {"name": diff.NAME}
    env = doc["spec"]["decode"].setdefault("env", [])
    env.append({"name": "PAD0", "value": ""})
    while record_bytes(doc["spec"]) < size:
        if len(env[-1]["value"]) >= 32_768:  # the schema's longest env value
            env.append({"name": f"PAD{len(env)}", "value": ""})
        missing = size - record_bytes(doc["spec"])
        env[-1]["value"] += "x" * min(missing, 32_768 - len(env[-1]["value"]))
    assert record_bytes(doc["spec"]) == size
    return doc


def test_a_spec_too_large_for_its_record_is_refused_by_check_and_the_largest_passes(cluster, catalog, diff_namespace,
                                                                                  monitoring_crds):
    """The class the 10,000-spec run led to: every workload records the spec in its annotations (at most
    262,144 bytes per object), so a spec the API server accepts could have every workload refused. The
    largest spec check accepts (planning.size.MAX_SPEC_BYTES) renders children the API server accepts, with
    the API server's defaults in the record; one byte more is refused by check, naming the field, and is
    stricter by design; past the 3 MiB request limit the API server refuses it too (413)."""
    from sglang_pd_operator.planning.size import MAX_SPEC_BYTES

    api = cluster.api_client()
    kube = diff.DryRunKube(api)
    largest = _spec_of_bytes(MAX_SPEC_BYTES)
    v = diff.Verdict(index=0)
    diff.check_verdict(largest, catalog, v)
    diff.api_verdict(api, diff_namespace, largest, v)
    diff.operator_verdict(kube, diff_namespace, largest, catalog, v, served=diff.served_apis(kube))
    assert v.cell == "both accept, every child accepted", (v.check_first, v.api_message, v.child_refused, v.stopped)
    assert any(c.startswith("Deployment ") for c in v.children), v.children

    past = _spec_of_bytes(MAX_SPEC_BYTES + 1)
    w = diff.Verdict(index=1)
    diff.check_verdict(past, catalog, w)
    diff.api_verdict(api, diff_namespace, past, w)
    assert (w.check_ok, w.api_ok) == (False, True), (w.check_first, w.api_message)
    assert w.check_rules == ("spec_size",) and w.check_fields == ("spec.decode.env",), w.check_first
    assert diff.classify(w, diff.stricter_classes()) == "a spec too large for the record each workload keeps of it"

    huge = _spec_of_bytes(3 * 1024 * 1024 + 1)
    u = diff.Verdict(index=2)
    diff.check_verdict(huge, catalog, u)
    diff.api_verdict(api, diff_namespace, huge, u)
    assert (u.check_ok, u.api_ok) == (False, False) and "too large" in u.api_message, (u.check_first, u.api_message)
    assert u.check_rules == ("spec_size",), u.check_first


#: A fresh user's report: what the API server says for a bad value of a field whose form is a long regex or a
#: duration: the field, the form in words and the fix; never the regex, a CEL conversion error or
#: the literal word "string" for the value.
READABLE_REFUSALS = [
    ("PVC path /../etc", lambda s: s["model"].__setitem__("source", {"pvc": {"claimName": "model-store",
                                                                              "path": "/../etc"}}),
     "spec.model.source.pvc.path", "must be an absolute path inside the volume"),
    ("progressDeadline abc", lambda s: s.__setitem__("rollout", {"progressDeadline": "abc"}),
     "spec.rollout.progressDeadline", "must be a duration: a number with unit"),
    ("progressDeadline 30d", lambda s: s.__setitem__("rollout", {"progressDeadline": "30d"}),
     "spec.rollout.progressDeadline", "must be a duration: a number with unit"),
    ("progressDeadline 2562048h", lambda s: s.__setitem__("rollout", {"progressDeadline": "2562048h"}),
     "spec.rollout.progressDeadline", "write a shorter duration"),
    ("progressDeadline 0s", lambda s: s.__setitem__("rollout", {"progressDeadline": "0s"}),
     "spec.rollout.progressDeadline", "set 1s or more"),
]


@pytest.mark.parametrize("what, edit, field, words", READABLE_REFUSALS, ids=[r[0] for r in READABLE_REFUSALS])
def test_the_api_servers_refusal_names_the_field_and_the_fix(cluster, catalog, diff_namespace, what, edit, field,
                                                             words):
    doc = copy.deepcopy(diff.examples()[0])
    doc["metadata"] = {"name": diff.NAME}
    edit(doc["spec"])
    v = diff.Verdict(index=0)
    diff.check_verdict(doc, catalog, v)
    diff.api_verdict(cluster.api_client(), diff_namespace, doc, v)
    assert v.check_ok is False and field in v.check_fields, (what, v.check_first)
    assert v.api_ok is False and field in v.api_message and words in v.api_message, (what, v.api_message)
    for unreadable in ("should match", "\\x{", "type conversion error", 'Invalid value: "string"'):
        assert unreadable not in v.api_message, (what, v.api_message)
    ok, stderr = diff.kubectl_verdict(cluster, diff_namespace, doc)  # what a user sees
    assert ok is False and field in stderr and words in stderr and "type conversion error" not in stderr, stderr
