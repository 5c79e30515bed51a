"""Paired rollouts end to end: the gateway never pairs two compat keys, failures keep the old group serving.

A watcher thread samples, every ~0.05 s, every gateway Deployment of the PDDeployment
(its prefill/decode selectors) and the user-facing Service's selector, together with the
readiness of every group, through the real API server while the operator (a separate
process) rolls the deployment.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

import pytest
from helpers import load_example
from kubernetes import client as k8s
from opkit import OperatorProcess, condition, kapply, kget, pods, wait_for

pytestmark = pytest.mark.e2e

NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"


def _spec(ns_, *, decode=2, rollout=None, **spec):
    doc = load_example()
    doc["metadata"]["namespace"] = ns_
    doc["spec"]["decode"]["replicas"] = decode
    doc["spec"]["gateway"]["replicas"] = 1
    if rollout:
        doc["spec"]["rollout"] = rollout
    doc["spec"].update(spec)
    return doc


def _ready_obj(cluster, ns_):
    obj = kget(cluster, "pdd", NAME, "-n", ns_)
    c = condition(obj, "Ready")
    gen = (obj or {}).get("metadata", {}).get("generation")
    return obj if c and c["status"] == "True" and (obj.get("status") or {}).get("observedGeneration") == gen else None


def _selector_keys(args: list[str]) -> set[str]:
    """Every compat key a gateway's smg arguments select (prefill and decode selectors)."""
    keys = set()
    collecting = False
    for tok in args:
        if tok in ("--prefill-selector", "--decode-selector"):
            collecting = True
            continue
        if tok.startswith("--"):
            collecting = False
        elif collecting and tok.startswith(f"{LBL}/compat-key="):
            keys.add(tok.split("=", 1)[1])
    return keys


@dataclass
class Sample:
    t: float
    service_key: str | None
    gateways: dict[str, set[str]]  # gateway deployment -> compat keys it selects
    ready: dict[str, bool]  # compat key -> every component fully ready


@dataclass
class Watcher:
    """Samples gateway selectors, the Service selector and group readiness in a thread."""

    api: k8s.ApiClient
    namespace: str
    name: str = NAME
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> Sample:
        """One snapshot: the Service is read at exactly the resourceVersion of the Deployment list.

        Two plain reads are two moments: under load a cutover can land between them, and a
        Service read after it beside Deployments listed before it looks like a Service pointing
        at a group that is not Ready (seen in CI). ``resourceVersionMatch=Exact`` reads the
        Service as etcd held it at the list's revision, so each sample is one state of the cluster.
        """
        apps, core = k8s.AppsV1Api(self.api), k8s.CoreV1Api(self.api)
        listed = apps.list_namespaced_deployment(self.namespace, label_selector=f"{LBL}/deployment={self.name}")
        deps = listed.items
        services = core.list_namespaced_service(
            self.namespace, field_selector=f"metadata.name={self.name}",
            resource_version=listed.metadata.resource_version, resource_version_match="Exact",
        ).items
        service_key = (services[0].spec.selector or {}).get(f"{LBL}/compat-key") if services else None
        gateways, comps = {}, {}
        for d in deps:
            key, role = d.metadata.labels[f"{LBL}/compat-key"], d.metadata.labels[f"{LBL}/role"]
            want = d.spec.replicas or 0
            st = d.status
            ok = want > 0 and (st.ready_replicas or 0) == want and (st.updated_replicas or 0) == want and (st.observed_generation or 0) >= d.metadata.generation
            comps.setdefault(key, {})[role] = ok
            if role == "gateway":
                gateways[d.metadata.name] = _selector_keys(d.spec.template.spec.containers[0].args)
        ready = {k: all(v.get(c, False) for c in ("prefill", "decode", "gateway")) for k, v in comps.items()}
        return Sample(time.monotonic(), service_key, gateways, ready)

    def run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            time.sleep(0.05)

    def __enter__(self) -> "Watcher":
        self.samples.append(self._sample())  # the state before the change
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def assert_safe(self) -> None:
        """No gateway selects two keys; the Service always points at a Ready group."""
        assert self.samples, "the watcher took no sample"
        for s in self.samples:
            for gw, keys in s.gateways.items():
                assert len(keys) == 1, f"gateway {gw} selects compat keys {keys}"
                assert gw.split("-")[-2] == next(iter(keys))[:6], f"gateway {gw} selects another group's key {keys}"
            assert s.service_key is not None and s.ready.get(s.service_key), f"Service points at a group that is not Ready: {s}"


def test_image_change_rolls_a_new_group_with_a_safe_cutover(cluster, operator, ns):
    kapply(cluster, _spec(ns, rollout={"drainGracePeriod": "3s"}))
    old = wait_for(lambda: _ready_obj(cluster, ns), timeout=60, what="Ready")["status"]["compatKey"]
    changed = _spec(ns, rollout={"drainGracePeriod": "3s"})
    changed["spec"]["runtime"]["image"] = "lmsysorg/sglang:v0.5.23-cu130-post1"
    seen: dict = {}

    def complete():
        seen["status"] = (kget(cluster, "pdd", NAME, "-n", ns) or {}).get("status")
        o = _ready_obj(cluster, ns)
        return o and o["status"]["compatKey"] != old and o["status"]["rollout"]["phase"] == "Complete" and o

    with Watcher(cluster.api_client(), ns) as watcher:
        kapply(cluster, changed)
        try:  # about 30 s alone; a loaded CI machine has taken more than 90
            obj = wait_for(complete, timeout=180, what="rollout Complete")
        except AssertionError as e:
            raise AssertionError(f"{e}\nlast status: {seen.get('status')}\noperator log:\n{operator.log_tail(40)}") from None
        wait_for(lambda: watcher.samples and set(watcher.samples[-1].ready) == {obj["status"]["compatKey"]}, timeout=30, what="old group gone")
    watcher.assert_safe()
    new = obj["status"]["compatKey"]
    assert {s.service_key for s in watcher.samples} == {old, new}
    assert any(len(s.ready) == 2 for s in watcher.samples), "the new group never stood beside the old one (no surge)"
    phases = obj["status"]["rollout"]["phaseTransitions"]
    assert {"Surging", "Cutover", "Draining", "Complete"} <= set(phases), phases
    events = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME}")["items"]
    reasons = [e["reason"] for e in events if e["reason"] in ("Surging", "Cutover", "Draining", "RolloutComplete")]
    assert sorted(reasons) == ["Cutover", "Draining", "RolloutComplete", "RolloutComplete", "Surging"], reasons  # first deploy + rollout


def test_scale_decode_keeps_the_group_and_prefill(cluster, operator, ns):
    kapply(cluster, _spec(ns, decode=2))
    key = wait_for(lambda: _ready_obj(cluster, ns), timeout=60, what="Ready")["status"]["compatKey"]
    prefill = {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/role=prefill")}
    with Watcher(cluster.api_client(), ns) as watcher:
        kapply(cluster, _spec(ns, decode=4))
        obj = wait_for(lambda: (o := _ready_obj(cluster, ns)) and o["status"]["decode"]["replicas"] == "4/4" and o, timeout=60, what="decode 4/4")
    assert obj["status"]["compatKey"] == key
    assert all(set(s.ready) == {key} for s in watcher.samples), "a second group appeared"
    assert {p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/role=prefill")} == prefill


def test_group_that_cannot_become_ready_keeps_the_old_one_serving_and_revert_recovers(cluster, operator, ns):
    rollout = {"progressDeadline": "8s", "drainGracePeriod": "2s"}
    good = _spec(ns, decode=1, rollout=rollout)
    kapply(cluster, good)
    old = wait_for(lambda: _ready_obj(cluster, ns), timeout=60, what="Ready")["status"]["compatKey"]
    serving_pods = sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/compat-key={old}"))
    bad = _spec(ns, decode=1, rollout=rollout)
    bad["spec"]["runtime"]["image"] = "lmsysorg/sglang:v0.5.23-broken"
    bad["spec"]["decode"]["nodeSelector"] = {"pd.sglang-operator.io/no-such-pool": "true"}  # never schedulable
    with Watcher(cluster.api_client(), ns) as watcher:
        kapply(cluster, bad)
        obj = wait_for(
            lambda: (o := kget(cluster, "pdd", NAME, "-n", ns)) and (o.get("status") or {}).get("rollout", {}).get("phase") == "Failed" and o,
            timeout=60,
            what="rollout Failed",
        )
        prog, deg = condition(obj, "Progressing"), condition(obj, "Degraded")
        assert (prog["status"], prog["reason"]) == ("False", "ProgressDeadlineExceeded")
        assert (deg["status"], deg["reason"]) == ("True", "ProgressDeadlineExceeded")
        assert "cannot be scheduled" in prog["message"] and "node affinity" in prog["message"], prog["message"]
        assert obj["status"]["rollout"]["servingKey"] == old
        assert sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/compat-key={old}")) == serving_pods
        failed_key = obj["status"]["compatKey"]
        assert pods(cluster, ns, f"{LBL}/compat-key={failed_key}"), "the failed group's pods are kept for inspection"
        warnings = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},type=Warning")
        assert any(e["reason"] == "ProgressDeadlineExceeded" for e in warnings["items"])
        # revert: the old key serves on, the failed group goes, no serving pod restarts
        kapply(cluster, good)
        obj = wait_for(
            lambda: (o := _ready_obj(cluster, ns)) and o["status"]["compatKey"] == old and o["status"]["rollout"]["phase"] == "Complete" and o,
            timeout=60,
            what="revert Complete",
        )
        wait_for(lambda: not pods(cluster, ns, f"{LBL}/compat-key={failed_key}"), timeout=60, what="failed group deleted")
    watcher.assert_safe()
    assert sorted(p["metadata"]["uid"] for p in pods(cluster, ns, f"{LBL}/compat-key={old}")) == serving_pods


@pytest.mark.parametrize("kill_at", ["Surging", "Draining", "Complete"])
def test_operator_killed_at_each_phase_boundary_completes_the_rollout(cluster, crds, ns, tmp_path, kill_at):
    rollout = {"drainGracePeriod": "3s"}
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op-a.log").start()
    try:
        kapply(cluster, _spec(ns, decode=1, rollout=rollout))
        old = wait_for(lambda: _ready_obj(cluster, ns), timeout=60, what="Ready")["status"]["compatKey"]
        changed = _spec(ns, decode=1, rollout=rollout)
        changed["spec"]["runtime"]["image"] = f"lmsysorg/sglang:v0.5.23-{kill_at.lower()}"
        with Watcher(cluster.api_client(), ns) as watcher:
            kapply(cluster, changed)

            def reached() -> bool:
                s = watcher.samples[-1] if watcher.samples else None
                if s is None:
                    return False
                if kill_at == "Surging":  # the new group's objects exist; the Service still serves the old one
                    return len(s.gateways) == 2 and s.service_key == old
                if kill_at == "Draining":  # cut over; the old group still exists
                    return len(s.gateways) == 2 and s.service_key not in (None, old)
                st = (kget(cluster, "pdd", NAME, "-n", ns) or {}).get("status") or {}
                return st.get("compatKey") != old and st.get("rollout", {}).get("phase") == "Complete"

            wait_for(reached, timeout=60, interval=0.05, what=f"phase {kill_at}")
            op.kill(signal.SIGKILL)
            time.sleep(1)
            op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "op-b.log").start()
            obj = wait_for(
                lambda: (o := _ready_obj(cluster, ns)) and o["status"]["compatKey"] != old and o["status"]["rollout"]["phase"] == "Complete" and o,
                timeout=90,
                what="rollout Complete after restart",
            )
            new = obj["status"]["compatKey"]
            wait_for(lambda: watcher.samples and set(watcher.samples[-1].ready) == {new}, timeout=30, what="old group gone")
    finally:
        op.stop()
    watcher.assert_safe()
    deps = kget(cluster, "deployments", "-n", ns, "-l", f"{LBL}/deployment={NAME}")["items"]
    assert sorted(d["metadata"]["name"] for d in deps) == sorted(f"{NAME}-{new[:6]}-{c}" for c in ("prefill", "decode", "gateway"))
