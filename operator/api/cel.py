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


def violations(obj: dict[str, Any], *, kind: str = "PDDeployment") -> list[RuleViolation]:
    """Every CEL rule of ``kind``'s CRD that ``obj`` (the whole object, as a dict) breaks.

    A rule that cannot be evaluated on the object (a type error, say) counts as broken,
    as the API server refuses such an object too. The schema is generated once per
    process; each rule is compiled once.
    """
    out = []
    for path, rule, value in _walk(_schema(kind), obj, ""):
        field = (path + rule["fieldPath"]).lstrip(".") if rule.get("fieldPath") else path
        if not field:  # a rule on the whole object: name what it reads
            field = "metadata.name" if "metadata.name" in rule["rule"] else "metadata"
        try:
            ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except Exception as e:  # celpy raises its own evaluation errors
            out.append(RuleViolation(field, f"{rule['message']} (rule not evaluable: {e})"))
            continue
        if not bool(ok):
            out.append(RuleViolation(field, rule["message"]))
    return out
