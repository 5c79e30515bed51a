"""The differential test: the operator's rules against SGLang 0.5.23's own verdict.

The corpus is 2,000 generated PDDeployments (tests/oracle_corpus.py, seed 13: the same
specs on every run), 200 more whose roles span nodes (seed 31: each node rank's command
is judged, and the handshake with prefill ranks on several nodes), every document of examples/ and every case of the rules table
(tests/unit/rules_cases/*.yaml, built as tests/unit/test_rules_table.py builds them; a
case's catalog overlay is not applied: both sides judge it with the built-in catalog).
One oracle judges all of them (one worker per accelerator, started on first use).

The confusion matrix is printed (``pytest -s`` or ``-rA`` shows it) and written to
``.run/oracle-differential.txt`` with the smallest example of each false-accept group.
Targets: no false accepts (we accept, SGLang refuses), no false refusals (we refuse,
SGLang accepts, and a rule is not listed with a reason in stricter_by_design.yaml), no
oracle failures, and few indeterminate verdicts, each with a reason.

Needs the real sglang==0.5.23 (requirements/contract.txt); without it the tests skip,
which fails under SGLANG_PD_OPERATOR_STRICT=1 (tests/conftest.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import rules_table
import yaml

import oracle_corpus
import oracle_differential as diff

pytestmark = [pytest.mark.contract, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
REPORT = ROOT / ".run" / "oracle-differential.txt"
GENERATED = 2000
SEED = 13
#: Generated specs with a role spanning nodes (their own stream: the 2,000 above are unchanged).
GENERATED_MULTI_NODE = 200
MULTI_NODE_SEED = 31
#: Most indeterminate verdicts tolerated, as a fraction of the judged specs.
MAX_INDETERMINATE = 0.02


def example_docs() -> list[tuple[str, dict]]:
    """Every PDDeployment of examples/, labelled with its file."""
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "PDDeployment":
                out.append((f"examples/{path.name}", doc))
    return out


def rules_case_docs() -> list[tuple[str, dict]]:
    """Every case of the rules table as its PDDeployment, labelled ``rules:<file>:<case>``."""
    table = rules_table()
    return [(f"rules:{case['id']}", table.build_doc(case["base"], case)) for case in table.CASES]


def full_corpus() -> list[tuple[str, dict]]:
    """Generated specs (single-node, then multi-node), examples and rules cases, in that order."""
    generated = [("generated", d) for d in oracle_corpus.corpus(GENERATED, seed=SEED)]
    generated += [("generated", d) for d in oracle_corpus.multi_node_corpus(GENERATED_MULTI_NODE, seed=MULTI_NODE_SEED)]
    return generated + example_docs() + rules_case_docs()


@pytest.fixture(scope="session")
def stricter():
    return diff.load_stricter()


@pytest.fixture(scope="session")
def rows(oracle, catalog, stricter):
    docs = full_corpus()
    t0 = time.monotonic()
    # The CI gate judges at the argument depth (resolution, validation, model divisions,
    # PD facts, handshake). The full startup (model build, memory planning) still finds
    # false accepts the rules do not catch yet, and takes ~28 min for this corpus on the
    # 2-core CI machine: benchmarks/bench_oracle_differential.py --depth startup reports
    # them (docs/sglang-oracle.md, "The scheduler's startup in the differential").
    depth, oracle.depth = oracle.depth, "args"
    try:
        out = diff.judge_corpus(docs, oracle, catalog, stricter=stricter)
    finally:
        oracle.depth = depth
    timing = diff.Timing(len(out), time.monotonic() - t0, sum(r.seconds for r in out), list(oracle.pool.started_s))
    text = diff.confusion_matrix(out, stricter=stricter) + "\n" + timing.line() + "\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    examples = diff.examples_report(out)
    REPORT.write_text(text + ("\nSmallest example of each false-accept group:\n\n" + examples + "\n" if examples else ""))
    print("\n" + text)
    return out


# --------------------------------------------------------------------------- corpus


def test_corpus_is_large_distinct_and_reproducible():
    docs = oracle_corpus.corpus(GENERATED, seed=SEED)
    assert len(docs) == GENERATED
    assert len({oracle_corpus.spec_key(d) for d in docs}) == GENERATED
    assert len({d["metadata"]["name"] for d in docs}) == GENERATED
    assert docs == oracle_corpus.corpus(GENERATED, seed=SEED)
    assert docs[:50] != oracle_corpus.corpus(50, seed=SEED + 1)
    assert len(example_docs()) >= 5 and len(rules_case_docs()) >= 40


def test_corpus_covers_what_the_issue_asks_for():
    docs = oracle_corpus.corpus(GENERATED, seed=SEED)
    specs = [d["spec"] for d in docs]
    roles = [s[r] for s in specs for r in ("prefill", "decode") if isinstance(s.get(r), dict)]
    seen = {
        "accelerators": {s["accelerator"] for s in specs},
        "backends": {s.get("kvLayout", {}).get("attentionBackend") for s in specs},
        "layouts": {s.get("kvLayout", {}).get("layout") for s in specs},
        "compressed": {s.get("kvLayout", {}).get("compressed") for s in specs},
        "plugins": {s.get("kernels", {}).get("plugin") for s in specs},
        "engram": {s.get("engram", {}).get("placement") for s in specs},
        "transfer": {s.get("transfer", {}).get("backend") for s in specs},
        "speculative": {(s.get("speculative") or {}).get("algorithm") for s in specs},
    }
    assert set(oracle_corpus.ACCELERATORS) <= seen["accelerators"]
    assert {"auto", "flashmla", "flashmla_mega", "trtllm"} <= seen["backends"]
    assert {"auto", "v4", "v41", "v41_new"} <= seen["layouts"]
    assert {"auto", "fp8", "fp4"} <= seen["compressed"]
    assert {"none", "sgl-nvidia-mega", "sgl-amd-mono"} <= seen["plugins"]
    assert {"host", "device", "peerShards"} <= seen["engram"]
    assert {"mooncake", "nixl", "mori", "fake"} <= seen["transfer"]
    assert {"DSPARK", "EAGLE"} <= seen["speculative"]
    assert sum("pagedExperts" in s or any("pagedExperts" in s[r] for r in ("prefill", "decode")) for s in specs) >= 100
    assert sum(any("accelerator" in s[r] for r in ("prefill", "decode")) for s in specs) >= 100  # cross-hardware
    assert sum(bool(r.get("parallelism", {}).get("dpAttention")) for r in roles) >= 300  # DEP / DP attention
    flags = {a.split("=")[0] for r in roles for a in r.get("extraArgs", []) if a.startswith("--")}
    assert {"--chunked-prefill-size", "--enable-dp-lm-head", "--moe-a2a-backend", "--attn-cp-size"} <= flags
    assert sum("1000" in r.get("extraArgs", []) for r in roles) >= 5  # a chunk that is not a multiple of 256
    assert {e["name"] for r in roles for e in r.get("env", [])} >= {"SGLANG_RAGGED_VERIFY_MODE"}


def test_hypothesis_strategy_draws_pddeployments():
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=25, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(oracle_corpus.pddeployments())
    def check(doc):
        assert doc["apiVersion"] == "pd.sglang-operator.io/v1alpha1" and doc["kind"] == "PDDeployment"
        assert doc["metadata"]["namespace"] and {"prefill", "decode", "model"} <= set(doc["spec"])

    check()


def test_stricter_file_names_real_rules_with_reasons():
    from sglang_pd_operator.planning.rules import PAIR_RULES, ROLE_RULES

    raw = yaml.safe_load(diff.STRICTER_FILE.read_text()) or {}
    assert isinstance(raw, dict), "stricter_by_design.yaml must be a mapping rule-name -> reason"
    rules = {r.__name__ for r in ROLE_RULES + PAIR_RULES}
    for name, entry in raw.items():
        assert name in rules or str(name).startswith(("cel:spec.", "cel:metadata.")), (
            f"{name}: not a planning rule nor cel:<field>")
        reason = entry.get("reason") if isinstance(entry, dict) else entry
        assert isinstance(reason, str) and len(reason.strip()) >= 20, f"{name}: give the reason it is stricter"
        if isinstance(entry, dict):
            assert set(entry) <= {"reason", "dominates"}, f"{name}: only reason and dominates"
    assert diff.load_dominating() <= set(diff.load_stricter())


# --------------------------------------------------------------------------- the differential


def test_confusion_matrix_is_printed(rows):
    text = REPORT.read_text()
    assert "operator accepts" in text and "operator refuses" in text
    assert len(rows) >= GENERATED + 40
    assert diff.counts(rows)["agree-accept"] > 0  # the corpus reaches specs SGLang starts and pairs


def test_no_false_accepts(rows):
    groups = diff.false_accept_groups(rows)
    lines = [f"{len(m)} x {where}: {msg} (e.g. {diff._smallest(m).label})" for (where, msg), m in groups]
    assert not groups, "operator accepts specs SGLang refuses:\n" + "\n".join(lines)


def test_no_false_refusals(rows, stricter):
    groups = diff.false_refuse_rules(rows, stricter)
    lines = [f"{len(m)} x {rule} (e.g. {diff._smallest(m).label}: {diff._smallest(m).our_errors[0][:200]})"
             for rule, m in groups]  # fmt: skip
    assert not groups, ("operator refuses specs SGLang starts and pairs; fix the rule or list it with a reason in "
                        "stricter_by_design.yaml:\n" + "\n".join(lines))


def test_indeterminate_verdicts_are_rare_and_explained(rows):
    judged = [r for r in rows if r.klass not in ("schema", "plan-error", "oracle-error")]
    unknown = [r for r in judged if r.klass == "indeterminate"]
    assert all(r.indeterminate for r in unknown), [r.label for r in unknown if not r.indeterminate]
    reasons = diff.grouped(rows, "indeterminate", diff.indeterminate_reasons)
    assert len(unknown) <= MAX_INDETERMINATE * len(judged), "\n".join(f"{len(m)} x {why}" for why, m in reasons)


def test_oracle_never_fails(rows):
    broken = [r for r in rows if r.klass in ("oracle-error", "plan-error")]
    assert not broken, "\n\n".join(f"{r.label}: {r.error}" for r in broken[:5])
