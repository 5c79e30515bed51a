"""The built-in SLO planner (planning/planner.py) and the role counts (planning/scaling.py), pure.

Each test states the figures an SLO source would hand over and checks which role moves,
by how much and when: attribution of a breach to a role from SGLang's queue gauges,
early action on queue and burn rate, stabilization and the one-window hold after a step,
hysteresis on the way down (the learned load), bounds, the GPU budget with a rollout's
second group, and stepping aside for an external autoscaler.
"""

from __future__ import annotations

import pytest

from sglang_pd_operator.metrics.health import Health
from sglang_pd_operator.metrics.slo import KVTransferResult, RoleSummary, SLOEvaluator, SLOResult, TargetResult
from sglang_pd_operator.planning import planner as P
from sglang_pd_operator.planning.scaling import role_counts, seed_replicas, surge_replicas
from sglang_pd_operator.reconcilers.scaling import (
    _role_block,
    list_autoscalers,
    memory_of,
    per_replica,
    signals_from_health,
)

BOUNDS = {"prefill": P.RoleBounds(1, 4), "decode": P.RoleBounds(1, 6)}
GPUS = {"prefill": 4, "decode": 4}


def settings(**kw) -> P.Settings:
    kw.setdefault("bounds", BOUNDS)
    kw.setdefault("gpus_per_replica", GPUS)
    kw.setdefault("up_stabilization_s", 30.0)
    kw.setdefault("down_stabilization_s", 120.0)
    return P.Settings(**kw)


def ttft(measured, target=0.8):
    return P.TargetSignal("ttft", "p90", measured, target, None if measured is None else measured <= target)


def itl(measured, target=0.025):
    return P.TargetSignal("itl", "p90", measured, target, None if measured is None else measured <= target)


def signals(*targets, burn=0.0, prefill=None, decode=None, at=1000.0, window=60.0, **kw) -> P.Signals:
    return P.Signals(at=at, window_s=window, targets=tuple(targets), burn_short=burn, burn_long=burn,
                     roles={"prefill": prefill or P.RoleLoad(pods=1, known=True),
                            "decode": decode or P.RoleLoad(pods=1, known=True)}, **kw)


def decide(sig, replicas=None, memory=None, now=1000.0, **kw):
    return P.decide(signals=sig, replicas=replicas or {"prefill": 1, "decode": 1}, memory=memory or {},
                    settings=settings(**kw), now=now)


def held(pressure, since):
    return {r: P.RoleMemory(pressure=pressure, since=since) for r in ("prefill", "decode")}


# ------------------------------------------------------------------ attribution
def test_ttft_miss_with_prefill_queueing_is_prefills():
    s = signals(ttft(1.6), itl(0.012), prefill=P.RoleLoad(pods=1, waiting=6, running=1, known=True),
                decode=P.RoleLoad(pods=1, transfer=5, running=2, known=True))
    r = P.read(s, replicas={"prefill": 1, "decode": 1}, memory={})
    assert r["prefill"].pressure == "up" and r["decode"].pressure != "up"
    assert r["prefill"].factor == 2.0  # 1.6 / 0.8
    assert "ttft p90 1.6s > 800ms" in r["prefill"].why and "prefill waiting 6/pod" in r["prefill"].why


def test_ttft_miss_with_decode_out_of_kv_memory_is_decodes():
    s = signals(ttft(1.2), prefill=P.RoleLoad(pods=1, bootstrap=4, known=True),
                decode=P.RoleLoad(pods=1, prealloc=3, running=64, token_usage=1.0, known=True))
    r = P.read(s, replicas={"prefill": 1, "decode": 1}, memory={})
    assert r["decode"].pressure == "up" and r["prefill"].pressure != "up"


def test_ttft_miss_with_both_sides_queueing_scales_both_and_without_queues_prefill():
    both = signals(ttft(1.2), prefill=P.RoleLoad(pods=1, waiting=3, known=True),
                   decode=P.RoleLoad(pods=1, prealloc=2, known=True))
    assert {r: x.pressure for r, x in P.read(both, replicas={}, memory={}).items()} == {"prefill": "up",
                                                                                         "decode": "up"}
    dwarfed = signals(ttft(2.2), prefill=P.RoleLoad(pods=1, waiting=31, bootstrap=1, known=True),
                      decode=P.RoleLoad(pods=1, transfer=34, running=1, known=True))
    assert {r: x.pressure for r, x in P.read(dwarfed, replicas={}, memory={}).items()} == {"prefill": "up",
                                                                                            "decode": "hold"}
    neither = signals(ttft(1.2))
    r = P.read(neither, replicas={}, memory={})
    assert r["prefill"].pressure == "up" and r["decode"].pressure != "up"
    assert "TTFT's PD share is prefill's" in r["prefill"].why


def test_itl_miss_is_decodes_never_prefills():
    s = signals(ttft(0.3), itl(0.04), prefill=P.RoleLoad(pods=1, waiting=0.5, known=True),
                decode=P.RoleLoad(pods=1, running=30, known=True))
    r = P.read(s, replicas={"prefill": 2, "decode": 1}, memory={})
    assert r["decode"].pressure == "up" and r["decode"].factor == pytest.approx(1.6)
    assert r["prefill"].pressure != "up"


def test_an_itl_miss_at_a_batch_of_one_is_the_engines_floor_not_capacity():
    s = signals(itl(0.05), decode=P.RoleLoad(pods=2, running=1, known=True))
    r = P.read(s, replicas={"prefill": 1, "decode": 2}, memory={})
    assert r["decode"].pressure == "hold" and "engine's floor" in r["decode"].why and r["decode"].missed
    busy = signals(itl(0.05), decode=P.RoleLoad(pods=2, running=6, known=True))
    assert P.read(busy, replicas={"prefill": 1, "decode": 2}, memory={})["decode"].pressure == "up"


def test_speed_miss_is_decodes():
    speed = P.TargetSignal("perUserSpeed", "p90", 20.0, 40.0, False)
    r = P.read(signals(speed, decode=P.RoleLoad(pods=1, running=8, known=True)), replicas={}, memory={})
    assert r["decode"].pressure == "up" and r["decode"].factor == 2.0 and r["prefill"].pressure != "up"
    assert speed.describe() == "perUserSpeed p90 20 tok/s < 40 tok/s"


# ------------------------------------------------------------------ acting early
def test_queue_acts_before_the_window_percentile_crosses_the_target():
    s = signals(ttft(0.7), prefill=P.RoleLoad(pods=1, waiting=2, known=True))  # 88% of target, queueing
    r = P.read(s, replicas={}, memory={})
    assert r["prefill"].pressure == "up" and r["prefill"].factor == 1.0 and not r["prefill"].lagging_only
    early = signals(ttft(0.5), prefill=P.RoleLoad(pods=1, waiting=2, known=True))  # 62%, queueing
    assert P.read(early, replicas={}, memory={})["prefill"].pressure == "up"
    calm = signals(ttft(0.4), prefill=P.RoleLoad(pods=1, waiting=2, known=True))  # 50%: far from target
    assert P.read(calm, replicas={}, memory={})["prefill"].pressure == "hold"


def test_a_close_target_waits_while_the_other_role_misses_its_own():
    """The e2e's ITL-bound load on a loaded machine: decode misses ITL with a batch of 24, TTFT sits at 61%
    of its target and prefill's queue reads one. Decode scales; prefill holds until decode's step took
    effect (its slower steps delay the first token too). Without decode's miss, the same queue acts early."""
    loads = dict(prefill=P.RoleLoad(pods=1, waiting=1, known=True), decode=P.RoleLoad(pods=1, running=24, known=True))
    s = signals(ttft(0.364, target=0.6), itl(0.055, target=0.03), burn=100.0, **loads)
    r = P.read(s, replicas={"prefill": 1, "decode": 1}, memory={"decode": P.RoleMemory(last_miss=995.0)})
    assert r["decode"].pressure == "up" and r["prefill"].pressure == "hold"
    assert "decode misses its own target" in r["prefill"].why
    alone = signals(ttft(0.364, target=0.6), itl(0.02, target=0.03), **loads)
    assert P.read(alone, replicas={"prefill": 1, "decode": 1}, memory={})["prefill"].pressure == "up"


def test_burn_rate_acts_early_when_the_roles_target_is_close_again():
    """The budget still burns from prefill's miss 10 s ago and TTFT is within 20% again: act before the
    next miss. Without a miss of its own (or one older than the window) a role ignores the burn rate."""
    s = signals(ttft(0.7), burn=3.0)
    recent = {"prefill": P.RoleMemory(last_miss=990.0)}
    r = P.read(s, replicas={}, memory=recent)
    assert r["prefill"].pressure == "up" and r["prefill"].lagging_only and "burns at 3x" in r["prefill"].why
    assert P.read(s, replicas={}, memory={})["prefill"].pressure == "hold"
    old = {"prefill": P.RoleMemory(last_miss=900.0)}
    assert P.read(s, replicas={}, memory=old)["prefill"].pressure == "hold"


def test_a_burn_from_one_roles_miss_does_not_scale_the_other():
    """TTFT (prefill's) was missed and burns the budget; ITL is close but never missed: decode holds,
    also once TTFT recovered while the burn rate still counts its bad intervals."""
    mem = {"prefill": P.RoleMemory(last_miss=995.0)}
    s = signals(ttft(0.5), itl(0.0189, target=0.02), burn=90.0, decode=P.RoleLoad(pods=1, running=1, known=True))
    r = P.read(s, replicas={"prefill": 2, "decode": 1}, memory=mem)
    assert r["decode"].pressure == "hold", r["decode"]
    d = decide(signals(ttft(1.7), burn=20.0), memory=held("up", 0.0))
    assert d.roles["prefill"].memory.last_miss == 1000.0 and d.roles["decode"].memory.last_miss is None


def test_up_waits_for_stabilization_unless_the_burn_is_fast():
    s = signals(ttft(1.6), burn=2.0)
    d = decide(s, now=1000.0)
    assert d.replicas("prefill", 1) == 1 and d.next_look_s == pytest.approx(30.0)
    assert d.roles["prefill"].memory.since == 1000.0 and "acting in 30s" in d.roles["prefill"].reason
    d = decide(s, memory=held("up", 965.0), now=1000.0)
    assert d.replicas("prefill", 1) == 2 and d.roles["prefill"].acted
    assert d.events[0][1] == "PlannerScaled" and "prefill 1 -> 2" in d.events[0][2] and "GPUs 4" in d.events[0][2]
    fast = decide(signals(ttft(1.6), burn=20.0), now=1000.0)  # page-rate burn: no waiting
    assert fast.replicas("prefill", 1) == 2


def test_after_a_step_only_the_roles_own_queue_adds_more_within_a_window():
    mem = {"prefill": P.RoleMemory(pressure="up", since=900.0, last_scale=990.0)}
    lagging = signals(ttft(1.6))  # the window still holds the slow requests; prefill no longer queues
    d = decide(lagging, replicas={"prefill": 2, "decode": 1}, memory=mem, now=1000.0)
    assert d.replicas("prefill", 2) == 2 and "does not queue" in d.roles["prefill"].reason
    assert d.next_look_s == pytest.approx(50.0)  # until a window passed since the step
    queueing = signals(ttft(1.6), prefill=P.RoleLoad(pods=2, waiting=4, known=True))
    d = decide(queueing, replicas={"prefill": 2, "decode": 1}, memory=mem, now=1000.0)
    assert d.replicas("prefill", 2) == 4


def test_up_waits_for_the_last_steps_pods_to_be_ready():
    d = decide(signals(ttft(1.6)), replicas={"prefill": 2, "decode": 1}, memory=held("up", 900.0),
               ready={"prefill": 1, "decode": 1})
    assert d.replicas("prefill", 2) == 2 and "ready" in d.roles["prefill"].reason


# ------------------------------------------------------------------ the way down
def test_down_after_stabilization_one_at_a_time_and_never_below_min():
    idle = signals(ttft(0.2), itl(0.01))
    d = decide(idle, replicas={"prefill": 3, "decode": 1}, memory=held("down", 900.0), now=1000.0)
    assert d.replicas("prefill", 3) == 3 and d.next_look_s == pytest.approx(20.0)  # 100 of 120 s held
    d = decide(idle, replicas={"prefill": 3, "decode": 1}, memory=held("down", 870.0), now=1000.0)
    assert d.replicas("prefill", 3) == 2 and d.replicas("decode", 1) == 1  # decode is at its minimum
    assert d.roles["prefill"].memory.since == 1000.0  # the next one waits a whole window again


def test_down_waits_a_window_after_any_scaling_of_the_role():
    mem = {"prefill": P.RoleMemory(pressure="down", since=800.0, last_scale=950.0)}
    d = decide(signals(ttft(0.2)), replicas={"prefill": 3, "decode": 1}, memory=mem, now=1000.0)
    assert d.replicas("prefill", 3) == 3 and d.next_look_s == pytest.approx(70.0)


def test_down_hysteresis_uses_the_load_that_last_needed_a_replica():
    # a replica was added at 6 requests/pod; now 3 pods carry 3 each: two would carry 4.5 > 70% of 6
    mem = {"prefill": P.RoleMemory(pressure="down", since=0.0, up_load=6.0)}
    busy = signals(ttft(0.3), prefill=P.RoleLoad(pods=3, running=9, known=True))
    r = P.read(busy, replicas={"prefill": 3, "decode": 1}, memory=mem)
    assert r["prefill"].pressure == "hold" and "4.5" in r["prefill"].why
    light = signals(ttft(0.3), prefill=P.RoleLoad(pods=3, running=4, known=True))
    assert P.read(light, replicas={"prefill": 3, "decode": 1}, memory=mem)["prefill"].pressure == "down"


def test_without_a_learned_load_the_targets_scaled_by_n_over_n_minus_1_must_stay_below_90_percent():
    r = P.read(signals(itl(0.015)), replicas={"prefill": 1, "decode": 2}, memory={})
    assert r["decode"].pressure == "hold"  # 60% x 2 = 120%
    r = P.read(signals(itl(0.010)), replicas={"prefill": 1, "decode": 3}, memory={})
    assert r["decode"].pressure == "down"  # 40% x 3/2 = 60%
    r = P.read(signals(ttft(None), no_traffic=True), replicas={"prefill": 2, "decode": 2}, memory={})
    assert r["prefill"].pressure == "down" and r["decode"].pressure == "down"


def test_a_burning_budget_holds_the_way_down():
    r = P.read(signals(ttft(0.2), burn=1.5), replicas={"prefill": 3, "decode": 1}, memory={})
    assert r["prefill"].pressure == "hold"


# ------------------------------------------------------------------ bounds and budget
def test_a_step_up_follows_the_miss_ratio_within_hpas_default_policy():
    big = signals(ttft(4.0), prefill=P.RoleLoad(pods=1, waiting=30, known=True))   # 6.7x the target
    wide = settings(bounds={"prefill": P.RoleBounds(1, 20), "decode": P.RoleBounds(1, 20)})
    one = P.decide(signals=big, replicas={"prefill": 1, "decode": 1}, memory=held("up", 0.0), settings=wide, now=1000.0)
    assert one.replicas("prefill", 1) == 5            # +4 pods is more than 2x at one replica
    ten = P.decide(signals=big, replicas={"prefill": 10, "decode": 1}, memory=held("up", 0.0), settings=wide,
                   now=1000.0)
    assert ten.replicas("prefill", 10) == 20          # 2x is more than +4 at ten
    small = P.decide(signals=signals(ttft(0.9)), replicas={"prefill": 4, "decode": 1}, memory=held("up", 0.0),
                     settings=wide, now=1000.0)
    assert small.replicas("prefill", 4) == 5          # ceil(4 x 1.125)


def test_max_replicas_and_the_gpu_budget_bound_every_step():
    s = signals(ttft(2.4), prefill=P.RoleLoad(pods=3, waiting=9, known=True))
    d = decide(s, replicas={"prefill": 3, "decode": 1}, memory=held("up", 0.0))
    assert d.replicas("prefill", 3) == 4  # 4x missed: +4 wanted (HPA's default policy), maxReplicas 4
    # 24 GPUs in use of 28: one more prefill replica (4 GPUs) fits, the doubling does not
    d = decide(s, replicas={"prefill": 2, "decode": 1}, memory=held("up", 0.0), max_gpus=28, gpus_in_use=24)
    assert d.replicas("prefill", 2) == 3 and "cut from 4 by maxGPUs 28" in d.roles["prefill"].reason
    # while a new group surges beside the serving one a replica costs twice
    d = decide(s, replicas={"prefill": 2, "decode": 1}, memory=held("up", 0.0), max_gpus=28, gpus_in_use=24,
               receivers=2)
    assert d.replicas("prefill", 2) == 2 and d.roles["prefill"].memory.blocked
    assert d.events == (("Warning", "PlannerBlocked", d.events[0][2]),) and "GPU budget: 24 of 28" in d.events[0][2]
    again = decide(s, replicas={"prefill": 2, "decode": 1},
                   memory={"prefill": d.roles["prefill"].memory}, max_gpus=28, gpus_in_use=24, receivers=2)
    assert again.events == ()  # one Warning per blocked stretch, not one per reconcile


def test_a_count_outside_the_bounds_is_brought_back():
    d = decide(signals(ttft(0.5)), replicas={"prefill": 9, "decode": 0})
    assert d.replicas("prefill", 9) == 4 and d.replicas("decode", 0) == 1


def test_the_planner_steps_aside_for_an_external_autoscaler_and_holds_without_figures():
    d = decide(signals(ttft(3.0)), external={"prefill": "HorizontalPodAutoscaler/p"})
    assert d.replicas("prefill", 1) == 1 and "steps aside" in d.roles["prefill"].reason
    d = decide(None)
    assert d.replicas("prefill", 1) == 1 and "waiting for the first SLO figures" in d.roles["prefill"].reason
    d = decide(P.Signals(at=0, window_s=0, problem="Prometheus is down"))
    assert d.replicas("prefill", 1) == 1 and "Prometheus is down" in d.roles["prefill"].reason


# ------------------------------------------------------------------ counts and groups
def test_role_counts_seed_and_surge(gb300_doc):
    from sglang_pd_operator.api.load import parse_pddeployment

    del gb300_doc["spec"]["decode"]["replicas"]
    gb300_doc["spec"]["autoscaling"] = {"decode": {"minReplicas": 2, "maxReplicas": 5}}
    gb300_doc["spec"]["slo"] = {"itl": {"p90": "25ms"}}
    spec = parse_pddeployment(gb300_doc).spec
    assert seed_replicas(spec, "decode") == 2 and seed_replicas(spec, "prefill") == 1
    # a role that already serves keeps its count (within the planner's bounds): handing it over scales nothing
    assert seed_replicas(spec, "decode", serving=4) == 4
    assert seed_replicas(spec, "decode", serving=9) == 5 and seed_replicas(spec, "decode", serving=1) == 2
    assert seed_replicas(spec, "prefill", serving=3) == 3 and seed_replicas(spec, "prefill", serving=0) == 1
    assert role_counts(spec, {}) == {"prefill": spec.prefill.replicas, "decode": 2}
    assert role_counts(spec, {"decode": 4, "prefill": 9})["decode"] == 4  # prefill's count is the spec's
    counts, per = {"prefill": 2, "decode": 4}, {"prefill": 4, "decode": 4}
    assert surge_replicas(counts=counts, current=None, gpus_per_replica=per, max_surge_gpus=8) == counts
    assert surge_replicas(counts=counts, current={"prefill": 1, "decode": 1}, gpus_per_replica=per,
                          max_surge_gpus=16) == {"prefill": 2, "decode": 2}
    assert surge_replicas(counts={"prefill": 1, "decode": 1}, current={"prefill": 2, "decode": 3},
                          gpus_per_replica=per, max_surge_gpus=4) == {"prefill": 1, "decode": 1}


# ------------------------------------------------------------------ from the SLO sources
def _health(roles=None, problem=None):
    targets = (TargetResult("ttft", "p90", "seconds", 0.8, 1.2, False, -0.4, 0.1, 100, "decode",
                            "sglang:time_to_first_token_seconds"),)
    kv = KVTransferResult(latency_seconds={}, transfers=0, transfer_failures=0, bootstrap_failures=0,
                          failures_per_second=0, failure_ratio=None)
    burn = SLOEvaluator().record_interval("x/y", 60.0, 0.99, False, 1000.0)[1]
    slo = SLOResult(deployment="ns/d", evaluated_at=1000.0, window_seconds=60.0, objective=0.99, targets=targets,
                    met=False, no_traffic=False, attainment=0.0, burn_rates=burn, kv_transfer=kv, roles=roles or {})
    return Health(namespace="ns", name="d", serving_key="k", evaluated_at=1000.0, ready={"prefill": 2, "decode": 1},
                  reachable={"prefill": 2, "decode": 1}, slo=None if problem else slo, kv_transfer=kv,
                  problem=problem)


def test_signals_from_either_sources_health():
    roles = {"prefill": RoleSummary("prefill", 2, {"num_queue_reqs": 6.0, "num_running_reqs": 2.0}, None),
             "decode": RoleSummary("decode", 1, {"num_decode_transfer_queue_reqs": 3.0}, None, token_usage=0.4)}
    s = signals_from_health(_health(roles))
    assert s.targets[0].ratio == pytest.approx(1.5) and s.burn_short == pytest.approx(100.0)
    assert s.role("prefill") == P.RoleLoad(pods=2, running=2.0, waiting=6.0, known=True)
    assert s.role("decode").transfer == 3.0 and s.role("decode").token_usage == 0.4
    assert P.read(s, replicas={}, memory={})["prefill"].pressure == "up"
    off = signals_from_health(_health(problem=("PrometheusUnavailable", "timed out")))
    assert off.problem == "timed out" and signals_from_health(None) is None


def test_memory_round_trips_through_status():
    d = P.RoleDecision(3, P.RoleMemory(pressure="up", since=1000.0, last_scale=990.0, up_load=4.25, blocked=True,
                                       last_miss=980.0), "why")
    block = _role_block(3, "planner", d)
    assert block["since"] == "1970-01-01T00:16:40Z" and block["upLoad"] == 4.25
    assert memory_of({"autoscaling": {"decode": block}})["decode"] == d.memory
    assert memory_of({})["prefill"] == P.RoleMemory()


def test_an_hpa_targeting_a_pdrolescale_is_found():
    class Kube:
        def list(self, api_version, kind, namespace, selector):
            assert (api_version, kind) == ("autoscaling/v2", "HorizontalPodAutoscaler")
            return [
                {"metadata": {"name": "web"}, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                                                          "name": "d-decode"}}},
                {"metadata": {"name": "keda-hpa-d"}, "spec": {"scaleTargetRef": {
                    "apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDRoleScale", "name": "d-decode"}}},
            ]

    assert list_autoscalers(Kube(), "ns") == {"d-decode": "HorizontalPodAutoscaler/keda-hpa-d"}


def test_loads_are_per_replica_of_the_serving_group_not_per_pod():
    """A multi-node replica (a LeaderWorkerSet group of 4 pods) has one queue: 8 waiting over 2 groups is
    4 per replica, not 1 per pod."""
    import dataclasses

    roles = {"prefill": RoleSummary("prefill", 8, {"num_queue_reqs": 8.0}, None)}
    s = signals_from_health(dataclasses.replace(_health(roles), reachable={"prefill": 8, "decode": 1}))
    assert s.role("prefill").per_pod(s.role("prefill").waiting) == 1.0   # per pod: looks idle-ish
    grouped = per_replica(s, {"prefill": 2, "decode": 1})
    assert grouped.role("prefill").per_pod(grouped.role("prefill").waiting) == 4.0  # per replica: it queues
    assert grouped.role("decode").pods == 1
    assert per_replica(s, {}) == s and per_replica(None, {"prefill": 2}) is None
