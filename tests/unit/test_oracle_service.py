"""The oracle service's HTTP layer: cache, coalescing, bounded queue, time and size limits, readiness.

The judge here is a stand-in (a counter that returns a fixed verdict) so the service's own
behaviour is tested without SGLang; tests/contract/test_oracle_service.py runs the same
service on the real oracle and holds its answer to ``check --sglang -o json``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from helpers import load_example

from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.oracle.judge import PairVerdict, RoleVerdict, Verdict
from sglang_pd_operator.oracle.pool import OracleError
from sglang_pd_operator.oracle.service import API_PATH, OracleHTTPServer, VerdictService, judged_key
from sglang_pd_operator.planning.plan import plan_object


#: Why the stand-in's indeterminate verdict is one: a transient limit of the oracle (issue 23's OracleLimit).
BOOTSTRAP_LIMIT = "bootstrap: the bootstrap server did not listen within 10 s (OracleLimit)"


class StandInOracle:
    """Counts judgements; ``gate`` holds each one until set; ``fail`` raises OracleError;
    ``indeterminate``: the pair's verdict is indeterminate (``BOOTSTRAP_LIMIT``), not an accept."""

    def __init__(self, catalog, *, gate: threading.Event | None = None, fail: bool = False,
                 indeterminate: bool = False) -> None:
        self.catalog = catalog
        self.judged: list[str] = []
        self.gate = gate
        self.fail = fail
        self.indeterminate = indeterminate
        self.pool = SimpleNamespace(worker=lambda acc: self.warmed.append(acc))
        self.warmed: list[str] = []
        self.closed = False

    def judge_plan(self, plan):
        self.judged.append(plan.name)
        if self.gate is not None:
            self.gate.wait(60)
        if self.fail:
            raise OracleError("worker for gb300 exited (code -9)")
        ok = RoleVerdict("prefill", "gb300", True), RoleVerdict("decode", "gb300", True)
        pair = PairVerdict(None, indeterminate=BOOTSTRAP_LIMIT) if self.indeterminate else PairVerdict(True)
        return Verdict(plan.name, plan.namespace, ok[0], ok[1], pair)

    def close(self) -> None:
        self.closed = True


class FakeClock:
    """Monotonic seconds that move only when a test moves them (``now``)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def served():
    """(start(service options) -> (service, oracle, port)); everything stops at the end.

    ``read_timeout_s``: the server's deadline per request (2 s unless given)."""
    made = []

    def start(*, gate=None, fail=False, indeterminate=False, read_timeout_s=2.0, **options):
        holder = {}

        def factory(catalog):
            holder["oracle"] = StandInOracle(catalog, gate=gate, fail=fail, indeterminate=indeterminate)
            return holder["oracle"]

        service = VerdictService(oracle_factory=factory, **options)
        server = OracleHTTPServer(("127.0.0.1", 0), service, max_body_bytes=256 * 1024, read_timeout_s=read_timeout_s,
                                  max_connections=16)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        service.start()
        made.append((server, service))
        service.ready.wait(5)
        return service, holder["oracle"], server.server_address[1]

    yield start
    for server, service in made:
        server.shutdown()
        server.server_close()
        service.close()


def post(port: int, body: bytes | dict, *, headers: dict | None = None, timeout: float = 60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", API_PATH, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read() or b"{}"), dict(resp.getheaders())
    conn.close()
    return out


def get(port: int, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def named(name: str, **spec_changes) -> dict:
    doc = load_example()
    doc["metadata"]["name"] = name
    for k, v in spec_changes.items():
        doc["spec"][k] = v
    return {"object": doc}


def test_a_verdict_in_the_shape_of_check_sglang_and_cached_by_what_was_judged(served):
    service, oracle, port = served()
    status, first, _ = post(port, named("alpha"))
    assert status == 200, first
    assert first["valid"] is True and first["sglang"]["accepted"] is True
    assert set(first["sglang"]) >= {"accepted", "prefill", "decode", "pair", "assumptions", "seconds"}
    assert first["oracle"]["cached"] is False
    # another tenant's deployment with the same spec: the same judged inputs, answered from the cache
    status, second, _ = post(port, named("beta"))
    assert status == 200 and second["oracle"]["cached"] is True
    assert second["oracle"]["key"] == first["oracle"]["key"]
    assert oracle.judged == ["alpha"]
    # what SGLang would run changes: judged again
    status, third, _ = post(port, named("gamma", decode={**load_example()["spec"]["decode"], "extraArgs": ["--chunked-prefill-size", "4096"]}))
    assert status == 200 and third["oracle"]["cached"] is False and third["oracle"]["key"] != first["oracle"]["key"]
    assert oracle.judged == ["alpha", "gamma"]


def test_the_key_covers_launches_and_accelerator_but_not_the_name(catalog):
    def key(doc):
        plan, _ = plan_object(doc, catalog)
        return judged_key(plan, catalog)

    base = load_example()
    renamed = load_example()
    renamed["metadata"]["name"] = "other"
    renamed["metadata"]["namespace"] = "tenant-b"
    flagged = load_example()
    flagged["spec"]["prefill"].setdefault("extraArgs", []).extend(["--chunked-prefill-size", "4096"])
    assert key(base) == key(renamed)
    assert key(base) != key(flagged)
    assert key(base) != judged_key(plan_object(base, catalog)[0], catalog, sglang_version="0.5.24")


def test_requests_for_the_same_inputs_at_once_are_judged_once(served):
    gate = threading.Event()
    service, oracle, port = served(gate=gate)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(post(port, named(f"d{i}")))) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while service.snapshot()["coalesced"] < 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    gate.set()
    for t in threads:
        t.join()
    assert [r[0] for r in results] == [200] * 8
    assert len(oracle.judged) == 1
    assert service.snapshot()["coalesced"] == 7


def test_a_full_queue_answers_503_with_retry_after(served):
    gate = threading.Event()
    service, oracle, port = served(gate=gate, judges=1, queue_size=1)
    specs = [named(f"q{i}", accelerator=acc) for i, acc in enumerate(["gb300", "b300", "b200"])]
    threads = []

    def until(predicate):
        deadline = time.monotonic() + 30
        while not predicate() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert predicate(), service.snapshot()

    for spec, reached in ((specs[0], lambda: len(oracle.judged) == 1),  # the judge holds the first,
                          (specs[1], lambda: service.snapshot()["queued"] == 1)):  # the second waits
        threads.append(threading.Thread(target=post, args=(port, spec)))
        threads[-1].start()
        until(reached)
    status, body, headers = post(port, specs[2])
    gate.set()
    for t in threads:
        t.join()
    assert status == 503, body
    assert "queue is full" in body["error"] and headers.get("Retry-After") == "5"


def test_no_verdict_in_time_is_504_and_the_expired_job_is_never_judged(served):
    gate = threading.Event()
    service, oracle, port = served(gate=gate, judges=1, request_timeout_s=0.5)
    slow = threading.Thread(target=post, args=(port, named("slow")))
    slow.start()
    deadline = time.monotonic() + 30
    while not oracle.judged and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body, _ = post(port, named("late", accelerator="b300"))
    assert status == 504 and "no verdict within" in body["error"]
    gate.set()
    slow.join()
    deadline = time.monotonic() + 30
    while service.snapshot()["expiredInQueue"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert oracle.judged == ["slow"]


def test_an_indeterminate_verdict_is_cached_only_briefly_then_judged_again(served):
    """The oracle could not judge (a transient limit, e.g. a bootstrap server slow under load):
    served from the cache for ``indeterminate_ttl_s`` only, so an operator that asks again gets a
    fresh judgement after it; SGLang's accept stays cached."""
    clock = FakeClock()
    service, oracle, port = served(indeterminate=True, clock=clock, indeterminate_ttl_s=30.0)
    status, first, _ = post(port, named("alpha"))
    assert status == 200, first
    assert first["sglang"]["accepted"] is None and first["sglang"]["pair"]["indeterminate"] == BOOTSTRAP_LIMIT
    assert first["oracle"]["cached"] is False
    clock.now += 29.0
    assert post(port, named("alpha"))[1]["oracle"]["cached"] is True  # within the 30 s: not judged again
    assert oracle.judged == ["alpha"]
    clock.now += 1.0
    status, again, _ = post(port, named("alpha"))
    assert status == 200 and again["oracle"]["cached"] is False
    assert oracle.judged == ["alpha", "alpha"]
    assert service.snapshot()["indeterminate"] == 2
    # SGLang's accept (and refusal) is kept however long it waits
    oracle.indeterminate = False
    clock.now += 30.0
    assert post(port, named("alpha"))[1]["sglang"]["accepted"] is True
    clock.now += 3600.0
    assert post(port, named("alpha"))[1]["oracle"]["cached"] is True
    assert len(oracle.judged) == 3


def test_an_indeterminate_verdict_is_never_cached_with_a_zero_ttl(served):
    service, oracle, port = served(indeterminate=True, clock=FakeClock(), indeterminate_ttl_s=0)
    answers = [post(port, named("alpha"))[1] for _ in range(2)]
    assert [a["oracle"]["cached"] for a in answers] == [False, False]
    assert oracle.judged == ["alpha", "alpha"] and service.snapshot()["cached"] == 0


def test_an_oracle_failure_is_503_and_not_cached(served):
    service, oracle, port = served(fail=True)
    for _ in range(2):
        status, body, _ = post(port, named("x"))
        assert status == 503 and "the oracle failed, no verdict" in body["error"]
    assert len(oracle.judged) == 2


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b"x" * (300 * 1024), {}, 413, "more than the limit"),
        (b"{not json", {}, 400, "not JSON"),
        (b"[" * 200_000, {}, 400, "not JSON"),
        (b'{"spec": {}}', {}, 400, '"object"'),
        (json.dumps({"object": {"kind": "PDDeployment", "spec": {"model": 3}}}).encode(), {}, 422, "does not parse"),
        (json.dumps({"object": {}, "catalogOverrides": {"a": 1}}).encode(), {}, 400, "catalogOverrides"),
    ],
)
def test_bad_requests_are_answered_with_what_is_wrong(served, body, headers, status, says):
    service, oracle, port = served()
    got, answer, _ = post(port, body, headers=headers)
    assert got == status, answer
    assert says in answer["error"]
    assert oracle.judged == []
    assert get(port, "/healthz")[0] == 200  # still serving


def test_a_request_without_length_and_a_stalled_body_do_not_hold_the_service(served):
    service, oracle, port = served()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST {API_PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert b" 411 " in s.recv(4096)
    with socket.create_connection(("127.0.0.1", port)) as s:  # promises 1000 bytes, sends 10
        s.sendall(f"POST {API_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{".encode() + b" " * 9)
        t0 = time.monotonic()
        assert b" 408 " in _until_closed(s, within=10)  # answered and closed at the request's deadline (2 s here)
        assert time.monotonic() - t0 < 8
    assert post(port, named("after"))[0] == 200


def _until_closed(sock: socket.socket, *, within: float) -> bytes:
    """Everything the server sends on ``sock`` until it closes the connection; raises
    ``TimeoutError`` when it is still open ``within`` seconds from now."""
    deadline = time.monotonic() + within
    got = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


@pytest.mark.parametrize("trickled", ["headers", "body"])
def test_a_client_trickling_its_request_is_cut_off_at_the_request_deadline(served, trickled):
    """A byte every 0.2 s never trips a per-read timeout of 1 s, but the request as a whole has
    1 s for its line, headers and body: the server answers 408 (body) or closes (headers) by
    then, not when the client stops (the trickle would last 40 s)."""
    service, oracle, port = served(read_timeout_s=1.0)
    body = json.dumps(named("slow")).encode()
    head = (f"POST {API_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    at_once, slowly = (b"", head.encode() + body) if trickled == "headers" else (head.encode(), body)
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(at_once)

        def trickle():
            for i in range(min(len(slowly), 200)):  # at most 40 s
                if stop.wait(0.2):
                    return
                try:
                    s.sendall(slowly[i:i + 1])
                except OSError:  # the server closed the connection
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        t0 = time.monotonic()
        try:
            answer = _until_closed(s, within=6)
        finally:
            stop.set()
            sender.join()
        cut_after = time.monotonic() - t0
    assert cut_after < 4, cut_after
    if trickled == "body":
        assert b" 408 " in answer and b"did not arrive within 1 s" in answer
    else:
        assert answer == b""
    assert oracle.judged == []
    assert post(port, named("after"))[0] == 200  # the service still serves


def test_a_huge_spec_within_the_size_limit_is_judged_or_refused_quickly(served):
    service, oracle, port = served()
    doc = load_example()
    doc["spec"]["decode"]["extraArgs"] = ["--chunked-prefill-size", "4096"] * 5000
    t0 = time.monotonic()
    status, body, _ = post(port, {"object": doc})
    assert time.monotonic() - t0 < 30
    # the schema bounds extraArgs (api/structural.py): refused with the field named, never judged
    assert status == 422, body
    assert body["problems"][0]["field"] == "spec.decode.extraArgs" and oracle.judged == []


@pytest.mark.parametrize("warm_fails", [False, True])
def test_readyz_answers_503_with_why_over_http_until_the_warm_worker_started(warm_fails):
    """GET /readyz: 503 naming the warming accelerators while a worker imports SGLang, then
    200; a worker that fails to start keeps it 503 with the worker's error (never ready)."""
    release = threading.Event()

    def worker(acc):
        release.wait(30)
        if warm_fails:
            raise OracleError(f"worker for {acc} exited (code 1)\nTraceback ...")

    def factory(catalog):
        oracle = StandInOracle(catalog)
        oracle.pool = SimpleNamespace(worker=worker)
        return oracle

    service = VerdictService(oracle_factory=factory, warm=("gb300",))
    server = OracleHTTPServer(("127.0.0.1", 0), service, max_body_bytes=1024, read_timeout_s=2.0, max_connections=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    service.start()
    try:
        port = server.server_address[1]
        assert get(port, "/readyz") == (503, {"ready": False, "why": "warming the workers of gb300"})
        assert get(port, "/healthz") == (200, {"ok": True})  # alive while it warms
        release.set()
        if warm_fails:
            deadline = time.monotonic() + 5
            while not service.warm_error and time.monotonic() < deadline:
                time.sleep(0.01)
            assert get(port, "/readyz") == (503, {"ready": False, "why": "worker for gb300 exited (code 1)"})
        else:
            assert service.ready.wait(5)
            assert get(port, "/readyz") == (200, {"ready": True})
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        service.close()


def test_ready_once_the_warm_workers_started(served):
    service, oracle, port = served(warm=("gb300", "h200"))
    assert get(port, "/readyz") == (200, {"ready": True})
    assert oracle.warmed == ["gb300", "h200"]
    unready = VerdictService(oracle_factory=lambda c: StandInOracle(c), warm=("gb300",))
    assert not unready.ready.is_set()  # not started: /readyz answers 503 with why
