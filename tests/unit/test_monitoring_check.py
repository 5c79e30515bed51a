"""The Prometheus Operator check (``Runtime.monitoring_available``) asks discovery once per period,
however many workers find it due at once (bench_scale counted 9-12 discovery GETs a minute at
rest from 4 workers with a 15 s period)."""

from __future__ import annotations

import threading
import time

from kubernetes.client import ApiException

from sglang_pd_operator.reconcilers import process_state as R
from sglang_pd_operator.reconcilers.runtime import Runtime


class _Discovery:
    calls = 0

    def __init__(self, api_client) -> None:
        pass

    def get_api_resources(self, group, version):
        type(self).calls += 1
        time.sleep(0.2)  # a slow answer: the other workers arrive meanwhile
        raise ApiException(status=404, reason="Not Found")


def test_concurrent_workers_share_one_discovery_request(monkeypatch):
    monkeypatch.setattr(R.k8s, "CustomObjectsApi", _Discovery)
    rt = Runtime(kube=type("K", (), {"api_client": None})())  # type: ignore[arg-type]
    answers: list[bool] = []
    threads = [threading.Thread(target=lambda: answers.append(rt.monitoring_available())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _Discovery.calls == 1 and answers == [False] * 8
    rt.served.ttl_s = 0.0  # due again: asked again
    rt.monitoring_available()
    assert _Discovery.calls == 2
