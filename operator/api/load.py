"""Read PDDeployment objects from YAML or dicts, turning validation errors into field-named problems.

Used by the CLI (``check``, ``render``) and by the reconciler on the object it receives.
The CRD schema refuses most of these errors at ``kubectl apply`` already; this is the
same check for files that never went through an API server (GitOps pre-merge checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from .v1alpha1 import API_VERSION, PDDeployment


@dataclass(frozen=True)
class FieldError:
    """A schema error: the field path (``spec.decode.parallelism.tp``) and the message."""

    field: str
    message: str


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
    the object's root (``spec.kvLayout.pageSize``).
    """
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != "PDDeployment":
        raise SpecError(
            [FieldError("apiVersion", f"expected apiVersion {API_VERSION} and kind PDDeployment, got "
                        f"{obj.get('apiVersion')!r} {obj.get('kind')!r}")]
        )
    try:
        return PDDeployment.model_validate({k: v for k, v in obj.items() if k != "status"})
    except ValidationError as e:
        errors = []
        for err in e.errors():
            loc = [p for p in err["loc"] if p not in ("function-after",)]
            errors.append(FieldError(_path(loc), err["msg"]))
        raise SpecError(errors) from e


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``text`` as a dict; raises ``yaml.YAMLError`` on bad YAML."""
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise yaml.YAMLError(f"expected a mapping, got {type(d).__name__}")
    return docs
