"""Status that never lies (issue 15 item 5): the pure parts.

Refused generations are not Ready and say what still serves; an API error becomes
conditions naming the call; RolloutComplete only for a rollout that finished. Stale
health is in test_status_health.py, the SLO bounds in test_slo_bounds.py; the end-to-end
side is tests/e2e/test_status_truth.py.
"""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

from sglang_pd_operator.planning.problems import Problem
from sglang_pd_operator.planning.rollout import GroupState, RolloutSettings, RolloutStatus, decide
from sglang_pd_operator.reconcilers import status as S
from sglang_pd_operator.reconcilers.apierrors import brief, describe_api_error, namespace_terminating

KEY = "abc123def456"
#: the status of a valid generation 1 whose group KEY serves (as ``status.valid_status`` writes it)
SERVED = {
    "observedGeneration": 1,
    "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "observedGeneration": 1},
                   {"type": "Reconciled", "status": "True", "reason": "Reconciled", "observedGeneration": 1},
                   {"type": "Ready", "status": "True", "reason": "Ready", "observedGeneration": 1}],
    "rollout": {"generation": 1, "servingKey": KEY, "targetKey": KEY, "phase": "Complete"},
}


def _problem() -> Problem:
    return Problem(field="spec.decode.parallelism.tp", message="tp 2 is not served", fix="set tp: 4", rule="plugin_tp")


def test_a_refused_generation_is_not_ready_and_names_what_still_serves():
    assert S.applied_generation(SERVED) == 1 and SERVED["rollout"]["generation"] == 1
    conds = {c.type: c for c in S.invalid_conditions([_problem()], generation=2, previous=SERVED)}
    assert conds["Valid"].status == "False" and "spec.decode.parallelism.tp" in conds["Valid"].message
    assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "InvalidSpec")
    assert f"group {KEY[:6]} of generation 1 still serves" in conds["Ready"].message
    # never Ready=False with Progressing=False/Complete: Progressing says the rollout stopped
    assert (conds["Progressing"].status, conds["Progressing"].reason) == ("False", "InvalidSpec")
    never = {c.type: c for c in S.invalid_conditions([_problem()], generation=1, previous={})}
    assert "nothing serves yet" in never["Ready"].message


def test_a_status_from_before_the_rollout_generation_still_names_the_served_generation():
    old = {**SERVED, "rollout": {k: v for k, v in SERVED["rollout"].items() if k != "generation"}}
    assert S.served_by(old) == (KEY, 1)


def _api_error(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "message": message}).encode()
    return e


def test_an_admission_denial_is_named_with_the_call_and_the_servers_answer():
    msg = ('deployments.apps "d-abc123-prefill" is forbidden: ValidatingAdmissionPolicy \'p\' with binding \'b\' '
           'denied request: no engines here')
    reason, text = describe_api_error(_api_error(422, "Unprocessable Entity", msg),
                                      call="apply Deployment ns/d-abc123-prefill")
    assert reason == "AdmissionDenied"  # a policy's denial is a 422 unless the validation sets a reason
    assert text == f"apply Deployment ns/d-abc123-prefill: 422 Unprocessable Entity: {msg}"
    webhook = 'admission webhook "v.example.com" denied the request: no'
    assert describe_api_error(_api_error(400, "Bad Request", webhook), call="c")[0] == "AdmissionDenied"
    assert describe_api_error(_api_error(403, "Forbidden", 'pods is forbidden: User "x" cannot list'), call="c")[0] == "Forbidden"
    assert describe_api_error(_api_error(422, "Unprocessable Entity", "spec.x: Invalid value"), call="c")[0] == "Invalid"
    assert describe_api_error(_api_error(503, "Service Unavailable", "etcd"), call="c")[0] == "ServerError"


def test_a_failed_call_logs_in_one_line_and_a_terminating_namespace_is_told_apart():
    """The dynamic client's error prints headers, body and the original traceback on many
    lines; the operator's log gets one: status, class, the server's message."""
    from kubernetes.dynamic.exceptions import api_exception

    msg = ('persistentvolumeclaims "b-cache" is forbidden: unable to create new content in namespace k '
           'because it is being terminated')
    raw = ApiException(status=403, reason="Forbidden")
    raw.body = json.dumps({"kind": "Status", "message": msg, "reason": "Forbidden", "code": 403, "details": {
        "name": "b-cache", "kind": "persistentvolumeclaims",
        "causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]}}).encode()
    try:
        raise raw
    except ApiException as e:
        dynamic = api_exception(e)  # what kubernetes.dynamic raises (ForbiddenError), traceback included
    assert "\n" in str(dynamic) and "Original traceback" in str(dynamic)
    assert brief(dynamic) == f"403 Forbidden: {msg}"
    assert namespace_terminating(dynamic)
    rbac = _api_error(403, "Forbidden", 'pods is forbidden: User "x" cannot list resource "pods"')
    assert not namespace_terminating(rbac) and brief(rbac).startswith("403 Forbidden: pods is forbidden: User")


def test_a_failed_new_generation_is_not_ready_but_a_failure_at_rest_keeps_ready():
    new = {c.type: c for c in S.reconcile_error_conditions(reason="AdmissionDenied", message="apply X: denied",
                                                            generation=2, previous=SERVED)}
    assert new["Reconciled"].status == "False" and new["Reconciled"].reason == "AdmissionDenied"
    assert (new["Ready"].status, new["Ready"].reason) == ("False", "ReconcileError")
    assert f"group {KEY[:6]} of generation 1 still serves" in new["Ready"].message
    assert new["Progressing"].status == "False" and "apply X: denied" in new["Progressing"].message
    at_rest = [c.type for c in S.reconcile_error_conditions(reason="ServerError", message="m", generation=1,
                                                             previous=SERVED)]
    assert at_rest == ["Reconciled"]


def test_rollout_complete_fires_for_a_finished_rollout_not_for_a_recovering_pod():
    settings = RolloutSettings(progress_deadline_s=600, drain_grace_s=0)
    ready, unready = {"k": GroupState("k", ready=True)}, {"k": GroupState("k", ready=False)}
    first = decide(target="k", serving="k", groups=ready, settings=settings, target_gpus=1, now=10,
                   previous=RolloutStatus(target_key="k", phase="Surging", phase_started=0))
    assert [e for e in first.events if e[0] == "RolloutComplete"] == [("RolloutComplete", "group k serves")]
    dip = decide(target="k", serving="k", groups=unready, settings=settings, target_gpus=1, now=20,
                 previous=RolloutStatus(target_key="k", phase="Complete", phase_started=10, completed=True))
    assert dip.phase == "Recovering" and not dip.events  # no rollout: not a surge
    back = decide(target="k", serving="k", groups=ready, settings=settings, target_gpus=1, now=30,
                  previous=RolloutStatus(target_key="k", phase="Recovering", phase_started=20, completed=True))
    assert back.phase == "Complete" and not back.events
    # after a cutover the old group is deleted: that rollout's completion is an event, and says so
    drained = decide(target="k", serving="k", groups={**ready, "old": GroupState("old", ready=True)}, settings=settings,
                     target_gpus=1, now=40, previous=RolloutStatus(target_key="k", phase="Draining", phase_started=30,
                                                                   draining_key="old", drain_started=30))
    assert ("RolloutComplete", "group k serves; old groups deleted") in drained.events
