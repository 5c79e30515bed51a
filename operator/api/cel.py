"""Evaluate the CRD's CEL rules (``x-kubernetes-validations``) on an object, without an API server.

The rules that need only the object itself live in the CRD, so ``kubectl apply`` is
refused by the API server. ``check`` runs offline (a GitOps pipeline before merging), so
it evaluates the same rules from the same generated schema with cel-python: an object
``check`` accepts is one the API server accepts, for every rule written once in
``api/v1alpha1.py``.

A rule on a nested object applies where that object is present, with ``self`` bound to
it (as the API server does); the rule's ``fieldPath`` (or else the object's own path)
names the field in the returned error.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

import celpy

from .crd import all_crds
from .structural import _regex


@dataclass(frozen=True)
class RuleViolation:
    """A CEL rule that evaluated to false (or failed): the field path and the rule's message."""

    field: str
    message: str


def _matches(text: Any, pattern: Any) -> Any:
    """CEL's ``matches``: an unanchored RE2 search, compiled with the memory the long patterns
    need (cel-python's own ``matches`` uses re2's default, too small for the image pattern)."""
    return celpy.celtypes.BoolType(_regex(str(pattern)).search(str(text)) is not None)


def _find_all(text: Any, pattern: Any) -> Any:
    """The Kubernetes CEL regex library's ``findAll``: every non-overlapping match, leftmost first."""
    return celpy.celtypes.ListType(celpy.celtypes.StringType(m.group(0)) for m in _regex(str(pattern)).finditer(str(text)))


#: Functions the API server's CEL has beyond cel-python's (or with Go's RE2 semantics).
_FUNCTIONS = {"matches": _matches, "findAll": _find_all}


@lru_cache(maxsize=None)
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions=_FUNCTIONS)


@lru_cache(maxsize=None)
def _schema(kind: str) -> dict[str, Any]:
    for crd in all_crds().values():
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise KeyError(kind)


def _walk(schema: dict[str, Any], obj: Any, path: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(path, rule, object) for every rule of ``schema`` whose object is present in ``obj``."""
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path, rule, obj
    if isinstance(obj, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name in obj and obj[name] is not None:
                yield from _walk(sub, obj[name], f"{path}.{name}" if path else name)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                yield from _walk(extra, value, f"{path}.{key}" if path else key)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from _walk(schema["items"], item, f"{path}[{i}]")


#: Most subtrees of an object (a whole ``spec``, say) whose verdicts are remembered by content.
SUBTREE_MEMO_SIZE = 256

_subtree_memo: OrderedDict[tuple[str, str, bytes], tuple[RuleViolation, ...]] = OrderedDict()
_subtree_lock = threading.Lock()


def violations(obj: dict[str, Any], *, kind: str = "PDDeployment") -> list[RuleViolation]:
    """Every CEL rule of ``kind``'s CRD that ``obj`` (the whole object, as a dict) breaks.

    A rule that cannot be evaluated on the object (a type error, say) counts as broken,
    as the API server refuses such an object too. The schema is generated once per
    process; each rule is compiled once.

    A rule on a top-level field's subtree (``spec`` and everything under it) sees only
    that subtree (``self`` is bound to it), so its verdict is a function of the subtree's
    content: the verdicts of a subtree are remembered by a digest of its canonical JSON
    (at most :data:`SUBTREE_MEMO_SIZE`, least recently used dropped), and a second object
    with the same ``spec`` (another name, another namespace) costs one JSON dump instead
    of every rule (cel-python takes 30-80 ms per PDDeployment on this machine). The
    rules on the whole object (its name) are evaluated every time.
    """
    schema = _schema(kind)
    out = list(_evaluate(_walk({"x-kubernetes-validations": schema.get("x-kubernetes-validations")}, obj, "")))
    for name, sub in (schema.get("properties") or {}).items():
        if name in obj and obj[name] is not None:
            out.extend(_subtree_violations(kind, name, sub, obj[name]))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in obj.items():
            out.extend(_evaluate(_walk(extra, value, key)))
    return out


def _subtree_violations(kind: str, name: str, schema: dict[str, Any], value: Any) -> tuple[RuleViolation, ...]:
    """The violations under top-level field ``name``, remembered by the digest of ``value``'s canonical JSON."""
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # not JSON (a YAML date, say): evaluated, not remembered
        return tuple(_evaluate(_walk(schema, value, name)))
    key = (kind, name, hashlib.blake2b(text.encode(), digest_size=16).digest())
    with _subtree_lock:
        found = _subtree_memo.get(key)
        if found is not None:
            _subtree_memo.move_to_end(key)
            return found
    found = tuple(_evaluate(_walk(schema, value, name)))
    with _subtree_lock:
        _subtree_memo[key] = found
        while len(_subtree_memo) > SUBTREE_MEMO_SIZE:
            _subtree_memo.popitem(last=False)
    return found


def _evaluate(rules: Iterator[tuple[str, dict[str, Any], Any]]) -> Iterator[RuleViolation]:
    """Evaluate each (path, rule, object) of :func:`_walk`; an object's CEL value is made once for all its rules."""
    converted: tuple[Any, Any] | None = None  # (the object, its CEL value): _walk yields one node's rules together
    for path, rule, value in rules:
        field = (path + rule["fieldPath"]).lstrip(".") if rule.get("fieldPath") else path
        if not field:  # a rule on the whole object: name what it reads
            field = "metadata.name" if "metadata.name" in rule["rule"] else "metadata"
        try:
            if converted is None or converted[0] is not value:
                converted = (value, celpy.json_to_cel(value))
            ok = _program(rule["rule"]).evaluate({"self": converted[1]})
        except Exception as e:  # celpy raises its own evaluation errors
            yield RuleViolation(field, f"{rule['message']} (rule not evaluable: {e})")
            continue
        if not bool(ok):
            yield RuleViolation(field, rule["message"])
