"""A compat group is created all or nothing (issue 26): a child the API server refuses leaves no other child behind.

The reconciler dry-runs a new group's engines but the first it writes before writing any child
(``pddeployment._apply_group``; an existing group's every changed child);
a refusal that comes only at the real write (a policy changed after the dry run) takes back
the children the pass created. Status names the child and the API server's message. The
real API server's side (a ValidatingAdmissionPolicy refusing the decode Deployment) is
tests/e2e/test_group_all_or_nothing.py.
"""

from __future__ import annotations

import copy
import json

import pytest
from helpers import EXAMPLES, load_example
from kubernetes.client.exceptions import ApiException

from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers.drift import needs_apply, with_applied_hash

EXAMPLE = EXAMPLES / "dsv41-flash-gb300-throughput-dep.yaml"
DENIED = "ValidatingAdmissionPolicy 'no-decode' with binding 'no-decode' denied request: decode is not allowed here"


def _refusal() -> ApiException:
    e = ApiException(status=422, reason="Unprocessable Entity")
    e.body = json.dumps({"kind": "Status", "message": f"deployments.apps is forbidden: {DENIED}"}).encode()
    return e


class RefusingKube:
    """Objects in memory; refuses a Deployment whose name ends with ``refuse`` (at the dry run, or only at the write)."""

    def __init__(self, *, refuse: str, at: str):
        self.refuse, self.at = refuse, at
        self.objects: dict[tuple[str, str], dict] = {}
        self.dry_runs: list[str] = []
        self.deleted: list[str] = []
        self.status: list[dict] = []
        self.events: list[tuple[str, str]] = []
        self.total_writes = 0

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.objects.get((kind, name)))

    def list(self, api_version, kind, namespace, label_selector):
        want = dict(p.split("=", 1) for p in label_selector.split(",") if "=" in p)
        return [copy.deepcopy(o) for (k, _), o in self.objects.items()
                if k == kind and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in want.items())]

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        if not needs_apply(with_applied_hash(desired), self.objects.get((desired["kind"], desired["metadata"]["name"]))):
            return False
        refused = desired["kind"] == "Deployment" and desired["metadata"]["name"].endswith(self.refuse)
        if dry_run:
            self.dry_runs.append(desired["metadata"]["name"])
            if refused and self.at == "dry-run":
                raise _refusal()
            return True
        if refused:
            raise _refusal()
        self.objects[(desired["kind"], desired["metadata"]["name"])] = with_applied_hash(desired)
        self.total_writes += 1
        return True

    def create(self, obj):
        self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return True

    def delete(self, api_version, kind, name, namespace):
        self.deleted.append(f"{kind} {name}")
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.status.append(status)

    def event(self, involved, *, type_, reason, message):
        self.events.append((reason, message))

    def has_kind(self, api_version, kind):
        return False


def _body() -> dict:
    doc = load_example(EXAMPLE)
    doc["metadata"].update(uid="u1", generation=1)
    return doc


def _reconciled(kube: RefusingKube) -> dict:
    return next(c for c in kube.status[-1]["conditions"] if c["type"] == "Reconciled")


def test_a_child_refused_at_its_dry_run_leaves_the_new_group_uncreated(catalog):
    kube = RefusingKube(refuse="-decode", at="dry-run")
    with pytest.raises(ApiException):
        P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    group = [k for k in kube.objects if k[0] in ("Deployment", "Service", "ConfigMap")]
    assert group == [], f"children written before the refused one was known: {group}"
    assert kube.total_writes == 0, "the decode engine's dry run comes before any write"
    cond = _reconciled(kube)
    assert cond["status"] == "False" and cond["reason"] == "AdmissionDenied"
    assert "dry-run apply Deployment" in cond["message"] and "-decode" in cond["message"]
    assert DENIED in cond["message"]
    assert [r for r, _ in kube.events] == ["ReconcileError"]


def test_a_child_refused_after_its_dry_run_passed_takes_back_what_the_pass_created(catalog):
    kube = RefusingKube(refuse="-decode", at="write")
    with pytest.raises(ApiException):
        P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    group = [k for k in kube.objects if k[0] in ("Deployment", "Service", "ConfigMap")]
    assert group == [], f"left behind: {group}"
    assert kube.deleted, "the children written before the refusal were deleted again"
    cond = _reconciled(kube)
    assert cond["status"] == "False" and "apply Deployment" in cond["message"] and "-decode" in cond["message"]
    assert "deleted again" in cond["message"] and DENIED in cond["message"]


def test_an_accepted_group_is_dry_run_then_written_once(catalog):
    kube = RefusingKube(refuse="-nothing", at="dry-run")
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    written = sorted(n for (k, n) in kube.objects if k == "Deployment")
    assert written and kube.dry_runs == [n for n in written if n.endswith("-decode")]
    dry_before = len(kube.dry_runs)
    body = _body()
    body["status"] = kube.status[-1]
    P.reconcile(kube=kube, body=body, catalog=catalog, now=1001.0)
    assert len(kube.dry_runs) == dry_before, "an unchanged child is not dry-run again"


def test_a_refused_child_still_records_this_generations_verdict(catalog):
    """A fresh user's finding: while every apply of generation 3 failed, Valid (and the VALID
    column) still spoke for generation 2, and a new object kept Valid=Unknown/AwaitingSGLangVerdict
    long after SGLang had answered. The failure record now carries the verdict the reconcile
    reached before the failing call: Valid speaks for the current generation."""
    body = _body()
    body["metadata"]["generation"] = 3
    body["status"] = {"observedGeneration": 2, "conditions": [
        {"type": "Valid", "status": "Unknown", "reason": "AwaitingSGLangVerdict", "message": "generation 2: waiting",
         "observedGeneration": 2, "lastTransitionTime": "2026-12-06T00:00:00Z"}]}
    kube = RefusingKube(refuse="-decode", at="dry-run")
    with pytest.raises(ApiException):
        P.reconcile(kube=kube, body=body, catalog=catalog, now=1000.0)
    conds = {c["type"]: c for c in kube.status[-1]["conditions"]}
    assert (conds["Valid"]["status"], conds["Valid"]["reason"]) == ("True", "Valid")
    assert conds["Valid"].get("observedGeneration") == 3 and kube.status[-1]["observedGeneration"] == 3
    assert conds["Reconciled"]["status"] == "False"


class _ServiceRefusingKube(RefusingKube):
    """Refuses every Service at its write; records the order of the writes."""

    def __init__(self):
        super().__init__(refuse="-nothing", at="write")
        self.writes: list[str] = []

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        if not dry_run and desired["kind"] == "Service" and needs_apply(
                with_applied_hash(desired), self.objects.get((desired["kind"], desired["metadata"]["name"]))):
            raise _refusal()
        done = super().apply(desired, live, fetch=fetch, dry_run=dry_run)
        if done and not dry_run:
            self.writes.append(desired["kind"])
        return done


def test_a_new_group_dry_runs_only_its_second_engine_and_writes_its_engines_last(catalog):
    """Convergence at scale (issue 29 item 6): the dry run of every child doubled a new group's requests.
    A new group's other children (the gateway's Deployment among them: no GPU) are written first; one
    refused then is taken back before any engine exists. Of its engines, only those after the first
    written are dry-run: the first one's write is the API server's verdict on it."""
    kube = RefusingKube(refuse="-nothing", at="dry-run")
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    assert [n.rsplit("-", 1)[1] for n in kube.dry_runs] == ["decode"], kube.dry_runs
    refusing = _ServiceRefusingKube()
    with pytest.raises(ApiException):
        P.reconcile(kube=refusing, body=_body(), catalog=catalog, now=1000.0)
    assert "Deployment" not in refusing.writes, f"a workload was written before the refused Service: {refusing.writes}"
    group = [k for k in refusing.objects if k[0] in ("Deployment", "Service", "ConfigMap")]
    assert group == [], f"left behind: {group}"
    cond = _reconciled(refusing)
    assert cond["status"] == "False" and "apply Service" in cond["message"] and "deleted again" in cond["message"]


def test_the_first_engine_refused_at_its_write_leaves_no_engine_and_takes_back_the_rest(catalog):
    """The first engine is not dry-run: refused at its write, no engine exists and the children
    written before it (Services, ConfigMaps, the gateway) are deleted again."""
    kube = RefusingKube(refuse="-prefill", at="write")
    with pytest.raises(ApiException):
        P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    assert [n for n in kube.dry_runs if n.endswith("-prefill")] == []
    group = [k for k in kube.objects if k[0] in ("Deployment", "Service", "ConfigMap")]
    assert group == [], f"left behind: {group}"
    assert any(d.endswith("-gateway") for d in kube.deleted), kube.deleted
    cond = _reconciled(kube)
    assert "apply Deployment" in cond["message"] and "-prefill" in cond["message"] and "deleted again" in cond["message"]
