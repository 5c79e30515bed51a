"""An edit of ``spec.slo`` alone restarts no engine.

The decode engines' latency histograms get boundaries at every SLO target
(``planning/buckets.py``: ``--bucket-*`` launch flags), so a new target would change the
decode pod template and restart every decode engine of the fleet, for a setting that only
changes how the operator reads their metrics (a fresh user's finding, issue 25). Instead,
when the serving group's record (``render/record.py``) shows that the spec it was rendered
from differs from the current one in ``slo`` alone, the plan keeps the buckets of the
recorded targets (:func:`keep_running_buckets`, ``planning.plan.with_bucket_targets``) as long
as nothing else would change the decode engines' configuration (their config hash): the
decode pods stay, and status says so with a warning on ``spec.slo``. The group's record then
names the targets its buckets follow (:meth:`HeldBuckets.recorded_spec`), so the buckets stay
held across later edits that leave the decode engines alone (a replica count, a prefill change). A target that is not a
boundary of the running buckets is measured by interpolation inside its bucket, whose width
``status.slo`` gives with each figure (``resolution``). The buckets follow the targets at the
decode role's next template change (any other spec change), or at once with
``spec.rollout.operatorChanges: apply``.

Pure: reads the observed group's record, the PDDeployment body and the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..api.v1alpha1 import SLOSpec
from ..planning.buckets import BUCKET_ROLE
from ..planning.plan import with_bucket_targets
from ..planning.problems import Problem
from ..planning.structs import Plan
from ..render.engine import config_hash
from ..render.record import canonical_json
from .observe import Observed

#: The rule name of the warning in ``status.problems``.
RULE = "slo_buckets_held"


@dataclass(frozen=True)
class HeldBuckets:
    """The decode engines keep the buckets of ``slo`` (None: SGLang's defaults), the targets of
    the spec the serving group was rendered from at ``generation``; ``raw``: that ``slo`` as
    the record holds it (JSON)."""

    slo: SLOSpec | None
    generation: int
    raw: Any = None

    def recorded_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``spec`` with the ``slo`` the buckets follow: what the group's record says it was rendered from."""
        out = {k: v for k, v in spec.items() if k != "slo"}
        return out if self.raw is None else {**out, "slo": self.raw}

    def problem(self) -> Problem:
        """The warning status shows while the buckets are held."""
        return Problem(
            field="spec.slo",
            message=(f"the decode engines keep the latency histogram buckets of the SLO targets of generation "
                     f"{self.generation}: an edit of spec.slo alone restarts no engine. A target that is not one of "
                     "their bucket boundaries is measured by interpolation inside its bucket (status.slo gives "
                     "each figure's resolution, the bucket's width)"),
            fix=("nothing is needed; the buckets follow the targets at the decode role's next template change, or at "
                 "once (the decode pods roll within rollout.maxSurgeGPUs) with spec.rollout.operatorChanges: apply"),
            rule=RULE,
            severity="warning",
        )


def held_buckets(*, spec: dict[str, Any], observed: Observed) -> HeldBuckets | None:
    """The recorded targets whose buckets the serving decode engines run with, when ``spec.slo`` differs.

    None when: there is no serving group or it records nothing (made before 0.2.0); the
    user opted in (``spec.rollout.operatorChanges: apply``); the recorded ``slo`` equals
    ``spec.slo`` or no longer parses.
    """
    group = observed.groups.get(observed.serving_key or "")
    record = group.record if group is not None else None
    if record is None or ((spec.get("rollout") or {}).get("operatorChanges") == "apply"):
        return None
    if canonical_json(record.spec.get("slo")) == canonical_json(spec.get("slo")):
        return None
    raw = record.spec.get("slo")
    try:
        slo = SLOSpec.model_validate(raw) if raw is not None else None
    except ValidationError:
        return None
    return HeldBuckets(slo=slo, generation=record.generation, raw=raw)


def keep_running_buckets(plan: Plan, *, spec: dict[str, Any], observed: Observed) -> tuple[Plan, HeldBuckets | None]:
    """``plan`` with the serving decode engines' buckets when that alone keeps their configuration.

    Returns (the plan to render, the hold) or (``plan``, None): the hold applies when
    :func:`held_buckets` finds one and the decode role planned with those buckets has the
    config hash the serving decode workload's pod template carries (no other change would
    restart the decode engines). The returned plan carries the :meth:`HeldBuckets.problem` warning.
    """
    held = held_buckets(spec=spec, observed=observed)
    if held is None:
        return plan, None
    group = observed.groups[observed.serving_key or ""]
    live = group.workloads.get(BUCKET_ROLE)
    kept = with_bucket_targets(plan, held.slo, held.problem())
    role = kept.role(BUCKET_ROLE)
    if live is None or not live.config_hash or config_hash(role, role.inputs.runtime.image) != live.config_hash:
        return plan, None
    return kept, held
