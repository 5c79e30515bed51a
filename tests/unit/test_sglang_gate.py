"""SGLang's verdict in front of a new generation (reconcilers/sglang_gate.py), through the real reconcile.

The oracle service is a stand-in client here (answers set by the test) and the API a
dict in memory (test_multinode.MemoryKube); tests/e2e/test_sglang_gate.py runs the same
path against the real API server and the real ``oracle serve``.
"""

from __future__ import annotations

import threading

from helpers import ROOT, load_example, load_script, merge_patched

from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers.sglang_gate import (
    OracleSettings,
    OracleUnreachable,
    VerdictBook,
)

MemoryKube = load_script(ROOT / "tests" / "unit" / "test_multinode.py", "multinode_cases").MemoryKube

ACCEPTED = {"accepted": True, "prefill": {"accelerator": "gb300", "starts": True, "refusal": None},
            "decode": {"accelerator": "gb300", "starts": True, "refusal": None},
            "pair": {"pairs": True, "refusal": None}, "assumptions": [], "seconds": 0.2}
REFUSED = {"accepted": False, "prefill": {"accelerator": "gb300", "starts": True, "refusal": None},
           "decode": {"accelerator": "gb300", "starts": False,
                      "refusal": {"stage": "resolve", "type": "ValueError", "message": "LoRA needs a rank",
                                  "where": "sglang/srt/arg_groups/lora_hook.py:check_lora_server_args:152"}},
           "pair": {"pairs": None, "refusal": None, "indeterminate": "a role does not start"},
           "assumptions": [], "seconds": 0.1}


class StandInClient:
    """Answers with ``reply`` (a verdict dict, or an OracleUnreachable to raise); counts the asks."""

    def __init__(self, reply):
        self.reply = reply
        self.asked = 0
        self.done = threading.Event()

    def ask(self, obj, overrides):
        self.asked += 1
        try:
            if isinstance(self.reply, Exception):
                raise self.reply
            return {"sglang": self.reply}
        finally:
            self.done.set()


def _setup(reply, **settings):
    client = StandInClient(reply)
    woken = []
    book = VerdictBook(client=client, on_answer=lambda ns, name: woken.append(name), clock=lambda: 1000.0)
    return client, book, woken, OracleSettings(book=book, **settings)


def _body(generation=1, status=None, **spec):
    doc = load_example()
    doc["metadata"].update(uid="u1", generation=generation)
    doc["spec"].update(spec)
    if status is not None:
        doc["status"] = status
    return doc


def _answered(client, book):
    assert client.done.wait(5)
    for _ in range(100):
        if not book._waiting:
            return
        threading.Event().wait(0.01)


def _status(kube):
    """The status the API server holds after every patch the reconciler sent."""
    out = {}
    for patch in kube.status:
        out = merge_patched(out, patch)
    return out


def _conds(status):
    return {c["type"]: c for c in status["conditions"]}


def test_nothing_is_created_until_sglang_accepts_then_the_generation_rolls_out(catalog):
    client, book, woken, oracle = _setup(ACCEPTED)
    kube = MemoryKube()
    outcome = P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, oracle=oracle)
    assert kube.applied == [] and outcome.requeue_after is not None
    held = _status(kube)
    assert (_conds(held)["Valid"]["status"], _conds(held)["Valid"]["reason"]) == ("Unknown", "AwaitingSGLangVerdict")
    assert _conds(held)["Ready"]["status"] == "False" and held["sglang"]["verdict"] == "Awaiting"
    _answered(client, book)
    assert woken == [_body()["metadata"]["name"]]  # the answer queues the deployment again
    P.reconcile(kube=kube, body=_body(status=held), catalog=catalog, now=1001.0, oracle=oracle)
    assert {o["kind"] for o in kube.applied} >= {"Deployment", "Service", "ConfigMap"}
    valid = _conds(_status(kube))["Valid"]
    assert (valid["status"], valid["reason"]) == ("True", "SGLangAccepted") and "gb300 starts" in valid["message"]
    assert _status(kube)["sglang"]["verdict"] == "Accepted"
    assert ("SGLangAccepted" in [r for r, _ in kube.events]) and client.asked == 1


def test_a_later_generation_with_the_same_judged_inputs_is_not_asked_again(catalog):
    client, book, _, oracle = _setup(ACCEPTED)
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, oracle=oracle)
    _answered(client, book)
    P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=1001.0, oracle=oracle)
    status = _status(kube)
    fresh = VerdictBook(client=StandInClient(REFUSED))  # an operator restart: the book is empty
    scaled = _body(generation=2, status=status, gateway={"replicas": 2})
    before = len(kube.applied)
    P.reconcile(kube=kube, body=scaled, catalog=catalog, now=1002.0, oracle=OracleSettings(book=fresh))
    assert fresh.asked == 0 and len(kube.applied) > before


def test_a_refusal_names_role_stage_and_sglangs_message_and_touches_nothing(catalog):
    client, book, _, oracle = _setup(REFUSED)
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0, oracle=oracle)
    _answered(client, book)
    outcome = P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=1001.0, oracle=oracle)
    assert kube.applied == [] and not outcome.valid
    status = _status(kube)
    valid = _conds(status)["Valid"]
    assert (valid["status"], valid["reason"]) == ("False", "SGLangRefused")
    for text in ("decode role", "stage resolve", "LoRA needs a rank", "lora_hook.py"):
        assert text in valid["message"]
    assert [p["rule"] for p in status["problems"] if p["severity"] == "error"] == ["sglang:resolve"]
    assert status["problems"][0]["field"] == "spec.decode"
    assert [(r) for r, _ in kube.events] == ["SGLangRefused"]


def test_unreachable_waits_at_most_max_wait_then_the_policy_never_a_silent_accept(catalog):
    for policy, proceeds, reason, valid in (("wait", False, "SGLangUnavailable", "False"),
                                            ("rulesOnly", True, "RulesOnly", "True")):
        client, book, _, oracle = _setup(OracleUnreachable("connection refused"), default_max_wait_s=60.0)
        kube = MemoryKube()
        P.reconcile(kube=kube, body=_body(oracle={"onUnavailable": policy}), catalog=catalog, now=1000.0, oracle=oracle)
        _answered(client, book)
        status = _status(kube)
        P.reconcile(kube=kube, body=_body(status=status, oracle={"onUnavailable": policy}), catalog=catalog,
                    now=1030.0, oracle=oracle)
        awaiting = _conds(_status(kube))["Valid"]
        assert (awaiting["status"], awaiting["reason"]) == ("Unknown", "AwaitingSGLangVerdict")
        assert "connection refused" in awaiting["message"] and kube.applied == []
        status = _status(kube)
        P.reconcile(kube=kube, body=_body(status=status, oracle={"onUnavailable": policy}), catalog=catalog,
                    now=1061.0, oracle=oracle)
        after = _conds(_status(kube))["Valid"]
        assert (after["status"], after["reason"]) == (valid, reason), policy
        assert bool(kube.applied) is proceeds, policy
        assert "no verdict from SGLang in 60 s" in after["message"] and f"onUnavailable={policy}" in after["message"]
        assert reason in [r for r, _ in kube.events]


def test_the_spec_max_wait_overrides_the_operators_default(catalog):
    client, book, _, oracle = _setup(OracleUnreachable("503"), default_max_wait_s=600.0)
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(oracle={"maxWait": "5s"}), catalog=catalog, now=1000.0, oracle=oracle)
    _answered(client, book)
    P.reconcile(kube=kube, body=_body(status=_status(kube), oracle={"maxWait": "5s"}), catalog=catalog,
                now=1006.0, oracle=oracle)
    assert _conds(_status(kube))["Valid"]["reason"] == "SGLangUnavailable"


def test_without_the_service_the_rules_alone_decide_as_before(catalog):
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)
    valid = _conds(_status(kube))["Valid"]
    assert (valid["status"], valid["reason"]) == ("True", "Valid") and _status(kube).get("sglang") is None


def test_a_generation_applied_before_the_service_existed_is_not_held(catalog):
    """Turning the oracle on (or an operator restart/upgrade) never holds what serves: the gate is for new generations."""
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=1000.0)  # no oracle: applied on the rules
    applied = _status(kube)
    client, book, _, oracle = _setup(REFUSED)
    P.reconcile(kube=kube, body=_body(status=applied), catalog=catalog, now=1001.0, oracle=oracle)
    assert client.asked == 0
    assert _conds(_status(kube))["Valid"]["status"] == "True"
    assert _conds(_status(kube))["Ready"] == _conds(applied)["Ready"]
    # its next generation is asked
    P.reconcile(kube=kube, body=_body(generation=2, status=_status(kube), gateway={"replicas": 2}), catalog=catalog,
                now=1002.0, oracle=oracle)
    assert client.done.wait(5) and client.asked == 1
