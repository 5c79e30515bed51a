"""A KernelBuild's life, decided purely: start, await the result, succeed and reuse, retry with backoff, give up, expire."""

from __future__ import annotations

from helpers import load_example

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild.inputs import (
    LABEL_CREATED_BY,
    CREATED_BY_AUTO,
    LABEL_INPUT_HASH,
    kernel_build_inputs,
)
from sglang_pd_operator.kernelbuild.lifecycle import ObservedJob, decide, observe_job, parse_time, rfc3339
from sglang_pd_operator.kernelbuild.render import LABEL_ATTEMPT, job_name
from sglang_pd_operator.planning.plan import build_plan

T0 = 1_800_000_000.0


def _kb(**retry):
    plan = build_plan(parse_pddeployment(load_example()), builtin_catalog())
    kb = kernel_build_inputs(plan, "decode")
    spec = kb.spec
    if retry:
        spec = spec.model_copy(update={"retry": spec.retry.model_copy(update=retry)})
    return kb, spec


def _decide(kb, spec, *, previous=None, jobs=(), now=T0, generation=1, in_use=True, labels=None, input_hash=None):
    return decide(
        name=kb.name,
        spec=spec,
        generation=generation,
        labels=labels or {},
        previous=previous or {},
        input_hash=input_hash or kb.input_hash,
        inputs=kb.inputs,
        pvc=f"{kb.name}-cache",
        jobs=list(jobs),
        in_use=in_use,
        now=now,
    )


def _job(kb, attempt, *, state, result=None, finished=T0, input_hash=None):
    h = input_hash or kb.input_hash
    return ObservedJob(
        name=job_name(kb.name, h, attempt),
        attempt=attempt,
        input_hash=h,
        active=state == "active",
        succeeded=state == "succeeded",
        failed=state == "failed",
        failure_reason="BackoffLimitExceeded" if state == "failed" else "",
        failure_message="Job has reached the specified backoff limit" if state == "failed" else "",
        start_time=finished - 60,
        finish_time=None if state == "active" else finished,
        result=result,
    )


def _ok(kb, digest="sha256:" + "a" * 64):
    return {"ok": True, "digest": digest, "path": "sha256-" + "a" * 64, "sizeBytes": 10, "files": 2,
            "durationSeconds": 42.0, "inputHash": kb.input_hash, "complete": True, "writablePaths": ["deep_gemm/locks"]}  # fmt: skip


def test_first_reconcile_starts_attempt_one():
    kb, spec = _kb()
    d = _decide(kb, spec)
    assert d.create_attempt == 1 and d.status["phase"] == "Building"
    assert d.status["jobName"] == job_name(kb.name, kb.input_hash, 1)
    assert d.status["inputHash"] == kb.input_hash and d.status["inputs"] == kb.inputs
    assert {c["type"]: c["status"] for c in d.status["conditions"]} == {"Ready": "False", "Building": "True"}


def test_running_job_is_building_and_creates_nothing():
    kb, spec = _kb()
    d = _decide(kb, spec, previous=_decide(kb, spec).status, jobs=[_job(kb, 1, state="active")])
    assert d.create_attempt is None and d.status["phase"] == "Building" and not d.delete_jobs


def test_success_records_digest_size_duration_and_is_reused():
    kb, spec = _kb()
    d = _decide(kb, spec, jobs=[_job(kb, 1, state="succeeded", result=_ok(kb))], now=T0 + 5)
    st = d.status
    assert st["phase"] == "Succeeded" and st["digest"] == "sha256:" + "a" * 64 and st["sizeBytes"] == 10
    assert st["durationSeconds"] == 42.0 and st["complete"] is True and st["writablePaths"] == ["deep_gemm/locks"]
    assert st["completedAt"] == rfc3339(T0) and ("Normal", "BuildSucceeded") == d.events[0][:2]
    # equal inputs: reused, even without the Job, and even after a spec edit (new generation)
    again = _decide(kb, spec, previous=st, jobs=[], now=T0 + 3600, generation=2)
    assert again.status["phase"] == "Succeeded" and again.create_attempt is None and not again.events
    assert again.status["digest"] == st["digest"]


def test_completed_job_without_result_waits_then_fails():
    kb, spec = _kb()
    job = _job(kb, 1, state="succeeded", result=None)
    d = _decide(kb, spec, jobs=[job], now=T0 + 10)
    assert d.status["phase"] == "Building" and d.status["conditions"][0]["reason"] == "AwaitingResult"
    late = _decide(kb, spec, previous=d.status, jobs=[job], now=T0 + 301)
    assert late.status["phase"] == "Failed" and late.status["lastFailure"]["reason"] == "NoResult"


def test_failure_schedules_a_retry_with_exponential_backoff_then_gives_up():
    kb, spec = _kb(maxAttempts=3, backoff="10s", maxBackoff="15s")
    j1 = _job(kb, 1, state="failed", finished=T0)
    d = _decide(kb, spec, jobs=[j1], now=T0 + 1)
    st = d.status
    assert st["phase"] == "Failed" and st["failedAttempts"] == 1 and not st["retriesExhausted"]
    assert st["nextRetryAt"] == rfc3339(T0 + 10) and d.create_attempt is None
    assert st["lastFailure"]["reason"] == "BackoffLimitExceeded" and d.events[0][1] == "BuildFailed"
    assert st["conditions"][0]["reason"] == "RetryScheduled"
    # counted once, however often it is reconciled
    same = _decide(kb, spec, previous=st, jobs=[j1], now=T0 + 5)
    assert same.status["failedAttempts"] == 1 and not same.events
    # backoff over: attempt 2 starts, the failed Job is kept for logs
    d2 = _decide(kb, spec, previous=st, jobs=[j1], now=T0 + 10)
    assert d2.create_attempt == 2 and d2.status["phase"] == "Building" and not d2.delete_jobs
    assert ("Normal", "Retrying") == d2.events[0][:2]
    # attempt 2 fails: backoff doubles but is capped at maxBackoff (15s, not 20s)
    j2 = _job(kb, 2, state="failed", finished=T0 + 100)
    d3 = _decide(kb, spec, previous=d2.status, jobs=[j1, j2], now=T0 + 101)
    assert d3.status["failedAttempts"] == 2 and d3.status["nextRetryAt"] == rfc3339(T0 + 115)
    d4 = _decide(kb, spec, previous=d3.status, jobs=[j1, j2], now=T0 + 115)
    assert d4.create_attempt == 3 and d4.delete_jobs == (j1.name,)  # older failed attempts go
    j3 = _job(kb, 3, state="failed", finished=T0 + 200)
    d5 = _decide(kb, spec, previous=d4.status, jobs=[j2, j3], now=T0 + 201)
    assert d5.status["phase"] == "Failed" and d5.status["retriesExhausted"] is True
    assert d5.status["nextRetryAt"] is None and d5.create_attempt is None
    assert "3 of 3 attempts failed" in d5.status["message"] and d5.events[-1][1] == "RetriesExhausted"
    # nothing more happens later ...
    d6 = _decide(kb, spec, previous=d5.status, jobs=[j2, j3], now=T0 + 10_000)
    assert d6.create_attempt is None and d6.status["retriesExhausted"]
    # ... until the spec is edited: a new generation grants a fresh budget and retries at once
    d7 = _decide(kb, spec, previous=d5.status, jobs=[j2, j3], now=T0 + 10_000, generation=2)
    assert d7.create_attempt == 4 and d7.status["failedAttempts"] == 0 and not d7.status["retriesExhausted"]


def test_builder_reported_failure_is_the_message():
    kb, spec = _kb()
    result = {"ok": False, "step": "verify", "reason": "Incomplete", "message": "the cache still changed"}
    d = _decide(kb, spec, jobs=[_job(kb, 1, state="failed", result=result)], now=T0 + 1)
    assert (
        d.status["lastFailure"]["reason"] == "Incomplete" and "verify: the cache still changed" in d.status["message"]
    )


def test_changed_inputs_start_over_and_delete_old_jobs():
    kb, spec = _kb()
    done = _decide(kb, spec, jobs=[_job(kb, 1, state="succeeded", result=_ok(kb))]).status
    old_job = _job(kb, 1, state="succeeded", result=_ok(kb))
    d = _decide(kb, spec, previous=done, jobs=[old_job], input_hash="f" * 32)
    assert d.create_attempt == 1 and d.status["phase"] == "Building" and "digest" not in d.status
    assert d.delete_jobs == (old_job.name,) and d.events[0][1] == "InputsChanged"


def test_retention_deletes_unused_auto_builds_only():
    kb, spec = _kb()
    done = _decide(kb, spec, jobs=[_job(kb, 1, state="succeeded", result=_ok(kb))]).status
    auto = {LABEL_CREATED_BY: CREATED_BY_AUTO}
    d = _decide(kb, spec, previous=done, in_use=False, labels=auto, now=T0 + 10)
    assert d.status["unusedSince"] == rfc3339(T0 + 10) and not d.delete_self
    week = 168 * 3600
    assert not _decide(kb, spec, previous=d.status, in_use=False, labels=auto, now=T0 + 10 + week - 1).delete_self
    assert _decide(kb, spec, previous=d.status, in_use=False, labels=auto, now=T0 + 10 + week).delete_self
    # used again: the clock resets
    assert _decide(kb, spec, previous=d.status, in_use=True, labels=auto, now=T0 + week).status["unusedSince"] is None
    # unknown usage (listing failed): nothing changes
    assert _decide(kb, spec, previous=d.status, in_use=None, labels=auto, now=T0 + 2 * week).delete_self is False
    # a user's build is kept forever unless it sets spec.retention
    assert not _decide(kb, spec, previous=d.status, in_use=False, now=T0 + 10 * week).delete_self
    short = spec.model_copy(update={"retention": "1h"})
    assert _decide(kb, short, previous=d.status, in_use=False, now=T0 + 10 + 3600).delete_self


def test_observe_job_reads_conditions_labels_and_termination_message():
    kb, _ = _kb()
    job = {
        "metadata": {"name": "j", "labels": {LABEL_ATTEMPT: "2", LABEL_INPUT_HASH: kb.input_hash}},
        "status": {
            "startTime": "2027-01-15T08:00:00Z",
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2027-01-15T08:30:00Z"}],
        },
    }
    pod = {
        "metadata": {"creationTimestamp": "2027-01-15T08:00:00Z"},
        "status": {
            "containerStatuses": [
                {"name": "builder", "state": {"terminated": {"message": '{"ok": true, "digest": "d"}'}}}
            ]
        },
    }
    o = observe_job(job, [pod])
    assert (o.attempt, o.input_hash, o.succeeded, o.active, o.failed) == (2, kb.input_hash, True, False, False)
    assert o.result == {"ok": True, "digest": "d"}
    assert o.finish_time == parse_time("2027-01-15T08:30:00Z") and o.start_time == parse_time("2027-01-15T08:00:00Z")
    failed = {**job, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    f = observe_job(failed, [])
    assert f.failed and not f.succeeded and f.failure_reason == "DeadlineExceeded" and f.result is None
