"""The control loop without a cluster: which watch events queue which keys, the spread resync, bounded SLO writes.

The runtime is the real :class:`Runtime` on a Kube with an object cache and no API
server behind it: these tests drive :meth:`Controller.observe`, :meth:`Controller.on_health`
and the resync directly and read the work queue.
"""

from __future__ import annotations

import time

import copy

from sglang_pd_operator.runtime.controller import KERNELBUILD, PDDEPLOYMENT, Controller, LoopSettings, resync_offset
from sglang_pd_operator.runtime import controller as C
from sglang_pd_operator.runtime.cache import ObjectCache, watched_kind
from sglang_pd_operator.reconcilers.kube import Kube
from sglang_pd_operator.reconcilers.runtime import HealthChange, KernelBuildRuntime, Runtime

GROUP = "pd.sglang-operator.io/v1alpha1"
OWNER = "pd.sglang-operator.io/deployment"
KB_LABEL = "pd.sglang-operator.io/kernelbuild"


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def controller(clock: Clock | None = None, **settings) -> Controller:
    kube = Kube(api_client=None, cache=ObjectCache())  # type: ignore[arg-type]
    runtime = Runtime(kube=kube)
    kbs = KernelBuildRuntime(kube=kube, catalog=runtime.catalog, in_use=lambda ns: None)
    return Controller(runtime=runtime, kernelbuilds=kbs, kube=kube, clock=clock or Clock(),
                      settings=LoopSettings(**{"resync_s": 100.0, **settings}))


def pdd(name: str, rv: str, *, generation: int = 1, status: dict | None = None) -> dict:
    return {"apiVersion": GROUP, "kind": "PDDeployment",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv,
                         "generation": generation},
            "spec": {"model": {"name": "m"}}, "status": status or {}}


def child(kind: str, name: str, rv: str, owner: str = "d", **extra) -> dict:
    api = {"Deployment": "apps/v1", "Job": "batch/v1"}.get(kind, "v1")
    labels = {OWNER: owner} if kind != "Job" else {KB_LABEL: owner}
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels}, **extra}


def drain(c: Controller) -> list:
    out = []
    while (key := c.queue.get(timeout=0)) is not None:
        out.append(key)
        c.queue.done(key)
    return out


def event(obj: dict, type_: str = "MODIFIED") -> dict:
    return {"type": type_, "object": obj}


def test_a_spec_change_queues_its_deployment_but_a_status_echo_does_not():
    c = controller()
    w = watched_kind(GROUP, "PDDeployment")
    assert c.observe(w, event(pdd("d", "1"), "ADDED")) == [(PDDEPLOYMENT, "ns", "d")]
    assert c.observe(w, event(pdd("d", "2", status={"observedGeneration": 1}))) == []  # status only
    assert c.observe(w, event(pdd("d", "2", status={"observedGeneration": 1}))) == []  # same version again
    assert c.observe(w, event(pdd("d", "3", generation=2))) == [(PDDEPLOYMENT, "ns", "d")]
    assert drain(c) == [(PDDEPLOYMENT, "ns", "d")]  # two triggers, one reconcile


def test_the_echo_of_the_operators_own_write_queues_nothing():
    c = controller()
    w = watched_kind("apps/v1", "Deployment")
    c.cache.record_write(child("Deployment", "d-abc-prefill", "7"))  # the API server's answer to our apply
    assert c.observe(w, event(child("Deployment", "d-abc-prefill", "7"), "ADDED")) == []
    ready = child("Deployment", "d-abc-prefill", "8", status={"readyReplicas": 1})
    assert c.observe(w, event(ready)) == [(PDDEPLOYMENT, "ns", "d")]


def test_a_pod_event_concerns_the_reconcile_only_when_its_scheduling_state_moves():
    c = controller()
    w = watched_kind("v1", "Pod")
    pending = child("Pod", "p", "1", status={"phase": "Pending"})
    assert c.observe(w, event(pending, "ADDED")) == []
    stuck = copy.deepcopy(pending)
    stuck["metadata"]["resourceVersion"] = "2"
    stuck["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/3 nodes are available"}]
    assert c.observe(w, event(stuck)) == [(PDDEPLOYMENT, "ns", "d")]
    running = child("Pod", "p", "3", status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
    assert c.observe(w, event(running)) == [(PDDEPLOYMENT, "ns", "d")]  # no longer unschedulable
    again = copy.deepcopy(running)
    again["metadata"]["resourceVersion"] = "4"
    assert c.observe(w, event(again)) == []  # readiness reaches it through the Deployment


def test_kernelbuild_children_queue_the_build_and_a_build_that_moves_queues_its_users():
    c = controller()
    c.runtime.uses.record("ns", "d", ("kb1",))
    c.runtime.uses.record("ns", "other", ())
    assert c.observe(watched_kind("batch/v1", "Job"), event(child("Job", "kb1-1", "1", owner="kb1"), "ADDED")) == \
        [(KERNELBUILD, "ns", "kb1")]
    kb = {"apiVersion": GROUP, "kind": "KernelBuild",
          "metadata": {"name": "kb1", "namespace": "ns", "resourceVersion": "5"}, "status": {"phase": "Building"}}
    w = watched_kind(GROUP, "KernelBuild")
    assert c.observe(w, event(kb, "ADDED")) == [(KERNELBUILD, "ns", "kb1"), (PDDEPLOYMENT, "ns", "d")]
    done = copy.deepcopy(kb)
    done["metadata"]["resourceVersion"], done["status"]["phase"] = "6", "Succeeded"
    assert c.observe(w, event(done)) == [(KERNELBUILD, "ns", "kb1"), (PDDEPLOYMENT, "ns", "d")]
    relabelled = copy.deepcopy(done)
    relabelled["metadata"]["resourceVersion"] = "7"
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert c.observe(w, event(relabelled)) == [(KERNELBUILD, "ns", "kb1")]  # status unchanged: users not queued


def test_a_deleted_deployment_is_forgotten_and_not_reconciled():
    c = controller()
    w = watched_kind(GROUP, "PDDeployment")
    c.observe(w, event(pdd("d", "1"), "ADDED"))
    c.runtime.uses.record("ns", "d", ("kb1",))
    assert c.observe(w, event(pdd("d", "2"), "DELETED")) == []
    assert c.runtime.kernelbuild_users("ns", "kb1") == []
    assert c.cache.get(GROUP, "PDDeployment", "d", "ns") is None


def test_the_resync_queues_every_key_once_per_period_spread_over_it():
    clock = Clock()
    c = controller(clock, resync_s=100.0)
    w = watched_kind(GROUP, "PDDeployment")
    for i in range(200):
        c.cache.upsert(pdd(f"d{i}", "1"))
    per_tick = []
    for _ in range(100):  # one period, one tick per second
        before = clock.t
        clock.t += 1.0
        c._resync_due(before, clock.t, 100.0)
        per_tick.append(len(drain(c)))
    assert sum(per_tick) == 200  # every key exactly once
    assert max(per_tick) <= 12  # spread: no burst (200 keys over 100 ticks, hash-distributed)
    offsets = [resync_offset((PDDEPLOYMENT, "ns", f"d{i}"), f"uid-d{i}", 100.0) for i in range(200)]
    assert all(0 <= o < 100 for o in offsets) and len({round(o) for o in offsets}) > 60
    assert w is not None


def test_a_tick_takes_its_due_keys_from_a_schedule_not_from_every_key(monkeypatch):
    """At rest the ticker looked at all 1,000 keys every second (issue 29 item 6): now the keys are listed
    once per schedule (every SCHEDULE_REFRESH_S, or when their number changes), and a period still queues
    each key exactly once, across the period's wrap-around too."""
    clock = Clock()
    c = controller(clock, resync_s=100.0)
    for i in range(50):
        c.cache.upsert(pdd(f"d{i}", "1"))
    lists = []
    keys = c.cache.keys
    monkeypatch.setattr(c.cache, "keys", lambda *a: lists.append(a) or keys(*a))
    clock.t = 50.0  # the period wraps at 100 in the middle of these ticks
    queued = []
    for _ in range(100):
        before = clock.t
        clock.t += 1.0
        c._resync_due(before, clock.t, 100.0)
        queued += drain(c)
    assert sorted(queued) == sorted((PDDEPLOYMENT, "ns", f"d{i}") for i in range(50))
    listed = [a for a in lists if a[1] == "PDDeployment"]
    assert len(listed) <= 100 / C.SCHEDULE_REFRESH_S + 2, f"{len(listed)} listings in 100 ticks"
    c.cache.upsert(pdd("new", "1"))  # one more key: the next tick's schedule has it
    before = clock.t
    clock.t += 100.0
    c._resync_due(before, clock.t, 100.0)
    assert (PDDEPLOYMENT, "ns", "new") in drain(c)


def test_slo_figures_that_only_move_are_written_at_most_once_per_period_transitions_at_once(monkeypatch):
    clock = Clock()
    c = controller(clock, slo_status_period_s=60.0)
    answers = iter([HealthChange.CONDITIONS, HealthChange.FIGURES, HealthChange.FIGURES, HealthChange.NONE,
                    HealthChange.FIGURES, HealthChange.CONDITIONS])
    monkeypatch.setattr(c.runtime, "set_health", lambda health: next(answers))

    class H:
        namespace, name = "ns", "d"

    key = (PDDEPLOYMENT, "ns", "d")
    c.on_health(H)  # a condition moved: at once
    assert drain(c) == [key]
    clock.t += 15
    c.on_health(H)  # figures moved 15 s later: deferred to 60 s after the last write
    assert drain(c) == [] and c.queue.pending(key)
    clock.t += 15
    c.on_health(H)  # more figures: still one deferred write
    c.on_health(H)  # nothing moved
    clock.t += 30
    assert drain(c) == [key]  # 60 s after the first write
    clock.t += 15
    c.on_health(H)  # figures again 15 s later: deferred
    c.on_health(H)  # a transition: at once, whatever the period
    assert drain(c) == [key]


def test_a_move_of_what_the_planner_reads_queues_a_planned_deployment_at_once():
    """Figures that only move are written at most once per period, but for a deployment the built-in
    planner scales, a move of its reading (a role going under pressure) queues a reconcile at once."""
    from sglang_pd_operator.metrics.health import Health
    from sglang_pd_operator.metrics.slo import KVTransferResult, SLOEvaluator, SLOResult, TargetResult

    clock = Clock()
    c = controller(clock, slo_status_period_s=60.0)
    kv = KVTransferResult(latency_seconds={}, transfers=0, transfer_failures=0, bootstrap_failures=0,
                          failures_per_second=0, failure_ratio=None)

    def health(ttft: float) -> Health:
        target = TargetResult("ttft", "p90", "seconds", 0.8, ttft, ttft <= 0.8, 0.8 - ttft, 0.1, 50, "decode", "x")
        slo = SLOResult(deployment="ns/d", evaluated_at=time.time(), window_seconds=60, objective=0.99,
                        targets=(target,), met=ttft <= 0.8, no_traffic=False, attainment=1.0,
                        burn_rates=SLOEvaluator().record_interval("ns/d", 60, 0.99, True, 1.0)[1], kv_transfer=kv)
        return Health(namespace="ns", name="d", serving_key="k", evaluated_at=time.time(), ready={}, reachable={},
                      slo=slo, kv_transfer=kv)

    key = (PDDEPLOYMENT, "ns", "d")
    c.on_health(health(0.30))
    assert drain(c) == [key]            # the first figures: a condition appeared
    clock.t += 15
    c.on_health(health(0.31))
    assert drain(c) == []               # not planned: a figure that moved waits for the period
    c.runtime.planner.mark("ns", "d", True)
    clock.t += 15
    c.on_health(health(0.32))
    assert drain(c) == [key]            # planned: the planner's first reading
    clock.t += 15
    c.on_health(health(0.33))
    assert drain(c) == []               # the same reading (hold): no extra reconcile
    clock.t += 1
    c.on_health(health(0.78))           # within 20% of the target: still hold without a queue
    c.on_health(health(1.2))            # missed: prefill under pressure
    assert drain(c) == [key]
    c.runtime.planner.mark("ns", "d", False)
    assert not c.runtime.planner_moved(health(0.3))


def test_a_kernelbuild_is_looked_at_again_while_it_builds_and_when_its_retry_is_due():
    from sglang_pd_operator.runtime.controller import KERNELBUILD_POLL_S, _kernelbuild_next_look
    from sglang_pd_operator.reconcilers.kernelbuild import KernelBuildOutcome

    assert _kernelbuild_next_look(KernelBuildOutcome(phase="Building"), now=0) == KERNELBUILD_POLL_S
    assert _kernelbuild_next_look(KernelBuildOutcome(phase="Failed", next_retry_at=130.0), now=100.0) == 30.0
    assert _kernelbuild_next_look(KernelBuildOutcome(phase="Failed"), now=100.0) is None  # retries exhausted
    assert _kernelbuild_next_look(KernelBuildOutcome(phase="Succeeded"), now=100.0) is None
    assert _kernelbuild_next_look(KernelBuildOutcome(phase="Building", deleted=True), now=0) is None
    assert _kernelbuild_next_look(None, now=0) is None


def test_resync_pass_and_lag_are_published_once_per_finished_period(monkeypatch):
    clock = Clock()
    c = controller(clock, resync_s=100.0)
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: None)
    for i in range(50):
        c.cache.upsert(pdd(f"d{i}", "1"))
    last_offset = max(resync_offset((PDDEPLOYMENT, "ns", f"d{i}"), f"uid-d{i}", 100.0) for i in range(50))

    def tick(*, work: bool) -> None:
        before = clock.t
        clock.t += 1.0
        c._resync_due(before, clock.t, 100.0)
        due = clock.t
        for j, key in enumerate(drain(c) if work else []):
            clock.t = due + 0.05 * (j + 1)  # each reconcile takes 50 ms, one after the other
            c._reconcile(key)
        clock.t = due

    for _ in range(99):  # one whole period (its 100th tick begins the next one), keeping up
        tick(work=True)
        assert c._last_pass_s is None  # nothing published while the period runs
    tick(work=True)  # the next period begins: the first one is published
    assert last_offset <= c._last_pass_s <= 100.0 + 5  # until its last key (spread over the period) was done
    assert 0 < c._last_lag_s < 1.0  # each key waited at most for the few due in the same tick
    for i in range(50):  # their inputs moved (events): the next period's resync cannot skip them
        c.ledger.moved((PDDEPLOYMENT, "ns", f"d{i}"))
    for _ in range(99):  # a period in which no worker runs: it falls behind
        tick(work=False)
    tick(work=False)
    assert c._last_pass_s >= 100.0 and c._last_lag_s > 50.0


# --------------------------------------------------------------------------- the resync skips what did not move
def _resync_period(c: Controller, clock: Clock, period: float = 100.0) -> list:
    """One whole resync period, one tick a second; the keys it queued."""
    queued = []
    for _ in range(int(period)):
        before = clock.t
        clock.t += 1.0
        c._resync_due(before, clock.t, period)
        queued += drain(c)
    return queued


def _looks(metrics, result: str) -> float:
    from prometheus_client import generate_latest

    text = generate_latest(metrics.registry).decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang_pd_operator_reconciles_total{") and f'result="{result}"' in line)


def test_a_key_settles_only_after_a_clean_reconcile_and_any_trigger_unsettles_it(monkeypatch):
    """Issue 29, item 6: the resync may skip a key only when its last reconcile succeeded, asked for no
    later look and read nothing from outside the view, and no trigger of it came since."""
    from sglang_pd_operator.reconcilers.kube import note_outside_read
    from sglang_pd_operator.reconcilers.pddeployment import Outcome

    c = controller()
    outcomes = {"outside": "outside", "later": "later", "fail": "fail"}  # the others settle

    def reconcile_key(ns, name):
        what = outcomes.get(name)
        if what == "outside":
            note_outside_read()  # e.g. the namespace's HPAs, a PodMonitor
        if what == "fail":
            raise RuntimeError("boom")
        return Outcome(valid=True, requeue_after=30.0) if what == "later" else None

    monkeypatch.setattr(c.runtime, "reconcile_key", reconcile_key)
    w = watched_kind(GROUP, "PDDeployment")
    names = ["settled", "outside", "later", "fail", "child-moved", "spec-moved"]
    for n in names:
        c.observe(w, event(pdd(n, "1"), "ADDED"))
    for key in drain(c):
        c._reconcile(key)
    key = {n: (PDDEPLOYMENT, "ns", n) for n in names}
    assert [n for n in names if c.ledger.unchanged(key[n])] == ["settled", "child-moved", "spec-moved"]
    c.observe(watched_kind("v1", "ConfigMap"), event(child("ConfigMap", "cm", "7", owner="child-moved")))
    c.observe(w, event(pdd("spec-moved", "2", generation=2)))
    c.observe(w, event(pdd("settled", "2", status={"phase": "x"})))  # a status echo moves nothing
    assert [n for n in names if c.ledger.unchanged(key[n])] == ["settled"]
    # a trigger during the reconcile: the reconcile saw the older inputs, the key stays unsettled
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: c.ledger.moved(key["settled"]))
    c._reconcile(key["settled"])
    assert not c.ledger.unchanged(key["settled"])


def test_a_resync_period_at_rest_reconciles_nothing_and_an_event_brings_the_key_back(monkeypatch):
    from sglang_pd_operator.metrics.operator_metrics import OperatorMetrics

    clock = Clock()
    kube = Kube(api_client=None, cache=ObjectCache())  # type: ignore[arg-type]
    runtime = Runtime(kube=kube)
    kbs = KernelBuildRuntime(kube=kube, catalog=runtime.catalog, in_use=lambda ns: None)
    metrics = OperatorMetrics()
    c = Controller(runtime=runtime, kernelbuilds=kbs, kube=kube, clock=clock, metrics=metrics,
                   settings=LoopSettings(resync_s=100.0))
    reconciled = []
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: reconciled.append(name))
    w = watched_kind(GROUP, "PDDeployment")
    for i in range(20):
        c.observe(w, event(pdd(f"d{i}", "1"), "ADDED"))
    for key in drain(c):
        c._reconcile(key)
    assert len(reconciled) == 20
    assert _resync_period(c, clock) == []  # at rest: every key skipped
    assert _looks(metrics, "unchanged") == 20
    # a child's change queues its deployment at once (and is reconciled); the next resync skips it again
    assert c.observe(watched_kind("v1", "Service"), event(child("Service", "s", "5", owner="d3"))) == [
        (PDDEPLOYMENT, "ns", "d3")]
    for key in drain(c):
        c._reconcile(key)
    assert _resync_period(c, clock) == []
    # a trigger that was not worked yet (e.g. its worker is still busy) is not skipped by the resync
    c.ledger.moved((PDDEPLOYMENT, "ns", "d7"))
    assert _resync_period(c, clock) == [(PDDEPLOYMENT, "ns", "d7")]
    # a deleted deployment is forgotten by the ledger too
    c.observe(w, event(pdd("d0", "9"), "DELETED"))
    assert (PDDEPLOYMENT, "ns", "d0") not in c.ledger._settled


def test_a_change_of_the_served_kinds_reconciles_every_deployment(monkeypatch):
    """The Prometheus Operator installed later: settled keys would not look again without a trigger."""
    clock = Clock()
    c = controller(clock)
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: None)
    served = {"monitoring": False}
    monkeypatch.setattr(c, "served_env", lambda: (served["monitoring"], False, False))
    monkeypatch.setattr(c, "served", lambda watched: not watched.optional)  # no discovery here
    w = watched_kind(GROUP, "PDDeployment")
    for i in range(3):
        c.observe(w, event(pdd(f"d{i}", "1"), "ADDED"))
    for key in drain(c):
        c._reconcile(key)
    c._poll_unwatched(clock.t)
    assert drain(c) == []
    served["monitoring"] = True
    c._poll_unwatched(clock.t + 60)
    assert sorted(drain(c)) == [(PDDEPLOYMENT, "ns", f"d{i}") for i in range(3)]


# --------------------------------------------------------------------------- stale SLO figures
def test_a_deployment_whose_figures_went_stale_is_queued_once_by_the_ticker_within_the_check_period(monkeypatch):
    from sglang_pd_operator.runtime import controller as C

    clock = Clock()
    c = controller(clock)
    monkeypatch.setattr(c, "_poll_unwatched", lambda now: None)  # no API server behind this loop
    monkeypatch.setattr(c, "_catalog_changes", lambda: None)
    wall = [time.time()]
    monkeypatch.setattr(C.time, "time", lambda: wall[0])
    store = c.runtime.health_store
    for i in range(3):
        c.cache.upsert(pdd(f"d{i}", "1"))
    keys = [(PDDEPLOYMENT, "ns", f"d{i}") for i in range(3)]

    def reconciled() -> None:  # nothing moved since: the resync skips them, so only staleness queues
        for key in keys:
            c.ledger.finished(key, c.ledger.began(key), settled=True)

    reconciled()

    def tick(seconds: float) -> list:
        clock.t += seconds
        wall[0] += seconds
        c.tick(clock.t - seconds, clock.t)
        return sorted(drain(c))

    tick(1.0)  # the first look: no figures yet, counted from now (HealthStore._first_asked)
    assert not c._stale_flagged
    tick(store.max_age_s - 2)
    assert not c._stale_flagged, "not stale before max_age_s"
    assert tick(C.STALE_CHECK_S + 2) == keys, "stale: every one queued at the next look"
    reconciled()
    assert tick(1.0) == [] and tick(C.STALE_CHECK_S) == [], "flagged once until fresh figures arrive"


def test_a_reconcile_that_asks_for_no_later_look_drops_the_step_an_earlier_one_asked_for(monkeypatch):
    """After a burst every key had asked for a look at its progress deadline; the rollouts completed, and
    the bench saw 1,000 reconciles that found nothing to do twenty minutes later. A reconcile's own
    answer now says when to look again."""
    from sglang_pd_operator.reconcilers.pddeployment import Outcome

    clock = Clock()
    c = controller(clock)
    key = (PDDEPLOYMENT, "ns", "d")
    answers = [Outcome(valid=True, requeue_after=600.0), Outcome(valid=True), Outcome(valid=True, requeue_after=30.0)]
    monkeypatch.setattr(c.runtime, "reconcile_key", lambda ns, name: answers.pop(0))
    c.cache.upsert(pdd("d", "1"))
    c._reconcile(key)  # surging: look again at the deadline
    assert c.queue.stats().delayed == 1
    clock.t += 5
    c._reconcile(key)  # complete: nothing to look at later
    assert c.queue.stats().delayed == 0 and c.ledger.unchanged(key)
    clock.t += 5
    c._reconcile(key)  # a new step replaces nothing it should not: one delayed look, at +30 s
    assert c.queue.stats().delayed == 1
    clock.t += 31
    assert drain(c) == [key]
