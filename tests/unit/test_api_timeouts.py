"""Every call of the operator's API client gives up on a peer that accepts and never answers.

A real TCP listener on loopback completes the connection (the kernel's backlog: nobody
calls ``accept`` while the client waits) and never sends a byte (what a half-open
connection or a stalled proxy looks like); the client built the way the operator builds
it must raise within its timeouts instead of blocking the thread. Which timeout fired is
read from urllib3's own error (``read timeout=<s>``), not from a wall clock, so a loaded
machine cannot make these tests fail or pass; the connections the client opened are
counted afterwards from the listener's backlog.
"""

from __future__ import annotations

import socket

import pytest
import urllib3
from kubernetes import client as k8s

from sglang_pd_operator.reconcilers.kube import ApiTimeouts, Kube, with_timeouts


class SilentServer:
    """A listener whose connections complete in the kernel and are never answered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []

    def connections(self) -> int:
        """Connections the clients opened so far (every one waiting in the backlog is taken now)."""
        self.sock.setblocking(False)
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except BlockingIOError:
                return len(self.held)

    def close(self) -> None:
        for c in self.held:
            c.close()
        self.sock.close()


@pytest.fixture
def silent_server():
    srv = SilentServer()
    yield srv
    srv.close()


def _timed_out(excinfo) -> str:
    """The read timeout urllib3 says fired (its ReadTimeoutError message), e.g. ``"0.4"``."""
    err = excinfo.value
    reason = getattr(err, "reason", err)  # MaxRetryError wraps the ReadTimeoutError
    assert isinstance(reason, urllib3.exceptions.ReadTimeoutError), repr(err)
    return str(reason).rsplit("read timeout=", 1)[1].rstrip(")")


def _client(port: int, timeouts: ApiTimeouts) -> k8s.ApiClient:
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = timeouts.retries()
    return with_timeouts(k8s.ApiClient(configuration), timeouts)


def test_a_read_against_a_silent_server_times_out_and_the_pool_is_dropped(silent_server):
    timeouts = ApiTimeouts(connect=0.5, read=0.4)
    kube = Kube(_client(silent_server.port, timeouts))
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)) as excinfo:
        k8s.CoreV1Api(kube.api_client).read_namespace("default")
    assert _timed_out(excinfo) == "0.4"  # the operator's default read timeout, not none (a hang)
    assert silent_server.connections() == 1  # no retry after the request was sent
    assert not kube.api_client.rest_client.pool_manager.pools  # idle connections on that path dropped


def test_a_write_times_out_too_and_an_explicit_timeout_wins(silent_server):
    api = k8s.CoreV1Api(_client(silent_server.port, ApiTimeouts(connect=0.5, read=0.4)))
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)) as excinfo:
        api.create_namespace({"metadata": {"name": "x"}})
    assert _timed_out(excinfo) == "0.4"
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)) as excinfo:
        api.read_namespace("default", _request_timeout=(0.5, 1.5))
    assert _timed_out(excinfo) == "1.5"  # the call's own read timeout, not the default 0.4 s
    assert silent_server.connections() == 2  # one per call, none retried


def test_wrapping_twice_keeps_one_layer():
    c = _client(1, ApiTimeouts())
    inner = c.rest_client._untimed_request
    with_timeouts(c, ApiTimeouts(connect=1, read=2))
    assert c.rest_client._untimed_request is inner and c.default_timeouts == ApiTimeouts(connect=1, read=2)
