"""The operator's object cache: watch order wins with opaque resourceVersions, the operator's writes read back
at once, tombstones, a re-list that reports deletions (client-go's Replace), trimmed pods, indexed lists."""

from __future__ import annotations

from sglang_pd_operator.runtime.cache import PENDING_S, ObjectCache, matches, parse_selector, trim

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


def test_resource_versions_are_opaque_the_watch_order_wins():
    """No ordering of resourceVersions: a watch event replaces what is stored whatever its
    version says (here a "smaller" one, as an API server not backed by etcd may issue)."""
    cache = ObjectCache()
    assert cache.upsert(dep("a", "10")).stored
    assert not cache.upsert(dep("a", "10")).stored  # the same version again: nothing changed
    assert cache.upsert(dep("a", "9", status={"readyReplicas": 1})).stored
    assert cache.get("apps/v1", "Deployment", "a", "ns")["status"] == {"readyReplicas": 1}
    assert cache.upsert(dep("a", "zz-not-a-number")).stored


def test_the_operators_write_is_read_back_at_once_and_older_watch_events_do_not_undo_it():
    clock = Clock()
    cache = ObjectCache(clock=clock)
    cache.upsert(dep("a", "10"))
    written = dep("a", "12", spec={"replicas": 3})
    assert cache.record_write(written, before="10").stored
    # the watch still delivers an event from before the write: skipped, the write stays visible
    assert not cache.upsert(dep("a", "11", spec={"replicas": 1})).stored
    assert cache.get("apps/v1", "Deployment", "a", "ns")["spec"] == {"replicas": 3}
    assert not cache.upsert(dep("a", "12", spec={"replicas": 3})).stored  # the write's own echo
    assert cache.upsert(dep("a", "13", spec={"replicas": 4})).stored  # and what came after it
    # a write that changed nothing (the answer carries the version read before it) stores nothing
    assert not cache.record_write(dep("a", "13", spec={"replicas": 4}), before="13").stored
    # an echo that never comes: after PENDING_S the watch wins again
    cache.record_write(dep("a", "20", spec={"replicas": 5}), before="13")
    clock.t += PENDING_S + 1
    assert cache.upsert(dep("a", "21", spec={"replicas": 6})).stored


def test_a_late_answer_never_brings_back_an_older_version_or_a_deleted_object():
    clock = Clock()
    cache = ObjectCache(clock=clock)
    cache.upsert(dep("a", "10"))
    cache.upsert(dep("a", "11", spec={"replicas": 2}))
    # the answer to a write the watch already delivered (its version, or the one before the stored one)
    assert not cache.record_write(dep("a", "11", spec={"replicas": 2})).stored
    assert not cache.record_write(dep("a", "10")).stored
    assert cache.get("apps/v1", "Deployment", "a", "ns")["spec"] == {"replicas": 2}
    assert cache.remove(dep("a", "12")).stored
    assert not cache.record_write(dep("a", "13")).stored  # same uid: that object is gone
    assert not cache.upsert(dep("a", "11")).stored  # a late event about it too
    assert cache.get("apps/v1", "Deployment", "a", "ns") is None
    again = dep("a", "14")
    again["metadata"]["uid"] = "u-a-2"
    assert cache.upsert(again).stored  # a new object of that name


def test_the_operator_recreating_an_object_keeps_it_through_the_old_objects_delete_event():
    cache = ObjectCache()
    cache.upsert(dep("a", "10"))
    cache.forget("apps/v1", "Deployment", "a", "ns")  # the operator deleted it
    assert cache.get("apps/v1", "Deployment", "a", "ns") is None
    assert not cache.upsert(dep("a", "11")).stored  # a late MODIFIED of the deleted uid
    new = dep("a", "15")
    new["metadata"]["uid"] = "u-a-2"
    assert cache.record_write(new).stored  # created again
    assert not cache.remove(dep("a", "12")).stored  # the old uid's DELETED: not the new object
    assert cache.get("apps/v1", "Deployment", "a", "ns")["metadata"]["uid"] == "u-a-2"


def test_a_relist_reports_deletions_a_watch_never_delivered_and_keeps_writes_made_after_it():
    cache = ObjectCache()
    cache.upsert(dep("gone", "5"))
    cache.upsert(dep("kept", "6"))
    cache.upsert(dep("other-ns", "7", ns="elsewhere"))
    cache.record_write(dep("written-before-the-list", "8"))
    since = cache.write_seq()
    cache.record_write(dep("created-after-the-list", "50"))
    changes = cache.replace_kind("apps/v1", "Deployment", [dep("kept", "6"), dep("new", "20")],
                                 namespaces=["ns"], listed_after=since)
    names = sorted(o["metadata"]["name"] for o in cache.list("apps/v1", "Deployment", None))
    assert names == ["created-after-the-list", "kept", "new", "other-ns"]
    assert sorted(ref for ref, _ in changes) == [("ns", "gone"), ("ns", "new"), ("ns", "written-before-the-list")]
    assert [c.new is None for ref, c in sorted(changes)] == [True, False, True]
    assert cache.synced("apps/v1", "Deployment") and not cache.synced("v1", "Pod")


def test_a_relist_item_wins_over_a_write_made_before_the_list():
    cache = ObjectCache()
    cache.record_write(dep("a", "8", spec={"replicas": 2}))
    since = cache.write_seq()
    cache.replace_kind("apps/v1", "Deployment", [dep("a", "9", spec={"replicas": 7})], listed_after=since)
    assert cache.get("apps/v1", "Deployment", "a", "ns")["spec"] == {"replicas": 7}
    assert cache.upsert(dep("a", "10", spec={"replicas": 8})).stored  # no pending write holds the watch back


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
           "spec": {"nodeName": "n1", "volumes": [{"name": "big"}] * 20 + [{"name": "config", "configMap": {"name": "c1", "defaultMode": 420}}],
                    "containers": [{"name": "engine", "image": "x", "command": ["python"] * 50,
                                    "env": [{"name": "A", "value": "1"}] * 30,
                                    "ports": [{"name": "metrics", "containerPort": 9003}]}]},
           "status": {"phase": "Running", "podIP": "127.0.0.5", "qosClass": "Burstable",
                      "conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": "engine", "ready": True, "image": "x", "imageID": "y",
                                             "state": {"terminated": {"message": "result"}}}]}}
    t = trim(pod)
    assert t["spec"] == {"nodeName": "n1", "containers": [{"name": "engine",
                                                           "ports": [{"name": "metrics", "containerPort": 9003}]}],
                         "volumes": [{"name": "config", "configMap": {"name": "c1"}}]}  # what the pruner reads
    assert t["status"]["podIP"] == "127.0.0.5" and t["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert t["status"]["containerStatuses"] == [{"name": "engine", "ready": True,
                                                 "state": {"terminated": {"message": "result"}}}]
    assert "managedFields" not in t["metadata"] and "qosClass" not in t["status"]


def test_selectors():
    req = parse_selector("a=1,b!=2,c,!d,e==5")
    assert matches({"a": "1", "c": "", "e": "5"}, req)
    assert not matches({"a": "1", "b": "2", "c": "", "e": "5"}, req)
    assert not matches({"a": "1", "c": "", "d": "x", "e": "5"}, req)


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


def test_a_projection_is_computed_once_per_stored_version_and_dropped_with_it():
    """``get``/``list`` with ``project`` hand out ``project(object)``, computed once per stored version:
    a reader that looks at every object every pass decodes only what changed since."""
    cache = ObjectCache()
    calls: list[str] = []

    def replicas(obj: dict) -> int:
        calls.append(obj["metadata"]["resourceVersion"])
        return obj["spec"]["replicas"]

    cache.upsert(dep("a", "10"))
    cache.upsert(dep("b", "20", spec={"replicas": 2}))
    assert cache.list("apps/v1", "Deployment", "ns", project=replicas) == [1, 2]
    assert cache.list("apps/v1", "Deployment", "ns", f"{OWNER}=d", project=replicas) == [1, 2]
    assert cache.get("apps/v1", "Deployment", "a", "ns", project=replicas) == 1
    assert sorted(calls) == ["10", "20"]  # once each, whatever read them
    cache.upsert(dep("a", "11", spec={"replicas": 3}))  # a new version: computed again
    assert cache.get("apps/v1", "Deployment", "a", "ns", project=replicas) == 3
    assert calls[-1] == "11" and len(calls) == 3
    cache.record_write(dep("b", "21", spec={"replicas": 4}), before="20")  # the operator's write too
    assert cache.list("apps/v1", "Deployment", "ns", project=replicas) == [3, 4]
    cache.remove(dep("a", "11"))
    assert cache.get("apps/v1", "Deployment", "a", "ns", project=replicas) is None
    assert cache.list("apps/v1", "Deployment", "ns", project=replicas) == [4]
    assert cache._views.keys() == {("apps/v1", "Deployment", "ns", "b")}  # nothing kept of what went
    assert cache.get("apps/v1", "Deployment", "a", "ns") is None and len(calls) == 4


def test_each_kind_is_compressed_with_its_own_dictionary_and_every_entry_decodes_to_what_was_stored():
    """Memory at rest (issue 29 item 6): the first object of a kind is that kind's preset dictionary."""
    import zlib

    from sglang_pd_operator.runtime.cache import encode

    def engine(name: str, rv: str) -> dict:
        args = [f"--flag-{i}=value-{i * 7919 % 1000}" for i in range(60)]  # the same model: the same flags
        return dep(name, rv, spec={"replicas": 1, "template": {"spec": {"containers": [{"name": "engine", "args": args}]}}})

    cache = ObjectCache()
    first, second = engine("pd-0000-prefill", "1"), engine("pd-0001-prefill", "2")
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "pd-0000", "namespace": "ns", "resourceVersion": "3", "uid": "u-s"}, "spec": {"ports": []}}
    for obj in (first, second, svc):
        cache.upsert(obj)
    entries = cache._objects[("apps/v1", "Deployment")]["ns"]
    a, b = entries["pd-0000-prefill"], entries["pd-0001-prefill"]
    assert a.zdict is b.zdict and a.zdict == encode(trim(first)), "one dictionary per kind, the first object's"
    assert cache._objects[("v1", "Service")]["ns"]["pd-0000"].zdict is not a.zdict
    alone = len(zlib.compress(encode(trim(second)), 1))
    assert len(b.blob) * 3 < alone, (len(b.blob), alone)
    assert cache.get("apps/v1", "Deployment", "pd-0001-prefill", "ns") == trim(second)
    cache.remove(first)  # the dictionary outlives the object it was made of
    assert cache.get("apps/v1", "Deployment", "pd-0001-prefill", "ns") == trim(second)
    again = engine("pd-0000-prefill", "5")
    again["metadata"]["uid"] = "u-recreated"  # a new object of the same name (uids are never reused)
    cache.upsert(again)
    assert cache.get("apps/v1", "Deployment", "pd-0000-prefill", "ns")["metadata"]["resourceVersion"] == "5"


def test_entries_with_the_same_labels_share_one_labels_object_that_goes_with_the_last_of_them():
    import gc

    from sglang_pd_operator.runtime import cache as C

    cache = ObjectCache()
    cache.upsert(dep("a", "1"))
    cache.upsert(dep("b", "2"))
    cache.upsert(dep("c", "3", owner="other"))
    stored = cache._objects[("apps/v1", "Deployment")]["ns"]
    assert stored["a"].labels is stored["b"].labels and stored["a"].labels == dep("a", "1")["metadata"]["labels"]
    assert stored["c"].labels is not stored["a"].labels
    key = tuple(s for kv in sorted(dep("a", "1")["metadata"]["labels"].items()) for s in kv)  # flat: k1, v1, k2, v2
    assert key in C._LABELS
    cache.remove(dep("a", "1"))
    cache.remove(dep("b", "2"))
    gc.collect()
    assert key not in C._LABELS, "no entry holds those labels any more: the shared set is gone"


def test_the_shared_labels_hold_no_second_copy_of_the_callers_strings():
    """The set is found by a flat tuple of interned strings: the Labels' own keys and values, not copies."""
    import json

    from sglang_pd_operator.runtime import cache as C

    raw = json.loads(json.dumps({"pd.sglang-operator.io/deployment": "pd-7", "pod-template-hash": "5d4f"}))
    shared = C.shared_labels(raw)
    key = next(k for k, v in C._LABELS.items() if v is shared)
    assert all(isinstance(s, str) for s in key) and len(key) == 4
    assert all(any(s is x for x in list(shared) + list(shared.values())) for s in key)
    assert C.shared_labels(json.loads(json.dumps(raw))) is shared
