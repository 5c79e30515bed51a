"""SGLang's verdict in front of every new generation: the operator's side of the oracle service.

With ``run --oracle-url`` a generation whose rules pass waits for SGLang's verdict (the
service of ``oracle serve``, :mod:`..oracle.service`) before the reconcile creates or
changes a child. The verdict is asked off the reconcile thread: :class:`VerdictBook`
posts the request on its own small thread pool, and when the answer arrives it calls
``on_answer(namespace, name)`` (the control loop queues the deployment again), so a
reconcile worker never blocks on SGLang.

:func:`gate` is the pure decision: from the book's state for the plan's judged key
(:func:`..oracle.service.judged_key`, the service's cache key), what the previous status
remembers (``status.sglang``: a later generation with the same key is not asked again,
also after an operator restart), the policy (``spec.oracle`` over the operator's
defaults) and the clock, it says whether the reconcile goes on and what status and
events say:

- accepted: go on; ``Valid`` True, reason ``SGLangAccepted``.
- refused: hold; ``Valid`` False, reason ``SGLangRefused`` naming the role, stage and
  SGLang's own message (also one entry of ``status.problems`` per refusal), a Warning event.
- no verdict yet (asked, unreachable, 503/504, indeterminate): hold with ``Valid``
  Unknown, reason ``AwaitingSGLangVerdict`` saying why, for at most ``maxWait``; then
  ``wait``: hold with ``Valid`` False, reason ``SGLangUnavailable`` (asked again), or
  ``rulesOnly``: go on, ``Valid`` True, reason ``RulesOnly`` and a Warning event. Never a
  silent accept.

An indeterminate verdict (``accepted`` None: the oracle could not judge, which may be
transient, e.g. a bootstrap request that timed out on a loaded machine) counts as no
verdict: the book forgets it after ``retry_s`` like an unreachable service's error, so
the key is asked again (the service keeps it only briefly too:
``oracle.service.DEFAULT_INDETERMINATE_TTL_S``), and the same ``maxWait`` and policy apply.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from ..api.v1alpha1 import parse_duration
from ..oracle.service import API_PATH
from ..planning.problems import Problem
from ..planning.rules.fields import field_named_in
from ..planning.structs import Plan

log = logging.getLogger(__name__)

POLICIES = ("wait", "rulesOnly")
DEFAULT_POLICY = "wait"
DEFAULT_MAX_WAIT_S = 300.0
#: Seconds between two asks for a key that got no determinate verdict (unreachable, 503, 504, indeterminate).
RETRY_S = 5.0
#: How long one HTTP request may take (the service's own request timeout is 120 s).
REQUEST_TIMEOUT_S = 150.0

REASON_AWAITING = "AwaitingSGLangVerdict"
REASON_REFUSED = "SGLangRefused"
REASON_ACCEPTED = "SGLangAccepted"
REASON_UNAVAILABLE = "SGLangUnavailable"
REASON_RULES_ONLY = "RulesOnly"


@dataclass(frozen=True)
class Answer:
    """The service's answer for one judged key: ``verdict`` (the ``sglang`` JSON of
    ``check --sglang -o json``) or ``error`` (why there is none), and when it came (Unix s)."""

    verdict: dict[str, Any] | None
    error: str | None
    at: float

    @property
    def accepted(self) -> bool | None:
        """True / False from SGLang, None without a determinate verdict."""
        return None if self.verdict is None else self.verdict.get("accepted")


class OracleClient:
    """POSTs one PDDeployment to the service at ``url`` (``http://host:port``) and returns its JSON answer.

    Raises :class:`OracleUnreachable` with a one-line reason for anything but a 200
    (connection refused, timeout, the service's 4xx/5xx with its ``error``).
    """

    def __init__(self, url: str, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def ask(self, obj: dict[str, Any], catalog_overrides: dict[str, str] | None) -> dict[str, Any]:
        """SGLang's answer on ``obj`` (apiVersion, kind, metadata name/namespace and spec only are sent)."""
        meta = obj.get("metadata") or {}
        body = {"object": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                           "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
                           "spec": obj.get("spec")},
                "catalogOverrides": catalog_overrides or None}
        req = urllib.request.Request(self.url + API_PATH, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                why = json.load(e).get("error") or e.reason
            except (ValueError, AttributeError):
                why = e.reason
            raise OracleUnreachable(f"the oracle service answered {e.code}: {why}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise OracleUnreachable(f"the oracle service at {self.url} is unreachable: {reason}") from None


class OracleUnreachable(RuntimeError):
    """No answer from the oracle service (the message says why, in one line)."""


@dataclass
class VerdictBook:
    """Answers by judged key, asked on a thread pool; one owner of the oracle's state in the operator.

    ``ask(key, ...)`` returns at once; the answer (or the failure) lands in the book and
    ``on_answer(namespace, name)`` is called for every deployment that waits for that key.
    An answer without SGLang's accept or refusal (a failure, or an indeterminate verdict)
    is kept ``retry_s`` seconds, then the key may be asked again; an accept or a refusal
    is kept until ``max_answers`` newer keys evicted it. ``clock``: Unix seconds (status
    timestamps use it too).
    """

    client: OracleClient
    on_answer: Callable[[str, str], None] | None = None
    retry_s: float = RETRY_S
    max_answers: int = 4096
    clock: Callable[[], float] = time.time
    _answers: collections.OrderedDict[str, Answer] = field(default_factory=collections.OrderedDict)
    _waiting: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="oracle-ask"))
    asked: int = 0

    def answer(self, key: str) -> Answer | None:
        """The latest answer for ``key``; one without SGLang's accept or refusal (a failure, an
        indeterminate verdict) older than ``retry_s`` counts as none (ask again)."""
        with self._lock:
            a = self._answers.get(key)
            if a is not None and a.accepted is None and self.clock() - a.at >= self.retry_s:
                return None
            return a

    def pending(self, key: str) -> bool:
        """A request for ``key`` is in flight."""
        with self._lock:
            return key in self._waiting

    def ask(self, key: str, *, namespace: str, name: str, obj: dict[str, Any],
            catalog_overrides: dict[str, str] | None) -> None:
        """Ask for ``key`` unless a request for it is in flight (then ``name`` waits for that one too)."""
        with self._lock:
            if key in self._waiting:
                self._waiting[key].add((namespace, name))
                return
            self._waiting[key] = {(namespace, name)}
            self.asked += 1
        self._pool.submit(self._ask, key, obj, catalog_overrides)

    def _ask(self, key: str, obj: dict[str, Any], overrides: dict[str, str] | None) -> None:
        try:
            reply = self.client.ask(obj, overrides)
            verdict = reply.get("sglang") if isinstance(reply, dict) else None
            answer = Answer(verdict, None if verdict else "the oracle service's answer has no verdict", self.clock())
        except OracleUnreachable as e:
            answer = Answer(None, str(e), self.clock())
        except Exception as e:  # noqa: BLE001 - never lose the waiters on a bug
            log.exception("asking the oracle for %s failed", key[:12])
            answer = Answer(None, f"{type(e).__name__}: {e}", self.clock())
        with self._lock:
            self._answers[key] = answer
            self._answers.move_to_end(key)
            while len(self._answers) > self.max_answers:
                self._answers.popitem(last=False)
            waiters = self._waiting.pop(key, set())
        for ns, name in sorted(waiters):
            if self.on_answer is not None:
                try:
                    self.on_answer(ns, name)
                except Exception:  # noqa: BLE001
                    log.exception("on_answer for %s/%s failed", ns, name)

    def close(self) -> None:
        """Stop the thread pool (requests in flight finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class OracleSettings:
    """The operator's oracle: its :class:`VerdictBook` and the defaults a spec's ``oracle`` overrides."""

    book: VerdictBook
    default_policy: str = DEFAULT_POLICY
    default_max_wait_s: float = DEFAULT_MAX_WAIT_S


@dataclass(frozen=True)
class GateDecision:
    """What :func:`gate` decided: ``proceed`` (reconcile as usual) or hold (create and change nothing).

    ``valid``: (status, reason, message) of the Valid condition; ``record``: the new
    ``status.sglang``; ``problems``: SGLang's refusals as problems; ``event``: (type,
    reason, message) to emit when ``record`` changed; ``ask``: ask the book now;
    ``requeue_after``: seconds until the decision may change without an answer.
    """

    proceed: bool
    valid: tuple[str, str, str]
    record: dict[str, Any] | None
    problems: tuple[Problem, ...] = ()
    event: tuple[str, str, str] | None = None
    ask: bool = False
    requeue_after: float | None = None


def policy_of(plan: Plan, *, default_policy: str, default_max_wait_s: float) -> tuple[str, float]:
    """(onUnavailable, maxWait seconds): ``spec.oracle`` over the operator's defaults."""
    spec = plan.spec.oracle
    policy = (spec.onUnavailable if spec is not None and spec.onUnavailable else None) or default_policy
    wait = parse_duration(spec.maxWait) if spec is not None and spec.maxWait else default_max_wait_s
    return policy, wait


#: The start of SGLang's memory-planning refusal when the weights leave no KV memory
#: (mem_cache/kv_cache_configurator.py _profile_available_bytes).
WEIGHTS_FILL_GPU = "Loaded weights leave no GPU memory for the KV cache"


def refusal_problems(verdict: dict[str, Any], plan: Plan | None = None) -> list[Problem]:
    """One Problem per refusal in a verdict's JSON, rule ``sglang:<stage>``, with SGLang's
    exception text and where it raised.

    The field is the ``extraArgs`` item or ``env`` entry SGLang's message names when exactly
    one of the role's is named (``rules.fields.field_named_in``; needs ``plan``), the role's
    ``parallelism.tp`` when SGLang's weights leave no KV memory (:data:`WEIGHTS_FILL_GPU`), else
    ``spec.<role>``, and ``spec`` for the pair's handshake.
    """
    out = []
    for part in ("prefill", "decode", "pair"):
        r = (verdict.get(part) or {}).get("refusal")
        if not r:
            continue
        where = f" ({r['where']})" if r.get("where") else ""
        who = f"the {part} role" if part != "pair" else "the PD handshake"
        message = f"SGLang 0.5.23 refuses {who} at stage {r.get('stage')}: {r.get('type')}: {r.get('message')}{where}"
        field_path = f"spec.{part}" if part != "pair" else "spec"
        fix = "change what SGLang names (check --sglang shows the same verdict offline)"
        text = str(r.get("message") or "")
        named = field_named_in(getattr(plan, part), text) if plan and part != "pair" else None
        if named is not None:
            field_path = named
            fix = f"change or remove {named}, which SGLang's message names (check --sglang shows the same verdict offline)"
        elif part != "pair" and WEIGHTS_FILL_GPU in text:
            # SGLang's own fix ("raise --mem-fraction-static above ...") names a value the user never set
            field_path = f"spec.{part}.parallelism.tp"
            fix = (f"raise spec.{part}.parallelism.tp (the weights on each GPU shrink with it) or use a GPU with more "
                   "memory; a higher --mem-fraction-static helps only where SGLang's message gives one below 1")
        out.append(Problem(field=field_path, message=message, fix=fix, rule=f"sglang:{r.get('stage')}"))
    return out


def _verdict_summary(verdict: dict[str, Any]) -> str:
    parts = []
    for role in ("prefill", "decode"):
        v = verdict.get(role) or {}
        parts.append(f"{role} on {v.get('accelerator')} starts")
    assumes = verdict.get("assumptions") or []
    tail = f"; assumes: {'; '.join(assumes)}" if assumes else ""
    return f"SGLang 0.5.23: {', '.join(parts)}, the PD handshake passes ({verdict.get('seconds', 0):.1f} s){tail}"


def _why_none(answer: Answer | None, *, pending: bool) -> str:
    if answer is None or pending:
        return "asked SGLang (the oracle service); nothing is created or changed until it answers"
    if answer.verdict is None:
        return f"no verdict: {answer.error}"
    reasons = [v.get("indeterminate") for v in (answer.verdict.get(p) or {} for p in ("prefill", "decode", "pair"))]
    return "SGLang could not judge: " + "; ".join(dict.fromkeys(r for r in reasons if r))


def gate(*, plan: Plan, key: str, previous: dict[str, Any], generation: int, answer: Answer | None,
         pending: bool, now: float, default_policy: str = DEFAULT_POLICY,
         default_max_wait_s: float = DEFAULT_MAX_WAIT_S, rfc3339: Callable[[float], str],
         parse_rfc3339: Callable[[str | None], float | None]) -> GateDecision:
    """Decide whether generation ``generation`` (``plan``, its rules pass) may touch children (see module docstring).

    ``key``: the plan's judged key (``oracle.service.judged_key``); ``answer``/``pending``: the
    book's state for it. ``previous``: the status before this reconcile (``status.sglang``
    is the memory across restarts).
    """
    before = previous.get("sglang") or {}
    same_key = before.get("key") == key
    since = (parse_rfc3339(before.get("since")) if same_key else None) or now
    base = {"key": key, "generation": generation, "since": rfc3339(since)}

    if same_key and before.get("verdict") == "Accepted" and (answer is None or answer.accepted is not False):
        msg = before.get("message") or "SGLang 0.5.23 accepted these inputs"
        return GateDecision(True, ("True", REASON_ACCEPTED, msg), {**before, "generation": generation})
    if answer is not None and answer.accepted is True:
        msg = _verdict_summary(answer.verdict or {})
        return GateDecision(True, ("True", REASON_ACCEPTED, msg),
                            {**base, "verdict": "Accepted", "message": msg, "seconds": (answer.verdict or {}).get("seconds")},
                            event=("Normal", REASON_ACCEPTED, f"generation {generation}: {msg}"))
    if answer is not None and answer.accepted is False:
        problems = refusal_problems(answer.verdict or {}, plan)
        msg = f"generation {generation}: " + "; ".join(p.message for p in problems)
        return GateDecision(False, ("False", REASON_REFUSED, msg),
                            {**base, "verdict": "Refused", "message": msg, "seconds": (answer.verdict or {}).get("seconds")},
                            problems=tuple(problems), event=("Warning", REASON_REFUSED, msg))
    if same_key and before.get("verdict") == "Refused" and answer is None and not pending:
        # an operator restart: the refusal stands for the same inputs (asked again to refresh the problems)
        return GateDecision(False, ("False", REASON_REFUSED, before.get("message") or "SGLang refused these inputs"),
                            {**before, "generation": generation}, ask=True)

    policy, max_wait = policy_of(plan, default_policy=default_policy, default_max_wait_s=default_max_wait_s)
    why = _why_none(answer, pending=pending)
    waited = now - since
    ask = answer is None and not pending
    if waited < max_wait:
        left = max_wait - waited
        msg = (f"generation {generation}: {why} (waiting since {rfc3339(since)}, at most {max_wait:.0f} s; then "
               f"oracle.onUnavailable={policy})")
        retry = min(left, RETRY_S) if answer is not None else left
        return GateDecision(False, ("Unknown", REASON_AWAITING, msg),
                            {**base, "verdict": "Awaiting", "message": why}, ask=ask, requeue_after=retry)
    if policy == "rulesOnly":
        msg = (f"generation {generation}: no verdict from SGLang in {max_wait:.0f} s ({why}); "
               "oracle.onUnavailable=rulesOnly: accepted by the operator's own rules alone")
        return GateDecision(True, ("True", REASON_RULES_ONLY, msg),
                            {**base, "verdict": "RulesOnly", "message": msg},
                            event=("Warning", REASON_RULES_ONLY, msg), ask=ask, requeue_after=RETRY_S * 6)
    msg = (f"generation {generation}: no verdict from SGLang in {max_wait:.0f} s ({why}); "
           "oracle.onUnavailable=wait: nothing is created or changed; SGLang is asked again")
    return GateDecision(False, ("False", REASON_UNAVAILABLE, msg), {**base, "verdict": "Unavailable", "message": why},
                        event=("Warning", REASON_UNAVAILABLE, msg), ask=ask, requeue_after=RETRY_S)
