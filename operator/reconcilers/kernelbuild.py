"""Reconcile one KernelBuild: validate -> resolve inputs -> ensure storage -> observe Jobs -> decide -> act -> status.

Level-triggered and idempotent, like the PDDeployment reconciler: it reads the object,
its Jobs and their pods, lets the pure :func:`sglang_pd_operator.kernelbuild.lifecycle.decide`
say what to do, does it, and writes status only when it changed. Children (the cache PVC,
the request ConfigMap, one Job per attempt) carry an owner reference to the KernelBuild,
so deleting it (by hand, or by retention) collects them.

Also here: :func:`ensure_kernelbuild` (create-if-missing, for ``kernels.cache: auto``)
and :func:`builds_in_use` (which KernelBuilds the namespace's PDDeployments use, for
retention).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiException
from pydantic import ValidationError

from ..api.kernelbuild import KIND, parse_kernelbuild
from ..api.load import SpecError, parse_pddeployment
from ..api.v1alpha1 import API_VERSION
from ..catalog import Catalog
from ..kernelbuild.gate import required_builds
from ..kernelbuild.inputs import LABEL_KERNELBUILD, KernelBuildError, spec_inputs
from ..kernelbuild.lifecycle import Decision, decide, invalid, observe_job, parse_time
from ..kernelbuild.recipes import BuildCatalog, builtin_build_catalog
from ..kernelbuild.render import build_request, owner_of, pvc_name, render_job, render_pvc, render_request
from ..planning.plan import build_plan
from .drift import merge_patch
from .kube import Kube

log = logging.getLogger(__name__)

JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


@dataclass
class KernelBuildOutcome:
    """What one reconcile did. ``next_retry_at``: Unix time of the next attempt of a failed
    build waiting out its backoff (status ``nextRetryAt``), else None."""

    phase: str | None = None
    next_retry_at: float | None = None
    writes: int = 0
    created_job: str | None = None
    deleted: bool = False
    events: list[tuple[str, str, str]] = field(default_factory=list)


def builds_in_use(kube: Kube, namespace: str, catalog: Catalog, builds: BuildCatalog | None = None) -> set[str] | None:
    """Names of the KernelBuilds the PDDeployments of ``namespace`` use; None when they cannot be listed.

    Each PDDeployment is planned (pure) to find its builds (:func:`~sglang_pd_operator.kernelbuild.gate.required_builds`);
    one that does not parse keeps nothing alive.
    """
    try:
        items = kube.list(API_VERSION, "PDDeployment", namespace, "")
    except ApiException as e:
        log.warning("kernelbuild retention: cannot list PDDeployments in %s: %s", namespace, e)
        return None
    used: set[str] = set()
    for body in items:
        try:
            plan = build_plan(parse_pddeployment(body), catalog)
        except SpecError:
            continue
        used |= required_builds(plan, builds=builds)
    return used


def ensure_kernelbuild(kube: Kube, manifest: dict[str, Any]) -> bool:
    """Create the KernelBuild ``manifest`` unless one of that name exists; True when it created it.

    Never updates an existing build: two PDDeployments with equal inputs share one build,
    and fields outside the inputs (the weights' PVC, say) stay as the first one set them.
    """
    meta = manifest["metadata"]
    if kube.get(API_VERSION, KIND, meta["name"], meta["namespace"]) is not None:
        return False
    return kube.apply(manifest, live=None, fetch=False)


def _pods_by_job(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        job = next((labels[k] for k in JOB_NAME_LABELS if k in labels), None)
        if job:
            out.setdefault(job, []).append(pod)
    return out


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in (status or {}).items() if v is not None}


def reconcile(
    *,
    kube: Kube,
    body: dict[str, Any],
    catalog: Catalog,
    builds: BuildCatalog | None = None,
    in_use: bool | None = None,
    now: float | None = None,
    builder_image: str | None = None,
) -> KernelBuildOutcome:
    """Converge one KernelBuild ``body`` (a dict as read from the API).

    ``in_use``: whether a PDDeployment uses this build (None: unknown, retention waits).
    """
    now = time.time() if now is None else now
    before = kube.total_writes
    meta = body["metadata"]
    name, namespace, generation = meta["name"], meta["namespace"], int(meta.get("generation") or 0)
    labels = meta.get("labels") or {}
    previous = body.get("status") or {}
    builds = builds or builtin_build_catalog()
    outcome = KernelBuildOutcome()

    # 1. validate the object and resolve its inputs against the catalogs
    try:
        kb = parse_kernelbuild(body)
        resolved, inputs, input_hash = spec_inputs(kb.spec, builds=builds, catalog=catalog)
    except ValidationError as e:
        first = e.errors()[0]
        where = (
            "spec." + ".".join(str(p) for p in first["loc"][1:])
            if first["loc"][:1] == ("spec",)
            else ".".join(map(str, first["loc"]))
        )
        decision = invalid(previous=previous, generation=generation, field_path=where, message=first["msg"], now=now)
        return _finish(kube, body, previous, decision, outcome, before)
    except KernelBuildError as e:
        decision = invalid(previous=previous, generation=generation, field_path=e.field, message=e.message, now=now)
        return _finish(kube, body, previous, decision, outcome, before)
    spec = kb.spec
    accelerator = catalog.accelerator(spec.accelerator)
    assert accelerator is not None  # resolve() refused unknown accelerators
    owner = owner_of(body)

    # 2. observe this build's Jobs and their pods (the builder's result is in the pod)
    selector = f"{LABEL_KERNELBUILD}={name}"
    jobs = kube.list("batch/v1", "Job", namespace, selector)
    pods = _pods_by_job(kube.list("v1", "Pod", namespace, selector))
    observed = [observe_job(j, pods.get(j["metadata"]["name"], [])) for j in jobs]

    # 3. decide: reuse, await, retry with backoff, give up, or expire
    decision = decide(
        name=name,
        spec=spec,
        generation=generation,
        labels=labels,
        previous=previous,
        input_hash=input_hash,
        inputs=inputs,
        pvc=pvc_name(name),
        jobs=observed,
        in_use=in_use,
        now=now,
    )
    if decision.delete_self:
        kube.delete(API_VERSION, KIND, name, namespace)
        outcome.deleted = True
        return _finish(kube, body, previous, decision, outcome, before, write_status=False)

    # 4. storage and the request before any Job needs them (create-only: PVC specs are immutable)
    pvc = render_pvc(name=name, namespace=namespace, spec=spec, owner=owner)
    if kube.get("v1", "PersistentVolumeClaim", pvc["metadata"]["name"], namespace) is None:
        kube.apply(pvc, fetch=False)
    request = build_request(name=name, spec=spec, resolved=resolved, input_hash=input_hash)
    kube.apply(render_request(name=name, namespace=namespace, request=request, owner=owner))

    # 5. act: start the next attempt, remove stale or superseded Jobs
    if decision.create_attempt is not None:
        job = render_job(
            name=name,
            namespace=namespace,
            spec=spec,
            accelerator=accelerator,
            input_hash=input_hash,
            attempt=decision.create_attempt,
            owner=owner,
            builder_image=builder_image,
        )
        if kube.get("batch/v1", "Job", job["metadata"]["name"], namespace) is None:
            kube.apply(job, fetch=False)
        outcome.created_job = job["metadata"]["name"]
    for job_name in decision.delete_jobs:
        kube.delete("batch/v1", "Job", job_name, namespace)

    # 6. status (only when changed) and events
    return _finish(kube, body, previous, decision, outcome, before)


def _finish(
    kube: Kube,
    body: dict[str, Any],
    previous: dict[str, Any],
    decision: Decision,
    outcome: KernelBuildOutcome,
    before: int,
    *,
    write_status: bool = True,
) -> KernelBuildOutcome:
    meta = body["metadata"]
    if write_status:
        patch = merge_patch(_comparable(previous), _comparable(decision.status))
        if patch:
            try:
                kube.patch_status(API_VERSION, KIND, meta["name"], meta["namespace"], patch)
            except ApiException as e:
                if e.status != 404:  # deleted meanwhile: nothing to report on
                    raise
    for type_, reason, message in decision.events:
        outcome.events.append((type_, reason, message))
        try:
            kube.event(body, type_=type_, reason=reason, message=message)
        except Exception as e:  # events are best effort
            log.warning("could not record event %s on KernelBuild %s: %s", reason, meta["name"], e)
    outcome.phase = decision.status.get("phase")
    outcome.next_retry_at = parse_time(decision.status.get("nextRetryAt"))
    outcome.writes = kube.total_writes - before
    return outcome
