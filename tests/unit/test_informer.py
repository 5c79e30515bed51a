"""The reflectors without a cluster: one LIST per kind at start, bookmarks, a re-list after 410 Gone that
reports the deletions the watch never delivered, 429 at start waited out by Retry-After.

The watch stream is scripted (``informer.Watch`` replaced); the LISTs are ``Kube.list_kind``
replaced; waits go to a recording ``sleep`` (no real time passes). The same behaviour on
the real kube-apiserver: ``tests/e2e/test_informer.py``.
"""

from __future__ import annotations

from kubernetes import client as k8s

from sglang_pd_operator.reconcilers.kube import Kube
from sglang_pd_operator.reconcilers.runtime import KernelBuildRuntime, Runtime
from sglang_pd_operator.runtime import informer
from sglang_pd_operator.runtime.cache import WATCHED, ObjectCache, watched_kind
from sglang_pd_operator.runtime.controller import PDDEPLOYMENT, Controller, LoopSettings
from sglang_pd_operator.runtime.informer import Reflector

OWNER = "pd.sglang-operator.io/deployment"
DEPLOYMENTS = watched_kind("apps/v1", "Deployment")


def child(name: str, rv: str, owner: str = "d") -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": f"u-{name}",
                         "labels": {OWNER: owner}}}


class Lists:
    """``Kube.list_kind`` answering scripted LISTs: each call pops (items, resourceVersion) or an exception."""

    def __init__(self, *answers) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, watched, namespace, listed=None):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        items, rv = answer
        if listed is not None:
            listed["resourceVersion"] = rv
        yield from items


class ScriptedWatch:
    """Stands in for ``kubernetes.watch.Watch``: each stream() plays the next script (events, then maybe raises)."""

    scripts: list = []
    asked: list = []

    def stream(self, func, **kwargs):
        ScriptedWatch.asked.append(kwargs.get("resource_version"))
        events, error = ScriptedWatch.scripts.pop(0)
        for e in events:
            yield {**e, "raw_object": e["object"]}
        if error is not None:
            raise error

    def stop(self):
        pass


def controller() -> Controller:
    kube = Kube(api_client=None, cache=ObjectCache())  # type: ignore[arg-type]
    runtime = Runtime(kube=kube)
    kbs = KernelBuildRuntime(kube=kube, catalog=runtime.catalog, in_use=lambda ns: None)
    return Controller(runtime=runtime, kernelbuilds=kbs, kube=kube, settings=LoopSettings())


def gone() -> k8s.ApiException:
    return k8s.ApiException(status=410, reason="Expired: too old resource version: 5 (90)")


def test_a_deletion_missed_while_the_watch_was_gone_is_seen_at_the_relist_and_queues_its_owner(monkeypatch):
    c = controller()
    waits: list[float] = []
    lists = Lists(([child("d-prefill", "5"), child("d-decode", "6")], "10"),  # at start
                  ([child("d-prefill", "5")], "90"))  # after 410: d-decode was deleted meanwhile
    monkeypatch.setattr(c.kube, "list_kind", lists)
    c.sync_kind(DEPLOYMENTS, reason="start")
    reflector = c._reflectors[0]
    assert reflector.resource_version == "10" and lists.calls == 1
    c._started = True  # the loop runs: what a LIST changes is queued
    monkeypatch.setattr(informer, "Watch", ScriptedWatch)
    ScriptedWatch.asked = []
    ScriptedWatch.scripts = [
        ([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "40"}}}], None),  # the server ended it
        ([], gone()),  # resumed from the bookmark: too old
        ([], None),  # the watch after the re-list
    ]
    reflector._sleep = lambda s: waits.append(s) or False

    def stop_after_three(*a, **k):
        if len(ScriptedWatch.scripts) == 1:
            reflector._stopped.set()  # the last script is played, then run() ends
        return original(*a, **k)

    original = reflector.watch_once
    monkeypatch.setattr(reflector, "watch_once", stop_after_three)
    reflector.run()
    assert ScriptedWatch.asked == ["10", "40", "90"]  # from the LIST, the bookmark, the new LIST
    assert lists.calls == 2 and waits == []
    assert c.cache.get("apps/v1", "Deployment", "d-decode", "ns") is None
    assert c.queue.get(timeout=0) == (PDDEPLOYMENT, "ns", "d")


def test_watch_events_reach_the_loop_in_order_and_move_the_resume_version(monkeypatch):
    c = controller()
    monkeypatch.setattr(c.kube, "list_kind", Lists(([], "10")))
    c.sync_kind(DEPLOYMENTS)
    reflector = c._reflectors[0]
    monkeypatch.setattr(informer, "Watch", ScriptedWatch)
    ScriptedWatch.scripts = [([{"type": "ADDED", "object": child("d-decode", "11")},
                               {"type": "DELETED", "object": child("d-decode", "12")}], None)]
    reflector.watch_once()
    assert reflector.resource_version == "12"
    assert c.cache.get("apps/v1", "Deployment", "d-decode", "ns") is None
    assert c.queue.get(timeout=0) == (PDDEPLOYMENT, "ns", "d")


def test_one_list_per_kind_at_start_and_429_is_waited_out_by_retry_after(monkeypatch):
    """The first start right after the CRDs were created: the API server answers 429 while its
    cache of the new kind fills; the LIST is asked again after Retry-After (capped), not after a minute."""
    c = controller()
    busy = k8s.ApiException(status=429, reason="Too Many Requests: storage is (re)initializing")
    busy.headers = {"Retry-After": "1"}
    waits: list[float] = []
    answers = {w.kind: Lists(busy, busy, ([], "7")) if w.kind == "PDRoleScale" else Lists(([], "1"))
               for w in WATCHED}
    monkeypatch.setattr(c.kube, "list_kind", lambda w, ns, listed=None: answers[w.kind](w, ns, listed))
    monkeypatch.setattr(c.runtime, "kinds_served", lambda av: frozenset())
    monkeypatch.setattr(Reflector, "__init__", _recording_sleep(Reflector.__init__, waits))
    for watched in WATCHED:
        c.sync_kind(watched, reason="start", deadline_s=60)
    optional = {w.kind: 0 for w in WATCHED if w.optional}  # not served here: never listed
    assert {k: a.calls for k, a in answers.items() if a.calls != 1} == {"PDRoleScale": 3, **optional}
    assert waits == [1.0, 1.0]
    assert all(c.cache.synced(w.api_version, w.kind) for w in WATCHED if not w.optional)
    assert len(c._reflectors) == len([w for w in WATCHED if not w.optional])


def test_a_retry_after_longer_than_the_cap_is_capped():
    e = k8s.ApiException(status=429)
    e.headers = {"Retry-After": "60"}
    assert informer._retry_after(e) == informer.RETRY_429_MAX_S


def _recording_sleep(init, waits):
    def wrapped(self, *a, **k):
        init(self, *a, **k)
        self._sleep = lambda s: waits.append(s) or False
    return wrapped
