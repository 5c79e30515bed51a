"""Operator upgrades restart no engine: hold what a new operator would render differently.

A running group keeps its rendered objects and compat key until the user's spec changes
or the user opts in (``spec.rollout.operatorChanges: apply``). Each group records the
operator that rendered it and the spec it came from (``render/record.py``). On every
reconcile :func:`operator_changes` asks: would this operator render the serving group
differently although the user changed nothing it is made of? Then the group is *held*:
the reconciler applies nothing of it but its replica counts, and the ``UpgradePending``
condition says what an opt-in would change (:func:`describe_changes`) and why
(:data:`KNOWN_CHANGES`).

"The user changed nothing": the recorded spec and the current one are equal, or this
operator renders both identically (a new CRD default read into the spec, a field outside
the group such as ``slo``, a replica count). A group made before 0.2.0 records nothing;
it counts as unchanged when status says the current generation was applied and the group
serves it with no rollout under way, and the operator then writes the record once
(adoption: metadata only, no pod restarts).

Everything here but :func:`adopt` is pure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..api import kueue, lws
from ..api.load import SpecError, parse_pddeployment
from ..catalog import Catalog
from ..planning.plan import build_plan
from ..render import render_group
from ..render import labels as L
from ..render.record import UNRECORDED, RenderRecord, canonical_json, render_hash
from .drift import contains
from .kube import Kube
from .observe import Observed
from .status import applied_generation

CONDITION = "UpgradePending"
#: The kinds whose metadata carries a group's record (``render.record``).
RECORD_KINDS = (("apps/v1", "Deployment"), (lws.API_VERSION, lws.KIND))
#: The kinds of a group's objects, compared with what this operator would render.
GROUP_OBJECT_KINDS = (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"), (lws.API_VERSION, lws.KIND))
REASON_HELD = "OperatorChangesHeld"


@dataclass(frozen=True)
class KnownChange:
    """A way an operator release renders groups differently from the one before.

    ``since``: the first version that renders it; ``match``: a word that appears in the
    change lines :func:`describe_changes` writes for it; ``why``: the reason, with its source.
    """

    since: str
    match: str
    why: str


#: Why a release renders differently, newest last; shown in UpgradePending for a group a
#: release before ``since`` rendered.
KNOWN_CHANGES: tuple[KnownChange, ...] = (
    KnownChange("0.2.0", "compat key", "the compat key gained the input pairShape (the parallel shapes SGLang's PD "
                "handshake compares, conn.py _resolve_rank_mapping) and DeepSeek-V4.1's KV layout string is "
                "predicted as SGLang's pd_kv_layout writes it (docs/compat-key.md)"),
    KnownChange("0.2.0", "Probe", "engine probes follow SGLang's own /health budget (render/probes.py) and the "
                "gateway is Ready only once smg has registered a prefill and a decode worker (smg /readiness)"),
    KnownChange("0.2.0", "--bucket-", "engines render histogram buckets so that every SLO target is a bucket "
                "boundary (planning/buckets.py: percentile error near a target is bounded)"),
    KnownChange("0.2.0", "preStop", "engines and gateways drain before they stop: a preStop waits until SGLang's "
                "own metrics show no running or queued request, bounded by rollout.drainGracePeriod"),
    KnownChange("0.3.0", "pod volumes", "each engine config is an immutable ConfigMap named after its content "
                "(render/engine.py config_map_name), so an in-place update never rewrites the config its old pods read"),
    KnownChange("0.3.0", "pod resourceClaims", "each replica of a multi-node GB200 / GB300 role gets its own "
                "ComputeDomain and IMEX channel (render/multinode.py; the chart's admission policy points each pod "
                "at its replica's), instead of one domain shared by every replica of the LeaderWorkerSet"),
)


#: The words of the change line a different Kueue queue writes (:func:`describe_changes`), and why it is held:
#: with the spec unchanged, only the operator's default queue can have moved.
QUEUE_CHANGE = "Kueue queue"
QUEUE_REASON = ("the operator's default Kueue queue (run --default-queue-name, the chart's "
                "scheduling.defaultQueueName) is not the one this group was admitted through; a running group keeps "
                "its queue (Kueue refuses to change it on a running LeaderWorkerSet) and the default reaches new groups")


@dataclass(frozen=True)
class Hold:
    """The serving group is kept as rendered; what an opt-in would change.

    ``key``: the held group's compat key; ``new_key``: the key this operator would give
    it; ``rendered_by``: the version that rendered it; ``adopt``: the record to write into
    a group made before 0.2.0 (None when it has one); ``changes``: one line per
    difference; ``reasons``: why, from :data:`KNOWN_CHANGES`.
    """

    key: str
    new_key: str
    rendered_by: str
    adopt: RenderRecord | None
    changes: tuple[str, ...]
    reasons: tuple[str, ...] = field(default=())

    @property
    def paired(self) -> bool:
        """The opt-in is a paired rollout (the compat key changes), not an in-place update."""
        return self.key != self.new_key

    def message(self) -> str:
        """The UpgradePending condition's message."""
        how = ("a paired rollout (a new group beside this one, then a cutover)" if self.paired
               else "an in-place update within rollout.maxSurgeGPUs")
        text = (f"group {self.key[:L.GROUP_ID_LENGTH]} was rendered by operator {self.rendered_by}; this operator "
                f"would render it differently and holds it as it is (spec.rollout.operatorChanges: hold). "
                f"Would change: {'; '.join(self.changes)}.")
        if self.reasons:
            text += f" Why: {'; '.join(self.reasons)}."
        return text + f" Set spec.rollout.operatorChanges: apply to roll it out as {how}."


def _version(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split("+")[0].split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def reasons_for(changes: list[str], rendered_by: str) -> tuple[str, ...]:
    """The :data:`KNOWN_CHANGES` newer than ``rendered_by`` whose word appears in ``changes``."""
    old = (0,) if rendered_by == UNRECORDED else _version(rendered_by)
    text = "\n".join(changes)
    return tuple(k.why for k in KNOWN_CHANGES if _version(k.since) > old and k.match in text)


#: render hashes of recorded specs, by (catalog id, metadata, spec) JSON: a rollout the user started
#: asks about the serving group's recorded spec on every reconcile until it completes.
_HASH_MEMO: dict[tuple[int, str, str, str | None], str | None] = {}
_HASH_MEMO_SIZE = 256


def renders_alike(*, body: dict[str, Any], spec: dict[str, Any], catalog: Catalog, expected_hash: str,
                  default_queue: str | None = None) -> bool:
    """Whether this operator renders ``spec`` (in ``body``'s metadata) to ``expected_hash``.

    ``default_queue``: the operator's default Kueue queue, as for the current spec
    (``planning.plan.build_plan``). False when the spec no longer parses or plans valid
    (the operator cannot know what it would make of it, so the user's current spec counts
    as a change).
    """
    meta = {k: body["metadata"].get(k) for k in ("name", "namespace")}
    memo_key = (id(catalog), canonical_json(meta), canonical_json(spec), default_queue)
    if memo_key not in _HASH_MEMO:
        if len(_HASH_MEMO) >= _HASH_MEMO_SIZE:
            _HASH_MEMO.pop(next(iter(_HASH_MEMO)))
        _HASH_MEMO[memo_key] = _hash_of(body, spec, catalog, default_queue)
    return _HASH_MEMO[memo_key] == expected_hash


def _hash_of(body: dict[str, Any], spec: dict[str, Any], catalog: Catalog, default_queue: str | None) -> str | None:
    try:
        pdd = parse_pddeployment({"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                                  "metadata": body["metadata"], "spec": spec})
    except SpecError:
        return None
    plan = build_plan(pdd, catalog, default_queue=default_queue)
    return render_hash(render_group(plan)) if plan.valid else None


def operator_changes(
    *, body: dict[str, Any], observed: Observed, previous: dict[str, Any], spec_objects: list[dict[str, Any]],
    live_objects: Callable[[], list[dict[str, Any]]], new_key: str, catalog: Catalog,
    default_queue: str | None = None,
) -> Hold | None:
    """The hold of the serving group, or None when this operator may apply its own rendering.

    ``spec_objects``: ``render_group`` of the current spec alone (no owner, no kernel gate,
    no counts); ``live_objects``: reads the serving group's objects as they exist (called
    only when a hold is likely); ``new_key``: the compat key the current plan gives;
    ``default_queue``: the operator's default Kueue queue the current plan was made with (a
    changed default is an operator change like a new release: held, :data:`QUEUE_REASON`).
    None when there is no serving group, the user opted in, the user's spec changed the
    group, or nothing would change.
    """
    serving = observed.serving_key
    group = observed.groups.get(serving) if serving else None
    if group is None or (body.get("spec", {}).get("rollout") or {}).get("operatorChanges") == "apply":
        return None
    spec = body.get("spec") or {}
    generation = int(body["metadata"].get("generation") or 0)
    new_hash = render_hash(spec_objects)
    record = group.record
    adopt = None
    if record is not None:
        if record.render_hash == new_hash:
            return None  # this operator renders it as it was
        unchanged = canonical_json(record.spec) == canonical_json(spec) or (
            renders_alike(body=body, spec=record.spec, catalog=catalog, expected_hash=new_hash,
                          default_queue=default_queue))
        if not unchanged:
            return None  # the user changed the group: it is rendered by this operator
        rendered_by = record.operator_version
    else:
        rollout = previous.get("rollout") or {}
        settled = (applied_generation(previous) == generation and rollout.get("targetKey") == serving
                   and rollout.get("servingKey") == serving and rollout.get("phase") == "Complete")
        if not settled:
            return None
        rendered_by = UNRECORDED
        adopt = RenderRecord(operator_version=UNRECORDED, generation=generation, render_hash=UNRECORDED, spec=spec)
    changes = describe_changes(live=live_objects(), desired=spec_objects, old_key=serving, new_key=new_key)
    if not changes:
        return None
    reasons = reasons_for(changes, rendered_by)
    if any(QUEUE_CHANGE in c for c in changes):
        reasons += (QUEUE_REASON,)
    return Hold(key=serving, new_key=new_key, rendered_by=rendered_by, adopt=adopt, changes=tuple(changes),
                reasons=reasons)


# --------------------------------------------------------------------------- what would change


def _component(obj: dict[str, Any]) -> str:
    return (obj.get("metadata", {}).get("labels") or {}).get(L.LABEL_ROLE, "?")


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec") or {}
    if "leaderWorkerTemplate" in spec:
        return ((spec["leaderWorkerTemplate"].get("workerTemplate") or {}).get("spec")) or {}
    return (spec.get("template") or {}).get("spec") or {}


def _flags(args: list[str]) -> dict[str, tuple[str, ...]]:
    """``--flag value...`` groups of an argument list, by flag (a leading non-flag word counts as its own)."""
    out: dict[str, list[str]] = {}
    current = ""
    for a in args:
        if a.startswith("-"):
            current = a
            out.setdefault(current, [])
        else:
            out.setdefault(current, []).append(a)
    return {k: tuple(v) for k, v in out.items()}


def _args_diff(desired: list[str], live: list[str]) -> str:
    """Flags added (+), removed (-) and given other values (~), e.g. ``+--bucket-inter-token-latency ~--tp-size``."""
    d, lv = _flags(desired), _flags(live)
    words = ([f"+{f}" for f in d if f not in lv] + [f"-{f}" for f in lv if f not in d]
             + [f"~{f}" for f in d if f in lv and d[f] != lv[f]])
    return " ".join(w for w in words if w not in ("+", "-", "~")) or "order"


def _env_diff(desired: list[dict], live: list[dict]) -> list[str]:
    d = {e["name"]: e for e in desired}
    lv = {e["name"]: e for e in live}
    out = [f"+{n}" for n in d if n not in lv] + [f"-{n}" for n in lv if n not in d]
    out += [f"{n} changed" for n in d if n in lv and not contains(d[n], lv[n])]
    return out


def _probe_text(probe: dict[str, Any] | None) -> str:
    if not probe:
        return "none"
    if "exec" in probe:
        return "exec " + " ".join(str(w) for w in (probe["exec"].get("command") or [])[:1])
    for kind in ("httpGet", "tcpSocket", "grpc"):
        if kind in probe:
            target = probe[kind]
            return str(target.get("path") or target.get("port") or kind)
    return "set"


def _container_changes(where: str, desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    out = []
    for f in ("image", "command"):
        if not contains(desired.get(f), live.get(f)):
            out.append(f"{where}: {f} {live.get(f)} -> {desired.get(f)}")
    if not contains(desired.get("args") or [], live.get("args") or []):
        out.append(f"{where}: args {_args_diff(desired.get('args') or [], live.get('args') or [])}")
    env = _env_diff(desired.get("env") or [], live.get("env") or [])
    if env:
        out.append(f"{where}: env {' '.join(env)}")
    for f in ("readinessProbe", "livenessProbe", "startupProbe"):
        if not contains(desired.get(f), live.get(f)) or (f in live) != (f in desired):
            out.append(f"{where}: {f} {_probe_text(live.get(f))} -> {_probe_text(desired.get(f))}")
    if not contains(desired.get("lifecycle"), live.get("lifecycle")) or ("lifecycle" in live) != ("lifecycle" in desired):
        pre = "preStop" if "preStop" in (desired.get("lifecycle") or {}) else "lifecycle"
        out.append(f"{where}: {pre} hook {'added' if 'lifecycle' not in live else 'changed'}")
    for f in ("resources", "volumeMounts", "ports"):
        if not contains(desired.get(f), live.get(f)):
            out.append(f"{where}: {f} changed")
    return out


def _queue_of(obj: dict[str, Any]) -> str:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(kueue.QUEUE_LABEL) or "none"


def _workload_changes(component: str, desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    dp, lp = _pod_spec(desired), _pod_spec(live)
    out = []
    if desired.get("kind") == lws.KIND and _queue_of(desired) != _queue_of(live):
        out.append(f"{component}: {QUEUE_CHANGE} {_queue_of(live)} -> {_queue_of(desired)}")
    live_containers = {c["name"]: c for c in lp.get("containers") or []}
    for c in dp.get("containers") or []:
        where = f"{component} {c['name']}"
        if c["name"] not in live_containers:
            out.append(f"{where}: new container")
            continue
        out += _container_changes(where, c, live_containers[c["name"]])
    for name in live_containers.keys() - {c["name"] for c in dp.get("containers") or []}:
        out.append(f"{component} {name}: container removed")
    if not contains(dp.get("terminationGracePeriodSeconds"), lp.get("terminationGracePeriodSeconds")):
        out.append(f"{component}: terminationGracePeriodSeconds {lp.get('terminationGracePeriodSeconds')} -> "
                   f"{dp.get('terminationGracePeriodSeconds')}")
    for f in ("initContainers", "volumes", "affinity", "tolerations", "nodeSelector", "resourceClaims"):
        if not contains(dp.get(f), lp.get(f)) or (bool(dp.get(f)) != bool(lp.get(f))):
            out.append(f"{component}: pod {f} changed")
    if not out and not contains(desired.get("spec"), live.get("spec")):
        out.append(f"{component}: {desired['kind']} spec changed outside the pod template")
    return out


def _config_changes(component: str, desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    out = []
    dd, ld = desired.get("data") or {}, live.get("data") or {}
    for k in sorted(set(dd) | set(ld)):
        if dd.get(k) == ld.get(k):
            continue
        try:
            dv, lv = yaml.safe_load(dd.get(k) or "{}"), yaml.safe_load(ld.get(k) or "{}")
        except yaml.YAMLError:
            dv = lv = None
        if isinstance(dv, dict) and isinstance(lv, dict):
            flags = ([f"+{f}" for f in dv if f not in lv] + [f"-{f}" for f in lv if f not in dv]
                     + [f"{f}: {lv[f]} -> {dv[f]}" for f in dv if f in lv and dv[f] != lv[f]])
            out.append(f"{component} config {k}: {' '.join(str(x) for x in flags)}")
        else:
            out.append(f"{component} config {k} changed")
    return out


def _swap_key(obj: dict[str, Any], old_key: str, new_key: str) -> dict[str, Any]:
    """``obj`` with the old compat key (and group id) written as the new one, so only real changes remain."""
    text = json.dumps(obj).replace(old_key, new_key).replace(
        f"-{old_key[:L.GROUP_ID_LENGTH]}-", f"-{new_key[:L.GROUP_ID_LENGTH]}-")
    return json.loads(text)


def describe_changes(*, live: list[dict[str, Any]], desired: list[dict[str, Any]], old_key: str,
                     new_key: str) -> list[str]:
    """One line per way ``desired`` (this operator's rendering) differs from ``live`` (the group as it runs).

    Objects are matched by kind and component (prefill, decode, gateway); the compat key
    and group id are taken out first, a change of key is its own line. Only fields the
    operator renders are compared (API-server defaults on the live side are not changes,
    ``drift.contains``). Pure; ``live`` and ``desired`` are lists of object dicts.
    """
    out = []
    if old_key != new_key:
        out.append(f"compat key {old_key[:L.GROUP_ID_LENGTH]} -> {new_key[:L.GROUP_ID_LENGTH]}")
    by = {(o["kind"], _component(o)): _swap_key(o, old_key, new_key) for o in live}
    kinds = {kind for _, kind in GROUP_OBJECT_KINDS}  # what live_group_objects reads (a ComputeDomain is per key)
    for obj in (o for o in desired if o["kind"] in kinds):
        component, kind = _component(obj), obj["kind"]
        other = by.get((kind, component))
        if other is None:
            out.append(f"{component}: new {kind}")
        elif kind in ("Deployment", "LeaderWorkerSet"):
            out += _workload_changes(component, obj, other)
        elif kind == "ConfigMap":
            out += _config_changes(component, obj, other)
        elif not contains(obj.get("spec"), other.get("spec")):
            out.append(f"{component}: {kind} spec changed")
    wanted = {(o["kind"], _component(o)) for o in desired}
    out += [f"{c}: {k} removed" for (k, c) in by if (k, c) not in wanted]
    return out


def live_group_objects(kube: Kube, *, name: str, namespace: str, key: str, lws_served: bool) -> list[dict[str, Any]]:
    """The objects of one compat group as they exist (workloads, Services, ConfigMaps)."""
    selector = f"{L.LABEL_DEPLOYMENT}={name},{L.LABEL_COMPAT_KEY}={key},app.kubernetes.io/managed-by={L.MANAGED_BY}"
    out = []
    for api_version, kind in GROUP_OBJECT_KINDS:
        if kind == lws.KIND and not lws_served:  # the kind exists only where LeaderWorkerSet is installed
            continue
        for obj in kube.list(api_version, kind, namespace, selector):
            out.append({**obj, "apiVersion": obj.get("apiVersion") or api_version, "kind": obj.get("kind") or kind})
    return out


def adopt(kube: Kube, *, namespace: str, refs: tuple[tuple[str, str, str], ...], record: RenderRecord) -> None:
    """Write ``record`` into the metadata of a group made before 0.2.0 (its workloads ``refs``); no pod restarts."""
    for api_version, kind in RECORD_KINDS:
        for name in [n for _, k, n in refs if k == kind]:
            kube.patch_metadata(api_version, kind, name, namespace, annotations=record.annotations())
