"""SGLang's verdict in front of a new generation (reconcilers/sglang_gate.py), through the real reconcile.

The oracle service is a stand-in client here (answers set by the test) and the API a
dict in memory (test_multinode.MemoryKube); tests/e2e/test_sglang_gate.py runs the same
path against the real API server and the real ``oracle serve``.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import ROOT, all_deployments_ready, load_example, load_script, merge_patched

from sglang_pd_operator.oracle.service import API_PATH
from sglang_pd_operator.reconcilers import pddeployment as P
from sglang_pd_operator.reconcilers.sglang_gate import (
    RETRY_S,
    OracleClient,
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


#: The oracle could not judge: a transient limit (issue 23: the bootstrap server slow to listen on a loaded machine).
INDETERMINATE = {"accepted": None, "prefill": {"accelerator": "gb300", "starts": True, "refusal": None},
                 "decode": {"accelerator": "gb300", "starts": True, "refusal": None},
                 "pair": {"pairs": None, "refusal": None,
                          "indeterminate": "bootstrap: the bootstrap server did not listen within 10 s (OracleLimit)"},
                 "assumptions": [], "seconds": 10.4}


class StandInClient:
    """Answers with ``reply`` (a verdict dict, or an OracleUnreachable to raise), or with each of a
    list of them in turn (the last one again once they run out); counts the asks."""

    def __init__(self, reply):
        self.replies = list(reply) if isinstance(reply, list) else [reply]
        self.asked = 0
        self.done = threading.Event()

    def ask(self, obj, overrides):
        reply = self.replies[min(self.asked, len(self.replies) - 1)]
        self.asked += 1
        try:
            if isinstance(reply, Exception):
                raise reply
            return {"sglang": reply}
        finally:
            self.done.set()


class FakeClock:
    """Unix seconds that move only when the test moves them (``now``); the book and the reconcile share it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class InlinePool:
    """The book's thread pool run on the caller's thread: an ask is answered before ``ask`` returns."""

    def submit(self, fn, *args):
        fn(*args)

    def shutdown(self, **_):
        pass


def _setup(reply, *, clock=None, **settings):
    """(client, book, woken names, OracleSettings). With ``clock`` (a FakeClock) the book answers inline
    (no thread, nothing to wait for) and stamps answers with that clock; without, on its thread pool at 1000 s."""
    client = StandInClient(reply)
    woken = []
    if clock is None:
        book = VerdictBook(client=client, on_answer=lambda ns, name: woken.append(name), clock=lambda: 1000.0)
    else:
        book = VerdictBook(client=client, on_answer=lambda ns, name: woken.append(name), clock=clock,
                           _pool=InlinePool())
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


def _valid(kube):
    return _conds(_status(kube))["Valid"]


def test_an_indeterminate_verdict_is_asked_again_after_the_retry_interval_then_decides(catalog):
    """The oracle could not judge (a transient limit): the generation waits, the book forgets that
    answer after its retry interval and asks again, and SGLang's next verdict decides."""
    clock = FakeClock()
    client, book, woken, oracle = _setup([INDETERMINATE, ACCEPTED], clock=clock)
    kube = MemoryKube()
    P.reconcile(kube=kube, body=_body(), catalog=catalog, now=clock(), oracle=oracle)  # asked: indeterminate
    assert client.asked == 1 and woken == [_body()["metadata"]["name"]]
    clock.now += 1.0
    outcome = P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=clock(), oracle=oracle)
    valid = _valid(kube)
    assert (valid["status"], valid["reason"]) == ("Unknown", "AwaitingSGLangVerdict")
    assert "SGLang could not judge: bootstrap: the bootstrap server did not listen within 10 s" in valid["message"]
    assert kube.applied == [] and client.asked == 1  # not asked again within the retry interval
    assert outcome.requeue_after == RETRY_S  # the reconcile comes back once the answer expired
    clock.now = 1000.0 + book.retry_s
    P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=clock(), oracle=oracle)
    assert client.asked == 2  # asked again: SGLang accepts this time
    clock.now += 1.0
    P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=clock(), oracle=oracle)
    assert (_valid(kube)["status"], _valid(kube)["reason"]) == ("True", "SGLangAccepted")
    assert {o["kind"] for o in kube.applied} >= {"Deployment", "Service", "ConfigMap"}


def test_a_lasting_indeterminate_verdict_waits_at_most_max_wait_then_the_policy_and_is_asked_again(catalog):
    """maxWait and onUnavailable apply to "SGLang could not judge" as to an unreachable service,
    and under ``wait`` the message's "SGLang is asked again" is what happens."""
    for policy, proceeds, reason, status in (("wait", False, "SGLangUnavailable", "False"),
                                             ("rulesOnly", True, "RulesOnly", "True")):
        clock = FakeClock()
        client, book, _, oracle = _setup(INDETERMINATE, clock=clock, default_max_wait_s=60.0)
        kube = MemoryKube()

        def reconcile_at(t):
            clock.now = t
            return P.reconcile(kube=kube, body=_body(status=_status(kube) if kube.status else None,
                                                     oracle={"onUnavailable": policy}),
                               catalog=catalog, now=t, oracle=oracle)

        reconcile_at(1000.0)
        reconcile_at(1030.0)  # the first answer expired: asked again
        reconcile_at(1031.0)
        awaiting = _valid(kube)
        assert (awaiting["status"], awaiting["reason"]) == ("Unknown", "AwaitingSGLangVerdict"), policy
        assert "SGLang could not judge" in awaiting["message"] and kube.applied == []
        assert client.asked == 2, policy
        reconcile_at(1058.0)  # the answer of 1030 expired: asked once more
        assert client.asked == 3, policy
        reconcile_at(1061.0)  # maxWait passed since 1000, with SGLang's answer of 1058 in the book
        after = _valid(kube)
        assert (after["status"], after["reason"]) == (status, reason), policy
        assert bool(kube.applied) is proceeds, policy
        assert "no verdict from SGLang in 60 s (SGLang could not judge: bootstrap" in after["message"], policy
        assert reason in [r for r, _ in kube.events]
        if policy == "wait":
            assert "SGLang is asked again" in after["message"]
            reconcile_at(1058.0 + book.retry_s)
            assert client.asked == 4 and kube.applied == []


class WriteLog(MemoryKube):
    """MemoryKube that logs every write as (verb, kind, name), /scale and metadata patches included,
    and every event as (type, reason, message); an apply keeps the object's status."""

    def __init__(self, objects=()):
        super().__init__(objects)
        self.writes: list[tuple[str, str, str]] = []
        self.typed_events: list[tuple[str, str, str]] = []

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        """As the API server applies: the object's status stays what its controller wrote."""
        if dry_run:
            return True
        self.writes.append(("apply", desired["kind"], desired["metadata"]["name"]))
        old = self.objects.get((desired["kind"], desired["metadata"]["name"]))
        done = super().apply(desired, live, fetch=fetch)
        if old is not None and "status" in old:
            self.objects[(desired["kind"], desired["metadata"]["name"])]["status"] = old["status"]
        return done

    def create(self, obj):
        self.writes.append(("create", obj["kind"], obj["metadata"]["name"]))
        return super().create(obj)

    def delete(self, api_version, kind, name, namespace):
        self.writes.append(("delete", kind, name))
        return super().delete(api_version, kind, name, namespace)

    def scale(self, api_version, kind, name, namespace, replicas, *, field_manager=None):
        self.writes.append(("scale", kind, name))
        self.objects[(kind, name)]["spec"]["replicas"] = replicas
        self.total_writes += 1

    def patch_metadata(self, api_version, kind, name, namespace, *, annotations):
        self.writes.append(("patch_metadata", kind, name))
        meta = self.objects[(kind, name)]["metadata"]
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        self.total_writes += 1

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.writes.append(("patch_status", kind, name))
        super().patch_status(api_version, kind, name, namespace, status, resource_version)

    def event(self, involved, *, type_, reason, message):
        self.typed_events.append((type_, reason, message))
        super().event(involved, type_=type_, reason=reason, message=message)


def test_a_refused_new_generation_leaves_the_serving_generation_untouched(catalog):
    """Issue 24: "whatever serves keeps serving untouched". Generation 1 was accepted and serves;
    SGLang refuses generation 2: not one child is written (no apply, create, delete, /scale or
    metadata patch), only the PDDeployment's status, which names the role, stage and SGLang's message."""
    clock = FakeClock()
    client, book, _, oracle = _setup([ACCEPTED, REFUSED], clock=clock)
    kube = WriteLog()
    name = _body()["metadata"]["name"]
    for t in (1000.0, 1001.0):  # asked, then accepted and applied
        P.reconcile(kube=kube, body=_body(status=_status(kube) if kube.status else None), catalog=catalog, now=t,
                    oracle=oracle)
    all_deployments_ready(kube.objects)
    P.reconcile(kube=kube, body=_body(status=_status(kube)), catalog=catalog, now=1010.0, oracle=oracle)
    serving = _status(kube)
    assert serving["rollout"]["phase"] == "Complete" and _conds(serving)["Ready"]["status"] == "True"
    key = serving["rollout"]["servingKey"]
    children = copy.deepcopy(kube.objects)
    writes_before, events_before = len(kube.writes), len(kube.typed_events)

    lora = {**load_example()["spec"]["decode"], "extraArgs": ["--enable-lora"]}
    for t in (1020.0, 1021.0):  # asked, then refused
        P.reconcile(kube=kube, body=_body(generation=2, status=_status(kube), decode=lora), catalog=catalog, now=t,
                    oracle=oracle)
    assert client.asked == 2
    assert kube.objects == children
    assert {w for w in kube.writes[writes_before:]} == {("patch_status", "PDDeployment", name)}
    status = _status(kube)
    valid, ready = _conds(status)["Valid"], _conds(status)["Ready"]
    assert (valid["status"], valid["reason"]) == ("False", "SGLangRefused")
    for text in ("generation 2", "the decode role", "stage resolve", "ValueError: LoRA needs a rank", "lora_hook.py"):
        assert text in valid["message"], text
    assert (ready["status"], ready["reason"]) == ("False", "SGLangRefused")
    assert f"group {key[:6]} of generation 1 still serves, untouched" in ready["message"]
    assert status["rollout"]["servingKey"] == key and status["observedGeneration"] == 2
    assert [(p["rule"], p["field"]) for p in status["problems"] if p["severity"] == "error"] == \
        [("sglang:resolve", "spec.decode")]
    assert [(t, r) for t, r, _ in kube.typed_events[events_before:]] == [("Warning", "SGLangRefused")]


class CapturingOracle(ThreadingHTTPServer):
    """An HTTP server in place of ``oracle serve``: keeps each request's (method, path, headers,
    JSON body) in ``requests`` and answers ``status`` with ``answer``."""

    def __init__(self, status: int, answer: dict):
        self.requests: list[tuple[str, str, dict, dict]] = []
        self.status, self.answer = status, answer
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(("POST", self.path, dict(self.headers), json.loads(body)))
                data = json.dumps(server.answer).encode()
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def test_the_client_sends_the_judgement_input_only(catalog):
    """What leaves the operator for the oracle (docs/sglang-oracle.md "What it can read"): the
    object's apiVersion, kind, name, namespace and spec (a Secret by reference only) and the
    catalog ConfigMap's files; no status, labels, annotations, uid, managedFields or owner, no
    credentials in the headers. The reconcile hands the client the whole object as the API server has it."""
    obj = _body(status={"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]})
    obj["spec"]["model"]["source"] = {"hub": {"tokenSecret": {"name": "hf-token", "key": "token"}}}
    obj["metadata"].update(labels={"team": "a"}, annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                           resourceVersion="42", finalizers=["x/y"], managedFields=[{"manager": "kubectl"}],
                           ownerReferences=[{"kind": "App", "name": "a", "uid": "u0"}])
    server = CapturingOracle(200, {"valid": True, "sglang": ACCEPTED})
    try:
        reply = OracleClient(server.url + "/").ask(obj, {"catalog.yaml": "accelerators: {}"})
    finally:
        server.stop()
    assert reply["sglang"] == ACCEPTED
    [(method, path, headers, sent)] = server.requests
    assert (method, path) == ("POST", API_PATH)
    assert sent == {
        "object": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                   "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]},
                   "spec": obj["spec"]},
        "catalogOverrides": {"catalog.yaml": "accelerators: {}"},
    }
    assert headers["Content-Type"] == "application/json"
    assert {h.lower() for h in headers} <= {"host", "content-type", "content-length", "user-agent", "accept-encoding",
                                            "connection"}
    no_overrides = CapturingOracle(200, {"sglang": ACCEPTED})
    try:
        OracleClient(no_overrides.url).ask(obj, {})
    finally:
        no_overrides.stop()
    assert no_overrides.requests[0][3]["catalogOverrides"] is None


def test_the_client_turns_anything_but_a_200_into_one_line_why(catalog):
    busy = CapturingOracle(503, {"error": "the oracle's queue is full (64 specs waiting); retry later"})
    try:
        with pytest.raises(OracleUnreachable) as refused:
            OracleClient(busy.url).ask(_body(), None)
    finally:
        busy.stop()
    assert str(refused.value) == ("the oracle service answered 503: "
                                  "the oracle's queue is full (64 specs waiting); retry later")
    gone = CapturingOracle(200, {})
    url = gone.url
    gone.stop()  # nothing listens there any more
    with pytest.raises(OracleUnreachable) as unreachable:
        OracleClient(url, timeout_s=5).ask(_body(), None)
    assert str(unreachable.value).startswith(f"the oracle service at {url} is unreachable: ")
    assert "\n" not in str(unreachable.value)


def test_the_dspark_assumption_in_the_valid_message_reads_as_a_whole_sentence():
    """The Valid message ends with the oracle's assumptions; the DSpark one used to end
    "... exactly when KV layout and dtype are", which reads as cut off."""
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.catalog import builtin_catalog
    from sglang_pd_operator.oracle.judge import _assumptions
    from sglang_pd_operator.planning.plan import build_plan

    catalog = builtin_catalog()
    plan = build_plan(parse_pddeployment(load_example()), catalog)  # DSpark on DeepSeek-V4.1 (ratio-2 caches)
    (note,) = [a for a in _assumptions(plan, catalog) if a.startswith("DSpark transfer layout")]
    assert note.endswith("are equal"), note
    from sglang_pd_operator.reconcilers.sglang_gate import _verdict_summary

    summary = _verdict_summary({"prefill": {"accelerator": "gb300"}, "decode": {"accelerator": "gb300"}, "assumptions": [note]})
    assert summary.endswith("KV layouts and KV dtypes are equal"), summary


def _refusal_of(part: str, message: str) -> dict:
    verdict = copy.deepcopy(REFUSED)
    verdict["decode"]["refusal"] = None
    verdict[part]["refusal"] = {"stage": "resolve", "type": "ValueError", "message": message, "where": None}
    return verdict


def test_a_refusal_points_at_the_extra_arg_or_env_entry_sglangs_message_names():
    """A fresh user's finding: SGLangRefused named ``spec.decode`` where SGLang's message named
    the flag the user added. The field now names the item (option or SGLang's dest spelling, an
    env variable's name), and stays the role when nothing or two items are named."""
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.catalog import builtin_catalog
    from sglang_pd_operator.planning.plan import build_plan
    from sglang_pd_operator.reconcilers.sglang_gate import refusal_problems

    doc = load_example()
    decode = doc["spec"]["decode"]
    decode["extraArgs"] = [*decode.get("extraArgs", []), "--chunked-prefill-size", "2048", "--max-running-requests=7"]
    decode["env"] = [*decode.get("env", []), {"name": "SGLANG_DISAGGREGATION_QUEUE_SIZE", "value": "3"}]
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    n = len(decode["extraArgs"])

    def field_of(message: str, part: str = "decode") -> str:
        (problem,) = refusal_problems(_refusal_of(part, message), plan)
        return problem.field

    assert field_of("chunked_prefill_size 2048 must be a multiple of page_size") == f"spec.decode.extraArgs[{n - 3}]"
    assert field_of("--max-running-requests must be positive") == f"spec.decode.extraArgs[{n - 1}]"
    env_index = len(decode["env"]) - 1
    assert field_of("SGLANG_DISAGGREGATION_QUEUE_SIZE exceeds the pool") == f"spec.decode.env[{env_index}]"
    # two items named, or none, or a word that only contains a dest: the role
    assert field_of("chunked_prefill_size and max_running_requests disagree") == "spec.decode"
    assert field_of("LoRA needs a rank") == "spec.decode"
    assert field_of("my_chunked_prefill_size_x") == "spec.decode"
    # the prefill carries none of these items; without a plan the role as before
    assert field_of("chunked_prefill_size 2048", part="prefill") == "spec.prefill"
    (problem,) = refusal_problems(_refusal_of("decode", "chunked_prefill_size 2048"))
    assert problem.field == "spec.decode"
    assert "change or remove" not in problem.fix


def test_a_weights_fill_the_gpu_refusal_points_at_tp_not_at_a_fraction_the_user_never_set():
    """A fresh user's finding: SGLang's memory refusal ("Raise --mem-fraction-static above 1.000")
    came as field ``spec.prefill`` with the fix "change what SGLang names"; the fix is more tp."""
    from sglang_pd_operator.api.load import parse_pddeployment
    from sglang_pd_operator.catalog import builtin_catalog
    from sglang_pd_operator.planning.plan import build_plan
    from sglang_pd_operator.reconcilers.sglang_gate import refusal_problems

    plan = build_plan(parse_pddeployment(load_example()), builtin_catalog())
    message = ("Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.901. Raise "
               "--mem-fraction-static above 1.000 (minimum viable = 1 - available/pre = 1.0000).")
    (problem,) = refusal_problems(_refusal_of("prefill", message), plan)
    assert problem.field == "spec.prefill.parallelism.tp" and "raise spec.prefill.parallelism.tp" in problem.fix
    # the user's own --mem-fraction-static, named in the message, is pointed at instead
    doc = load_example()
    doc["spec"]["decode"]["extraArgs"] = [*doc["spec"]["decode"].get("extraArgs", []), "--mem-fraction-static", "0.05"]
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    (problem,) = refusal_problems(_refusal_of("decode", message.replace("0.901", "0.05")), plan)
    assert problem.field == f"spec.decode.extraArgs[{len(doc['spec']['decode']['extraArgs']) - 2}]"
