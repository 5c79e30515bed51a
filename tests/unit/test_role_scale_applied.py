"""A PDRoleScale says whether its count reaches the role's workload (``Applied``).

A fresh user's finding (issue 25): while an edit of the PDDeployment was refused, ``kubectl
scale pdrs`` (or an HPA) changed the count and nothing happened, with nothing saying why.
Now the PDRoleScales of a generation that is not applied carry ``Applied=False`` with the
PDDeployment's reason, and ``Applied=True`` once a generation is reconciled again.
"""

from __future__ import annotations

import copy

from helpers import EXAMPLES, load_example

from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers.scaling import APPLIED, mark_role_scales_held

EXAMPLE = EXAMPLES / "dsv41-flash-h200-flashmla.yaml"


class Kube:
    """PDRoleScales and the PDDeployment's status in memory (what a refused reconcile reads and writes)."""

    def __init__(self, *scales: str) -> None:
        self.scales = {n: {"metadata": {"name": n, "generation": 4}, "spec": {"replicas": 3}, "status": {}}
                       for n in scales}
        self.writes: list[tuple[str, str]] = []
        self.events: list[str] = []
        self.total_writes = 0

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.scales.get(name)) if kind == "PDRoleScale" else None

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.writes.append((kind, name))
        self.total_writes += 1
        if kind == "PDRoleScale":
            self.scales[name]["status"].update(copy.deepcopy(status))

    def event(self, involved, *, type_, reason, message):
        self.events.append(reason)


def _applied(kube: Kube, name: str) -> dict:
    return next(c for c in kube.scales[name]["status"]["conditions"] if c["type"] == APPLIED)


def test_a_refused_generation_marks_its_role_scales_not_applied(catalog):
    doc = load_example(EXAMPLE)
    doc["metadata"].update(uid="u1", generation=7, namespace="ns")
    doc["spec"]["decode"]["parallelism"]["tp"] = 3  # no GPU count of H200 nodes takes it
    name = doc["metadata"]["name"]
    kube = Kube(f"{name}-decode")  # prefill's count is in the spec: no PDRoleScale of it
    outcome = P.reconcile(kube=kube, body=doc, catalog=catalog, now=1000.0)
    assert not outcome.valid
    c = _applied(kube, f"{name}-decode")
    assert (c["status"], c["reason"]) == ("False", "InvalidSpec"), c
    assert "generation 7 is not applied" in c["message"] and "spec.decode.parallelism" in c["message"], c
    assert c["observedGeneration"] == 4  # the PDRoleScale's own generation
    # the next reconcile of the same refused generation writes nothing more to it
    before = list(kube.writes)
    P.reconcile(kube=kube, body=doc, catalog=catalog, now=1010.0)
    assert [w for w in kube.writes if w[0] == "PDRoleScale"] == [w for w in before if w[0] == "PDRoleScale"]


def test_held_role_scales_keep_their_transition_time_and_skip_what_is_missing():
    kube = Kube("d-prefill", "d-decode")
    mark_role_scales_held(kube, name="d", namespace="ns", generation=2, reason="SGLangRefused", message="m", now=100.0)
    first = _applied(kube, "d-decode")
    assert first["reason"] == "SGLangRefused" and first["lastTransitionTime"]
    mark_role_scales_held(kube, name="d", namespace="ns", generation=3, reason="InvalidSpec", message="n", now=200.0)
    again = _applied(kube, "d-decode")
    assert again["reason"] == "InvalidSpec" and again["lastTransitionTime"] == first["lastTransitionTime"]
    mark_role_scales_held(Kube(), name="d", namespace="ns", generation=2, reason="X", message="m", now=1.0)  # none: no error
