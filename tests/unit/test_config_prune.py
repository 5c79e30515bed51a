"""Engine ConfigMaps: content-addressed and immutable, pruned only once nothing can mount them again.

The finding (issue 25, a fresh user): an in-place update rewrote the role's one ConfigMap,
which the old pods still mounted, so an old pod whose container restarted mid-update ran
the new config under the old template. Now a config change makes a second ConfigMap and the
old one goes only when no pod template, no pod and no older ReplicaSet can mount it.
"""

from __future__ import annotations

import copy

from helpers import EXAMPLES, load_example
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.reconcilers.configs import stale_config_maps
from sglang_pd_operator.reconcilers.observe import Observed, ObservedGroup, WorkloadState, mounted_config_maps
from sglang_pd_operator.render import render_group
from sglang_pd_operator.render import labels as L

KEY = "k" * 64


def _plan(doc, catalog):
    plan = build_plan(parse_pddeployment(doc), catalog)
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def _config_maps(objects):
    return {o["metadata"]["labels"][L.LABEL_ROLE]: o for o in objects if o["kind"] == "ConfigMap"}


def _mounted(objects):
    return {o["metadata"]["labels"][L.LABEL_ROLE]: mounted_config_maps(o["spec"]["template"]["spec"])
            for o in objects if o["kind"] == "Deployment" and o["metadata"]["labels"][L.LABEL_ROLE] != "gateway"}


def test_a_config_change_renders_a_new_immutable_config_map_the_pods_mount(catalog):
    doc = load_example(EXAMPLES / "dsv41-flash-h200-flashmla.yaml")
    before = render_group(_plan(doc, catalog))
    edited = copy.deepcopy(doc)
    edited["spec"]["decode"].setdefault("extraArgs", []).extend(["--max-running-requests", "64"])
    after_plan = _plan(edited, catalog)
    after = render_group(after_plan)
    old, new = _config_maps(before), _config_maps(after)
    assert all(cm["immutable"] is True for cm in (*old.values(), *new.values()))
    # the decode config changed: a second name; prefill's did not: the same name and data
    assert old["decode"]["metadata"]["name"] != new["decode"]["metadata"]["name"]
    assert "max-running-requests: 64" in new["decode"]["data"]["config.yaml"]
    assert "max-running-requests" not in old["decode"]["data"]["config.yaml"]
    assert old["prefill"] == new["prefill"]
    # each pod template mounts its own group's ConfigMap by that name
    assert _mounted(after) == {r: {cm["metadata"]["name"]} for r, cm in new.items()}
    assert _mounted(before) == {r: {cm["metadata"]["name"]} for r, cm in old.items()}


def _workload(*, settled=True, desired=1, updated=1, total=1) -> WorkloadState:
    return WorkloadState(name="w", desired=desired, ready=updated, updated=updated, available=updated,
                         settled=settled, total=total)


def _observed(workload: WorkloadState, in_use: set[str]) -> Observed:
    group = ObservedGroup(key=KEY, workloads={"decode": workload}, config_maps_in_use=frozenset(in_use))
    return Observed(groups={KEY: group}, serving_key=KEY, service_exists=True)


LABELS = {L.LABEL_COMPAT_KEY: KEY, L.LABEL_ROLE: "decode"}
CMS = [("old", LABELS), ("new", LABELS)]


def test_the_old_config_map_goes_only_when_nothing_can_mount_it():
    settled = _workload()
    assert stale_config_maps(CMS, _observed(settled, {"new"}), frozenset()) == ["old"]
    # a pod of the old template still mounts it (a draining pod too: the cache keeps it until it is gone)
    assert stale_config_maps(CMS, _observed(settled, {"new", "old"}), frozenset()) == []
    # an older ReplicaSet still has replicas (status.replicas > updatedReplicas): it could make a pod again
    assert stale_config_maps(CMS, _observed(_workload(desired=1, updated=1, total=2), {"new"}), frozenset()) == []
    # the controller has not seen the current template yet
    assert stale_config_maps(CMS, _observed(_workload(settled=False), {"new"}), frozenset()) == []
    # what this reconcile applied is never pruned, even before the cache shows the template mounting it
    assert stale_config_maps(CMS, _observed(settled, set()), frozenset({"new"})) == ["old"]


def test_what_the_pruner_cannot_place_is_kept():
    observed = _observed(_workload(), set())
    other_group = {L.LABEL_COMPAT_KEY: "other", L.LABEL_ROLE: "decode"}
    no_role = {L.LABEL_COMPAT_KEY: KEY}
    shared = {L.LABEL_DEPLOYMENT: "d"}  # an object outside any compat group
    prefill = {L.LABEL_COMPAT_KEY: KEY, L.LABEL_ROLE: "prefill"}  # no prefill workload observed
    assert stale_config_maps([("a", other_group), ("b", no_role), ("c", shared), ("d", prefill)], observed,
                             frozenset()) == []
