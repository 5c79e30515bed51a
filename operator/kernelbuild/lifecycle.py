"""A KernelBuild's life (pure): observed Jobs and previous status -> next status and actions.

Level-triggered like every reconcile here: given what exists now, :func:`decide` says
what the status should read, which attempt's Job to create, which Jobs to delete and
whether the build itself is past its retention. The reconciler
(``reconcilers/kernelbuild.py``) only observes and carries the decision out, so every
rule below is unit-tested without a cluster.

Rules:

- **Reuse.** A build that Succeeded for its current inputs is never rebuilt. A change of
  inputs (the input hash) starts over: new attempts, Jobs of the old inputs deleted.
- **Result.** A Job that completed is a success only with the builder's result (the
  termination message of its pod, :func:`sglang_pd_operator.kernelbuild.builder.decode_result`)
  for these inputs. Without one after :data:`RESULT_TIMEOUT_S` it counts as failed (NoResult).
- **Retry.** Each attempt is its own Job (``backoffLimit: 0``). A failed attempt waits
  ``retry.backoff * 2**(n-1)`` (at most ``retry.maxBackoff``) before the next one, up to
  ``retry.maxAttempts`` failures; then the phase stays Failed with ``retriesExhausted``.
  A new generation (any spec edit) grants a fresh budget. The last failed Job is kept
  for ``kubectl logs``; older ones are deleted.
- **Retention.** ``unusedSince`` records since when no PDDeployment uses the build; after
  the retention period (``spec.retention``; default 168h for builds ``kernels.cache:
  auto`` created, none for builds a user created) the build is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, UTC
from typing import Any

from ..api.kernelbuild import KernelBuildSpec
from ..api.v1alpha1 import parse_duration
from .builder import decode_result
from .inputs import CREATED_BY_AUTO, LABEL_CREATED_BY, LABEL_INPUT_HASH
from .render import LABEL_ATTEMPT, job_name

RESULT_TIMEOUT_S = 300.0
AUTO_RETENTION = "168h"


def rfc3339(t: float | None) -> str | None:
    """Seconds since the epoch as an RFC 3339 UTC string (None stays None)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: Any) -> float | None:
    """An RFC 3339 string (or a datetime from the client) as seconds since the epoch; None when absent or bad."""
    if text is None:
        return None
    if isinstance(text, datetime):
        return text.timestamp() if text.tzinfo else text.replace(tzinfo=UTC).timestamp()
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class ObservedJob:
    """What one build Job (and its pod) says."""

    name: str
    attempt: int
    input_hash: str
    active: bool
    succeeded: bool
    failed: bool
    failure_reason: str = ""
    failure_message: str = ""
    start_time: float | None = None
    finish_time: float | None = None
    result: dict[str, Any] | None = field(default=None, hash=False)


def _condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def pod_result(pods: list[dict[str, Any]], container: str = "builder") -> dict[str, Any] | None:
    """The builder's result from the newest pod's termination message, or None."""
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            term = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated")) or {}
            result = decode_result(term.get("message"))
            if result is not None:
                return result
    return None


def observe_job(job: dict[str, Any], pods: list[dict[str, Any]]) -> ObservedJob:
    """Parse a Job dict and its pods into an :class:`ObservedJob` (pure)."""
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    labels = meta.get("labels") or {}
    complete = _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet")
    failed = _condition(job, "Failed")
    finished = failed or complete
    try:
        attempt = int(labels.get(LABEL_ATTEMPT, "0"))
    except ValueError:
        attempt = 0
    return ObservedJob(
        name=meta.get("name", ""),
        attempt=attempt,
        input_hash=labels.get(LABEL_INPUT_HASH, ""),
        active=finished is None,
        succeeded=complete is not None and failed is None,
        failed=failed is not None,
        failure_reason=(failed or {}).get("reason") or "",
        failure_message=(failed or {}).get("message") or "",
        start_time=parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp")),
        finish_time=parse_time((finished or {}).get("lastTransitionTime")) or parse_time(status.get("completionTime")),
        result=pod_result(pods),
    )


@dataclass(frozen=True)
class Decision:
    """What the reconciler should do: write ``status``, create ``create_attempt``'s Job, delete Jobs or itself."""

    status: dict[str, Any]
    create_attempt: int | None = None
    delete_jobs: tuple[str, ...] = ()
    delete_self: bool = False
    events: tuple[tuple[str, str, str], ...] = ()


def retention_seconds(spec: KernelBuildSpec, labels: dict[str, str]) -> float | None:
    """Retention of a build: spec.retention, else 168h when ``kernels.cache: auto`` created it, else never (None)."""
    if spec.retention is not None:
        return parse_duration(spec.retention)
    if labels.get(LABEL_CREATED_BY) == CREATED_BY_AUTO:
        return parse_duration(AUTO_RETENTION)
    return None


def backoff_seconds(spec: KernelBuildSpec, failed_attempts: int) -> float:
    """Wait after the ``failed_attempts``-th failure: backoff * 2**(n-1), at most maxBackoff."""
    base = parse_duration(spec.retry.backoff)
    return min(parse_duration(spec.retry.maxBackoff), base * (2 ** max(0, failed_attempts - 1)))


def _conditions(phase: str, reason: str, message: str, generation: int, previous: list[dict], now: float) -> list[dict]:
    wanted = {
        "Ready": ("True" if phase == "Succeeded" else "False", reason, message),
        "Building": ("True" if phase in ("Pending", "Building") else "False", reason, message),
    }
    old = {c.get("type"): c for c in previous or []}
    out = []
    for type_, (status, r, m) in wanted.items():
        prev = old.get(type_) or {}
        changed = prev.get("status") != status
        out.append(
            {
                "type": type_,
                "status": status,
                "reason": r,
                "message": m,
                "observedGeneration": generation,
                "lastTransitionTime": rfc3339(now)
                if changed or not prev.get("lastTransitionTime")
                else prev["lastTransitionTime"],
            }
        )
    return out


def invalid(*, previous: dict[str, Any], generation: int, field_path: str, message: str, now: float) -> Decision:
    """A spec the operator cannot build (unknown recipe, accelerator or plugin): Failed, nothing created."""
    text = f"{field_path}: {message}"
    status = {
        **{k: v for k, v in previous.items() if k not in ("nextRetryAt",)},
        "phase": "Failed",
        "observedGeneration": generation,
        "message": text,
        "retriesExhausted": True,
        "nextRetryAt": None,
        "conditions": _conditions("Failed", "InvalidSpec", text, generation, previous.get("conditions") or [], now),
    }
    return Decision(status=status, events=(("Warning", "InvalidSpec", text),))


def decide(
    *,
    name: str,
    spec: KernelBuildSpec,
    generation: int,
    labels: dict[str, str],
    previous: dict[str, Any],
    input_hash: str,
    inputs: dict[str, Any],
    pvc: str,
    jobs: list[ObservedJob],
    in_use: bool | None,
    now: float,
    result_timeout_s: float = RESULT_TIMEOUT_S,
) -> Decision:
    """The next status and actions of one KernelBuild (see the module docstring for the rules)."""
    prev = dict(previous or {})
    same_inputs = prev.get("inputHash") == input_hash
    events: list[tuple[str, str, str]] = []
    ours = sorted((j for j in jobs if j.input_hash == input_hash), key=lambda j: j.attempt)
    stale = [j.name for j in jobs if j.input_hash != input_hash]
    latest = ours[-1] if ours else None

    st: dict[str, Any] = {
        "inputHash": input_hash,
        "inputs": inputs,
        "pvcName": pvc,
        "observedGeneration": generation,
    }
    keep = ("digest", "path", "sizeBytes", "files", "durationSeconds", "complete", "writablePaths", "completedAt",
            "attempts", "failedAttempts", "lastFailure", "nextRetryAt", "retriesExhausted", "startedAt", "jobName")  # fmt: skip
    if same_inputs:
        st.update({k: prev[k] for k in keep if k in prev})
    elif prev.get("inputHash"):
        events.append(
            (
                "Normal",
                "InputsChanged",
                f"inputs changed ({prev['inputHash'][:10]} -> {input_hash[:10]}): building anew",
            )
        )
    attempts = max(int(st.get("attempts") or 0), latest.attempt if latest else 0)
    failed_attempts = int(st.get("failedAttempts") or 0)
    if prev.get("observedGeneration") not in (None, generation):
        failed_attempts = 0  # a new generation grants a fresh retry budget
        st["retriesExhausted"] = False
    last_failure = st.get("lastFailure") or None
    create: int | None = None
    delete = list(stale)

    def failure(job: ObservedJob, reason: str, message: str, at: float | None = None) -> None:
        nonlocal failed_attempts, last_failure
        if (last_failure or {}).get("attempt") != job.attempt:
            failed_attempts += 1
            when = rfc3339(at if at is not None else (job.finish_time or now))
            last_failure = {"attempt": job.attempt, "reason": reason, "message": message[-2000:], "at": when}
            events.append(("Warning", "BuildFailed", f"attempt {job.attempt} failed: {reason}: {message[-300:]}"))

    if prev.get("phase") == "Succeeded" and same_inputs and prev.get("digest"):
        phase, reason, message = "Succeeded", "Succeeded", f"cache {prev['digest']} published at {prev.get('path')}"
    elif latest is not None and latest.active:
        phase, reason, message = "Building", "Building", f"attempt {latest.attempt} running (Job {latest.name})"
        st["jobName"], st["startedAt"] = latest.name, rfc3339(latest.start_time)
    else:
        phase = reason = message = ""
        if latest is not None and latest.succeeded:
            result = latest.result
            if result and result.get("ok") and result.get("inputHash") == input_hash:
                phase, reason = "Succeeded", "Succeeded"
                st.update(
                    {
                        "digest": result.get("digest"),
                        "path": result.get("path"),
                        "sizeBytes": result.get("sizeBytes"),
                        "files": result.get("files"),
                        "durationSeconds": result.get("durationSeconds"),
                        "complete": bool(result.get("complete")),
                        "writablePaths": list(result.get("writablePaths") or []),
                        "completedAt": rfc3339(latest.finish_time or now),
                        "jobName": latest.name,
                        "nextRetryAt": None,
                        "retriesExhausted": False,
                    }
                )
                message = f"cache {st['digest']} published at {st['path']} ({st['sizeBytes']} bytes)"
                events.append(("Normal", "BuildSucceeded", message))
                delete += [j.name for j in ours if j.failed]
            elif result and not result.get("ok"):
                failure(
                    latest,
                    str(result.get("reason") or "BuildFailed"),
                    f"{result.get('step')}: {result.get('message', '')}",
                )
            elif result and result.get("inputHash") != input_hash:
                failure(
                    latest,
                    "WrongInputs",
                    f"the builder reported inputs {result.get('inputHash')}, expected {input_hash}",
                )
            elif now - (latest.finish_time or now) < result_timeout_s:
                phase, reason = "Building", "AwaitingResult"
                message = (
                    f"Job {latest.name} completed; waiting for the builder's result in its pod's termination message"
                )
                st["jobName"] = latest.name
            else:
                failure(
                    latest,
                    "NoResult",
                    f"Job {latest.name} completed without a builder result in {result_timeout_s:.0f}s",
                    at=now,
                )
        elif latest is not None and latest.failed:
            result = latest.result or {}
            if result and not result.get("ok"):
                failure(
                    latest,
                    str(result.get("reason") or "BuildFailed"),
                    f"{result.get('step')}: {result.get('message', '')}",
                )
            else:
                failure(latest, latest.failure_reason or "JobFailed", latest.failure_message or "the build Job failed")

        if not phase:
            max_attempts = spec.retry.maxAttempts
            if last_failure and failed_attempts >= max_attempts and (latest is None or not latest.active):
                phase, reason = "Failed", "RetriesExhausted"
                message = (
                    f"attempt {last_failure['attempt']} failed ({last_failure['reason']}): {last_failure['message'][-500:]}; "
                    f"{failed_attempts} of {max_attempts} attempts failed: edit the spec or delete the KernelBuild to retry"
                )
                if not st.get("retriesExhausted"):
                    events.append(("Warning", "RetriesExhausted", message))
                st["retriesExhausted"], st["nextRetryAt"] = True, None
            else:
                failed_at = parse_time((last_failure or {}).get("at")) if last_failure else None
                retry_at = failed_at + backoff_seconds(spec, failed_attempts) if failed_at is not None else now
                if last_failure and now < retry_at:
                    phase, reason = "Failed", "RetryScheduled"
                    message = (
                        f"attempt {last_failure['attempt']} failed ({last_failure['reason']}): "
                        f"{last_failure['message'][-500:]}; attempt {attempts + 1} starts at {rfc3339(retry_at)}"
                    )
                    st["nextRetryAt"] = rfc3339(retry_at)
                else:
                    create = attempts + 1
                    attempts = create
                    phase, reason = "Building", "Building"
                    message = f"attempt {create} started"
                    st.update({"nextRetryAt": None, "startedAt": rfc3339(now), "retriesExhausted": False})
                    if last_failure:
                        events.append(
                            (
                                "Normal",
                                "Retrying",
                                f"attempt {create} (failures so far {failed_attempts} of {max_attempts})",
                            )
                        )
                    # keep the last failed Job for `kubectl logs`; older attempts go
                    delete += [j.name for j in ours if j.failed and latest is not None and j.attempt < latest.attempt]
        if create is not None:
            st["jobName"] = job_name(name, input_hash, create)

    st["attempts"], st["failedAttempts"], st["lastFailure"] = attempts, failed_attempts, last_failure
    st["phase"], st["message"] = phase, message
    st["retriesExhausted"] = bool(st.get("retriesExhausted"))

    # retention
    delete_self = False
    if in_use is True:
        st["unusedSince"] = None
    elif in_use is False:
        st["unusedSince"] = prev.get("unusedSince") or rfc3339(now)
        keep_s = retention_seconds(spec, labels)
        since = parse_time(st["unusedSince"])
        if keep_s is not None and since is not None and now - since >= keep_s:
            delete_self = True
            events.append(
                ("Normal", "RetentionExpired", f"unused since {st['unusedSince']} (retention {keep_s:.0f}s): deleting")
            )
    else:
        st["unusedSince"] = prev.get("unusedSince")
    st["conditions"] = _conditions(phase, reason, message, generation, prev.get("conditions") or [], now)
    return Decision(
        status=st,
        create_attempt=create,
        delete_jobs=tuple(dict.fromkeys(delete)),
        delete_self=delete_self,
        events=tuple(events),
    )
