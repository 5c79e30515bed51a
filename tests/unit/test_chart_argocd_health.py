"""The Argo CD health check in docs/gitops.md, run by gopher-lua (the Lua interpreter Argo CD embeds).

The check is read from the ``argocd-cm`` block of docs/gitops.md, so the documented
script is the tested one. ``hack/argocd-health`` is a small Go program that evaluates it
like Argo CD (object as the global ``obj``, the returned table as status and message);
it is built with ``go build`` from its pinned module (gopher-lua v1.1.2).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from helpers import ROOT, load_example

DOC = ROOT / "docs" / "gitops.md"
KEY = "resource.customizations.health.pd.sglang-operator.io_PDDeployment"


def health_script() -> str:
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S):
        if KEY in block:
            return yaml.safe_load(block)["data"][KEY]
    raise AssertionError(f"docs/gitops.md has no argocd-cm block with {KEY}")


@pytest.fixture(scope="module")
def evaluate(tmp_path_factory):
    go = shutil.which("go")
    if not go:
        pytest.skip("no Go toolchain to build hack/argocd-health")
    out = tmp_path_factory.mktemp("argocd-health")
    binary = out / "argocd-health"
    subprocess.run([go, "build", "-trimpath", "-o", str(binary), "."], cwd=ROOT / "hack" / "argocd-health",
                   check=True, capture_output=True)
    script = out / "health.lua"
    script.write_text(health_script())

    def run(objs: list[dict]) -> list[dict]:
        proc = subprocess.run([str(binary), str(script)], input=json.dumps(objs), capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    return run


def cond(type_: str, status: str, reason: str, message: str = "", generation: int = 3) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message, "observedGeneration": generation,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def pdd(*, generation: int = 3, observed: int | None = 3, conditions: list[dict] | None = None) -> dict:
    obj = load_example()
    obj["metadata"]["generation"] = generation
    if observed is not None or conditions is not None:
        obj["status"] = {"conditions": conditions or []}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


CASES = {
    "new, no status yet": (pdd(observed=None), "Progressing", "generation 3"),
    "ready": (pdd(conditions=[cond("Valid", "True", "Valid"), cond("Ready", "True", "Ready", "group 3f9a1c serves"),
                              cond("Progressing", "False", "Complete"), cond("Degraded", "False", "AsExpected")]),
              "Healthy", "group 3f9a1c serves"),
    "pods starting": (pdd(conditions=[cond("Valid", "True", "Valid"), cond("Ready", "False", "NotReady", "decode 0/2"),
                                      cond("Progressing", "True", "Surging", "creating the first group")]),
                      "Progressing", "creating the first group"),
    "edited, not yet observed": (pdd(generation=4, observed=3, conditions=[
        cond("Valid", "True", "Valid"), cond("Ready", "True", "Ready")]), "Progressing", "generation 4"),
    "refused edit, old generation serves": (pdd(generation=4, observed=4, conditions=[
        cond("Valid", "False", "InvalidSpec", "spec.decode.parallelism.tp: not served by the plugin", generation=4),
        cond("Ready", "False", "InvalidSpec", "group 3f9a1c of generation 3 still serves", generation=4)]),
        "Degraded", "spec.decode.parallelism.tp"),
    "refused edit, status of an operator before issue 15": (pdd(generation=4, observed=3, conditions=[
        cond("Valid", "False", "InvalidSpec", "spec.decode.parallelism.tp: not served by the plugin", generation=4),
        cond("Ready", "True", "Ready", generation=3)]), "Degraded", "spec.decode.parallelism.tp"),
    "an admission policy denies a child": (pdd(generation=4, observed=4, conditions=[
        cond("Valid", "True", "Valid", generation=4),
        cond("Reconciled", "False", "AdmissionDenied", "apply Deployment ns/d-3f9a1c-prefill: 422 ...: denied",
             generation=4),
        cond("Ready", "False", "ReconcileError", "generation 4 could not be applied", generation=4)]),
        "Degraded", "reconcile failed (AdmissionDenied): apply Deployment ns/d-3f9a1c-prefill"),
    "an old reconcile error, fixed since": (pdd(generation=5, observed=5, conditions=[
        cond("Reconciled", "False", "AdmissionDenied", "denied", generation=4),
        cond("Ready", "True", "Ready", "serving", generation=5)]), "Healthy", "serving"),
    "refused first generation": (pdd(generation=1, observed=None, conditions=[
        cond("Valid", "False", "InvalidSpec", "attention TP 1 vs 4", generation=1),
        cond("Ready", "False", "InvalidSpec", generation=1)]), "Degraded", "attention TP 1 vs 4"),
    "stale refusal, fixed since": (pdd(generation=5, observed=5, conditions=[
        cond("Valid", "False", "InvalidSpec", "old problem", generation=4),
        cond("Ready", "True", "Ready", "serving", generation=5)]), "Healthy", "serving"),
    "rollout missed its deadline": (pdd(conditions=[
        cond("Valid", "True", "Valid"), cond("Ready", "False", "RolloutFailed", "new group not ready"),
        cond("Progressing", "False", "ProgressDeadlineExceeded", "new group not ready"),
        cond("Degraded", "True", "ProgressDeadlineExceeded", "new group not ready in 15m")]),
        "Degraded", "ProgressDeadlineExceeded: new group not ready in 15m"),
    "no prefill ready": (pdd(conditions=[
        cond("Valid", "True", "Valid"), cond("Ready", "True", "Ready"),
        cond("Degraded", "True", "NoPrefill", "decode is ready, no prefill is")]), "Degraded", "NoPrefill"),
}


def test_health_check_maps_each_state(evaluate):
    names = list(CASES)
    results = evaluate([CASES[n][0] for n in names])
    for name, got in zip(names, results):
        _, status, needle = CASES[name]
        assert got["status"] == status, (name, got)
        assert needle in got["message"], (name, got)


def test_health_check_on_the_operators_own_status(evaluate, catalog):
    """The status the real status code writes for a serving deployment reads as Healthy."""
    from sglang_pd_operator.reconcilers import status as S

    conditions = S.merge_conditions([], [S.Cond("Valid", "True", "Valid"), S.Cond("Ready", "True", "Ready", "serving"),
                                         S.Cond("Progressing", "False", "Complete"),
                                         S.Cond("Degraded", "False", "AsExpected")], generation=3, now=0.0)
    obj = pdd(conditions=conditions)
    (got,) = evaluate([obj])
    assert got == {"status": "Healthy", "message": "serving"}
