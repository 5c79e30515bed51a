"""What each compat group records about the operator that rendered it (pure).

Every workload of a group (its prefill, decode and gateway Deployments, or a multi-node
role's LeaderWorkerSet) carries, in its own ``metadata.annotations`` (never in the pod
template, so writing them restarts no pod):

- ``rendered-by``: the operator version that rendered the group (``__version__``);
- ``rendered-generation``: the PDDeployment generation it was first rendered from (a later
  generation that renders it alike keeps the record: :func:`current_record`);
- ``rendered-hash``: :func:`render_hash` of what that operator rendered for the spec;
- ``rendered-spec``: the PDDeployment ``spec`` it was rendered from (compact JSON).

With them a newer operator can tell its own changes from the user's: it renders the
recorded spec itself, and when that equals what it renders for the current spec, the
user changed nothing the group is made of, so any difference from the running group is
the operator's own (``reconcilers/upgrade.py`` holds it until the user opts in,
``spec.rollout.operatorChanges``). A group made before 0.2.0 records nothing
(:data:`UNRECORDED`); the operator adopts it by writing the record once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .. import __version__
from .labels import DOMAIN

ANNOTATION_RENDERED_BY = f"{DOMAIN}/rendered-by"
ANNOTATION_RENDERED_GENERATION = f"{DOMAIN}/rendered-generation"
ANNOTATION_RENDERED_HASH = f"{DOMAIN}/rendered-hash"
ANNOTATION_RENDERED_SPEC = f"{DOMAIN}/rendered-spec"
#: The version and hash written when the operator adopts a group an operator before 0.2.0 made.
UNRECORDED = "unrecorded (before 0.2.0)"
#: Kinds whose metadata carries the record (a group's workloads).
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


@dataclass(frozen=True)
class RenderRecord:
    """What a group says about its rendering.

    ``operator_version``: the version that rendered it (or :data:`UNRECORDED`);
    ``generation``: the PDDeployment generation; ``render_hash``: :func:`render_hash` of
    that rendering (:data:`UNRECORDED` for an adopted group); ``spec``: the spec it came from.
    """

    operator_version: str
    generation: int
    render_hash: str
    spec: dict[str, Any]

    def annotations(self) -> dict[str, str]:
        """The record as annotations of a workload's metadata."""
        return {
            ANNOTATION_RENDERED_BY: self.operator_version,
            ANNOTATION_RENDERED_GENERATION: str(self.generation),
            ANNOTATION_RENDERED_HASH: self.render_hash,
            ANNOTATION_RENDERED_SPEC: canonical_json(self.spec),
        }


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys (the form hashed and recorded)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def read_record(annotations: dict[str, str] | None) -> RenderRecord | None:
    """The record in a workload's annotations, or None when it has none (a group made before 0.2.0)
    or it cannot be read (then the group is treated as unrecorded)."""
    a = annotations or {}
    if ANNOTATION_RENDERED_BY not in a or ANNOTATION_RENDERED_SPEC not in a:
        return None
    try:
        spec = json.loads(a[ANNOTATION_RENDERED_SPEC])
        generation = int(a.get(ANNOTATION_RENDERED_GENERATION) or 0)
    except ValueError:
        return None
    if not isinstance(spec, dict):
        return None
    return RenderRecord(operator_version=a[ANNOTATION_RENDERED_BY], generation=generation,
                        render_hash=a.get(ANNOTATION_RENDERED_HASH) or UNRECORDED, spec=spec)


def _without_replicas(obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("kind") not in WORKLOAD_KINDS or "replicas" not in obj.get("spec", {}):
        return obj
    return {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}


def render_hash(objects: list[dict[str, Any]]) -> str:
    """sha256 prefix of a group's rendered objects, replica counts left out.

    ``objects``: ``render.render_group(plan)`` of the spec alone (no owner, no kernel
    gate): counts move with scaling (kubectl scale, an HPA, the planner) and never make
    a rendering different.
    """
    text = canonical_json([_without_replicas(o) for o in objects])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamp(objects: list[dict[str, Any]], record: RenderRecord) -> list[dict[str, Any]]:
    """Copies of ``objects`` whose workloads carry ``record`` in their metadata annotations."""
    out = []
    for obj in objects:
        if obj.get("kind") in WORKLOAD_KINDS:
            meta = dict(obj["metadata"])
            meta["annotations"] = {**(meta.get("annotations") or {}), **record.annotations()}
            obj = {**obj, "metadata": meta}
        out.append(obj)
    return out


def current_record(*, generation: int, spec: dict[str, Any], objects: list[dict[str, Any]],
                   kept: RenderRecord | None = None) -> RenderRecord:
    """The record this operator writes for a group it renders from ``spec`` at ``generation``.

    ``kept``: the record the group's workloads carry now. When this operator wrote it and
    it has the same :func:`render_hash` as ``objects``, it is returned unchanged: a new
    generation that leaves the group's rendering as it is (a revert, an ``slo`` edit, a
    replica count) must not rewrite the workloads' annotations, because a changed
    annotation bumps a Deployment's ``metadata.generation`` (apps/v1's update strategy,
    pkg/registry/apps/deployment/strategy.go, copies annotations to ReplicaSets), and until
    the controller observes it the serving group reads as unsettled, i.e. not Ready.
    The kept record's spec may then be an earlier spec that renders alike; that is all
    ``reconcilers/upgrade.py`` needs of it.
    """
    digest = render_hash(objects)
    if kept is not None and kept.operator_version == __version__ and kept.render_hash == digest:
        return kept
    return RenderRecord(operator_version=__version__, generation=generation, render_hash=digest, spec=spec)
