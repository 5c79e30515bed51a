"""The operator's verdict against SGLang's, spec by spec (helpers; no tests here).

:func:`judge_corpus` plans every document with the operator's own rules
(``planning.plan.plan_object``) and asks the SGLang oracle (``sglang_pd_operator.oracle``)
for SGLang 0.5.23's verdict on the same plan; each :class:`Row` gets one class:

``agree-accept``   both accept;
``agree-refuse``   both refuse (not necessarily for the same reason);
``false-accept``   we accept and SGLang refuses: the class that must stay empty;
``stricter``       we refuse, SGLang accepts, and every error rule of ours is listed with a
                   reason in ``stricter_by_design.yaml`` (stricter on purpose);
``false-refuse``   we refuse, SGLang accepts, and some rule is not listed there;
``indeterminate``  the oracle could not judge (SGLang needed a GPU kernel, an unknown
                   accelerator, a multi-node handshake ...);
``schema``         the CRD schema refuses the object: no plan, SGLang never sees it;
``oracle-error``   the oracle itself failed on the spec (a worker crashed or timed out,
                   or rendering the plan raised): a bug of the oracle, not a verdict;
``plan-error``     planning raised (it must not: planning is total).

Rule names are the planning rules' function names; a problem of the CRD's CEL rules
(rule ``schema`` on an object that passed the structural schema) is named
``cel:<field path>`` so the stricter-by-design file can list one CEL rule at a time.

:func:`confusion_matrix` prints the 2x2 table with the other classes' counts, the distinct
false-accept reasons (grouped by SGLang's ``where`` and the first line of its message,
each with the smallest example spec) and the false-refuse rules.
"""

from __future__ import annotations

import collections
import importlib.util
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

STRICTER_FILE = Path(__file__).resolve().parent / "stricter_by_design.yaml"
KNOWN_FALSE_ACCEPTS_FILE = Path(__file__).resolve().parent / "known_false_accepts.yaml"

CLASSES = ("agree-accept", "agree-refuse", "false-accept", "stricter", "false-refuse", "indeterminate", "schema",
           "oracle-error", "plan-error")  # fmt: skip


@dataclass
class Row:
    """One spec: the operator's verdict, SGLang's, and the class of the pair."""

    source: str  # where the spec came from: generated / example file / rules case id
    doc: dict[str, Any]
    ours: str  # accept | refuse | schema | error
    our_rules: tuple[str, ...] = ()  # error rules (sorted, distinct)
    our_errors: tuple[str, ...] = ()  # "field: message" of each error problem
    sglang: bool | None = None  # the oracle's Verdict.accepted
    refusals: tuple[tuple[str, Any], ...] = ()  # (prefill | decode | pair, Refusal)
    indeterminate: tuple[str, ...] = ()  # why the oracle could not judge (per role / pair)
    klass: str = ""
    error: str | None = None  # oracle-error / plan-error: the exception and its traceback
    seconds: float = 0.0  # time spent in the oracle
    depth: str = ""  # "startup" when a row of the args depth was judged again at startup depth
    #: (role, SGLang's resolved --mem-fraction-static, the operator's upper bound or None, the
    #: flag was given) for each role that reached SGLang's memory planning (startup depth only).
    fractions: tuple[tuple[str, float, float | None, bool], ...] = ()
    #: (role, bytes SGLang's model build put on the TP group's most loaded GPU, the operator's
    #: lower bound or None) for each role whose model was built (startup depth only).
    weights: tuple[tuple[str, int, int | None], ...] = ()

    @property
    def name(self) -> str:
        """metadata.name of the spec."""
        return str((self.doc.get("metadata") or {}).get("name", ""))

    @property
    def label(self) -> str:
        """``source`` and name, for reports."""
        return self.name if self.source in ("", self.name) else f"{self.source} ({self.name})"

    def refusal_lines(self) -> list[str]:
        """SGLang's refusals, one line each, prefixed by who refused."""
        return [f"{who}: {r.line()}" for who, r in self.refusals]

    def yaml(self) -> str:
        """The spec as YAML."""
        return yaml.safe_dump(self.doc, sort_keys=False, width=120)


def _stricter_entries(path: Path | str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping rule-name -> reason, got {type(data).__name__}")
    return data


def load_stricter(path: Path | str = STRICTER_FILE) -> dict[str, str]:
    """The stricter-by-design list: rule name -> reason; an entry without a reason does not count.

    An entry is a reason, or a mapping {reason, dominates}: see :func:`load_dominating`.
    """
    out = {}
    for k, v in _stricter_entries(path).items():
        reason = v.get("reason") if isinstance(v, Mapping) else v
        if reason is not None and str(reason).strip():
            out[str(k)] = str(reason).strip()
    return out


def load_dominating(path: Path | str = STRICTER_FILE) -> frozenset[str]:
    """Stricter rules marked ``dominates: true``: the operator never renders the command SGLang is
    shown for such a spec (a flag or variable it owns, given twice), so the spec's other verdicts
    are no evidence either way and the row counts as stricter by design."""
    return frozenset(
        str(k) for k, v in _stricter_entries(path).items()
        if isinstance(v, Mapping) and v.get("dominates") and str(v.get("reason") or "").strip()
    )


def load_known_false_accepts(path: Path | str = KNOWN_FALSE_ACCEPTS_FILE) -> dict[str, str]:
    """SGLang refusal sites (``where``) the operator's rules do not catch yet -> why; an entry
    without a reason does not count (known_false_accepts.yaml)."""
    return {str(k): str(v).strip() for k, v in _stricter_entries(path).items() if v is not None and str(v).strip()}


def _rule_key(problem: Any) -> str:
    return f"cel:{problem.field}" if problem.rule == "schema" else problem.rule


def classify(row: Row, stricter: Mapping[str, str], dominating: frozenset[str] = frozenset()) -> str:
    """The class of a row whose verdicts are filled in (see the module docstring)."""
    if row.ours == "schema":
        return "schema"
    if row.ours == "error":
        return "plan-error"
    if row.error is not None:
        return "oracle-error"
    if row.sglang is None:
        return "indeterminate"
    if row.ours == "accept":
        return "agree-accept" if row.sglang else "false-accept"
    if not row.sglang:
        return "agree-refuse"
    if any(rule in dominating for rule in row.our_rules):
        return "stricter"
    return "stricter" if all(rule in stricter for rule in row.our_rules) else "false-refuse"


def _items(docs: Iterable[Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    for item in docs:
        if isinstance(item, tuple):
            yield item[0], item[1]
        else:
            yield str((item.get("metadata") or {}).get("name", "")), item


def _take_verdict(row: Row, verdict: Any) -> None:
    row.sglang = verdict.accepted
    row.refusals = tuple(verdict.refusals)
    row.indeterminate = tuple(
        f"{who}: {why}" for who, why in (("prefill", verdict.prefill.indeterminate),
                                         ("decode", verdict.decode.indeterminate),
                                         ("pair", verdict.pair.indeterminate)) if why
    )  # fmt: skip


def _take_memory_facts(row: Row, plan: Any, verdict: Any) -> None:
    """Next to what SGLang's startup found for each role, the operator's restatement of it:
    the fraction it planned memory with (planning/sglang_defaults.py
    ``mem_fraction_static_upper_bound``) and the bytes its model build put on one GPU
    (rules/weights.py ``weights_per_gpu_lower_bound``, and for a bundled DSpark draft
    ``draft_weights_per_gpu_lower_bound`` as the role name plus " draft")."""
    from sglang_pd_operator.planning.features import parse_flags
    from sglang_pd_operator.planning.rules.weights import (draft_weights_per_gpu_lower_bound,
                                                           weights_per_gpu_lower_bound)
    from sglang_pd_operator.planning.sglang_defaults import mem_fraction_static_upper_bound

    fractions, weights = [], []
    for name in ("prefill", "decode"):
        facts = getattr(verdict, name).facts or {}
        role = getattr(plan, name)
        model = facts.get("model") or {}
        if model.get("weightBytes") is not None:  # the TP group's most loaded rank, as SGLang plans with it
            built = int(model["weightBytes"]) + int(model.get("maxRankExtraBytes", 0))
            weights.append((name, built, weights_per_gpu_lower_bound(spec=plan.spec, role=role)))
        draft = (facts.get("speculative") or {}).get("draftWeightBytes")
        draft_bound = draft_weights_per_gpu_lower_bound(spec=plan.spec, role=role)
        if draft is not None and draft_bound:  # the bundled DSpark draft the catalog carries
            weights.append((f"{name} draft", int(draft), draft_bound))
        memory = facts.get("memory") or {}
        if memory.get("memFractionStatic") is None:
            continue
        flags = parse_flags(list(role.command.args))
        env = {e.name: e.value for e in role.inputs.spec.env}
        fractions.append((name, float(memory["memFractionStatic"]), mem_fraction_static_upper_bound(role.inputs, flags, env),
                          flags.get("mem_fraction_static") is not None))
    row.fractions, row.weights = tuple(fractions), tuple(weights)


def _confirm_at_startup(row: Row, plan: Any, oracle: Any, stricter: Mapping[str, str],
                        dominating: frozenset[str]) -> None:
    """A row judged at a shallower depth than ``startup`` is judged again through SGLang's
    whole emulated startup (model build, memory planning, PD queues, transfer managers,
    the speculative worker) by ``oracle`` (a startup-depth oracle): a false refusal, since a
    rule may catch what SGLang refuses only there (rules/moe.py quantized_moe_block_width:
    the quantization method's ``create_weights``), and an agreed accept, since SGLang may
    refuse it only there. The row takes that verdict and records the depth (``row.depth``)."""
    t0 = time.monotonic()
    try:
        verdict = oracle.judge_plan(plan)
    except Exception as e:  # a bug of the oracle, not a verdict
        row.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    else:
        _take_verdict(row, verdict)
        _take_memory_facts(row, plan, verdict)
        row.depth = "startup"
    finally:
        row.seconds += time.monotonic() - t0
    row.klass = classify(row, stricter, dominating)


def _judge_one(source: str, doc: dict[str, Any], oracle: Any, deeper: Any, catalog: Any,
               stricter: Mapping[str, str], dominating: frozenset[str]) -> Row:
    """One document's row: planned, judged by ``oracle``, and again by ``deeper`` (a
    startup-depth oracle, or None) when it comes out a false refusal or an agreed accept."""
    from sglang_pd_operator.planning.plan import plan_object

    row = Row(source=source, doc=doc, ours="error")
    try:
        plan, problems = plan_object(doc, catalog)
    except Exception as e:  # planning is total; record it, do not stop the run
        row.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        plan = None
        problems = []
    else:
        errs = [p for p in problems if p.severity == "error"]
        row.our_rules = tuple(sorted({_rule_key(p) for p in errs}))
        row.our_errors = tuple(f"{p.field}: {p.message}" for p in errs)
        row.ours = "schema" if plan is None else ("accept" if plan.valid else "refuse")
    if plan is not None:
        t0 = time.monotonic()
        try:
            verdict = oracle.judge_plan(plan)
        except Exception as e:  # OracleError or a crash while rendering: a bug, not a verdict
            row.error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        else:
            _take_verdict(row, verdict)
            _take_memory_facts(row, plan, verdict)
        row.seconds = time.monotonic() - t0
    row.klass = classify(row, stricter, dominating)
    if deeper is not None and row.klass in ("false-refuse", "agree-accept"):
        _confirm_at_startup(row, plan, deeper, stricter, dominating)
    return row


def judge_corpus(docs: Iterable[Any], oracle: Any, catalog: Any, *, stricter: Mapping[str, str] | None = None,
                 dominating: frozenset[str] | None = None,
                 progress: Callable[[int, Row], None] | None = None, threads: int = 1) -> list[Row]:
    """Plan and judge every document; one :class:`Row` each, in order.

    ``docs`` holds PDDeployment dicts or ``(source, dict)`` pairs. ``oracle`` is an open
    :class:`sglang_pd_operator.oracle.Oracle`; ``stricter`` defaults to the file next to
    this module, ``dominating`` the entries marked ``dominates`` there (load_dominating). A
    failure of the oracle on one spec is recorded as ``oracle-error`` and the run goes on
    (the pool starts a fresh worker on the next call). ``progress`` is called after each
    row with its index (in the order rows finish when ``threads`` > 1). When the oracle
    judges at a depth shallower than ``startup`` (the CI gate: ``args``), a row that comes
    out a false refusal or an agreed accept is judged again at ``startup`` depth
    (:func:`_confirm_at_startup`, by a second Oracle over the same workers): a rule that
    catches a refusal of the model build or memory planning is scored against that refusal,
    and an accept SGLang refuses only while starting is a false accept. Every spec the
    operator accepts is so judged through SGLang's whole emulated startup, the others as
    far as SGLang's first refusal. ``threads`` specs are judged at once (each oracle worker
    serves one call at a time, so specs on different accelerators run side by side).
    """
    from concurrent.futures import ThreadPoolExecutor

    from sglang_pd_operator.oracle import Oracle

    dominating = load_dominating() if dominating is None else dominating
    stricter = load_stricter() if stricter is None else stricter
    deeper = None
    if getattr(oracle, "depth", "startup") != "startup":
        deeper = Oracle(catalog=oracle.catalog, pool=oracle.pool, depth="startup")  # shares the workers: never closed
    items = list(_items(docs))
    rows: list[Row | None] = [None] * len(items)

    def one(i: int) -> None:
        source, doc = items[i]
        rows[i] = _judge_one(source, doc, oracle, deeper, catalog, stricter, dominating)

    if threads <= 1:
        for i in range(len(items)):
            one(i)
            if progress is not None:
                progress(i, rows[i])
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = {pool.submit(one, i): i for i in range(len(items))}
            for future in futures:
                future.result()
                if progress is not None:
                    progress(futures[future], rows[futures[future]])
    return [r for r in rows if r is not None]


# --------------------------------------------------------------------------- reports
def counts(rows: Iterable[Row]) -> collections.Counter:
    """Rows per class (every class present, zeros included)."""
    c = collections.Counter({k: 0 for k in CLASSES})
    c.update(r.klass for r in rows)
    return c


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].strip()


_NUMBER = re.compile(r"\d+")


def _source_line(where: str | None) -> str | None:
    """The line of SGLang's source ``where`` (sglang/<file>:<function>:<line>) names, read from the
    installed package without importing it; None when it cannot be found."""
    if not where or where.count(":") < 2:
        return None
    path, _, line = where.rsplit(":", 2)
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations or not path.startswith("sglang/"):
        return None
    source = Path(list(spec.submodule_search_locations)[0]).parent / path
    try:
        return source.read_text().splitlines()[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return None


def _reason(ref: Any) -> str:
    """A refusal's first message line; a bare ``assert`` gets the asserted source line."""
    msg = _first_line(ref.message)
    if not msg or msg == ref.type:
        src = _source_line(ref.where)
        if src:
            msg = f"[{src}]"
    return f"{ref.type}: {msg}"


def _smallest(rows: Iterable[Row]) -> Row:
    return min(rows, key=lambda r: (len(r.yaml()), r.name))


def false_accept_groups(rows: Iterable[Row]) -> list[tuple[tuple[str, str], list[Row]]]:
    """False accepts grouped by (SGLang's ``where``, first line of its message), largest first.

    A spec counts once in every group one of its refusals belongs to (a spec refused by
    prefill and decode for the same reason counts once). Numbers in the message are masked
    when grouping (a port or a size does not make a new reason); a bare ``assert`` is shown
    with its source line.
    """
    groups: dict[tuple[str, str], list[Row]] = collections.defaultdict(list)
    shown: dict[tuple[str, str], str] = {}
    for r in rows:
        if r.klass != "false-accept":
            continue
        keys = {}
        for _, ref in r.refusals:
            where, reason = ref.where or f"({ref.stage})", _reason(ref)
            keys[(where, _NUMBER.sub("N", reason))] = reason
        if not keys:
            keys = {("(no refusal recorded)", ""): ""}
        for key, reason in keys.items():
            groups[key].append(r)
            shown.setdefault(key, reason)
    # numbers are masked for grouping (ports, sizes); the shown message is a real one
    out = [((where, shown[(where, masked)]), members) for (where, masked), members in groups.items()]
    return sorted(out, key=lambda kv: (-len(kv[1]), kv[0]))


def false_refuse_rules(rows: Iterable[Row], stricter: Mapping[str, str] | None = None) -> list[tuple[str, list[Row]]]:
    """Rules of false refusals that are not in the stricter-by-design list, most rows first."""
    stricter = load_stricter() if stricter is None else stricter
    groups: dict[str, list[Row]] = collections.defaultdict(list)
    for r in rows:
        if r.klass == "false-refuse":
            for rule in r.our_rules:
                if rule not in stricter:
                    groups[rule].append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def grouped(rows: Iterable[Row], klass: str, key: Callable[[Row], Iterable[str]]) -> list[tuple[str, list[Row]]]:
    """Rows of ``klass`` grouped by each string ``key`` gives, largest group first."""
    groups: dict[str, list[Row]] = collections.defaultdict(list)
    for r in rows:
        if r.klass == klass:
            for k in set(key(r)) or {""}:
                groups[k].append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def indeterminate_reasons(row: Row) -> set[str]:
    """Why the oracle could not judge ``row``, without the role prefix (a reason shared by
    both roles and the pair counts once)."""
    return {why.split(": ", 1)[-1] for why in row.indeterminate}


def _phase(row: Row) -> str:
    """The phase of SGLang's startup of the row's first refusal (stages.PHASES)."""
    from sglang_pd_operator.oracle.stages import PHASES

    for _, ref in row.refusals:
        return getattr(ref, "phase", "") or PHASES.get(getattr(ref, "stage", ""), "")
    return ""


def _known_count(rows: Iterable[Row]) -> int:
    """False accepts every refusal of which is at a site known_false_accepts.yaml lists."""
    known = load_known_false_accepts()
    return sum(1 for r in rows if r.klass == "false-accept" and r.refusals
               and all((ref.where or "") in known for _, ref in r.refusals))


def confusion_matrix(rows: list[Row], *, stricter: Mapping[str, str] | None = None, limit: int = 25) -> str:
    """The matrix and the lists a person reads first: false accepts, false refusals, the rest."""
    stricter = load_stricter() if stricter is None else stricter
    c = counts(rows)
    judged = sum(c[k] for k in ("agree-accept", "agree-refuse", "false-accept", "stricter", "false-refuse"))
    w = 14
    lines = [
        f"Oracle differential: {len(rows)} specs, {judged} judged by both",
        "",
        f"{'':<22}{'SGLang accepts':>{w + 2}}{'SGLang refuses':>{w + 2}}{'indeterminate':>{w + 2}}",
        f"{'operator accepts':<22}{c['agree-accept']:>{w + 2}}{c['false-accept']:>{w + 2}}"
        f"{sum(1 for r in rows if r.klass == 'indeterminate' and r.ours == 'accept'):>{w + 2}}"
        f"   <- false accepts: {c['false-accept']} (at a site of known_false_accepts.yaml: {_known_count(rows)})",
        f"{'operator refuses':<22}{c['stricter'] + c['false-refuse']:>{w + 2}}{c['agree-refuse']:>{w + 2}}"
        f"{sum(1 for r in rows if r.klass == 'indeterminate' and r.ours == 'refuse'):>{w + 2}}"
        f"   <- of the first column: stricter by design {c['stricter']}, false refusals {c['false-refuse']}",
        "",
        f"schema-refused (SGLang never sees them): {c['schema']}    oracle errors: {c['oracle-error']}    "
        f"planning errors: {c['plan-error']}",
    ]
    again = [r for r in rows if r.depth == "startup"]
    if again:
        accepts = [r for r in again if r.ours == "accept"]
        refusals = [r for r in again if r.ours == "refuse"]
        lines.append(f"judged again at startup depth: {len(accepts)} accepted by both at the shallower depth "
                     f"(SGLang's startup refuses {sum(1 for r in accepts if r.sglang is False)}, cannot judge "
                     f"{sum(1 for r in accepts if r.sglang is None)}); {len(refusals)} false refusals there "
                     f"(SGLang's startup refuses {sum(1 for r in refusals if r.sglang is False)})")
    lines += ["", "SGLang's refusals by phase (the first refusal of each spec; operator accepts / refuses):"]
    for phase in ("args", "model", "kv", "speculative", "memory", "graphs", "pd-queues", "transfer", "handshake"):
        ours = collections.Counter(r.ours for r in rows if r.sglang is False and _phase(r) == phase)
        lines.append(f"  {phase:<10} {ours['accept']:6d} / {ours['refuse']:6d}")
    fa = false_accept_groups(rows)
    lines += ["", f"False accepts: {c['false-accept']} specs, {len(fa)} distinct SGLang refusals"]
    for (where, msg), members in fa[:limit]:
        lines.append(f"  {len(members):5d}  {where}: {msg[:200]}   e.g. {_smallest(members).label}")
    if len(fa) > limit:
        lines.append(f"  ... {len(fa) - limit} more")
    fr = false_refuse_rules(rows, stricter)
    lines += ["", f"False refusals: {c['false-refuse']} specs (rules not in {STRICTER_FILE.name})"]
    for rule, members in fr[:limit]:
        lines.append(f"  {len(members):5d}  {rule}   e.g. {_smallest(members).label}")
    st = grouped(rows, "stricter", lambda r: r.our_rules)
    if st:
        lines += ["", f"Stricter by design: {c['stricter']} specs"]
        for rule, members in st[:limit]:
            lines.append(f"  {len(members):5d}  {rule}: {stricter.get(rule, '')[:120]}")
    ind = grouped(rows, "indeterminate", indeterminate_reasons)
    if ind:
        lines += ["", f"Indeterminate: {c['indeterminate']} specs"]
        for why, members in ind[:limit]:
            lines.append(f"  {len(members):5d}  {why[:200]}   e.g. {_smallest(members).label}")
    errs = grouped(rows, "oracle-error", lambda r: [_first_line(r.error or "")])
    errs += grouped(rows, "plan-error", lambda r: ["planning: " + _first_line(r.error or "")])
    if errs:
        lines += ["", f"Oracle / planning errors: {c['oracle-error'] + c['plan-error']} specs"]
        for msg, members in errs[:limit]:
            lines.append(f"  {len(members):5d}  {msg[:200]}   e.g. {_smallest(members).label}")
    return "\n".join(lines) + "\n"


def examples_report(rows: list[Row], *, limit: int = 10) -> str:
    """The smallest spec of each of the ``limit`` largest false-accept groups, as YAML with SGLang's refusals."""
    out = []
    for (where, msg), members in false_accept_groups(rows)[:limit]:
        r = _smallest(members)
        out.append(f"# {len(members)} false accepts: {where}: {msg}\n# smallest example: {r.label}\n"
                   + "".join(f"#   {line}\n" for line in r.refusal_lines()) + r.yaml())
    return "\n---\n".join(out)


@dataclass
class Timing:
    """Throughput of a run."""

    specs: int
    seconds: float
    oracle_seconds: float
    worker_starts: list[float] = field(default_factory=list)

    def line(self) -> str:
        """One line: specs, wall time, specs per second, worker start times."""
        rate = self.specs / self.seconds if self.seconds else 0.0
        starts = ", ".join(f"{s:.1f}" for s in self.worker_starts)
        return (f"{self.specs} specs in {self.seconds:.1f} s ({rate:.1f} specs/s; {self.oracle_seconds:.1f} s in the "
                f"oracle); {len(self.worker_starts)} worker starts [s]: {starts}")
