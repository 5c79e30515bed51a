"""The operator's default Kueue queue (issue 27, item 3: "or a chart default"), without a cluster.

``run --default-queue-name`` (the chart's ``scheduling.defaultQueueName``) is the queue of
every PDDeployment whose ``spec.scheduling.queueName`` is unset. It is an explicit input of
planning (``build_plan(..., default_queue=)``), never a global; ``check`` and ``render``
take the same flag. The queue of a queued plan is a compat input (Kueue refuses to change
a running LeaderWorkerSet's queue), so a running group is never re-rendered by a new
default on its own: it is held like any operator change (UpgradePending, issue 25) and
the default reaches groups created afterwards. tests/e2e/test_kueue.py admits a
PDDeployment without a queue name through the default queue on the real Kueue.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers import EXAMPLES, MemoryKube, load_example, merge_patched

from sglang_pd_operator.api import kueue, lws
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.cli import main
from sglang_pd_operator.planning.plan import QUEUE_COMPAT_INPUT, build_plan
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers import upgrade as U
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render import render_all

WIDE_EP = EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml"
SINGLE_NODE = EXAMPLES / "dsv41-flash-gb300-throughput-dep.yaml"


def _doc(path=WIDE_EP, **spec) -> dict:
    doc = load_example(path)
    doc["metadata"].update(uid="u1", generation=1)
    doc["spec"].update(spec)
    return doc


def _plan(catalog, doc, default=None):
    plan = build_plan(parse_pddeployment(doc), catalog, default_queue=default)
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def _lws(objs: list[dict], role: str = "decode") -> dict:
    [obj] = [o for o in objs if o["kind"] == lws.KIND and o["metadata"]["labels"][L.LABEL_ROLE] == role]
    return obj


@pytest.fixture(autouse=True)
def _fresh_memo():
    U._HASH_MEMO.clear()
    yield
    U._HASH_MEMO.clear()


# --- planning and rendering ---------------------------------------------------------------


def test_a_spec_without_a_queue_takes_the_default_and_a_spec_queue_wins(catalog):
    by_default = _plan(catalog, _doc(), default="gb300")
    assert (by_default.queue_name, by_default.queue_source, by_default.queued) == ("gb300", "operatorDefault", True)
    decode = _lws(render_all(by_default))
    assert decode["metadata"]["labels"][kueue.QUEUE_LABEL] == "gb300"
    for t in (decode["spec"]["leaderWorkerTemplate"]["leaderTemplate"], decode["spec"]["leaderWorkerTemplate"]["workerTemplate"]):
        assert t["metadata"]["annotations"][kueue.REQUIRED_TOPOLOGY] == "nvidia.com/gpu.clique"
    # the spec's own queue wins over the default
    own = _plan(catalog, _doc(scheduling={"queueName": "team-a"}), default="gb300")
    assert (own.queue_name, own.queue_source) == ("team-a", "spec")
    assert _lws(render_all(own))["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    # neither: no label, no Kueue annotation (as before the default existed)
    plain = _plan(catalog, _doc())
    assert (plain.queue_name, plain.queue_source, plain.queued) == (None, None, False)
    decode = _lws(render_all(plain))
    assert kueue.QUEUE_LABEL not in decode["metadata"]["labels"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in
                   decode["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"].get("annotations") or {})


def test_the_default_and_the_same_queue_in_the_spec_render_alike(catalog):
    """Writing the default into the spec (or dropping it from the spec while the default names it) changes nothing."""
    by_default = _plan(catalog, _doc(), default="gb300")
    own = _plan(catalog, _doc(scheduling={"queueName": "gb300"}))
    assert by_default.compat_key == own.compat_key
    assert render_all(by_default) == render_all(own)


def test_the_queue_is_a_compat_input_of_queued_plans_only(catalog):
    plain, queued = _plan(catalog, _doc()), _plan(catalog, _doc(), default="gb300")
    assert QUEUE_COMPAT_INPUT not in plain.prefill.compat_inputs  # unqueued keys are what they were
    assert queued.prefill.compat_inputs[QUEUE_COMPAT_INPUT] == queued.decode.compat_inputs[QUEUE_COMPAT_INPUT] == "gb300"
    assert queued.compat_key != plain.compat_key
    assert queued.prefill.compat_key == queued.decode.compat_key
    assert _plan(catalog, _doc(), default="other").compat_key not in (plain.compat_key, queued.compat_key)
    # the engines' arguments keep the key of SGLang's own inputs (the HiCache tag is not moved by a queue)
    assert queued.decode.command == plain.decode.command
    # a single-node deployment has no LeaderWorkerSet to queue: the default changes nothing of it
    single, single_default = _plan(catalog, _doc(SINGLE_NODE)), _plan(catalog, _doc(SINGLE_NODE), default="gb300")
    assert not single_default.queued and single_default.compat_key == single.compat_key
    assert render_all(single_default) == render_all(single)


# --- the reconciler: a running group keeps its queue, new groups take the default --------


def _status(kube: MemoryKube) -> dict:
    status: dict = {}
    for patch in kube.status:
        status = merge_patched(status, patch)
    return status


def _reconcile(kube, catalog, doc, *, default, now):
    if kube.status:
        doc["status"] = _status(kube)
    return P.reconcile(kube=kube, body=doc, catalog=catalog, now=now, lws_served=True, cd_served=True,
                       default_queue=default)


def _conds(kube) -> dict:
    return {c["type"]: c for c in _status(kube).get("conditions") or []}


def test_setting_the_default_holds_a_running_group_and_reaches_new_groups_only(catalog):
    kube = MemoryKube()
    _reconcile(kube, catalog, _doc(), default=None, now=1000.0)  # created before the default was set
    key = _status(kube)["compatKey"]
    assert kueue.QUEUE_LABEL not in _lws(kube.applied)["metadata"]["labels"] and "scheduling" not in _status(kube)
    # the chart now sets scheduling.defaultQueueName: the operator restarts with --default-queue-name gb300
    kube.applied.clear()
    _reconcile(kube, catalog, _doc(), default="gb300", now=1010.0)
    assert not [o for o in kube.applied if o["kind"] in (lws.KIND, "Deployment", "ConfigMap")]  # nothing re-rendered
    assert _status(kube)["compatKey"] == key and "scheduling" not in _status(kube)
    up = _conds(kube)["UpgradePending"]
    assert (up["status"], up["reason"]) == ("True", U.REASON_HELD)
    assert "decode: Kueue queue none -> gb300" in up["message"] and "paired rollout" in up["message"]
    assert U.QUEUE_REASON in up["message"] and "operatorChanges: apply" in up["message"]
    assert "ComputeDomain" not in up["message"]  # per-key objects are not reported as changes
    # again: still held, nothing applied, no second event
    kube.applied.clear()
    _reconcile(kube, catalog, _doc(), default="gb300", now=1020.0)
    assert not [o for o in kube.applied if o["kind"] in (lws.KIND, "Deployment", "ConfigMap")]
    assert [r for r, _ in kube.events].count("UpgradePending") == 1
    # a deployment created now is queued through the default, and says so in status
    other = MemoryKube()
    doc = _doc()
    doc["metadata"]["name"] = "wide-ep-new"
    _reconcile(other, catalog, doc, default="gb300", now=1000.0)
    assert _lws(other.applied)["metadata"]["labels"][kueue.QUEUE_LABEL] == "gb300"
    assert _status(other)["scheduling"] == {"queueName": "gb300", "queueSource": "operatorDefault"}
    assert "UpgradePending" not in _conds(other)
    # the opt-in moves the held group: a new group (new key) beside the serving one, queued through the default
    kube.applied.clear()
    opt_in = _doc(rollout={"operatorChanges": "apply"})
    opt_in["metadata"]["generation"] = 2
    _reconcile(kube, catalog, opt_in, default="gb300", now=1030.0)
    new = _lws(kube.applied)
    assert new["metadata"]["labels"][kueue.QUEUE_LABEL] == "gb300"
    assert new["metadata"]["labels"][L.LABEL_COMPAT_KEY] != key
    old = kube.get(lws.API_VERSION, lws.KIND, L.group_object_name(opt_in["metadata"]["name"], key, "decode"))
    assert old is not None and kueue.QUEUE_LABEL not in old["metadata"]["labels"]  # serving, untouched
    assert _status(kube)["rollout"]["servingKey"] == key  # the old group serves until the new one is Ready
    assert _status(kube)["scheduling"] == {"queueName": "gb300", "queueSource": "operatorDefault"}


def test_a_spec_queue_is_not_held_when_the_default_changes(catalog):
    kube = MemoryKube()
    doc = _doc(scheduling={"queueName": "team-a"})
    _reconcile(kube, catalog, doc, default="gb300", now=1000.0)
    assert _status(kube)["scheduling"] == {"queueName": "team-a", "queueSource": "spec"}
    kube.applied.clear()
    _reconcile(kube, catalog, _doc(scheduling={"queueName": "team-a"}), default="other", now=1010.0)
    assert "UpgradePending" not in _conds(kube)
    assert _lws(kube.applied)["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"


def test_a_users_queue_change_is_a_new_group_not_an_in_place_change_kueue_refuses(catalog):
    kube = MemoryKube()
    _reconcile(kube, catalog, _doc(scheduling={"queueName": "team-a"}), default=None, now=1000.0)
    key = _status(kube)["compatKey"]
    kube.applied.clear()
    doc = _doc(scheduling={"queueName": "team-b"})
    doc["metadata"]["generation"] = 2
    _reconcile(kube, catalog, doc, default=None, now=1010.0)
    [applied] = [o for o in kube.applied if o["kind"] == lws.KIND]
    assert applied["metadata"]["labels"][L.LABEL_COMPAT_KEY] != key  # the team-a LeaderWorkerSet is not patched
    assert applied["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-b"


def test_describe_changes_names_a_queue_change_of_a_leaderworkerset():
    def obj(queue):
        labels = {L.LABEL_ROLE: "decode", **({kueue.QUEUE_LABEL: queue} if queue else {})}
        return {"apiVersion": lws.API_VERSION, "kind": lws.KIND, "metadata": {"name": "x-k-decode", "labels": labels},
                "spec": {"leaderWorkerTemplate": {"workerTemplate": {"spec": {"containers": []}}}}}

    assert U.describe_changes(live=[obj(None)], desired=[obj("gb300")], old_key="k", new_key="k") == [
        "decode: Kueue queue none -> gb300"]
    assert U.describe_changes(live=[obj("a")], desired=[obj(None)], old_key="k", new_key="k") == [
        "decode: Kueue queue a -> none"]
    assert U.describe_changes(live=[obj("a")], desired=[obj("a")], old_key="k", new_key="k") == []


# --- the command line ----------------------------------------------------------------------


def test_check_and_render_plan_with_the_operators_default_queue():
    runner = CliRunner()
    res = runner.invoke(main, ["check", "-o", "json", str(WIDE_EP), "--default-queue-name", "gb300"])
    assert res.exit_code == 0, res.output
    with_default = json.loads(res.output)
    assert with_default["scheduling"] == {"queueName": "gb300", "queueSource": "operatorDefault"}
    plain = json.loads(runner.invoke(main, ["check", "-o", "json", str(WIDE_EP)]).output)
    assert "scheduling" not in plain and plain["compatKey"] != with_default["compatKey"]
    # the same value from the environment (a CI job's variable), and the human output names it
    res = runner.invoke(main, ["check", str(WIDE_EP)], env={"SGLANG_PD_DEFAULT_QUEUE_NAME": "gb300"})
    assert "Kueue queue gb300 (operator default)" in res.output and with_default["compatKey"] in res.output
    res = runner.invoke(main, ["render", "-o", "json", str(WIDE_EP), "--default-queue-name", "gb300"])
    items = json.loads(res.output)["items"]
    assert _lws(items)["metadata"]["labels"][kueue.QUEUE_LABEL] == "gb300"
    # not a LocalQueue name: refused before anything is planned
    res = runner.invoke(main, ["check", str(WIDE_EP), "--default-queue-name", "Team_A"])
    assert res.exit_code == 2 and "DNS label" in res.output
    # run parses it too (the chart's flag)
    ctx = main.commands["run"].make_context("run", ["--default-queue-name=gb300"])
    assert ctx.params["default_queue"] == "gb300"
    assert main.commands["run"].make_context("run", [])
