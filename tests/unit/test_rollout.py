"""Paired rollouts: the pure decision of which compat group serves and which groups go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_pd_operator.planning.rollout import GroupState, RolloutSettings, RolloutStatus, decide

S = RolloutSettings(progress_deadline_s=600, drain_grace_s=60)


def _status(d, target):
    return RolloutStatus(
        target_key=target, phase=d.phase, phase_started=d.phase_started, draining_key=d.draining_key, drain_started=d.drain_started
    )


def test_first_deploy_serves_target_immediately_and_completes_when_ready():
    d = decide(target="aaa", serving=None, groups={}, previous=RolloutStatus(), settings=S, target_gpus=12, now=0)
    assert (d.serving_key, d.apply_target, d.delete_keys, d.phase) == ("aaa", True, (), "Surging")
    d2 = decide(
        target="aaa", serving="aaa", groups={"aaa": GroupState("aaa", ready=True)}, previous=_status(d, "aaa"), settings=S, target_gpus=12, now=5
    )
    assert d2.phase == "Complete" and ("RolloutComplete" in [e[0] for e in d2.events])


def test_key_change_surges_then_cuts_over_then_drains_then_deletes():
    old = GroupState("old", ready=True)
    d = decide(target="new", serving="old", groups={"old": old}, previous=RolloutStatus(), settings=S, target_gpus=12, now=100)
    assert d.serving_key == "old" and d.apply_target and d.delete_keys == () and d.phase == "Surging"
    d = decide(target="new", serving="old", groups={"old": old, "new": GroupState("new", ready=False)},
               previous=_status(d, "new"), settings=S, target_gpus=12, now=200)
    assert d.serving_key == "old" and d.phase == "Surging" and d.phase_started == 100
    d = decide(target="new", serving="old", groups={"old": old, "new": GroupState("new", ready=True)},
               previous=_status(d, "new"), settings=S, target_gpus=12, now=300)
    assert d.serving_key == "new" and d.phase == "Draining" and d.draining_key == "old" and d.delete_keys == ()
    assert [e[0] for e in d.events] == ["Cutover", "Draining"]
    d = decide(target="new", serving="new", groups={"old": old, "new": GroupState("new", ready=True)},
               previous=_status(d, "new"), settings=S, target_gpus=12, now=330)
    assert d.phase == "Draining" and d.delete_keys == ()
    d = decide(target="new", serving="new", groups={"old": old, "new": GroupState("new", ready=True)},
               previous=_status(d, "new"), settings=S, target_gpus=12, now=361)
    assert d.phase == "Complete" and d.delete_keys == ("old",)


def test_deadline_exceeded_keeps_old_group_serving_and_revert_cancels():
    groups = {"old": GroupState("old", ready=True), "new": GroupState("new", ready=False)}
    d = decide(target="new", serving="old", groups=groups, previous=RolloutStatus(), settings=S, target_gpus=12, now=0)
    d = decide(target="new", serving="old", groups=groups, previous=_status(d, "new"), settings=S, target_gpus=12, now=601)
    assert d.phase == "Failed" and d.serving_key == "old" and "old" not in d.delete_keys
    assert "ProgressDeadlineExceeded" in [e[0] for e in d.events]
    zero = decide(target="new", serving="old", groups=groups, previous=_status(d, "new"),
                  settings=RolloutSettings(progress_deadline_s=600, scale_failed_to_zero=True), target_gpus=12, now=700)
    assert zero.target_to_zero and zero.serving_key == "old"
    revert = decide(target="old", serving="old", groups=groups, previous=_status(d, "new"), settings=S, target_gpus=12, now=702)
    assert revert.serving_key == "old" and revert.delete_keys == ("new",) and revert.phase == "Complete"


def test_unschedulable_pods_and_the_schedulers_reason_appear_in_the_message():
    why = "0/12 nodes are available: 12 node(s) didn't match Pod's node affinity/selector."
    stuck = GroupState("new", ready=False, unschedulable=3, unschedulable_reason=why)
    groups = {"old": GroupState("old", ready=True), "new": stuck}
    d = decide(target="new", serving="old", groups=groups, previous=RolloutStatus(), settings=S, target_gpus=12, now=0)
    assert d.phase == "Surging" and f"(3 pods cannot be scheduled: {why})" in d.message
    d = decide(target="new", serving="old", groups=groups, previous=_status(d, "new"), settings=S, target_gpus=12, now=601)
    assert d.phase == "Failed" and "3 pods cannot be scheduled" in d.message and "old keeps serving" in d.message
    first = decide(target="new", serving=None, groups={"new": stuck}, previous=RolloutStatus(), settings=S, target_gpus=12, now=0)
    assert first.message.startswith("creating the first group (3 pods cannot be scheduled")
    assert GroupState("x", ready=False).waiting() == ""


def test_surge_budget_queues_instead_of_creating():
    d = decide(target="new", serving="old", groups={"old": GroupState("old", ready=True)}, previous=RolloutStatus(),
               settings=RolloutSettings(max_surge_gpus=8), target_gpus=12, now=0)
    assert d.phase == "WaitingForCapacity" and not d.apply_target and d.serving_key == "old"
    assert "maxSurgeGPUs" in d.message


def test_lost_service_is_repaired_to_a_ready_group():
    groups = {"old": GroupState("old", ready=True), "new": GroupState("new", ready=False)}
    d = decide(target="new", serving=None, groups=groups, previous=RolloutStatus(), settings=S, target_gpus=12, now=0)
    assert d.serving_key == "old" and "old" not in d.delete_keys


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["k1", "k2", "k3"]), st.booleans(), st.integers(min_value=1, max_value=400)),
        min_size=1,
        max_size=25,
    )
)
def test_random_edit_sequences_never_serve_an_unready_group_over_a_ready_one(steps):
    """Simulate a cluster: groups appear when applied, become ready at random, vanish when deleted.

    Invariants at every step: the serving group is never deleted; once some group has
    served Ready, the Service never moves to a group that is not Ready; each group's
    gateway selects exactly its own key (names derive from the key, so no gateway can
    select two keys); at most three groups exist (serving, draining, target).
    """
    groups: dict[str, GroupState] = {}
    serving = None
    previous = RolloutStatus()
    now = 0.0
    for target, becomes_ready, dt in steps:
        now += dt
        d = decide(target=target, serving=serving, groups=dict(groups), previous=previous, settings=S, target_gpus=4, now=now)
        assert d.serving_key not in d.delete_keys
        if serving is not None and serving in groups and groups[serving].ready and d.serving_key != serving:
            assert d.serving_key in groups and groups[d.serving_key].ready, "cut over to a group that is not Ready"
        for k in d.delete_keys:
            groups.pop(k, None)
        if d.apply_target and target not in groups:
            groups[target] = GroupState(target, ready=False)
        if target in groups and becomes_ready:
            groups[target] = GroupState(target, ready=True)
        serving = d.serving_key
        previous = _status(d, target)
        assert len(groups) <= 3
    # with a Ready target and time to drain, the rollout converges to one group
    groups[steps[-1][0]] = GroupState(steps[-1][0], ready=True)
    for _ in range(3):
        now += 1000
        d = decide(target=steps[-1][0], serving=serving, groups=dict(groups), previous=previous, settings=S, target_gpus=4, now=now)
        for k in d.delete_keys:
            groups.pop(k, None)
        serving, previous = d.serving_key, _status(d, steps[-1][0])
    assert serving == steps[-1][0] and set(groups) == {serving} and d.phase == "Complete"


# --------------------------------------------------------------------------- in place
def test_in_place_update_is_updating_not_creating_the_first_group():
    served = RolloutStatus(target_key="aaa", phase="Complete", phase_started=0, completed=True)
    updating = GroupState("aaa", ready=False, updating=("prefill 1/1 updated, 2 pods",))
    d = decide(target="aaa", serving="aaa", groups={"aaa": updating}, previous=served, settings=S, target_gpus=12, now=50)
    assert d.phase == "Updating" and d.serving_key == "aaa" and d.apply_target and not d.target_to_zero
    assert "creating the first group" not in d.message
    assert "updates in place" in d.message and "prefill 1/1 updated, 2 pods" in d.message
    assert [e[0] for e in d.events] == ["Updating"]
    again = decide(target="aaa", serving="aaa", groups={"aaa": updating}, previous=_status(d, "aaa"), settings=S, target_gpus=12, now=60)
    assert again.phase_started == 50 and again.events == ()
    # a group that served before and only lost a pod is not Ready yet, not a first group
    recovering = decide(target="aaa", serving="aaa", groups={"aaa": GroupState("aaa", ready=False)}, previous=served,
                        settings=S, target_gpus=12, now=70)
    assert recovering.phase == "Recovering" and recovering.events == ()  # no rollout: not "Surging", no event
    assert recovering.message.startswith("group aaa is short of ready replicas") and "no rollout is under way" in recovering.message
    # the first group is the first group on every reconcile until it completes
    starting = decide(target="aaa", serving="aaa", groups={"aaa": GroupState("aaa", ready=False)},
                      previous=RolloutStatus(target_key="aaa", phase="Surging", phase_started=0), settings=S,
                      target_gpus=12, now=5)
    assert starting.message == "creating the first group"


def test_in_place_update_that_stalls_past_the_deadline_fails_and_keeps_serving():
    served = RolloutStatus(target_key="aaa", phase="Updating", phase_started=0)
    why = "0/14 nodes are available: 14 node(s) didn't match Pod's node affinity/selector."
    stuck = GroupState("aaa", ready=False, unschedulable=1, unschedulable_reason=why,
                       updating=("prefill 1/1 updated, 2 pods",),
                       stalled=('prefill: ReplicaSet "x-prefill-5f" has timed out progressing.',))
    zero = RolloutSettings(progress_deadline_s=10, scale_failed_to_zero=True)
    d = decide(target="aaa", serving="aaa", groups={"aaa": stuck}, previous=served, settings=zero, target_gpus=12, now=20)
    assert d.phase == "Failed" and d.serving_key == "aaa" and d.delete_keys == ()
    assert d.apply_target and not d.target_to_zero  # the serving group's older pods are all that serves
    assert "has timed out progressing" in d.message and "1 pod cannot be scheduled" in d.message
    assert d.message.endswith("its older pods keep serving")
    assert [e[0] for e in d.events] == ["ProgressDeadlineExceeded"]
    again = decide(target="aaa", serving="aaa", groups={"aaa": stuck}, previous=_status(d, "aaa"), settings=zero, target_gpus=12, now=30)
    assert again.phase == "Failed" and again.events == () and again.phase_started == 20
    fixed = decide(target="aaa", serving="aaa", groups={"aaa": GroupState("aaa", ready=True)}, previous=_status(again, "aaa"),
                   settings=zero, target_gpus=12, now=40)
    assert fixed.phase == "Complete"


def test_in_place_surge_is_charged_to_the_gpu_budget_in_role_order():
    from sglang_pd_operator.planning.rollout import in_place_strategies

    gpus, one = {"prefill": 4, "decode": 8}, {"prefill": 1, "decode": 1}
    unlimited = in_place_strategies(gpus_per_pod=gpus, replicas=one, max_surge_gpus=None)
    assert all(s.surge and s.reason == "" for s in unlimited.values())
    assert unlimited["prefill"].rolling_update() == {"maxSurge": 1, "maxUnavailable": 0}
    tight = in_place_strategies(gpus_per_pod=gpus, replicas={"prefill": 1, "decode": 3}, max_surge_gpus=10)
    assert tight["prefill"].surge and not tight["decode"].surge
    assert tight["decode"].rolling_update() == {"maxSurge": 0, "maxUnavailable": 1}
    assert "one needs 8 GPUs and rollout.maxSurgeGPUs (10) leaves 6" in tight["decode"].reason
    assert "one at a time" in tight["decode"].reason
    none = in_place_strategies(gpus_per_pod=gpus, replicas=one, max_surge_gpus=0)
    assert not none["prefill"].surge and "its only pod stops before the replacement is Ready" in none["prefill"].reason


def test_workload_state_sees_old_pods_and_a_stalled_rollout():
    from sglang_pd_operator.reconcilers.observe import workload_state

    dep = {
        "metadata": {"name": "x-prefill", "generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "readyReplicas": 1,
                   "availableReplicas": 1,
                   "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                   "message": 'ReplicaSet "x-prefill-5f" has timed out progressing.'}]},
    }
    w = workload_state(dep)
    assert w.updating and not w.ready_all  # the surge's old pod is the ready one
    assert w.stalled == 'ReplicaSet "x-prefill-5f" has timed out progressing.'
    dep["metadata"]["generation"] = 3  # a new template: the old verdict is not about it
    assert workload_state(dep).stalled == ""
    done = {**dep, "metadata": {"name": "x-prefill", "generation": 3},
            "status": {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}}
    assert workload_state(done).ready_all and not workload_state(done).updating


def test_a_role_scaled_to_zero_is_complete_and_says_it_serves_nothing_instead_of_surging_forever():
    serving = RolloutStatus(target_key="aaa", phase="Complete", phase_started=0, completed=True)
    not_ready = {"aaa": GroupState("aaa", ready=False)}
    d = decide(target="aaa", serving="aaa", groups=not_ready, previous=serving, settings=S, target_gpus=8, now=10,
               scaled_to_zero=("decode",))
    assert d.phase == "Complete" and d.serving_key == "aaa" and not d.events
    assert "serves nothing: decode scaled to 0 replicas" in d.message and "at least 1" in d.message
    assert "spec.decode.replicas" in d.message and "<role>" not in d.message, d.message  # the field, not a placeholder
    # without a role at zero the same group waits for its pods (a stalled Deployment still fails it: state.stalled)
    d = decide(target="aaa", serving="aaa", groups=not_ready, previous=serving, settings=S, target_gpus=8, now=10)
    assert d.phase == "Recovering"
    # older pods still being replaced: an in-place update, whatever the counts
    updating = {"aaa": GroupState("aaa", ready=False, updating=("decode 0/1 updated, 1 pods",))}
    d = decide(target="aaa", serving="aaa", groups=updating, previous=serving, settings=S, target_gpus=8, now=10,
               scaled_to_zero=("decode",))
    assert d.phase == "Updating"


def test_an_in_place_update_without_a_surge_pod_does_not_claim_older_pods_serve():
    """A fresh user's finding: with rollout.maxSurgeGPUs 0 the only decode pod is replaced with nothing
    serving meanwhile, yet the message said "its older pods serve until the new ones are Ready"."""
    served = RolloutStatus(target_key="aaa", phase="Complete", phase_started=0, completed=True)
    why = ("decode's in-place updates run without a surge pod: one needs 8 GPUs and rollout.maxSurgeGPUs (0) leaves 0; "
           "its only pod stops before the replacement is Ready (the role serves nothing meanwhile)")
    tight = RolloutSettings(progress_deadline_s=600, drain_grace_s=60, max_surge_gpus=0, no_surge=(("decode", why),))
    updating = {"aaa": GroupState("aaa", ready=False, updating=("decode: 1/1 on the new template, 0 of an older one "
                                                                  "still running, 0/1 available",))}
    d = decide(target="aaa", serving="aaa", groups=updating, previous=served, settings=tight, target_gpus=8, now=10)
    assert d.phase == "Updating" and why in d.message and "older pods serve" not in d.message, d.message
    # a role that surges keeps the old wording; a no-surge role that is not updating is not named
    prefill = {"aaa": GroupState("aaa", ready=False, updating=("prefill: 1/1 on the new template, 1 of an older one "
                                                                 "still running, 1/2 available",))}
    d = decide(target="aaa", serving="aaa", groups=prefill, previous=served, settings=tight, target_gpus=8, now=10)
    assert "its older pods serve until the new ones are Ready" in d.message and why not in d.message


def test_a_role_scaled_to_zero_still_says_which_pods_cannot_be_scheduled():
    """A fresh user's finding: ScaledToZero hid the other role's Pending pods."""
    serving = RolloutStatus(target_key="aaa", phase="Complete", phase_started=0, completed=True)
    stuck = {"aaa": GroupState("aaa", ready=False, unschedulable=1, unschedulable_reason="0/4 nodes are available")}
    d = decide(target="aaa", serving="aaa", groups=stuck, previous=serving, settings=S, target_gpus=8, now=10,
               scaled_to_zero=("decode",))
    assert "serves nothing: decode scaled to 0" in d.message
    assert "1 pod cannot be scheduled: 0/4 nodes are available" in d.message, d.message


def test_an_in_place_update_stays_updating_once_its_older_pods_are_gone():
    """A fresh user's finding: with maxSurgeGPUs 0 the only prefill pod was replaced, and once the old one was
    gone the phase turned "Surging: group ... is not Ready yet" until the new pod was Ready."""
    why = ("prefill's in-place updates run without a surge pod: one needs 8 GPUs and rollout.maxSurgeGPUs (0) leaves 0; "
           "its only pod stops before the replacement is Ready (the role serves nothing meanwhile)")
    tight = RolloutSettings(progress_deadline_s=600, drain_grace_s=60, max_surge_gpus=0, no_surge=(("prefill", why),))
    updating = RolloutStatus(target_key="aaa", phase="Updating", phase_started=40, completed=True)
    gone = {"aaa": GroupState("aaa", ready=False, short=("prefill: 0/1 ready",), unschedulable=1,
                              unschedulable_reason="0/46 nodes are available")}
    d = decide(target="aaa", serving="aaa", groups=gone, previous=updating, settings=tight, target_gpus=8, now=50)
    assert d.phase == "Updating" and d.phase_started == 40 and d.events == (), d
    assert "updates in place" in d.message and "prefill: 0/1 ready" in d.message and why in d.message, d.message
    assert "1 pod cannot be scheduled: 0/46 nodes are available" in d.message
    done = decide(target="aaa", serving="aaa", groups={"aaa": GroupState("aaa", ready=True)}, previous=_status(d, "aaa"),
                  settings=tight, target_gpus=8, now=60)
    assert done.phase == "Complete" and [e[0] for e in done.events] == ["RolloutComplete"]
