"""A spec small enough for the record the operator keeps of it in each workload.

Every workload of a group (its Deployments and LeaderWorkerSets) carries the spec it was
rendered from in ``metadata.annotations`` (``pd.sglang-operator.io/rendered-spec``, compact
JSON with ASCII escapes: ``render/record.py``), and the API server allows 262,144 bytes of
annotations per object (apimachinery ``ValidateAnnotationsSize``, ``TotalAnnotationSizeLimitB``).
A PDDeployment the API server accepts (its own limit is the 3 MiB request body) whose
record does not fit makes every workload refused: the CRD differential found it (issue 26).
The CRD cannot see it (a CEL rule has no size of an object), so ``check`` and the operator
refuse it here (rule ``spec_size``), naming the part of the spec that makes it large.
"""

from __future__ import annotations

import json
from typing import Any

from .problems import Problem

#: The API server's limit on the annotations of one object (keys and values, bytes).
ANNOTATIONS_LIMIT = 262_144
#: The largest spec (its record's bytes) ``check`` accepts: the annotation limit less 32 KiB for the
#: record's other annotations and the fields the API server's defaulting adds to the spec it records.
MAX_SPEC_BYTES = ANNOTATIONS_LIMIT - 32 * 1024


def record_bytes(value: Any) -> int:
    """Bytes of ``value`` as the record writes it (``render.record.canonical_json``: sorted keys, compact, ASCII)."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":")))


def _largest_part(node: Any, path: str) -> tuple[str, int]:
    """The field that makes ``node`` large: the child holding more than half of it, descended while one does."""
    size = record_bytes(node)
    children = (node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ())
    best = max(((k, record_bytes(v)) for k, v in children), key=lambda kv: kv[1], default=None)
    if best is None or best[1] * 2 <= size:
        return path, size
    key = best[0]
    sub = f"{path}[{key}]" if isinstance(node, list) else f"{path}.{key}"
    return _largest_part(node[key], sub)


def spec_size_problem(obj: dict[str, Any]) -> Problem | None:
    """The ``spec_size`` error of a PDDeployment whose spec would not fit in its workloads' annotations, or None."""
    spec = obj.get("spec") if isinstance(obj, dict) else None
    try:
        size = record_bytes(spec)
    except (TypeError, ValueError):  # not JSON: the schema says what is wrong
        return None
    if size <= MAX_SPEC_BYTES:
        return None
    field, part = _largest_part(spec, "spec")
    return Problem(
        field=field,
        message=(f"the spec is {size:,} bytes as the operator records it ({part:,} of them in {field}); each "
                 f"workload carries that record in its annotations, which the API server limits to "
                 f"{ANNOTATIONS_LIMIT:,} bytes, so every Deployment and LeaderWorkerSet would be refused"),
        fix=f"shorten {field} so the spec is at most {MAX_SPEC_BYTES:,} bytes (a value too large for an env "
            "variable or flag belongs in a ConfigMap or Secret mounted as a file)",
        rule="spec_size",
    )
