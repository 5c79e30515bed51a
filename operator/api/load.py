"""Read PDDeployment objects from YAML or dicts, turning validation errors into field-named problems.

Used by the CLI (``check``, ``render``) and by the reconciler on the object it receives.
The CRD schema refuses most of these errors at ``kubectl apply`` already; this is the
same check for files that never went through an API server (GitOps pre-merge checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

import difflib

import yaml
from pydantic import ValidationError

from .cel import violations

if TYPE_CHECKING:
    from ..planning.problems import Problem
from .v1alpha1 import API_VERSION, PDDeployment


@dataclass(frozen=True)
class FieldError:
    """A schema or CEL error: the field path (``spec.decode.parallelism.tp``), the message and the fix."""

    field: str
    message: str
    fix: str = ""

    def problem(self) -> "Problem":
        """As a planning Problem (rule ``schema``), the shape ``check`` and status report."""
        from ..planning.problems import Problem

        return Problem(field=self.field, message=self.message, fix=self.fix, rule="schema")


class SpecError(ValueError):
    """The object does not match the v1alpha1 schema; ``errors`` lists every field error."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))


def _path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def parse_pddeployment(obj: dict[str, Any]) -> PDDeployment:
    """Validate one object (a dict as read from YAML or the API) as a PDDeployment.

    Raises :class:`SpecError` with one :class:`FieldError` per problem; paths start at
    the object's root (``spec.kvLayout.pageSize``). The CRD's CEL rules are checked by
    :func:`rule_violations`.
    """
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != "PDDeployment":
        raise SpecError(
            [FieldError("apiVersion", f"expected apiVersion {API_VERSION} and kind PDDeployment, got "
                        f"{obj.get('apiVersion')!r} {obj.get('kind')!r}")]
        )
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        pdd = PDDeployment.model_validate(body)
    except ValidationError as e:
        raise SpecError([_field_error(err) for err in e.errors()]) from e
    return pdd


def _spec_fields_at(loc: list[Any]) -> list[str]:
    """Field names the schema allows at ``loc`` (a pydantic error location under ``spec``)."""
    from .crd import structural_schema
    from .v1alpha1 import PDDeploymentSpec

    node: dict[str, Any] = {"properties": {"spec": structural_schema(PDDeploymentSpec)}}
    for part in loc:
        if isinstance(part, int):
            node = node.get("items") or {}
        else:
            node = (node.get("properties") or {}).get(str(part)) or node.get("additionalProperties") or {}
    return sorted(node.get("properties") or {})


def _field_error(err: dict[str, Any]) -> FieldError:
    """One pydantic error as a field error whose fix says what to do."""
    loc = [p for p in err["loc"] if p not in ("function-after",)]
    path = _path(loc)
    parent = _path(loc[:-1])
    explain = "pdd." + (parent if err["type"] == "extra_forbidden" else path) if path.startswith("spec") else "pdd"
    if err["type"] == "extra_forbidden":
        known = _spec_fields_at(loc[:-1]) if loc and loc[0] == "spec" else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        fix = f"did you mean {parent}.{close[0]}?" if close else f"remove it; see `kubectl explain {explain}`"
        return FieldError(path, "unknown field", fix)
    if err["type"] == "missing":
        return FieldError(path, "required field is missing", f"add {path} (see `kubectl explain {explain}`)")
    got = err.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    return FieldError(path, f"{err['msg']}{shown}", f"see `kubectl explain {explain}` for the allowed values")


def rule_violations(obj: dict[str, Any]) -> list[FieldError]:
    """The CRD's CEL rules ``obj`` breaks (api/cel.py), as field errors with the rule's fix.

    ``parse_pddeployment`` checks the schema; this checks the rules the API server
    evaluates on top of it, so offline ``check`` refuses what ``kubectl apply`` would.
    """
    body = {k: v for k, v in obj.items() if k != "status"}
    return [FieldError(v.field, *_split_rule_message(v.field, v.message)) for v in violations(body)]


def _split_rule_message(field: str, message: str) -> tuple[str, str]:
    """A CEL message (written for kubectl: "<field>: <what>; <fix>") as (what, fix)."""
    head, colon, rest = message.partition(": ")
    if colon and " " not in head and (field == head or field.endswith("." + head)):
        message = rest  # the message names its field for kubectl; the problem names it already
    what, sep, fix = message.rpartition("; ")
    return (what, fix) if sep else (message, "change the field as the message says")


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every object of ``text`` as a dict: each YAML document, with ``kind: List`` (or
    ``...List``, as ``kubectl get -o yaml`` prints) expanded into its items.

    Raises ``yaml.YAMLError`` on bad YAML, on a document that is not a mapping, and when
    there is no object at all (an empty file is not a valid deployment).
    """
    docs: list[dict[str, Any]] = []
    for d in yaml.safe_load_all(text):
        if d is None:
            continue
        if not isinstance(d, dict):
            raise yaml.YAMLError(f"expected a mapping, got {type(d).__name__}")
        if str(d.get("kind", "")).endswith("List") and isinstance(d.get("items"), list):
            docs += [i for i in d["items"] if isinstance(i, dict)]
        else:
            docs.append(d)
    if not docs:
        raise yaml.YAMLError("no object in the input (empty, or only comments)")
    return docs
