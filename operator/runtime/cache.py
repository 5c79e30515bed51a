"""The operator's in-memory view of the objects it watches: what reconciles and the SLO scraper read.

One :class:`ObjectCache` per operator process, shared by every worker thread and the
scraper thread. It holds the objects of the :data:`WATCHED` kinds, each selected by the
API server (``WatchedKind.label_selector``; for children ``app.kubernetes.io/managed-by=
sglang-pd-operator``), so unrelated objects in the cluster never reach the process.

Fed from three places:

- the watch of each kind (``informer.py``): :meth:`ObjectCache.upsert` / :meth:`ObjectCache.remove`,
  in the order the API server sends them;
- a LIST per kind (:meth:`ObjectCache.replace_kind`): once at start, before any reconcile
  runs (a reconcile never acts on a half-filled view, e.g. a missing Service it would
  re-point), and again whenever a watch must start over (410 Gone): the view is made equal
  to the LIST, and objects the LIST no longer holds are removed and reported, as
  client-go's ``Replace`` reports them (a deletion missed while the watch was down is seen
  at the re-list, not at some later sweep);
- the operator's own writes (``kube.Kube``): :meth:`ObjectCache.record_write` stores the API
  server's answer to a server-side apply or a status patch at once, so the next reconcile
  reads what this one wrote before the watch event of that write arrives (read your
  writes); :meth:`ObjectCache.forget` drops what the operator deleted.

resourceVersions are opaque: they are only ever compared for equality, never ordered
(the API conventions: clients must not compare them). Order comes from the watch
itself, which delivers one kind's changes in the order they happened. A written object is
*pending* until the watch delivers the event with the write's resourceVersion: the events
the watch delivers before it are older than the write and are skipped (after
:data:`PENDING_S` without it, the watch wins again). An answer that arrives after the
watch already delivered its version (the cache remembers for :data:`RECENT_S` which
versions the watch delivered, and each entry its previous version) is not stored. A
deleted object's uid is a *tombstone* for :data:`TOMBSTONE_S` seconds: no later event
or answer about that uid brings it back (uids are never reused).

Objects are trimmed when stored (:func:`trim`): ``managedFields`` and kubectl's
last-applied annotation go; a Pod keeps only what the operator reads (labels, owner,
node, resource claims, container ports, ConfigMap volumes, phase, IP, conditions, container states). Each is kept as
compressed JSON beside the few metadata fields the cache itself needs (:class:`Entry`),
deflated with a preset dictionary per kind (the first object of the kind stored): a
rendered engine Deployment is about 9 KB as Python dicts, 1.3 KB compressed alone and
0.46 KB with its kind's dictionary, which is what lets one process hold a thousand
PDDeployments' children. Reads decode a fresh copy, so a
caller can never change the view by accident. A reader that looks at every object every few
seconds (the SLO pass) reads a *projection* instead (``get``/``list`` with ``project``): a
small value computed from the object once per stored version and shared until the object
changes or goes, so a pass at rest decodes nothing.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..api import computedomain as cd
from ..api import lws
from ..api.v1alpha1 import API_VERSION
from ..kernelbuild.inputs import LABEL_KERNELBUILD
from ..render.labels import LABEL_DEPLOYMENT, MANAGED_BY

#: Seconds a deleted object's uid keeps late events and answers about it out.
TOMBSTONE_S = 300.0
#: Seconds a written object waits for the watch event of its write before the watch wins again.
PENDING_S = 60.0
#: Seconds the cache remembers which (object, resourceVersion) the watch delivered.
RECENT_S = 60.0
#: The label every child object of the operator carries; the children's watches select on it.
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
#: Labels indexed for fast ``list`` by owner (a PDDeployment's or a KernelBuild's children).
INDEXED_LABELS = (LABEL_DEPLOYMENT, LABEL_KERNELBUILD)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


@dataclass(frozen=True)
class WatchedKind:
    """One kind the operator watches and caches.

    ``group`` / ``version`` / ``plural``: as kopf names the resource; ``label_selector``:
    what the API server filters the watch and the LIST by ("" for all objects).
    """

    api_version: str
    kind: str
    plural: str
    label_selector: str = ""
    #: Served only when an optional dependency is installed (LeaderWorkerSet): the loop lists
    #: it only while the API server serves it, and kopf watches it only if it did at start.
    optional: bool = False

    @property
    def group(self) -> str:
        """The API group ("" for the core group)."""
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        """The API version without the group."""
        return self.api_version.rpartition("/")[2]


#: Every kind the operator watches: its own two kinds, and the children it makes, selected by label
#: (LeaderWorkerSets only where the cluster serves them: multi-node roles).
WATCHED: tuple[WatchedKind, ...] = (
    WatchedKind(API_VERSION, "PDDeployment", "pddeployments"),
    WatchedKind(API_VERSION, "KernelBuild", "kernelbuilds"),
    WatchedKind(API_VERSION, "PDRoleScale", "pdrolescales", MANAGED_SELECTOR),
    WatchedKind("apps/v1", "Deployment", "deployments", MANAGED_SELECTOR),
    WatchedKind("v1", "Service", "services", MANAGED_SELECTOR),
    WatchedKind("v1", "ConfigMap", "configmaps", MANAGED_SELECTOR),
    WatchedKind("v1", "Pod", "pods", MANAGED_SELECTOR),
    WatchedKind("batch/v1", "Job", "jobs", MANAGED_SELECTOR),
    WatchedKind("v1", "ServiceAccount", "serviceaccounts", MANAGED_SELECTOR),
    WatchedKind("rbac.authorization.k8s.io/v1", "Role", "roles", MANAGED_SELECTOR),
    WatchedKind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", MANAGED_SELECTOR),
    WatchedKind(lws.API_VERSION, lws.KIND, lws.PLURAL, MANAGED_SELECTOR, optional=True),
    WatchedKind(cd.API_VERSION, cd.KIND, cd.PLURAL, MANAGED_SELECTOR, optional=True),
)


def watched_kind(api_version: str, kind: str) -> WatchedKind | None:
    """The :data:`WATCHED` entry of ``api_version``/``kind``, None when it is not watched."""
    return next((w for w in WATCHED if w.api_version == api_version and w.kind == kind), None)


# --------------------------------------------------------------------------- trimming
def _pick(d: dict[str, Any] | None, keys: Iterable[str]) -> dict[str, Any]:
    return {k: d[k] for k in keys if d and k in d}


_POD_STATUS = ("phase", "podIP", "podIPs", "conditions", "reason", "message", "startTime")
_CONTAINER_STATUS = ("name", "ready", "started", "restartCount", "state", "lastState")


def trim(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what no reader needs (see the module docstring).

    Shallow: the result shares nested values with ``obj`` (the cache serializes it at once).
    """
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    annotations = meta.get("annotations")
    if annotations and LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    if obj.get("kind") != "Pod":
        return {**{k: v for k, v in obj.items() if k != "metadata"}, "metadata": meta}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            # resourceClaims: an IMEX claim the admission policy did not rewrite (reconcilers/observe.py)
            **_pick(spec, ("nodeName", "resourceClaims")),
            "containers": [_pick(c, ("name", "ports")) for c in spec.get("containers") or []],
            # the ConfigMaps it mounts: one still mounted by a pod is never pruned (reconcilers/configs.py)
            "volumes": [{"name": v.get("name"), "configMap": {"name": v["configMap"].get("name")}}
                        for v in spec.get("volumes") or [] if v.get("configMap")],
        },
        "status": {
            **_pick(status, _POD_STATUS),
            "containerStatuses": [_pick(c, _CONTAINER_STATUS) for c in status.get("containerStatuses") or []],
        },
    }


def _rv(obj: dict[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


#: Most bytes of a preset dictionary zlib uses (its window).
ZDICT_MAX = 32 * 1024


def compress(data: bytes, zdict: bytes = b"") -> bytes:
    """``data`` deflated at level 1, with ``zdict`` as zlib's preset dictionary when given."""
    if not zdict:
        return zlib.compress(data, 1)
    c = zlib.compressobj(1, zdict=zdict)
    return c.compress(data) + c.flush()


def decompress(blob: bytes, zdict: bytes = b"") -> bytes:
    """The bytes :func:`compress` was given (the same ``zdict``)."""
    if not zdict:
        return zlib.decompress(blob)
    d = zlib.decompressobj(zdict=zdict)
    return d.decompress(blob) + d.flush()


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored object: what the cache reads itself (resourceVersion, uid, labels) and the
    trimmed object as zlib-compressed JSON (:meth:`decode` gives a fresh dict).

    ``zdict``: the preset dictionary it was compressed with (shared by every entry of its kind,
    :meth:`ObjectCache._zdict`; empty: none). Objects of one kind repeat each other's keys,
    labels and most values, so a dictionary made of one of them makes the others 3 to 6 times
    smaller than compressing each alone (a rendered engine Deployment 1.3 KB -> 0.46 KB).
    """

    resource_version: str | None
    uid: str | None
    labels: dict[str, str]
    blob: bytes
    #: the resourceVersion this entry replaced (a late answer carrying it is older than the entry)
    previous: str | None = None
    zdict: bytes = b""

    @classmethod
    def of(cls, obj: dict[str, Any], previous: str | None = None, *, zdict: bytes = b"") -> "Entry":
        """The entry of a full object (trimmed first); ``previous``: the version it replaces."""
        return cls.of_trimmed(trim(obj), previous, zdict=zdict)

    @classmethod
    def of_trimmed(cls, trimmed: dict[str, Any], previous: str | None = None, *, zdict: bytes = b"") -> "Entry":
        """:meth:`of` for an object :func:`trim` already trimmed."""
        meta = trimmed["metadata"]
        return cls(resource_version=meta.get("resourceVersion"), uid=meta.get("uid"),
                   labels=shared_labels(meta.get("labels") or {}),
                   blob=compress(encode(trimmed), zdict), previous=previous, zdict=zdict)

    def decode(self) -> dict[str, Any]:
        """The stored object as a new dict."""
        return json.loads(decompress(self.blob, self.zdict))


class Labels(dict):
    """A stored object's labels, shared by every entry with the same labels (:func:`shared_labels`).
    Readers never change them."""

    __slots__ = ("__weakref__",)


_LABELS: "weakref.WeakValueDictionary[tuple[str, ...], Labels]" = weakref.WeakValueDictionary()
_LABELS_LOCK = threading.Lock()


def shared_labels(labels: dict[str, str]) -> Labels:
    """One :class:`Labels` per distinct set of labels, alive while an entry holds it: a deployment's
    ServiceAccount, Role and RoleBinding, a role's Deployment, Service and ConfigMap, the replicas of
    one ReplicaSet carry the same labels (15,000 entries at N = 1,000 hold about 7,000 distinct sets).
    Keys and values are interned: every child carries the same keys, a deployment's children its name.
    The set is found by one flat tuple of those interned strings (``k1, v1, k2, v2, ...``, sorted by
    key): a tuple of pairs of the caller's own strings kept a second copy of every label and a tuple
    per label, 10 MB at N = 1,000 (a census of the converged operator, docs/scale.md)."""
    key = tuple(sys.intern(s) for kv in sorted(labels.items()) for s in kv)
    with _LABELS_LOCK:
        found = _LABELS.get(key)
        if found is None:
            found = _LABELS[key] = Labels(zip(key[::2], key[1::2]))
        return found


def encode(obj: dict[str, Any]) -> bytes:
    """``obj`` as compact JSON bytes (what :class:`Entry` compresses)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def parse_selector(selector: str) -> list[tuple[str, str, str | None]]:
    """``k=v,k2!=v2,k3,!k4`` -> ``[(op, key, value)]`` with op ``=``, ``!=``, ``exists``, ``!exists``.

    Raises ValueError for set-based requirements (``in``, ``notin``): no caller uses them.
    """
    out: list[tuple[str, str, str | None]] = []
    for part in (p.strip() for p in selector.split(",") if p.strip()):
        if " in " in part or " notin " in part or "(" in part:
            raise ValueError(f"set-based label selectors are not supported by the cache: {part!r}")
        if "!=" in part:
            k, v = part.split("!=", 1)
            out.append(("!=", k.strip(), v.strip()))
        elif "==" in part:
            k, v = part.split("==", 1)
            out.append(("=", k.strip(), v.strip()))
        elif "=" in part:
            k, v = part.split("=", 1)
            out.append(("=", k.strip(), v.strip()))
        elif part.startswith("!"):
            out.append(("!exists", part[1:].strip(), None))
        else:
            out.append(("exists", part, None))
    return out


def matches(labels: dict[str, str], requirements: list[tuple[str, str, str | None]]) -> bool:
    """True when ``labels`` satisfy every requirement of :func:`parse_selector`."""
    for op, key, value in requirements:
        have = labels.get(key)
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!exists" and key in labels:
            return False
    return True


# --------------------------------------------------------------------------- the cache
Ref = tuple[str, str, str, str]  # (api_version, kind, namespace, name); namespace "" for cluster-scoped
#: A pure function of a stored object (a decoded copy) to a small value its readers never change.
Projection = Callable[[dict[str, Any]], Any]


class Change:
    """What one :meth:`ObjectCache.upsert` or :meth:`ObjectCache.remove` did.

    ``stored``: the view changed (False: an older or equal version was ignored); ``old`` /
    ``new``: the object before and after (None when absent), decoded on first access.
    """

    def __init__(self, stored: bool, old: Entry | None, new: Entry | None) -> None:
        self.stored = stored
        self._old, self._new = old, new

    @functools.cached_property
    def old(self) -> dict[str, Any] | None:
        """The object before the change."""
        return self._old.decode() if self._old is not None else None

    @functools.cached_property
    def new(self) -> dict[str, Any] | None:
        """The object after the change (None: removed)."""
        return self._new.decode() if self._new is not None else None

    @property
    def labels(self) -> dict[str, str]:
        """The labels of the newer of the two (the older when removed)."""
        entry = self._new or self._old
        return entry.labels if entry is not None else {}


@dataclass(frozen=True, slots=True)
class _Pending:
    """An operator write whose watch event has not arrived: its version, uid, write sequence and time."""

    resource_version: str | None
    uid: str | None
    seq: int
    at: float


class ObjectCache:
    """Thread-safe store of watched objects by kind, namespace and name (see the module docstring).

    ``clock``: monotonic seconds (tombstone, pending and recent-version ages).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.RLock()
        self._objects: dict[tuple[str, str], dict[str, dict[str, Entry]]] = {}  # (av, kind) -> ns -> name -> entry
        # (av, kind, ns, label, value) -> names; tuples (a deployment has one to three children of a
        # kind): 13,000 of them at N = 1,000, a quarter of the memory sets took
        self._index: dict[tuple[str, str, str, str, str], tuple[str, ...]] = {}
        self._tombstones: dict[str, float] = {}  # uid -> when it was deleted
        self._pending: dict[Ref, _Pending] = {}
        self._recent: dict[tuple[Ref, str], float] = {}  # (ref, resourceVersion) the watch delivered -> when
        self._seq = 0  # operator writes recorded so far
        self._synced: set[tuple[str, str]] = set()
        self._next_purge = 0.0
        self._views: dict[Ref, tuple[Entry, dict[Projection, Any]]] = {}  # ref -> (entry, projection -> value)
        self._zdicts: dict[tuple[str, str], bytes] = {}  # (api_version, kind) -> preset dictionary (_zdict)

    # ------------------------------------------------------------------ the watch
    def upsert(self, obj: dict[str, Any]) -> Change:
        """Store ``obj`` (a full object as a watch event or a LIST gives it); see the module docstring.

        Not stored (``Change.stored`` False): the version stored already (an echo), an
        object whose uid was deleted, or an event older than a pending write of the
        operator. The returned :class:`Change` carries the old and new objects only when it stored.
        """
        ref = _ref(obj)
        rv = _rv(obj)
        uid = _uid(obj)
        with self._lock:
            now = self.clock()
            self._purge(now)
            if rv is not None:
                self._recent[(ref, rv)] = now
            if uid is not None and uid in self._tombstones:
                return Change(False, None, None)
            pending = self._pending.get(ref)
            if pending is not None:
                if pending.resource_version == rv:
                    del self._pending[ref]  # the echo of the operator's write: stored already
                    return Change(False, None, None)
                if now - pending.at < PENDING_S:
                    return Change(False, None, None)  # older than the operator's write
                del self._pending[ref]
            return self._store(ref, obj, rv)

    def remove(self, obj: dict[str, Any]) -> Change:
        """A watch reported ``obj`` deleted: forget it; its uid becomes a tombstone.

        A pending write of a newer object of that name (another uid: the operator created
        it again) keeps its entry.
        """
        ref = _ref(obj)
        uid = _uid(obj)
        with self._lock:
            now = self.clock()
            if uid is not None:
                self._tombstones[uid] = now
            pending = self._pending.get(ref)
            if pending is not None and uid is not None and pending.uid is not None and pending.uid != uid:
                return Change(False, None, None)
            self._pending.pop(ref, None)
            return self._drop(ref, uid)

    def replace_kind(self, api_version: str, kind: str, items: Iterable[dict[str, Any]], *,
                     namespaces: list[str] | None = None, listed_after: int | None = None
                     ) -> list[tuple[tuple[str, str], Change]]:
        """Make the view of ``kind`` (in ``namespaces``, or everywhere) equal a fresh LIST of it (client-go's Replace).

        Objects in ``items`` are stored one by one as they come (``items`` may be a LIST
        read page by page: the whole list is never held); a listed item wins over an
        operator write recorded before the LIST began (``listed_after``: :meth:`write_seq`
        taken just before it; None: every pending write is older). Then stored objects the
        LIST does not hold are removed (and reported), except in a namespace the LIST did
        not cover and those the operator wrote after the LIST began. Marks the kind synced.
        Returns ((namespace, name), change) for each change made.
        """
        listed: set[tuple[str, str]] = set()
        changes: list[tuple[tuple[str, str], Change]] = []
        for obj in items:
            ref = _ref(obj)
            listed.add((ref[2], ref[3]))
            with self._lock:
                pending = self._pending.get(ref)
                if pending is not None and (listed_after is None or pending.seq <= listed_after):
                    del self._pending[ref]  # the LIST is a newer read than that write
                    if pending.resource_version == _rv(obj):
                        continue  # and it found the version the write stored
                change = self.upsert(obj)
            if change.stored:
                changes.append((ref[2:], change))
        with self._lock:
            for ns, bucket in list(self._objects.get((api_version, kind), {}).items()):
                if namespaces is not None and ns not in namespaces:
                    continue
                for name in list(bucket):
                    if (ns, name) in listed:
                        continue
                    ref = (api_version, kind, ns, name)
                    pending = self._pending.get(ref)
                    if pending is not None and listed_after is not None and pending.seq > listed_after:
                        continue  # the operator wrote it after the LIST was taken
                    self._pending.pop(ref, None)
                    change = self._drop(ref, None)
                    if change.stored:
                        changes.append(((ns, name), change))
            self._synced.add((api_version, kind))
        return changes

    # ------------------------------------------------------------------ the operator's writes
    def write_seq(self) -> int:
        """How many operator writes were recorded so far (``replace_kind``'s ``listed_after``)."""
        with self._lock:
            return self._seq

    def record_write(self, obj: dict[str, Any], *, before: str | None = None) -> Change:
        """Store the API server's answer ``obj`` to the operator's write, pending its watch event.

        ``before``: the resourceVersion the writer read before writing, when known (an answer
        that carries it changed nothing). Not stored: an answer the watch already delivered
        (or delivered something after), a version equal to the stored one, a deleted uid.
        """
        ref = _ref(obj)
        rv = _rv(obj)
        uid = _uid(obj)
        with self._lock:
            now = self.clock()
            self._purge(now)
            if uid is not None and uid in self._tombstones:
                return Change(False, None, None)
            if rv is not None and (rv == before or (ref, rv) in self._recent):
                return Change(False, None, None)
            old = self._entry(ref)
            if old is not None and rv is not None and rv in (old.resource_version, old.previous):
                return Change(False, None, None)
            self._seq += 1
            self._pending[ref] = _Pending(rv, uid, self._seq, now)
            return self._store(ref, obj, rv)

    def forget(self, api_version: str, kind: str, name: str, namespace: str | None) -> Change:
        """The operator deleted the object: drop it now; its uid becomes a tombstone (late events skip it)."""
        ref = (api_version, kind, namespace or "", name)
        with self._lock:
            old = self._entry(ref)
            if old is not None and old.uid is not None:
                self._tombstones[old.uid] = self.clock()
            self._pending.pop(ref, None)
            return self._drop(ref, None)

    # ------------------------------------------------------------------ internals (under the lock)
    def _entry(self, ref: Ref) -> Entry | None:
        return self._objects.get((ref[0], ref[1]), {}).get(ref[2], {}).get(ref[3])

    def _store(self, ref: Ref, obj: dict[str, Any], rv: str | None) -> Change:
        bucket = self._objects.setdefault((ref[0], ref[1]), {}).setdefault(ref[2], {})
        old = bucket.get(ref[3])
        if old is not None and rv is not None and old.resource_version == rv:
            return Change(False, None, None)
        trimmed = trim(obj)
        new = Entry.of_trimmed(trimmed, previous=old.resource_version if old is not None else None,
                               zdict=self._zdict(ref, trimmed))
        bucket[ref[3]] = new
        self._views.pop(ref, None)
        self._reindex(ref, old, new)
        return Change(True, old, new)

    def _zdict(self, ref: Ref, trimmed: dict[str, Any]) -> bytes:
        """The preset dictionary of ``ref``'s kind: the JSON of the first object of that kind this
        cache stored (its last :data:`ZDICT_MAX` bytes), kept for the life of the cache, since every
        entry compressed with it needs it to decode. The caller holds the lock."""
        kind = (ref[0], ref[1])
        zdict = self._zdicts.get(kind)
        if zdict is None:
            zdict = self._zdicts[kind] = encode(trimmed)[-ZDICT_MAX:]
        return zdict

    def _drop(self, ref: Ref, uid: str | None) -> Change:
        bucket = self._objects.get((ref[0], ref[1]), {}).get(ref[2], {})
        old = bucket.get(ref[3])
        if old is None or (uid is not None and old.uid is not None and old.uid != uid):
            return Change(False, None, None)  # nothing stored, or a newer object of that name
        del bucket[ref[3]]
        self._views.pop(ref, None)
        self._reindex(ref, old, None)
        return Change(True, old, None)

    def _reindex(self, ref: Ref, old: Entry | None, new: Entry | None) -> None:
        for entry, add in ((old, False), (new, True)):
            labels = entry.labels if entry is not None else {}
            for label in INDEXED_LABELS:
                if label not in labels:
                    continue
                key = (ref[0], ref[1], ref[2], label, labels[label])
                names = self._index.get(key, ())
                if add:
                    if ref[3] not in names:
                        self._index[key] = (*names, ref[3])
                elif ref[3] in names:
                    rest = tuple(n for n in names if n != ref[3])
                    if rest:
                        self._index[key] = rest
                    else:
                        del self._index[key]

    def _purge(self, now: float) -> None:
        """Drop expired tombstones, pending marks and recent versions (at most every few seconds)."""
        if now < self._next_purge:
            return
        self._next_purge = now + 5.0
        for uid in [u for u, t in self._tombstones.items() if now - t >= TOMBSTONE_S]:
            del self._tombstones[uid]
        for ref in [r for r, p in self._pending.items() if now - p.at >= PENDING_S]:
            del self._pending[ref]
        for key in [k for k, t in self._recent.items() if now - t >= RECENT_S]:
            del self._recent[key]

    # ------------------------------------------------------------------ reads
    def synced(self, api_version: str, kind: str) -> bool:
        """True once a LIST of ``kind`` filled the view (:meth:`replace_kind`)."""
        with self._lock:
            return (api_version, kind) in self._synced

    def get(self, api_version: str, kind: str, name: str, namespace: str | None, *,
            project: Projection | None = None) -> Any:
        """A copy of the stored object, None when there is none; with ``project``, ``project(object)``
        computed once per stored version (:meth:`_projected`)."""
        ref = (api_version, kind, namespace or "", name)
        with self._lock:
            entry = self._entry(ref)
        if entry is None:
            return None
        return entry.decode() if project is None else self._projected(ref, entry, project)

    def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str = "", *,
             project: Projection | None = None) -> list[Any]:
        """Copies of the stored objects of ``kind`` in ``namespace`` (None: every namespace) matching the selector.

        Equality requirements on an indexed label (:data:`INDEXED_LABELS`) are answered
        from the index, so listing one PDDeployment's children does not scan the others'.
        With ``project``: ``project(object)`` of each instead, computed once per stored version
        (:meth:`_projected`).
        """
        requirements = parse_selector(label_selector)
        with self._lock:
            by_ns = self._objects.get((api_version, kind), {})
            namespaces = [namespace] if namespace is not None else sorted(by_ns)
            found: list[tuple[Ref, Entry]] = []
            for ns in namespaces:
                bucket = by_ns.get(ns, {})
                names = self._indexed_names(api_version, kind, ns, requirements)
                candidates = sorted(n for n in names if n in bucket) if names is not None else sorted(bucket)
                found.extend(((api_version, kind, ns, n), bucket[n]) for n in candidates
                             if matches(bucket[n].labels, requirements))
        if project is None:
            return [e.decode() for _, e in found]
        return [self._projected(ref, e, project) for ref, e in found]

    def _projected(self, ref: Ref, entry: Entry, project: Projection) -> Any:
        """``project`` of the object stored as ``entry``, memoized until the object changes or goes.

        A reader that runs every few seconds over every object (the SLO pass) decodes only
        what changed since its last pass. The value is shared by every caller: projections
        return small values their readers never change.
        """
        with self._lock:
            held = self._views.get(ref)
            if held is not None and held[0] is entry and project in held[1]:
                return held[1][project]
        value = project(entry.decode())
        with self._lock:
            held = self._views.get(ref)
            if held is None or held[0] is not entry:
                if self._entry(ref) is not entry:
                    return value  # changed meanwhile: nothing to keep
                held = self._views[ref] = (entry, {})
            held[1][project] = value
        return value

    def _indexed_names(self, api_version: str, kind: str, ns: str,
                       requirements: list[tuple[str, str, str | None]]) -> tuple[str, ...] | None:
        for op, key, value in requirements:
            if op == "=" and key in INDEXED_LABELS:
                return self._index.get((api_version, kind, ns, key, value or ""), ())
        return None

    def keys(self, api_version: str, kind: str) -> list[tuple[str, str, str | None]]:
        """(namespace, name, uid) of every stored object of ``kind`` (no copies: cheap enough to call every second)."""
        with self._lock:
            return [(ns, name, entry.uid)
                    for ns, bucket in self._objects.get((api_version, kind), {}).items()
                    for name, entry in bucket.items()]

    def count(self, api_version: str, kind: str) -> int:
        """How many objects of ``kind`` are stored (every namespace)."""
        with self._lock:
            return sum(len(b) for b in self._objects.get((api_version, kind), {}).values())


def _uid(obj: dict[str, Any]) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


def _ref(obj: dict[str, Any]) -> Ref:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))
