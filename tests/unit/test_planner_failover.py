"""A failover keeps the planner's decisions (issue 29, item 3).

The built-in planner's memory (each role's pressure and since when, its last scale, the
load that last needed a replica) lives in the PDDeployment's ``status.autoscaling``, its
counts in the PDRoleScales; nothing of it lives only in a process. Here three operator
processes lead one after the other (a Lease handed over: each starts with nothing in
memory) against one in-memory API server that keeps the objects and enforces the status
precondition (``metadata.resourceVersion`` in the merge patch; 409 when it is stale), fed
the same figures, as ``--slo-source prometheus`` gives a new leader at once (the
PrometheusRule's records: no warm-up of its own):

1. A sees prefill short (TTFT missed, prefill queueing) at t=1000 and starts the
   scale-up stabilization (60 s); A stops at t=1030 before acting.
2. B, fresh, at t=1045: the pressure is still counted from t=1000 (not restarted); at
   t=1061 B scales prefill 1 -> 2, 61 s after A first saw it. A process that started
   from nothing (no status) would have waited until t=1105.
3. A, back from a pause (a stale leader), writes the status it had computed at t=1030:
   the API server refuses it (409), so B's decision stays.
4. C takes over at t=1070 with the targets met again: the count stays 2 and the way down
   counts from B's scale (t=1061), not from C's start.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes.dynamic.exceptions import ConflictError

from sglang_pd_operator.api import rolescale
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.api.v1alpha1 import API_VERSION
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.metrics.health import Health
from sglang_pd_operator.metrics.slo import (
    KVTransferResult,
    RoleSummary,
    SLOResult,
    TargetResult,
    BurnRate,
    burn_windows,
)
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.reconcilers import pddeployment
from sglang_pd_operator.reconcilers.observe import Observed, ObservedGroup, WorkloadState
from sglang_pd_operator.reconcilers.scaling import memory_of, reconcile_scaling, role_scale_name

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-paged-experts.yaml"
UP_S, DOWN_S = 60.0, 120.0


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch, as the API server applies one."""
    out = copy.deepcopy(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


class ApiServer:
    """The objects of one namespace, a resourceVersion per write, and the status precondition."""

    def __init__(self, pdd: dict) -> None:
        self.rv = 1
        self.pdd = {**pdd, "metadata": {**pdd["metadata"], "resourceVersion": "1"}, "status": {}}
        self.objects: dict[tuple[str, str], dict] = {}

    def read_pdd(self) -> dict:
        return copy.deepcopy(self.pdd)

    def patch_status(self, patch: dict, resource_version: str | None) -> None:
        if resource_version is not None and resource_version != self.pdd["metadata"]["resourceVersion"]:
            raise ConflictError(type("E", (), {"status": 409, "reason": "Conflict", "body": "the object has been "
                                               "modified; please apply your changes to the latest version",
                                               "headers": {}})())
        self.pdd["status"] = _merge(self.pdd["status"], patch)
        self.rv += 1
        self.pdd["metadata"]["resourceVersion"] = str(self.rv)


class Kube:
    """One operator process's client to :class:`ApiServer` (what reconcile_scaling and _write_status call)."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    def get(self, api_version, kind, name, namespace=None):
        obj = self.api.objects.get((kind, name))
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, obj):
        self.api.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return True

    def apply(self, desired, live=None, **_):
        return False  # the PDRoleScale's spec besides replicas does not change here

    def list(self, api_version, kind, namespace, selector):
        return [copy.deepcopy(o) for (k, _), o in self.api.objects.items() if k == kind]

    def delete(self, *a):
        raise AssertionError("nothing is deleted in a failover")

    def scale(self, api_version, kind, name, namespace, replicas, *, field_manager=None):
        self.api.objects[(kind, name)]["spec"]["replicas"] = replicas

    def patch_status(self, api_version, kind, name, namespace, status, *, resource_version=None):
        self.api.patch_status(status, resource_version)


def _doc() -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": "d", "namespace": "ns", "uid": "u-1", "generation": 1}
    doc["spec"]["prefill"].pop("replicas", None)  # the PDRoleScale owns the count
    doc["spec"]["slo"] = {"ttft": {"p90": "800ms"}, "window": "1m"}
    doc["spec"]["autoscaling"] = {"prefill": {"minReplicas": 1, "maxReplicas": 4},
                                  "scaleUpStabilization": f"{UP_S:g}s", "scaleDownStabilization": f"{DOWN_S:g}s"}
    return doc


def _observed(plan, prefill: int) -> Observed:
    def w(name, n):
        return WorkloadState(name=name, desired=n, ready=n, updated=n, available=n, settled=True, gpus_per_pod=1,
                             total=n)
    group = ObservedGroup(key=plan.compat_key, workloads={"prefill": w("p", prefill), "decode": w("d", 1),
                                                          "gateway": w("g", 1)})
    return Observed(groups={plan.compat_key: group}, serving_key=plan.compat_key, service_exists=True)


def _health(at: float, ttft: float, prefill_queue: float) -> Health:
    """Figures as the Prometheus source hands them to any leader: the recorded percentile and burn rates."""
    met = ttft <= 0.8
    target = TargetResult("ttft", "p90", "seconds", 0.8, ttft, met, 0.8 - ttft, None, 200, "decode",
                          "sglang:time_to_first_token_seconds")
    burn = tuple(BurnRate(window=bw, value=0.0 if met else 2.0, intervals=0) for bw in burn_windows(60.0))
    kv = KVTransferResult(latency_seconds={}, transfers=0, transfer_failures=0, bootstrap_failures=0,
                          failures_per_second=0, failure_ratio=None)
    roles = {"prefill": RoleSummary("prefill", 1, {"num_queue_reqs": prefill_queue, "num_running_reqs": 1.0}, None),
             "decode": RoleSummary("decode", 1, {"num_running_reqs": 4.0}, None, token_usage=0.2)}
    slo = SLOResult(deployment="ns/d", evaluated_at=at, window_seconds=60.0, objective=0.99, targets=(target,),
                    met=met, no_traffic=False, attainment=1.0 if met else 0.5, burn_rates=burn, kv_transfer=kv,
                    roles=roles)
    return Health(namespace="ns", name="d", serving_key="k", evaluated_at=at, ready={"prefill": 1, "decode": 1},
                  reachable={"prefill": 1, "decode": 1, "gateway": 1}, slo=slo, kv_transfer=kv, source="prometheus")


class Leader:
    """One operator process while it leads: nothing in memory but what it reads from the API server."""

    def __init__(self, api: ApiServer) -> None:
        self.kube = Kube(api)
        self.api = api

    def reconcile(self, now: float, health: Health, *, write: bool = True) -> tuple[dict, dict, dict]:
        """One reconcile of the planner's step: (the body it read, its status before, the new status)."""
        body = self.api.read_pdd()
        plan = build_plan(parse_pddeployment(body), builtin_catalog())
        prefill = (self.kube.get(API_VERSION, rolescale.KIND, role_scale_name("d", "prefill")) or {}).get(
            "spec", {}).get("replicas", 1)
        previous = body.get("status") or {}
        scaling = reconcile_scaling(kube=self.kube, plan=plan, observed=_observed(plan, prefill),
                                    owner={"apiVersion": API_VERSION, "kind": "PDDeployment", "name": "d", "uid": "u-1"},
                                    previous=previous, health=health, now=now,
                                    autoscalers=lambda ns: {})
        new = {**previous, "autoscaling": scaling.status}
        if write:
            pddeployment._write_status(self.kube, body, previous, new)
        return body, previous, new


def _prefill(api: ApiServer) -> int:
    return api.objects[(rolescale.KIND, role_scale_name("d", "prefill"))]["spec"]["replicas"]


def test_a_failover_keeps_the_planners_decisions():
    api = ApiServer(_doc())
    short = lambda t: _health(t, ttft=1.2, prefill_queue=6.0)  # noqa: E731 (prefill queues: prefill is short)

    # 1. A sees the pressure and waits out the stabilization
    a = Leader(api)
    a.reconcile(1000.0, short(1000.0))
    assert _prefill(api) == 1
    since = memory_of(api.pdd["status"])["prefill"]
    assert (since.pressure, since.since) == ("up", 1000.0)
    stale_body, stale_prev, stale_new = a.reconcile(1030.0, short(1030.0), write=False)  # A computes, then pauses

    # 2. B leads with nothing in memory: the pressure still counts from A's t=1000
    b = Leader(api)
    b.reconcile(1045.0, short(1045.0))
    assert _prefill(api) == 1 and memory_of(api.pdd["status"])["prefill"].since == 1000.0
    b.reconcile(1061.0, short(1061.0))
    assert _prefill(api) == 2, api.pdd["status"]["autoscaling"]
    decided = copy.deepcopy(api.pdd["status"]["autoscaling"])
    assert memory_of(api.pdd["status"])["prefill"].last_scale == 1061.0
    # control: a leader that had kept its memory only in the process would have started over at t=1061
    forgetful = Leader(ApiServer(_doc()))
    forgetful.reconcile(1061.0, short(1061.0))
    assert _prefill(forgetful.api) == 1 and memory_of(forgetful.api.pdd["status"])["prefill"].since == 1061.0

    # 3. the stale leader's late write is refused: B's decision stays
    with pytest.raises(ConflictError):
        pddeployment._write_status(a.kube, stale_body, stale_prev, stale_new)
    assert api.pdd["status"]["autoscaling"] == decided

    # 4. C takes over with the targets met: the count stays, the way down counts from B's scale
    c = Leader(api)
    fine = _health(1070.0, ttft=0.3, prefill_queue=0.0)
    c.reconcile(1070.0, fine)
    assert _prefill(api) == 2
    memory = memory_of(api.pdd["status"])["prefill"]
    assert memory.last_scale == 1061.0 and memory.pressure in ("down", "hold")
    c.reconcile(1070.0 + DOWN_S - 1, _health(1070.0 + DOWN_S - 1, ttft=0.3, prefill_queue=0.0))
    assert _prefill(api) == 2  # not before the down stabilization, counted across the failover
