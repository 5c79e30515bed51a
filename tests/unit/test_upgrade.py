"""Operator upgrades restart no engine (issue 25, item 1): a running group is held as rendered.

A group records who rendered it and from what spec (render/record.py). A reconcile by an
operator that would render it differently, while the user changed nothing it is made
of, applies nothing of it (no Deployment written, the compat key kept), keeps Ready True
and says in UpgradePending what would change and why; ``rollout.operatorChanges: apply``
rolls it out (a paired rollout when the key changes, in place otherwise). A user's change
is rendered by the running operator. A group made before 0.2.0 (no record) is adopted:
its record is written into workload metadata, never into a pod template.

"A different operator" is this operator with one rendering function changed by
monkeypatch: the same code path a new release takes.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, all_deployments_ready, load_example, merge_patched

from sglang_pd_operator.planning import compat
from sglang_pd_operator.reconcilers import kube as K
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers import upgrade as U
from sglang_pd_operator.render import engine, gateway
from sglang_pd_operator.render import labels as L
from sglang_pd_operator.render import record as R

EXAMPLE = EXAMPLES / "dsv41-flash-h200-flashmla.yaml"


class MemoryKube:
    """The reconciler's reads and writes on dicts in memory: apply, /scale, metadata patches, status."""

    def __init__(self):
        self.objects: dict[tuple[str, str], dict] = {}
        self.applied: list[dict] = []
        self.scaled: list[tuple[str, str, int]] = []
        self.patched: list[tuple[str, str, dict]] = []
        self.status: list[dict] = []
        self.events: list[tuple[str, str]] = []
        self.total_writes = 0
        self.metadata_bumps = K.MetadataBumps()

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.objects.get((kind, name)))

    def list(self, api_version, kind, namespace, label_selector):
        want = dict(p.split("=", 1) for p in label_selector.split(",") if "=" in p)
        return [copy.deepcopy(o) for (k, _), o in self.objects.items()
                if k == kind and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in want.items())]

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        if dry_run:  # the API server's verdict only: nothing stored
            return True
        self.applied.append(desired)
        old = self.objects.get((desired["kind"], desired["metadata"]["name"]))
        new = copy.deepcopy(desired)
        if old is not None and "status" in old:
            new["status"] = old["status"]
            # apps/v1: a changed spec or a changed annotation bumps the generation (strategy.go)
            moved = old.get("spec") != new.get("spec") or old["metadata"].get("annotations") != new["metadata"].get("annotations")
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + moved
        self.objects[(desired["kind"], desired["metadata"]["name"])] = new
        self.total_writes += 1
        return True

    def scale(self, api_version, kind, name, namespace, replicas, *, field_manager=None):
        self.scaled.append((kind, name, replicas))
        self.objects[(kind, name)]["spec"]["replicas"] = replicas
        self.total_writes += 1

    def patch_metadata(self, api_version, kind, name, namespace, *, annotations):
        self.patched.append((kind, name, annotations))
        meta = self.objects[(kind, name)]["metadata"]
        merged = {**(meta.get("annotations") or {}), **annotations}
        if kind == "Deployment" and merged != meta.get("annotations"):  # apps/v1: annotations bump the generation
            meta["generation"] = meta.get("generation", 1) + 1
        meta["annotations"] = merged
        self.metadata_bumps.record(kind, namespace, name, meta.get("generation"))  # as Kube.patch_metadata does
        self.total_writes += 1

    def delete(self, api_version, kind, name, namespace):
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.status.append(status)
        self.total_writes += 1

    def event(self, involved, *, type_, reason, message):
        self.events.append((reason, message))

    def has_kind(self, api_version, kind):
        return False

    def all_ready(self):
        """Every Deployment rolled out and Ready (what the Deployment controller and the kubelet would report)."""
        all_deployments_ready(self.objects)

    def deployments(self):
        return {name: o for (kind, name), o in self.objects.items() if kind == "Deployment"}


def _body(kube: MemoryKube | None = None, generation: int = 1, **fields) -> dict:
    doc = load_example(EXAMPLE)
    doc["metadata"].update(uid="u1", generation=generation, namespace=doc["metadata"].get("namespace", "default"))
    for path, value in fields.items():
        node = doc["spec"]
        *head, last = path.split(".")
        for h in head:
            node = node.setdefault(h, {})
        node[last] = value
    if kube is not None and kube.status:
        status: dict = {}
        for s in kube.status:  # merge patches, in order
            status = merge_patched(status, s)
        doc["status"] = status
    return doc


def _conds(kube: MemoryKube, body: dict) -> dict:
    status = _body(kube)["status"]
    return {c["type"]: c for c in status.get("conditions") or []}


def _serving(catalog, **fields) -> tuple[MemoryKube, str]:
    """A deployment this operator created and that became Ready: (kube, its compat key)."""
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(**fields), catalog=catalog, now=1000.0)
    kube.all_ready()
    P.reconcile(kube=kube, body=_body(kube, **fields), catalog=catalog, now=1010.0)
    status = _body(kube)["status"]
    assert status["rollout"]["phase"] == "Complete"
    return kube, status["compatKey"]


def _unrecord(kube: MemoryKube) -> None:
    """Remove the render record from every Deployment, as a group made before 0.2.0 has none."""
    for dep in kube.deployments().values():
        for a in list(dep["metadata"]["annotations"]):
            if a.startswith(f"{L.DOMAIN}/rendered"):
                del dep["metadata"]["annotations"][a]


@pytest.fixture(autouse=True)
def _fresh_memo():
    """Each test renders with its own "operator" (monkeypatched): no render hash remembered from another."""
    U._HASH_MEMO.clear()
    yield
    U._HASH_MEMO.clear()


@pytest.fixture
def new_compat_input(monkeypatch):
    """This operator as a release whose compat key gained an input."""
    real = compat.compat_key

    def salted(inputs):
        return real({**inputs, "newInput": "x"})

    monkeypatch.setattr(compat, "compat_key", salted)


@pytest.fixture
def new_gateway_probe(monkeypatch):
    """This operator as a release whose gateway probe changed (the compat key stays)."""
    real = gateway.render_gateway_group

    def changed(plan, *, owner=None):
        objs = real(plan, owner=owner)
        c = objs[0]["spec"]["template"]["spec"]["containers"][0]
        c["readinessProbe"] = {**c["readinessProbe"], "httpGet": {"path": "/liveness", "port": "http"}}
        return objs

    monkeypatch.setattr("sglang_pd_operator.render.render_gateway_group", changed)


def test_a_rendered_group_records_who_rendered_it_from_what_spec_in_workload_metadata_only(catalog):
    kube, key = _serving(catalog)
    for name, dep in kube.deployments().items():
        rec = R.read_record(dep["metadata"]["annotations"])
        assert rec is not None and rec.operator_version == R.__version__ and rec.generation == 1
        assert rec.spec == _body()["spec"]
        assert not any(a.startswith(f"{L.DOMAIN}/rendered") for a in
                       dep["spec"]["template"]["metadata"].get("annotations") or {}), name
    assert "UpgradePending" not in _conds(kube, _body())


def test_a_generation_that_renders_the_group_alike_keeps_its_record_and_bumps_no_workload(catalog):
    """An slo window edit (or a revert to the serving spec) renders the group as it is: its record is
    kept, so no workload's annotations change and no Deployment's generation moves (a moved
    generation reads as unsettled, i.e. not Ready, until the controller observes it)."""
    kube, key = _serving(catalog)
    before = {n: (d["metadata"]["generation"], d["metadata"]["annotations"]) for n, d in kube.deployments().items()}
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"slo.window": "10m"}), catalog=catalog, now=1020.0)
    after = {n: (d["metadata"]["generation"], d["metadata"]["annotations"]) for n, d in kube.deployments().items()}
    assert after == before
    status = _body(kube)["status"]
    assert status["compatKey"] == key and status["observedGeneration"] == 2
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    # a change the group is made of renews the record (and the rendering)
    P.reconcile(kube=kube, body=_body(kube, generation=3, **{"gateway.policy": "round_robin"}), catalog=catalog,
                now=1030.0)
    gw = next(d for d in kube.deployments().values() if d["metadata"]["labels"][L.LABEL_ROLE] == "gateway")
    rec = R.read_record(gw["metadata"]["annotations"])
    assert rec.generation == 3 and rec.spec["gateway"]["policy"] == "round_robin"


def test_a_new_compat_input_holds_the_group_and_says_what_an_opt_in_would_change(catalog, request):
    kube, key = _serving(catalog)
    request.getfixturevalue("new_compat_input")
    kube.applied.clear()
    outcome = P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    assert [o for o in kube.applied if o["kind"] in ("Deployment", "ConfigMap")] == []  # no engine touched
    status = _body(kube)["status"]
    assert status["compatKey"] == key and status["rollout"]["phase"] == "Complete"
    conds = _conds(kube, _body())
    assert conds["Ready"]["status"] == "True"
    up = conds["UpgradePending"]
    assert (up["status"], up["reason"]) == ("True", "OperatorChangesHeld")
    assert f"compat key {key[:6]} -> " in up["message"] and "paired rollout" in up["message"]
    assert "operatorChanges: apply" in up["message"]
    assert [r for r, _ in kube.events].count("UpgradePending") == 1 and outcome.valid
    # the next reconcile touches no group object, writes no status and tells nothing again
    kube.applied.clear()
    statuses = len(kube.status)
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1030.0)
    assert [o for o in kube.applied if o["kind"] in ("Deployment", "ConfigMap")] == []
    assert len(kube.status) == statuses and [r for r, _ in kube.events].count("UpgradePending") == 1


def test_opt_in_rolls_a_new_key_out_as_a_paired_rollout(catalog, request):
    kube, key = _serving(catalog)
    request.getfixturevalue("new_compat_input")
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"rollout.operatorChanges": "apply"}), catalog=catalog,
                now=1030.0)
    new_keys = {o["metadata"]["labels"][L.LABEL_COMPAT_KEY] for o in kube.applied if o["kind"] == "Deployment"}
    assert len(new_keys) == 1 and key not in new_keys  # a new group beside the serving one
    assert any(k == key for k in (d["metadata"]["labels"][L.LABEL_COMPAT_KEY] for d in kube.deployments().values()))
    status = _body(kube)["status"]
    assert status["rollout"]["servingKey"] == key and status["rollout"]["targetKey"] in new_keys
    assert "UpgradePending" not in _conds(kube, _body())


def test_a_change_that_keeps_the_key_is_held_then_applied_in_place(catalog, request):
    kube, key = _serving(catalog)
    request.getfixturevalue("new_gateway_probe")
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    assert not [o for o in kube.applied if o["kind"] == "Deployment"]
    up = _conds(kube, _body())["UpgradePending"]
    assert "gateway smg: readinessProbe /readiness -> /liveness" in up["message"]
    assert "in-place update" in up["message"]
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"rollout.operatorChanges": "apply"}), catalog=catalog,
                now=1030.0)
    gw = [o for o in kube.applied if o["kind"] == "Deployment" and o["metadata"]["labels"][L.LABEL_ROLE] == "gateway"]
    assert gw and gw[-1]["metadata"]["labels"][L.LABEL_COMPAT_KEY] == key  # in place, same group
    assert gw[-1]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/liveness"


def test_a_users_change_is_rendered_by_the_running_operator(catalog, request):
    kube, key = _serving(catalog)
    request.getfixturevalue("new_gateway_probe")
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    assert "UpgradePending" in _conds(kube, _body())
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"gateway.policy": "round_robin"}), catalog=catalog,
                now=1030.0)
    gw = [o for o in kube.applied if o["kind"] == "Deployment" and o["metadata"]["labels"][L.LABEL_ROLE] == "gateway"]
    c = gw[-1]["spec"]["template"]["spec"]["containers"][0]
    assert "round_robin" in c["args"] and c["readinessProbe"]["httpGet"]["path"] == "/liveness"
    assert "UpgradePending" not in _conds(kube, _body())


def test_a_replica_change_is_no_spec_change_for_a_held_group(catalog, request):
    kube, key = _serving(catalog)
    request.getfixturevalue("new_compat_input")
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"decode.replicas": 2}), catalog=catalog, now=1030.0)
    assert not [o for o in kube.applied if o["kind"] == "Deployment"]
    decode = L.group_object_name(_body()["metadata"]["name"], key, "decode")
    assert ("Deployment", decode, 2) in kube.scaled
    assert _conds(kube, _body())["UpgradePending"]["status"] == "True"


def test_a_group_made_before_0_2_0_is_adopted_and_held(catalog, request):
    kube, key = _serving(catalog)
    _unrecord(kube)  # what v0.1.0 left: no record
    request.getfixturevalue("new_compat_input")
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    assert not [o for o in kube.applied if o["kind"] == "Deployment"]
    assert {k for k, _, _ in kube.patched} == {"Deployment"} and len(kube.patched) == 3
    for dep in kube.deployments().values():
        assert R.read_record(dep["metadata"]["annotations"]).operator_version == R.UNRECORDED
    up = _conds(kube, _body())["UpgradePending"]
    assert f"rendered by operator {R.UNRECORDED}" in up["message"]
    assert "pairShape" in up["message"]  # why, from KNOWN_CHANGES for a group before 0.2.0
    # adopted once: the next reconcile patches nothing
    kube.patched.clear()
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1030.0)
    assert kube.patched == []


def test_the_adoptions_record_moves_deployment_generations_and_ready_stays_true(catalog, request):
    """The adoption's metadata write bumps each Deployment's generation (apps/v1 counts annotations); until
    the controller observes it, the group must not read as a rollout in progress: Ready stays True in the
    reconcile that wrote it and in the next one (the e2e release upgrade saw one Ready=False sample)."""
    kube, key = _serving(catalog)
    _unrecord(kube)  # what v0.1.0 left: no record
    request.getfixturevalue("new_compat_input")
    before = {n: d["metadata"]["generation"] for n, d in kube.deployments().items()}
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    for n, d in kube.deployments().items():  # moved, not observed yet by the Deployment controller
        assert d["metadata"]["generation"] == before[n] + 1 and d["status"]["observedGeneration"] == before[n]
    assert _conds(kube, _body())["Ready"]["status"] == "True"
    assert _conds(kube, _body())["UpgradePending"]["status"] == "True"
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1021.0)
    assert _conds(kube, _body())["Ready"]["status"] == "True"


def test_only_our_own_metadata_generation_counts_as_settled():
    bumps = K.MetadataBumps()
    assert not bumps.settles("Deployment", "ns", "d", generation=3, observed=2)  # not ours: a spec change
    bumps.record("Deployment", "ns", "d", 3)
    assert bumps.settles("Deployment", "ns", "d", generation=3, observed=2)
    assert not bumps.settles("Deployment", "ns", "d", generation=3, observed=1)  # an earlier change not observed
    assert not bumps.settles("Deployment", "ns", "d", generation=4, observed=3)  # a later change on top of ours
    bumps.forget("Deployment", "ns", "d")
    assert not bumps.settles("Deployment", "ns", "d", generation=3, observed=2)


def test_an_unrecorded_group_mid_rollout_is_not_held(catalog, request):
    kube, key = _serving(catalog)
    for dep in kube.deployments().values():
        dep["metadata"]["annotations"] = {}
    request.getfixturevalue("new_compat_input")
    body = _body(kube, generation=2)  # status speaks for generation 1: the user changed the spec since
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1020.0)
    assert "UpgradePending" not in _conds(kube, _body())
    assert kube.patched == []


def test_describe_changes_names_args_env_probes_and_ignores_api_defaults():
    def dep(args, env, probe, key="k" * 16):
        return {"kind": "Deployment", "metadata": {"name": f"x-{key[:6]}-decode", "labels": {
            L.LABEL_ROLE: "decode", L.LABEL_COMPAT_KEY: key}},
            "spec": {"template": {"spec": {"containers": [{"name": "sglang", "args": args, "env": env,
                                                              "readinessProbe": probe}]}}}}
    live = dep(["--a", "--b"], [{"name": "X", "value": "1"}], {"httpGet": {"path": "/health"}}, key="o" * 16)
    live["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"
    desired = dep(["--a", "--c"], [{"name": "X", "value": "2"}, {"name": "Y", "value": "1"}],
                  {"httpGet": {"path": "/health"}}, key="n" * 16)
    lines = U.describe_changes(live=[live], desired=[desired], old_key="o" * 16, new_key="n" * 16)
    assert lines == ["compat key oooooo -> nnnnnn", "decode sglang: args +--c ---b",
                     "decode sglang: env +Y X changed"]
    same = U.describe_changes(live=[live], desired=[dep(["--a", "--b"], [{"name": "X", "value": "1"}],
                                                        {"httpGet": {"path": "/health"}}, key="o" * 16)],
                              old_key="o" * 16, new_key="o" * 16)
    assert same == []


def test_known_changes_apply_only_to_groups_rendered_before_them():
    lines = ["compat key a -> b"]
    assert U.reasons_for(lines, R.UNRECORDED) and U.reasons_for(lines, "0.1.0")
    assert U.reasons_for(lines, "0.2.0") == ()


def test_the_render_hash_ignores_replica_counts(catalog):
    from sglang_pd_operator.planning.plan import plan_object
    from sglang_pd_operator.render import render_group

    one, _ = plan_object(_body(), catalog)
    two, _ = plan_object(_body(**{"decode.replicas": 3}), catalog)
    assert R.render_hash(render_group(one)) == R.render_hash(render_group(two))
    assert R.render_hash(render_group(one)) != R.render_hash(render_group(one)[:-1])
    _ = engine  # the engine renderer is the same module the reconciler uses


V010 = Path(__file__).parent / "fixtures" / "v0.1.0-dsv41-flash-h200.yaml"


def test_a_real_v0_1_0_group_is_held_with_what_and_why_then_opt_in_rolls_it_out(catalog):
    """What v0.1.0 (b180e07) rendered for the example, running and Ready, with the status v0.1.0 wrote:
    this operator applies nothing of it, keeps it serving and Ready, and names the changes of this
    release (compat key, smg /readiness, the preStop drain) with their reasons."""
    docs = [d for d in yaml.safe_load_all(V010.read_text()) if d]
    kube = MemoryKube()
    for d in docs:
        kube.objects[(d["kind"], d["metadata"]["name"])] = d
    kube.all_ready()
    old_key = next(d for d in docs if d["kind"] == "Deployment")["metadata"]["labels"][L.LABEL_COMPAT_KEY]
    body = _body()
    body["status"] = {"observedGeneration": 1, "compatKey": old_key,
                      "conditions": [{"type": "Valid", "status": "True", "reason": "Valid"},
                                     {"type": "Ready", "status": "True", "reason": "Ready"}],
                      "rollout": {"servingKey": old_key, "targetKey": old_key, "phase": "Complete"}}
    kube.status.append(body["status"])
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1000.0)
    assert not [o for o in kube.applied if o["kind"] in ("Deployment", "ConfigMap")]
    status = _body(kube)["status"]
    assert status["compatKey"] == old_key and status["rollout"]["servingKey"] == old_key
    conds = _conds(kube, _body())
    assert conds["Ready"]["status"] == "True"
    message = conds["UpgradePending"]["message"]
    for change in (f"compat key {old_key[:6]} -> ", "gateway smg: readinessProbe /health -> /readiness",
                   "prefill sglang: preStop hook added", "decode sglang: preStop hook added"):
        assert change in message, (change, message)
    for why in ("pairShape", "smg /readiness", "drain"):
        assert why in message, (why, message)
    # opt in: a paired rollout to the key this operator gives
    kube.applied.clear()
    P.reconcile(kube=kube, body=_body(kube, generation=2, **{"rollout.operatorChanges": "apply"}), catalog=catalog,
                now=1010.0)
    new = {o["metadata"]["labels"][L.LABEL_COMPAT_KEY] for o in kube.applied if o["kind"] == "Deployment"}
    assert len(new) == 1 and old_key not in new
    assert _body(kube)["status"]["rollout"]["servingKey"] == old_key  # it serves until the new group is Ready


# --------------------------------------------------------------------------- an SLO edit alone restarts no engine


def _decode_template(kube: MemoryKube) -> dict:
    (dep,) = [d for n, d in kube.deployments().items() if n.endswith("-decode")]
    return dep["spec"]["template"]


def _bucket_values(template: dict, flag: str) -> list[str]:
    args = template["spec"]["containers"][0]["args"]
    i = args.index(flag)
    out = []
    for a in args[i + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def _problem_rules(kube: MemoryKube) -> set[str]:
    return {p["rule"] for p in _body(kube)["status"].get("problems") or []}


def test_an_slo_target_edit_alone_keeps_the_decode_engines_and_their_buckets(catalog):
    """A fresh user's finding (issue 25): editing a TTFT target restarted every decode engine, since
    each target is a histogram boundary of the engine's launch flags. Now the engines keep the
    buckets they run with, status says whose targets those are, and the buckets follow at the
    decode role's next real change, across edits that leave it alone (a replica count)."""
    from sglang_pd_operator.planning.buckets import TTFT_FLAG
    from sglang_pd_operator.reconcilers.slo_buckets import RULE

    kube, key = _serving(catalog)
    before = copy.deepcopy(_decode_template(kube))
    assert "1.5" in _bucket_values(before, TTFT_FLAG) and "0.525" not in _bucket_values(before, TTFT_FLAG)
    new_slo = {"ttft": {"p90": "700ms"}, "itl": {"p90": "30ms"}, "window": "5m"}
    P.reconcile(kube=kube, body=_body(kube, generation=2, slo=new_slo), catalog=catalog, now=1020.0)
    assert _decode_template(kube) == before, "an SLO edit alone changed the decode pod template"
    assert RULE in _problem_rules(kube)
    warning = next(p for p in _body(kube)["status"]["problems"] if p["rule"] == RULE)
    assert warning["field"] == "spec.slo" and "generation 1" in warning["message"], warning
    # a replica count leaves the decode engines' config alone: the buckets stay held, and so does the record
    P.reconcile(kube=kube, body=_body(kube, generation=3, slo=new_slo, **{"decode.replicas": 3}), catalog=catalog,
                now=1030.0)
    assert _decode_template(kube) == before
    (dec,) = [d for n, d in kube.deployments().items() if n.endswith("-decode")]
    assert R.read_record(dec["metadata"]["annotations"]).spec["slo"]["ttft"]["p90"] == "1500ms"
    # a change that restarts the decode engines anyway brings the new targets' buckets with it
    P.reconcile(kube=kube, body=_body(kube, generation=4, slo=new_slo, **{"decode.replicas": 3,
                                                                          "decode.extraArgs": ["--max-running-requests", "64"]}),
                catalog=catalog, now=1040.0)
    after = _decode_template(kube)
    assert "0.525" in _bucket_values(after, TTFT_FLAG) and "1.5" not in _bucket_values(after, TTFT_FLAG)
    assert RULE not in _problem_rules(kube)


def test_operator_changes_apply_rolls_an_slo_edits_buckets_at_once(catalog):
    from sglang_pd_operator.planning.buckets import TTFT_FLAG

    kube, key = _serving(catalog)
    new_slo = {"ttft": {"p90": "700ms"}, "itl": {"p90": "30ms"}, "window": "5m"}
    P.reconcile(kube=kube, body=_body(kube, generation=2, slo=new_slo, **{"rollout.operatorChanges": "apply"}),
                catalog=catalog, now=1020.0)
    assert "0.525" in _bucket_values(_decode_template(kube), TTFT_FLAG)


def test_replacing_bucket_flags_gives_what_planning_the_targets_gives(catalog):
    """The splice the held buckets use equals planning the spec with those targets outright."""
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.planning.plan import build_plan, with_bucket_targets

    a = build_plan(parse_pddeployment(_body()), catalog)
    b_body = _body(slo={"ttft": {"p90": "700ms"}, "e2e": {"p99": "20s"}, "perUserSpeed": {"p50": 40}, "window": "5m"})
    b = build_plan(parse_pddeployment(b_body), catalog)
    assert with_bucket_targets(a, b.spec.slo).decode.command == b.decode.command
    assert with_bucket_targets(b, a.spec.slo).decode.command == a.decode.command
    assert with_bucket_targets(a, None).decode.command.args == tuple(
        x for x in build_plan(parse_pddeployment({**_body(), "spec": {k: v for k, v in _body()["spec"].items()
                                                                        if k != "slo"}}), catalog).decode.command.args)


def test_a_group_mounting_0_2_0s_shared_config_map_is_held_and_says_why(catalog, monkeypatch):
    """0.2.0 mounted one ConfigMap per role, rewritten by every in-place update; this operator names
    each config's ConfigMap after its content. A running 0.2.0 group keeps its pods and is held."""
    real = engine.config_map_name
    monkeypatch.setattr(engine, "config_map_name",
                        lambda plan, role: f"{L.group_object_name(plan.name, plan.compat_key, role.role)}-config")
    kube, key = _serving(catalog)
    monkeypatch.setattr(engine, "config_map_name", real)
    before = {n: d["spec"]["template"] for n, d in kube.deployments().items()}
    P.reconcile(kube=kube, body=_body(kube), catalog=catalog, now=1020.0)
    held = _conds(kube, _body())["UpgradePending"]
    assert held["status"] == "True", held
    assert "decode: pod volumes changed" in held["message"] and "prefill: pod volumes changed" in held["message"]
    assert "config_map_name" in held["message"], held["message"]  # the reason, from KNOWN_CHANGES
    assert {n: d["spec"]["template"] for n, d in kube.deployments().items()} == before
    assert sorted(n for (k, n) in kube.objects if k == "ConfigMap") == sorted(
        f"{L.group_object_name(_body()['metadata']['name'], key, r)}-config" for r in ("prefill", "decode"))
