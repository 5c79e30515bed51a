"""The rendered prefill readiness probe, run for real against listeners on a loopback address.

The exec probe's script is the operator's own text (render/probes.py); here it runs with
this interpreter against a bootstrap-like and an engine-like HTTP server, the way the
kubelet runs it inside the pod (127.0.0.1 replaced by an unused loopback address, so the
engine port 30000 is free).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_pd_operator.render.probes import PROBE_HOST, PROBE_TIMEOUT_S, prefill_readiness_probe

pytestmark = pytest.mark.timeout(60)
HOST = "127.0.0.77"


class _Health(BaseHTTPRequestHandler):
    status = 200
    delay = 0.0

    def do_GET(self):  # noqa: N802 - http.server's name
        time.sleep(self.delay)
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b"OK")

    def log_message(self, *args):
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a probe that gave up closed the socket: expected
        pass


def _serve(port: int, **attrs) -> ThreadingHTTPServer:
    handler = type("H", (_Health,), attrs)
    server = _Server((HOST, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _run(bootstrap_port: int) -> subprocess.CompletedProcess:
    argv = [HOST if a == PROBE_HOST else a for a in prefill_readiness_probe(bootstrap_port)["exec"]["command"]]
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)


@pytest.fixture
def engine():
    try:
        server = _serve(30000)
    except OSError as e:
        pytest.skip(f"{HOST}:30000 is taken: {e}")
    yield server
    server.shutdown()
    server.server_close()


def test_ready_only_when_bootstrap_and_engine_answer(engine):
    port = _free_port()
    closed = _run(port)
    assert closed.returncode != 0 and f"{HOST}:{port}/health" in closed.stderr and "refused" in closed.stderr
    boot = _serve(port)
    try:
        assert _run(port).returncode == 0
    finally:
        boot.shutdown()
        boot.server_close()


def test_an_unhealthy_engine_or_a_slow_bootstrap_fails_within_the_timeout(engine):
    port = _free_port()
    boot = _serve(port)
    engine.RequestHandlerClass.status = 503
    try:
        res = _run(port)
        assert res.returncode != 0 and f"{HOST}:30000/health: HTTP/1.0 503" in res.stderr
    finally:
        boot.shutdown()
        boot.server_close()
    engine.RequestHandlerClass.status = 200
    slow_port = _free_port()
    slow = _serve(slow_port, delay=3.0)  # past the bootstrap server's 1 s share of the budget
    try:
        t = time.monotonic()
        res = _run(slow_port)
        assert res.returncode != 0 and "timed out" in res.stderr, res.stderr
        assert time.monotonic() - t < PROBE_TIMEOUT_S
    finally:
        slow.shutdown()
        slow.server_close()
