"""Validate an object against its generated CRD's own OpenAPI v3 schema, as the API server does.

pydantic (``api/v1alpha1.py``) is the source of the schema, but it does not enforce every
keyword it writes into the CRD: ``maxProperties`` of a map, say, is emitted for the API
server only, and pydantic's regexes, integer widths and length counts are not Go's. The
API server validates a custom object against the *generated* structural schema
(k8s.io/apiextensions-apiserver, kube-openapi's validate package); this module walks the
same schema (``crds/*.yaml`` is generated from the same function, ``crd.all_crds``) with
the same keywords and the same semantics, so ``check`` refuses what ``kubectl apply``
refuses:

- ``pattern`` is an unanchored RE2 search (Go's ``regexp.MatchString``): google-re2, not
  Python's ``re`` (whose ``$`` also matches before a final newline);
- ``maxLength``/``minLength`` count Unicode code points (Go's ``utf8.RuneCountInString``);
- ``integer`` is a JSON number without a fraction that fits an int64 (the API server
  decodes a larger one as a float and refuses it);
- ``maxItems``, ``maxProperties``, ``minimum``/``maximum`` (exclusive forms too),
  ``enum``, ``required`` and the types of every node.

The CEL rules (``x-kubernetes-validations``) are evaluated by ``api/cel.py``; unknown
fields are reported by pydantic (``extra="forbid"``) with a "did you mean" fix.
``tests/e2e/crd_differential.py`` holds this module to the real kube-apiserver's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

import re2

from .crd import all_crds

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class StructuralError:
    """One keyword of the schema the object breaks: the field path, what is wrong and the fix."""

    field: str
    message: str
    fix: str
    pattern: str | None = None  #: the pattern the value does not match, for a pattern error


@lru_cache(maxsize=None)
def _schema(kind: str) -> dict[str, Any]:
    for crd in all_crds().values():
        if crd["spec"]["names"]["kind"] == kind:
            return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise KeyError(kind)


@lru_cache(maxsize=None)
def _regex(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = 64 << 20  # as large as the patterns need
    return re2.compile(pattern, options)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def _type_ok(expected: str, value: Any) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX
    if expected == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _walk(schema: dict[str, Any], value: Any, path: str) -> Iterator[StructuralError]:
    if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        return
    expected = schema.get("type")
    if value is None:
        yield StructuralError(path, "must not be null (kubectl apply --server-side refuses a null field)",
                              "remove the field or give it a value")
        return
    if expected and not _type_ok(expected, value):
        if expected == "integer" and isinstance(value, int) and not isinstance(value, bool):
            yield StructuralError(path, f"{value} does not fit a 64-bit integer", "write a smaller number")
        else:
            yield StructuralError(path, f"must be of type {expected}, got {_type_name(value)}",
                                  f"write a {expected}")
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        yield StructuralError(path, f"unsupported value {value!r}", f"use one of {allowed}")
    if isinstance(value, str):
        yield from _string(schema, value, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield from _number(schema, value, path)
    elif isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield StructuralError(path, f"has {len(value)} items, more than {schema['maxItems']}",
                                  f"list at most {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            yield StructuralError(path, f"has {len(value)} items, fewer than {schema['minItems']}",
                                  f"list at least {schema['minItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                yield from _walk(schema["items"], item, f"{path}[{i}]")
    elif isinstance(value, dict):
        yield from _object(schema, value, path)


def _string(schema: dict[str, Any], value: str, path: str) -> Iterator[StructuralError]:
    length = len(value)  # code points, as utf8.RuneCountInString
    if "maxLength" in schema and length > schema["maxLength"]:
        yield StructuralError(path, f"is {length} characters long, more than {schema['maxLength']}",
                              f"shorten it to at most {schema['maxLength']} characters")
    if "minLength" in schema and length < schema["minLength"]:
        yield StructuralError(path, f"is {length} characters long, fewer than {schema['minLength']}",
                              f"write at least {schema['minLength']} character(s)")
    pattern = schema.get("pattern")
    if pattern is not None and _regex(pattern).search(value) is None:
        yield StructuralError(path, f"{value!r} is not of the form this field takes",
                              f"write a value of the form the field's description gives (the pattern is {pattern})",
                              pattern)


def _number(schema: dict[str, Any], value: float, path: str) -> Iterator[StructuralError]:
    if "maximum" in schema:
        top = schema["maximum"]
        if value > top or (schema.get("exclusiveMaximum") and value == top):
            word = "less than" if schema.get("exclusiveMaximum") else "at most"
            yield StructuralError(path, f"{value} is out of range", f"use a value {word} {top}")
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") and value == low):
            word = "greater than" if schema.get("exclusiveMinimum") else "at least"
            yield StructuralError(path, f"{value} is out of range", f"use a value {word} {low}")


def _object(schema: dict[str, Any], value: dict[str, Any], path: str) -> Iterator[StructuralError]:
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        yield StructuralError(path, f"has {len(value)} entries, more than {schema['maxProperties']}",
                              f"keep at most {schema['maxProperties']} entries")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        yield StructuralError(path, f"has {len(value)} entries, fewer than {schema['minProperties']}",
                              f"set at least {schema['minProperties']} entries")
    for name in schema.get("required") or []:
        if name not in value:
            yield StructuralError(_join(path, name), "required field is missing", f"add {_join(path, name)}")
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, sub in value.items():
        if key in properties:
            yield from _walk(properties[key], sub, _join(path, str(key)))
        elif isinstance(extra, dict):
            yield from _walk(extra, sub, _join(path, str(key)))


def structural_errors(obj: dict[str, Any], *, kind: str = "PDDeployment") -> list[StructuralError]:
    """Every keyword of ``kind``'s generated CRD schema that ``obj`` breaks, in document order.

    ``obj`` is the whole object (``apiVersion``, ``metadata``, ``spec``) as the API server
    holds it after decoding (``load.as_api_server_reads``: whole floats as integers; nulls
    kept, and refused, as a server-side apply refuses them); ``status`` is skipped (a subresource). Field paths start at the
    root (``spec.decode.nodeSelector``). Unknown fields and CEL rules are not reported
    here (pydantic and ``api/cel.py`` do). Source of the semantics:
    k8s.io/kube-openapi/pkg/validation/validate (type, string, number, object and slice
    validators) as the apiextensions-apiserver runs them on a custom object.
    """
    schema = _schema(kind)
    body = {k: v for k, v in obj.items() if k != "status"}
    return list(_walk({**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "status"}},
                      body, ""))
