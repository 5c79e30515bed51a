"""Read PDDeployment objects from YAML or dicts, turning validation errors into field-named problems.

Used by the CLI (``check``, ``render``) and by the reconciler on the object it receives.
The CRD schema refuses most of these errors at ``kubectl apply`` already; this is the
same check for files that never went through an API server (GitOps pre-merge checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

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
        errors = []
        for err in e.errors():
            loc = [p for p in err["loc"] if p not in ("function-after",)]
            path = _path(loc)
            explain = "pdd." + path if path.startswith("spec") else "pdd"
            errors.append(FieldError(path, err["msg"], f"see `kubectl explain {explain}` for the allowed values"))
        raise SpecError(errors) from e
    return pdd


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
    """Every non-empty YAML document of ``text`` as a dict; raises ``yaml.YAMLError`` on bad YAML."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise yaml.YAMLError(f"expected a mapping, got {type(d).__name__}")
    return docs
