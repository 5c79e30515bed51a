"""A PDDeployment deleted while it is reconciled is "gone", not a failed reconcile.

Deleting a PDDeployment while the resync loop reconciles it makes a write (its status
subresource) answer 404; the operator used to log that as ``ERROR resync: reconcile
<ns>/<name> failed: 404``. No cluster: the API is a fake that answers like the
DynamicClient (``NotFoundError`` wraps the 404), the reconciler a stub that raises it.
"""

from __future__ import annotations

import logging

import pytest
from kubernetes.client import ApiException
from kubernetes.dynamic.exceptions import NotFoundError

from sglang_pd_operator.reconcilers import runtime as R
from sglang_pd_operator.reconcilers.runtime import Hooks, Runtime


def _body(uid: str = "uid-1") -> dict:
    return {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
            "metadata": {"name": "d", "namespace": "ns", "uid": uid, "generation": 1}, "spec": {}}


class FakeKube:
    """Answers ``get`` of the PDDeployment from a list: one answer per call (None: not found)."""

    api_client = None

    def __init__(self, *answers: dict | None):
        self.answers = list(answers)
        self.gets = 0

    def uncached(self) -> "FakeKube":
        return self  # the re-read after a 404 asks the API server, past the cache

    def get(self, api_version, kind, name, namespace=None):
        assert (kind, name, namespace) == ("PDDeployment", "d", "ns")
        self.gets += 1
        return self.answers.pop(0)


def _runtime(kube: FakeKube, error: Exception, monkeypatch) -> tuple[Runtime, list[bool]]:
    def failing_reconcile(**_):
        raise error

    monkeypatch.setattr(R, "reconcile", failing_reconcile)
    passes: list[bool] = []
    rt = Runtime(kube=kube, hooks=Hooks(on_reconcile=lambda ns, name, seconds, ok: passes.append(ok)))
    rt.monitoring_available = lambda: False  # no discovery call
    rt.lws_available = lambda: False
    rt.compute_domains_available = lambda: False
    return rt, passes


def _not_found() -> NotFoundError:
    return NotFoundError(ApiException(status=404, reason="Not Found"))


@pytest.mark.parametrize("after", [None, _body(uid="uid-2")], ids=["deleted", "deleted-and-recreated"])
def test_a_404_after_the_object_went_away_is_gone_not_an_error(after, monkeypatch, caplog):
    kube = FakeKube(_body(), after)
    rt, passes = _runtime(kube, _not_found(), monkeypatch)
    with caplog.at_level(logging.DEBUG, logger=R.__name__):
        assert rt.reconcile_key("ns", "d") is None
    assert kube.gets == 2  # read, then re-read after the 404
    assert passes == [True]  # not counted as a failed reconcile
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    assert "ns/d was deleted while it was reconciled (404 Not Found)" in caplog.records[0].getMessage()


def test_a_404_while_the_object_still_exists_propagates(monkeypatch):
    kube = FakeKube(_body(), _body())
    rt, passes = _runtime(kube, _not_found(), monkeypatch)
    with pytest.raises(NotFoundError):
        rt.reconcile_key("ns", "d")
    assert passes == [False]


def test_other_api_errors_propagate_without_a_second_read(monkeypatch):
    kube = FakeKube(_body())
    rt, passes = _runtime(kube, ApiException(status=500, reason="Internal Server Error"), monkeypatch)
    with pytest.raises(ApiException):
        rt.reconcile_key("ns", "d")
    assert kube.gets == 1 and passes == [False]


def test_an_object_already_gone_is_not_reconciled(monkeypatch):
    kube = FakeKube(None)
    rt, passes = _runtime(kube, AssertionError("must not reconcile"), monkeypatch)
    assert rt.reconcile_key("ns", "d") is None
    assert passes == []
