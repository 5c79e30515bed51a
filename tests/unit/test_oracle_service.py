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


class StandInOracle:
    """Counts judgements; ``gate`` holds each one until set; ``fail`` raises OracleError."""

    def __init__(self, catalog, *, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.catalog = catalog
        self.judged: list[str] = []
        self.gate = gate
        self.fail = fail
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
        return Verdict(plan.name, plan.namespace, ok[0], ok[1], PairVerdict(True))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def served():
    """(start(service options) -> (service, oracle, port)); everything stops at the end."""
    made = []

    def start(*, gate=None, fail=False, **options):
        holder = {}

        def factory(catalog):
            holder["oracle"] = StandInOracle(catalog, gate=gate, fail=fail)
            return holder["oracle"]

        service = VerdictService(oracle_factory=factory, **options)
        server = OracleHTTPServer(("127.0.0.1", 0), service, max_body_bytes=256 * 1024, read_timeout_s=2.0,
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
        s.settimeout(10)
        assert s.recv(4096) == b""  # closed by the read timeout (2 s here)
        assert time.monotonic() - t0 < 8
    assert post(port, named("after"))[0] == 200


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


def test_ready_once_the_warm_workers_started(served):
    service, oracle, port = served(warm=("gb300", "h200"))
    assert get(port, "/readyz") == (200, {"ready": True})
    assert oracle.warmed == ["gb300", "h200"]
    unready = VerdictService(oracle_factory=lambda c: StandInOracle(c), warm=("gb300",))
    assert not unready.ready.is_set()  # not started: /readyz answers 503 with why
