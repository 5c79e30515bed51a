"""Does a live object already carry everything we would apply? (pure)

Server-side apply of an unchanged object is still a write request. To make a second
reconcile of an unchanged spec issue zero writes, the applier skips an object when both
hold:

- the live object's ``applied-hash`` annotation equals the hash of the desired object
  (catches fields we stopped setting, which a containment check cannot see), and
- the live object contains every desired field with an equal value (catches someone
  editing our fields by hand). Extra live fields (API-server defaults, other managers'
  fields, status) are ignored; lists must have the same length and match item by item;
  quantities compare by value (``1Gi`` == ``1024Mi``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubernetes.utils import parse_quantity

ANNOTATION_APPLIED_HASH = "pd.sglang-operator.io/applied-hash"


def applied_hash(desired: dict[str, Any]) -> str:
    """sha256 prefix of the canonical JSON of ``desired`` (without the hash annotation itself)."""
    return hashlib.sha256(json.dumps(desired, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_applied_hash(desired: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``desired`` whose metadata carries its own applied hash."""
    digest = applied_hash(desired)
    meta = dict(desired.get("metadata", {}))
    meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION_APPLIED_HASH: digest}
    return {**desired, "metadata": meta}


def _scalar_equal(desired: Any, live: Any) -> bool:
    if desired == live:
        return True
    if isinstance(desired, (str, int)) and isinstance(live, (str, int)) and not isinstance(desired, bool):
        if str(desired) == str(live):
            return True
        try:
            return parse_quantity(desired) == parse_quantity(live)
        except (ValueError, TypeError):
            return False
    return False


def _is_zero(value: Any) -> bool:
    """A zero value the API server omits when stored (Go ``omitempty``): False, 0, "", [], {}, None."""
    return value in (False, 0, "", None) or value == [] or value == {}


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; ``{}`` when they are equal.

    Keys absent from ``new`` become ``None`` (delete); nested dicts are diffed
    recursively; lists and scalars are replaced whole. ``None`` values in ``new`` mean
    "absent".
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for k in set(old) | set(new):
        o, n = old.get(k), new.get(k)
        if n is None:
            if o is not None:
                patch[k] = None
        elif isinstance(o, dict) and isinstance(n, dict):
            sub = merge_patch(o, n)
            if sub != {}:
                patch[k] = sub
        elif o != n:
            patch[k] = n
    return patch


def contains(desired: Any, live: Any) -> bool:
    """True when every field of ``desired`` is present in ``live`` with an equal value.

    Dicts: each desired key must be in live and match recursively (a zero value may be
    absent: the API server omits it). Lists: same length,
    item i of desired contained in item i of live. Scalars: equal, or equal as strings,
    or equal as Kubernetes quantities.
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        return all(contains(v, live[k]) if k in live else _is_zero(v) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(contains(d, l) for d, l in zip(desired, live))
    return _scalar_equal(desired, live)


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """True when ``desired`` (as returned by :func:`with_applied_hash`) must be applied over ``live``."""
    if live is None:
        return True
    want = desired.get("metadata", {}).get("annotations", {}).get(ANNOTATION_APPLIED_HASH)
    have = (live.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED_HASH)
    if want is None or want != have:
        return True
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {k: desired.get("metadata", {}).get(k) for k in ("labels", "annotations", "ownerReferences")}
    meta = {k: v for k, v in meta.items() if v}
    return not (contains(body, live) and contains(meta, live.get("metadata", {})))
