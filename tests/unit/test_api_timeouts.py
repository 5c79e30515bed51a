"""Every call of the operator's API client gives up on a peer that accepts and never answers.

A real TCP listener on loopback accepts the connection and never sends a byte (what a
half-open connection or a stalled proxy looks like); the client built the way the
operator builds it must raise within its timeouts instead of blocking the thread.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import urllib3
from kubernetes import client as k8s

from sglang_pd_operator.reconcilers.kube import ApiTimeouts, Kube, with_timeouts


@pytest.fixture
def silent_server():
    """A listener that accepts connections and never answers; yields (port, accepted sockets)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], held
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _client(port: int, timeouts: ApiTimeouts) -> k8s.ApiClient:
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = timeouts.retries()
    return with_timeouts(k8s.ApiClient(configuration), timeouts)


def test_a_read_against_a_silent_server_times_out_and_the_pool_is_dropped(silent_server):
    port, accepted = silent_server
    timeouts = ApiTimeouts(connect=0.5, read=0.4)
    kube = Kube(_client(port, timeouts))
    start = time.monotonic()
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)):
        k8s.CoreV1Api(kube.api_client).read_namespace("default")
    took = time.monotonic() - start
    assert 0.4 <= took < 5, took  # bounded (the exact figure depends on the machine's load)
    assert len(accepted) == 1  # no retry after the request was sent
    assert not kube.api_client.rest_client.pool_manager.pools  # idle connections on that path dropped


def test_a_write_times_out_too_and_an_explicit_timeout_wins(silent_server):
    port, accepted = silent_server
    api = k8s.CoreV1Api(_client(port, ApiTimeouts(connect=0.5, read=0.4)))
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)):
        api.create_namespace({"metadata": {"name": "x"}})
    start = time.monotonic()
    with pytest.raises((urllib3.exceptions.MaxRetryError, urllib3.exceptions.TimeoutError)):
        api.read_namespace("default", _request_timeout=(0.5, 1.5))
    assert time.monotonic() - start >= 1.4  # the call's own read timeout, not the default 0.4 s


def test_wrapping_twice_keeps_one_layer():
    c = _client(1, ApiTimeouts())
    inner = c.rest_client._untimed_request
    with_timeouts(c, ApiTimeouts(connect=1, read=2))
    assert c.rest_client._untimed_request is inner and c.default_timeouts == ApiTimeouts(connect=1, read=2)
