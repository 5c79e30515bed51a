"""Status and events from the scraper's figures (reconcilers/status.py, pddeployment.py), pure.

The figures come from a real SLOEvaluator fed with prometheus_client exposition text in
SGLang's names; the status functions are the ones the reconcile calls.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.health import Health
from sglang_pd_operator.metrics.slo import SLOEvaluator
from sglang_pd_operator.planning.rollout import RolloutDecision
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.reconcilers.drift import merge_patch
from sglang_pd_operator.reconcilers.observe import Observed, ObservedGroup, WorkloadState
from sglang_pd_operator.reconcilers.process_state import HealthStore
from sglang_pd_operator.reconcilers.runtime import Runtime

KEY = "abc123def456"
SPEC = SLOSpec(ttft={"p90": "800ms"}, itl={"p90": "40ms"}, window="1m")


class Pod:
    """A decode pod's TTFT/ITL histograms and a prefill-style failure counter."""

    def __init__(self) -> None:
        self.r = CollectorRegistry()
        self.ttft = Histogram(ex.TTFT, "t", buckets=ex.SGLANG_BUCKETS[ex.TTFT], registry=self.r)
        self.itl = Histogram(ex.ITL, "i", buckets=ex.SGLANG_BUCKETS[ex.ITL], registry=self.r)
        self.failed = Counter(ex.TRANSFER_FAILED, "f", registry=self.r)
        self.requests = Counter(ex.REQUESTS, "r", registry=self.r)

    def traffic(self, n: int, ttft: float, itl: float = 0.01) -> None:
        for _ in range(n):
            self.ttft.observe(ttft)
            self.itl.observe(itl)
            self.requests.inc()

    def text(self) -> str:
        return generate_latest(self.r).decode()


class Feed:
    """An evaluator fed like the scraper feeds it, giving Health values."""

    def __init__(self, spec: SLOSpec | None = SPEC) -> None:
        self.ev, self.pod, self.spec, self.t = SLOEvaluator(resolution_s=1), Pod(), spec, 1000.0
        self.ev.observe("ns/d", "decode", "d0", self.pod.text(), self.t)

    def health(self, *, reachable=None, ready=None) -> Health:
        self.t += 15
        self.ev.observe("ns/d", "decode", "d0", self.pod.text(), self.t)
        result = self.ev.evaluate("ns/d", self.spec or SLOSpec(), self.t)
        return Health(namespace="ns", name="d", serving_key=KEY, evaluated_at=self.t,
                      ready=ready or {"prefill": 1, "decode": 1, "gateway": 1},
                      reachable=reachable or {"prefill": 1, "decode": 1, "gateway": 1},
                      slo=result if self.spec else None, kv_transfer=result.kv_transfer)


def ws(name: str, n: int = 1) -> WorkloadState:
    return WorkloadState(name=name, desired=n, ready=n, updated=n, available=n, settled=True)


GROUP = ObservedGroup(key=KEY, workloads={c: ws(c) for c in ("prefill", "decode", "gateway")})
OBSERVED = Observed(groups={KEY: GROUP}, serving_key=KEY, service_exists=True)
DECISION = RolloutDecision(serving_key=KEY, apply_target=True, target_to_zero=False, delete_keys=(),
                           phase="Complete", phase_started=0.0, draining_key=None, drain_started=None, message="ok")


def status(previous: dict, health: Health | None, *, slo: bool = True, now: float = 2000.0) -> dict:
    return S.valid_status(previous=previous, generation=1, problems=[], observed=OBSERVED, decision=DECISION,
                          target_key=KEY, kv_layouts={}, attention_backends={}, endpoint="http://d.ns.svc:8000",
                          now=now, health=health, slo_enabled=slo)


def cond(st: dict, type_: str) -> dict | None:
    return next((c for c in st["conditions"] if c["type"] == type_), None)


def test_slo_met_false_names_the_target_and_idle_status_does_not_change():
    feed = Feed()
    feed.pod.traffic(50, ttft=0.15, itl=0.07)
    st = status({}, feed.health())
    c = cond(st, "SLOMet")
    assert c["status"] == "False" and c["reason"] == "TargetMissed"
    assert c["message"].startswith("itl p90 ") and "> target 40ms by" in c["message"]
    assert st["slo"]["met"] is False and st["slo"]["window"] == "1m"
    targets = {t["metric"]: t for t in st["slo"]["targets"]}
    assert targets["itl"]["met"] is False and targets["ttft"]["met"] is True
    assert st["scrape"] == {"source": "scrape", "group": KEY[:6], "prefill": "1/1", "decode": "1/1", "gateway": "1/1",
                            "measuredAt": S.rfc3339(feed.t)}
    assert not any(v is None for v in st["slo"].values())
    # no traffic for longer than the window: Unknown, then nothing moves any more
    for _ in range(5):
        st = status(st, feed.health(), now=3000.0)
    assert cond(st, "SLOMet")["status"] == "Unknown" and st["slo"]["noTraffic"] is True
    assert merge_patch(S.comparable(st), S.comparable(status(st, feed.health(), now=4000.0))) == {}


def test_without_fresh_figures_status_keeps_what_it_said():
    feed = Feed()
    feed.pod.traffic(10, ttft=0.15)
    st = status({}, feed.health(reachable={"prefill": 0, "decode": 1, "gateway": 1}))
    assert cond(st, "Degraded")["reason"] == "NoPrefill" and "0 reachable" in cond(st, "Degraded")["message"]
    again = status(st, None)           # e.g. a reconcile outside the operator, or just after a restart
    assert merge_patch(S.comparable(st), S.comparable(again)) == {}
    gone = status(st, None, slo=False)  # spec.slo removed: SLOMet and status.slo go
    assert cond(gone, "SLOMet") is None and gone.get("slo") is None


def test_kv_transfer_failures_degrade():
    feed = Feed(spec=None)
    feed.pod.traffic(20, ttft=0.1)
    feed.pod.failed.inc(3)
    st = status({}, feed.health(), slo=False)
    d = cond(st, "Degraded")
    assert d["status"] == "True" and d["reason"] == "KVTransferFailing"
    assert d["message"].startswith("3 KV transfer and 0 bootstrap failures in the last 5m (15% of")
    assert cond(st, "SLOMet") is None and st.get("slo") is None


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, involved, *, type_, reason, message):
        self.events.append((type_, reason, message))


def test_warning_events_only_on_transitions():
    body = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "d", "namespace": "ns"}}
    feed, kube = Feed(), Events()

    def step(previous: dict, health: Health) -> dict:
        new = status(previous, health)
        P._warn_health_transitions(kube, body, previous, new, health, P.Outcome(valid=True))
        return new

    feed.pod.traffic(20, ttft=0.15)
    st = step({}, feed.health())                   # green: nothing
    assert kube.events == []
    feed.pod.traffic(20, ttft=3.0)
    st = step(st, feed.health())                   # red: one Warning
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "SLOTargetMissed")]
    assert "ttft p90" in kube.events[0][2] and "> target 800ms" in kube.events[0][2]
    feed.pod.traffic(20, ttft=3.0)
    st = step(st, feed.health())                   # still red: no new event
    assert len(kube.events) == 1
    st = step(st, feed.health(reachable={"prefill": 0, "decode": 1, "gateway": 1}))
    assert [r for _, r, _ in kube.events] == ["SLOTargetMissed", "NoPrefill"]
    st = step(st, feed.health(reachable={"prefill": 0, "decode": 1, "gateway": 1}))
    assert len(kube.events) == 2


def test_readiness_no_prefill_is_not_kept_without_figures():
    """Only a Degraded that came from the scraper is kept while there are no figures; one
    from Deployment readiness follows readiness."""
    previous = {"conditions": [{"type": "Degraded", "status": "True", "reason": "NoPrefill",
                                "message": "no prefill replica is ready while 1 decode replica is: requests cannot be disaggregated",
                                "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    assert cond(status(previous, None), "Degraded")["status"] == "False"


def test_stale_health_turns_slo_met_unknown_after_the_bound_and_drops_the_figures():
    feed = Feed()
    feed.pod.traffic(10, ttft=0.15)
    health = feed.health()
    fresh = status({}, health)
    assert cond(fresh, "SLOMet")["status"] == "True" and fresh["slo"] and fresh["scrape"]
    rt = Runtime(kube=None, health_store=HealthStore(max_age_s=60.0, started_at=health.evaluated_at - 5))  # type: ignore[arg-type]
    assert rt.health_stale("ns", "d", now=health.evaluated_at + 30) is None  # nothing yet, within the bound
    rt.set_health(health)
    assert rt.health_stale("ns", "d", now=health.evaluated_at + 59) is None
    why = rt.health_stale("ns", "d", now=health.evaluated_at + 90)
    assert why and "90s old" in why and "more than 1m" in why
    assert rt.health("ns", "d") is None  # too old to be written
    stale = S.valid_status(previous=fresh, generation=1, problems=[], observed=OBSERVED, decision=DECISION,
                           target_key=KEY, kv_layouts={}, attention_backends={}, endpoint="e", now=3000.0,
                           health=None, slo_enabled=True, health_stale=why)
    c = cond(stale, "SLOMet")
    assert (c["status"], c["reason"], c["message"]) == ("Unknown", "NoRecentMeasurement", why)
    assert stale["slo"] is None and stale["scrape"] is None
    assert cond(stale, "Ready")["status"] == "True"
    # never any health: counted from the runtime's start or the first look at the deployment, the later (scraper off)
    idle = Runtime(kube=None, health_store=HealthStore(max_age_s=60.0, started_at=0.0))  # type: ignore[arg-type]
    assert idle.health_stale("ns", "other", now=0.0) is None
    assert "in the 61s since it first saw it" in idle.health_stale("ns", "other", now=61.0)
    # a deployment created long after the operator started is not stale for the operator's uptime
    assert idle.health_stale("ns", "new", now=500.0) is None
    assert idle.health_stale("ns", "new", now=559.0) is None
    assert "in the 61s since" in idle.health_stale("ns", "new", now=561.0)


def test_measured_at_is_kept_while_the_figures_stay_and_moves_with_them():
    """An idle deployment writes nothing at rest (issue 15): a measurement that finds the same
    figures keeps measuredAt; that they are current is SLOMet's to say (NoRecentMeasurement)."""
    feed = Feed()
    st = status({}, feed.health())
    first = st["scrape"]["measuredAt"]
    assert st["scrape"]["source"] == "scrape" and first == S.rfc3339(feed.t)
    for _ in range(3):  # 45 s of the same (idle) figures: nothing to write
        again = status(st, feed.health())
        assert merge_patch(S.comparable(st), S.comparable(again)) == {}
        st = again
    feed.t += 3600  # an hour of unchanged figures: still no write
    again = status(st, feed.health())
    assert merge_patch(S.comparable(st), S.comparable(again)) == {} and again["scrape"]["measuredAt"] == first
    st = again
    feed.pod.traffic(10, ttft=0.1)  # the figures move: measuredAt with them
    st = status(st, feed.health())
    assert st["scrape"]["measuredAt"] == S.rfc3339(feed.t)


def _decision(phase: str, started: float) -> RolloutDecision:
    return RolloutDecision(serving_key=KEY, apply_target=True, target_to_zero=False, delete_keys=(), phase=phase,
                           phase_started=started, draining_key=None, drain_started=None, message="m")


def test_phase_transitions_stamp_when_a_phase_is_entered_not_when_the_surge_began():
    t = S.rfc3339
    surging = S.phase_transitions({}, _decision("Surging", 1000.0), target_key=KEY, now=1000.0)
    assert surging == {"Surging": t(1000.0)}
    still = S.phase_transitions({"targetKey": KEY, "phase": "Surging", "phaseTransitions": surging},
                                _decision("Surging", 1000.0), target_key=KEY, now=1500.0)
    assert still == {"Surging": t(1000.0)}
    # Failed's phase_started is the surge's start (the deadline's clock); it failed now
    failed = S.phase_transitions({"targetKey": KEY, "phase": "Surging", "phaseTransitions": still},
                                 _decision("Failed", 1000.0), target_key=KEY, now=2800.0)
    assert failed == {"Surging": t(1000.0), "Failed": t(2800.0)}
    # a second in-place update of the same key: Surging entered again gets its new time
    done = S.phase_transitions({"targetKey": KEY, "phase": "Failed", "phaseTransitions": failed},
                               _decision("Complete", 3000.0), target_key=KEY, now=3000.0)
    again = S.phase_transitions({"targetKey": KEY, "phase": "Complete", "phaseTransitions": done},
                                _decision("Surging", 4000.0), target_key=KEY, now=4000.0)
    assert again["Surging"] == t(4000.0) and again["Complete"] == t(3000.0)
    draining = S.phase_transitions({"targetKey": KEY, "phase": "Surging", "phaseTransitions": again},
                                   _decision("Draining", 4100.0), target_key=KEY, now=4100.0)
    assert draining["Draining"] == draining["Cutover"] == t(4100.0)
    # a new target key starts a new map
    assert S.phase_transitions({"targetKey": "other", "phase": "Complete", "phaseTransitions": done},
                               _decision("Surging", 5000.0), target_key=KEY, now=5000.0) == {"Surging": t(5000.0)}


def test_ready_false_scaled_to_zero_when_the_decision_is_complete_but_the_group_is_not_ready():
    parked = _decision("Complete", 0.0)
    not_ready = Observed(groups={KEY: ObservedGroup(key=KEY, workloads={c: ws(c) for c in ("prefill", "gateway")})},
                         serving_key=KEY, service_exists=True)
    st = S.valid_status(previous={}, generation=1, problems=[], observed=not_ready, decision=parked, target_key=KEY,
                        kv_layouts={}, attention_backends={}, endpoint="http://d.ns.svc:8000", now=10.0)
    conds = {c["type"]: c for c in st["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == ("False", "Complete")


def test_an_in_place_update_line_counts_a_pending_new_pod_as_not_available():
    """A fresh user read "decode 1/1 updated" while the new pod was Pending: updatedReplicas
    counts pods created from the new template, not Ready ones. The line now says so and gives
    the available count over every replica (old and new); a settled update is not listed."""
    surging = WorkloadState(name="decode", desired=1, ready=1, updated=1, available=1, settled=True, total=2)
    rolled = WorkloadState(name="decode", desired=1, ready=1, updated=1, available=1, settled=True, total=1)
    group = ObservedGroup(key=KEY, workloads={"prefill": ws("prefill"), "decode": surging, "gateway": ws("gateway")})
    assert group.state().updating == ("decode: 1/1 on the new template, 1 of an older one still running, 1/2 available",)
    done = ObservedGroup(key=KEY, workloads={"prefill": ws("prefill"), "decode": rolled, "gateway": ws("gateway")})
    assert done.state().updating == ()


def test_decode_with_no_ready_replica_while_prefill_is_is_degraded_no_decode_with_one_warning():
    """A fresh user's finding: decode at 0 ready pods (all crashed, or Pending) with prefill ready showed
    Degraded False, though nothing could answer a request. Asked-for decode replicas, none ready: NoDecode."""
    def ws(name, desired, ready):
        return WorkloadState(name=name, desired=desired, ready=ready, updated=desired, available=ready, settled=True,
                             total=desired)

    def observed(decode_desired, decode_ready, prefill_ready=1):
        group = ObservedGroup(key=KEY, workloads={"prefill": ws("p", 1, prefill_ready),
                                                  "decode": ws("d", decode_desired, decode_ready),
                                                  "gateway": ws("g", 1, 1)})
        return Observed(groups={KEY: group}, serving_key=KEY, service_exists=True)

    def at(obs, previous=None):
        return S.valid_status(previous=previous or {}, generation=1, problems=[], observed=obs, decision=DECISION,
                              target_key=KEY, kv_layouts={}, attention_backends={}, endpoint="e", now=2000.0,
                              health=None, slo_enabled=False)

    down = at(observed(2, 0))
    c = cond(down, "Degraded")
    assert (c["status"], c["reason"]) == ("True", "NoDecode") and "while 1 prefill replica is:" in c["message"], c
    assert cond(at(observed(2, 1)), "Degraded")["status"] == "False"
    assert cond(at(observed(0, 0)), "Degraded")["status"] == "False"  # scaled to zero: Ready says ScaledToZero
    assert cond(at(observed(2, 0, prefill_ready=0)), "Degraded")["status"] == "False"  # nothing ready yet: creating
    no_prefill = cond(at(observed(2, 1, prefill_ready=0)), "Degraded")  # worded as NoDecode is: what fails, and why
    assert (no_prefill["reason"], no_prefill["message"]) == (
        "NoPrefill", "no prefill replica is ready while 1 decode replica is: requests cannot be disaggregated")
    # the first group, still being created: prefill is often Ready a moment before decode (a fresh user's finding)
    creating = RolloutDecision(serving_key=KEY, apply_target=True, target_to_zero=False, delete_keys=(), phase="Surging",
                               phase_started=0.0, draining_key=None, drain_started=None, message="creating the first group")
    first = S.valid_status(previous={}, generation=1, problems=[], observed=observed(2, 0), decision=creating,
                           target_key=KEY, kv_layouts={}, attention_backends={}, endpoint="e", now=2000.0, health=None,
                           slo_enabled=False)
    assert cond(first, "Degraded")["status"] == "False"
    # a paired rollout surges a new group while this one serves: losing its decode is degraded
    paired = S.valid_status(previous={}, generation=2, problems=[], observed=observed(2, 0), decision=creating,
                            target_key="newkey", kv_layouts={}, attention_backends={}, endpoint="e", now=2000.0,
                            health=None, slo_enabled=False)
    assert cond(paired, "Degraded")["reason"] == "NoDecode"
    kube = Events()
    body = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "d", "namespace": "ns"}}
    P._warn_health_transitions(kube, body, {}, down, None, P.Outcome(valid=True))
    P._warn_health_transitions(kube, body, down, at(observed(2, 0), down), None, P.Outcome(valid=True))
    assert [(t, r) for t, r, _ in kube.events] == [("Warning", "NoDecode")]
