"""The applier's zero-write check: skip only when the live object already holds what we apply."""

from __future__ import annotations

from sglang_pd_operator.reconcilers.drift import contains, needs_apply, with_applied_hash

DESIRED = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}},
    "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}},
}


def _live(desired):
    live = {**desired, "metadata": {**desired["metadata"], "uid": "u", "resourceVersion": "7"}, "status": {"readyReplicas": 2}}
    live["spec"] = {**desired["spec"], "progressDeadlineSeconds": 600}  # an API-server default
    return live


def test_unchanged_object_is_not_applied_despite_server_defaults():
    d = with_applied_hash(DESIRED)
    assert not needs_apply(d, _live(d))


def test_quantities_compare_by_value():
    assert contains({"memory": "1Gi"}, {"memory": "1024Mi"})
    assert not contains({"memory": "1Gi"}, {"memory": "1G"})


def test_hand_edit_of_an_owned_field_is_reapplied():
    d = with_applied_hash(DESIRED)
    live = _live(d)
    live["spec"] = {**live["spec"], "replicas": 5}
    assert needs_apply(d, live)


def test_removed_field_is_detected_through_the_hash():
    d_old = with_applied_hash(DESIRED)
    new = {**DESIRED, "metadata": {**DESIRED["metadata"], "labels": {}}}
    assert needs_apply(with_applied_hash(new), _live(d_old))


def test_missing_object_is_applied():
    assert needs_apply(with_applied_hash(DESIRED), None)
