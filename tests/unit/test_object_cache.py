"""The operator's object cache: newest version wins, tombstones, re-list sweeps, trimmed pods, indexed lists."""

from __future__ import annotations

from sglang_pd_operator.runtime.cache import ObjectCache, matches, newer, parse_selector, trim

OWNER = "pd.sglang-operator.io/deployment"


def dep(name: str, rv: str, *, ns: str = "ns", owner: str = "d", **extra) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "uid": f"u-{name}",
                         "labels": {OWNER: owner, "app.kubernetes.io/managed-by": "sglang-pd-operator"},
                         "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 1}, **extra}


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_older_or_equal_version_never_replaces_a_newer_one():
    cache = ObjectCache()
    assert cache.upsert(dep("a", "10")).stored
    assert not cache.upsert(dep("a", "9")).stored  # a late watch event
    assert not cache.upsert(dep("a", "10")).stored  # the echo of our own write
    assert cache.upsert(dep("a", "11", status={"readyReplicas": 1})).stored
    assert cache.get("apps/v1", "Deployment", "a", "ns")["status"] == {"readyReplicas": 1}


def test_a_deleted_object_is_not_brought_back_by_a_late_answer_until_its_tombstone_expires():
    clock = Clock()
    cache = ObjectCache(clock=clock)
    cache.upsert(dep("a", "10"))
    assert cache.remove(dep("a", "12")).stored
    assert not cache.upsert(dep("a", "11")).stored  # an answer to a write made before the deletion
    assert cache.get("apps/v1", "Deployment", "a", "ns") is None
    assert cache.upsert(dep("a", "13")).stored  # recreated afterwards
    cache.remove(dep("a", "14"))
    clock.t += 301
    assert cache.upsert(dep("a", "5")).stored  # tombstone expired (a new object with a reset name)


def test_a_relist_removes_what_a_watch_never_reported_deleted_but_keeps_newer_objects():
    cache = ObjectCache()
    cache.upsert(dep("gone", "5"))
    cache.upsert(dep("kept", "6"))
    cache.upsert(dep("created-after-the-list", "50"))
    cache.upsert(dep("other-ns", "7", ns="elsewhere"))
    changes = cache.replace_kind("apps/v1", "Deployment", [dep("kept", "6"), dep("new", "20")], namespaces=["ns"])
    names = sorted(o["metadata"]["name"] for o in cache.list("apps/v1", "Deployment", None))
    assert names == ["created-after-the-list", "kept", "new", "other-ns"]
    assert sorted(ref for ref, _ in changes) == [("ns", "gone"), ("ns", "new")]
    assert [c.new is None for ref, c in sorted(changes)] == [True, False]
    assert cache.synced("apps/v1", "Deployment") and not cache.synced("v1", "Pod")


def test_lists_by_owner_label_use_the_index_and_still_apply_every_requirement():
    cache = ObjectCache()
    for i in range(50):
        cache.upsert(dep(f"x{i}", str(i + 1), owner=f"d{i % 5}"))
    got = cache.list("apps/v1", "Deployment", "ns", f"{OWNER}=d3,app.kubernetes.io/managed-by=sglang-pd-operator")
    assert sorted(o["metadata"]["name"] for o in got) == sorted(f"x{i}" for i in range(50) if i % 5 == 3)
    assert cache.list("apps/v1", "Deployment", "ns", f"{OWNER}=d3,missing") == []
    # an owner label that changes moves the object between index entries
    moved = dep("x3", "100", owner="d4")
    cache.upsert(moved)
    assert "x3" not in {o["metadata"]["name"] for o in cache.list("apps/v1", "Deployment", "ns", f"{OWNER}=d3")}
    assert "x3" in {o["metadata"]["name"] for o in cache.list("apps/v1", "Deployment", "ns", f"{OWNER}=d4")}


def test_reads_are_copies_and_stored_objects_are_trimmed():
    cache = ObjectCache()
    obj = dep("a", "1")
    obj["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"}
    cache.upsert(obj)
    got = cache.get("apps/v1", "Deployment", "a", "ns")
    assert "managedFields" not in got["metadata"] and got["metadata"]["annotations"] == {"keep": "me"}
    got["spec"]["replicas"] = 99
    assert cache.get("apps/v1", "Deployment", "a", "ns")["spec"]["replicas"] == 1


def test_a_pod_keeps_only_what_the_operator_reads():
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ns", "labels": {OWNER: "d"}, "managedFields": [1]},
           "spec": {"nodeName": "n1", "volumes": [{"name": "big"}] * 20,
                    "containers": [{"name": "engine", "image": "x", "command": ["python"] * 50,
                                    "env": [{"name": "A", "value": "1"}] * 30,
                                    "ports": [{"name": "metrics", "containerPort": 9003}]}]},
           "status": {"phase": "Running", "podIP": "127.0.0.5", "qosClass": "Burstable",
                      "conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": "engine", "ready": True, "image": "x", "imageID": "y",
                                             "state": {"terminated": {"message": "result"}}}]}}
    t = trim(pod)
    assert t["spec"] == {"nodeName": "n1", "containers": [{"name": "engine",
                                                           "ports": [{"name": "metrics", "containerPort": 9003}]}]}
    assert t["status"]["podIP"] == "127.0.0.5" and t["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert t["status"]["containerStatuses"] == [{"name": "engine", "ready": True,
                                                 "state": {"terminated": {"message": "result"}}}]
    assert "managedFields" not in t["metadata"] and "qosClass" not in t["status"]


def test_selectors_and_resource_versions():
    req = parse_selector("a=1,b!=2,c,!d,e==5")
    assert matches({"a": "1", "c": "", "e": "5"}, req)
    assert not matches({"a": "1", "b": "2", "c": "", "e": "5"}, req)
    assert not matches({"a": "1", "c": "", "d": "x", "e": "5"}, req)
    assert newer("10", "9") and not newer("9", "10") and newer(None, "3") and newer("x", "y")


def test_a_relist_stores_each_item_as_it_comes_without_holding_the_list():
    """replace_kind consumes a LIST read page by page (Kube.list_kind yields items): every item
    is in the view before the next one is asked for, so only one item is held at a time."""
    cache = ObjectCache()
    cache.upsert(dep("gone", "1"))
    asked: list[str] = []

    def items():
        for i in range(5):
            if asked:  # the previous item is stored already
                assert cache.get("apps/v1", "Deployment", asked[-1], "ns") is not None
            asked.append(f"d{i}")
            yield dep(f"d{i}", str(10 + i))

    changes = cache.replace_kind("apps/v1", "Deployment", items())
    assert sorted(o["metadata"]["name"] for o in cache.list("apps/v1", "Deployment", "ns")) == asked
    assert ("ns", "gone") in [ref for ref, _ in changes]
