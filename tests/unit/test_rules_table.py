"""Table-driven test of every planning rule, through the real ``check -o json`` command.

Cases live in tests/unit/rules_cases/*.yaml (bases in bases.yaml). A case names a base
spec and a compact overlay: ``set`` (dotted field path -> value; ``[i]`` for list
items), ``unset`` (paths to delete) and ``catalog`` (catalog file -> entries merged over
the built-in kernels/ catalog, given to ``check --catalog-dir``). ``expect`` is the
outcome: ``errors`` and ``warnings`` as exact sets of ``[field path, rule]`` (empty
lists when none), optionally ``contains`` (substrings of the problem messages), ``fix_contains`` /
``fix_lacks`` (substrings the fixes have / must not have) and
``roles`` (values of the JSON's per-role fields). Every case runs through the real
``sglang-pd-operator check ... -o json`` (and the human-readable ``check``) in a
subprocess, batched by expected outcome so the exit code is asserted too: 0 for valid
specs (warnings allowed), 1 for refused ones; unreadable input (a missing file, invalid
YAML) must exit 2.

The table must trigger every rule in ``planning.rules`` (ROLE_RULES + PAIR_RULES) at
least once, and hold at least 40 specs.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = Path(__file__).resolve().parent / "rules_cases"
EXAMPLES = ROOT / "examples"
CATALOG_DIR = ROOT / "kernels"
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


# --------------------------------------------------------------------------- overlay


def _parts(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _PATH_PART.findall(path)]


def set_path(doc: Any, path: str, value: Any) -> None:
    """Set ``doc[path]``, creating mappings on the way; ``[i]`` indexes (or appends to) a list."""
    parts = _parts(path)
    node = doc
    for part, nxt in zip(parts, parts[1:]):
        if isinstance(part, int):
            node = node[part]
        else:
            if node.get(part) is None:
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
    last = parts[-1]
    if isinstance(last, int) and last == len(node):
        node.append(copy.deepcopy(value))
    else:
        node[last] = copy.deepcopy(value)


def unset_path(doc: Any, path: str) -> None:
    """Delete ``doc[path]`` (missing paths are an error in the table, not silently ignored)."""
    parts = _parts(path)
    node = doc
    for part in parts[:-1]:
        node = node[part]
    del node[parts[-1]]


@lru_cache(maxsize=1)
def bases() -> dict[str, dict]:
    return yaml.safe_load((CASES_DIR / "bases.yaml").read_text())


def build_doc(base: str, overlay: dict) -> dict:
    """The base's example document with the base's and then the case's overlay applied."""
    b = bases()[base]
    doc = yaml.safe_load((EXAMPLES / b["example"]).read_text())
    for layer in (b, overlay):
        for path in layer.get("unset", []):
            unset_path(doc, path)
        for path, value in (layer.get("set") or {}).items():
            set_path(doc, path, value)
    return doc


def load_cases() -> list[dict]:
    """Every case of every table file, each with a unique id ``<file>:<name>``."""
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        if path.name == "bases.yaml":
            continue
        for case in yaml.safe_load(path.read_text()):
            case = dict(case)
            case["id"] = f"{path.stem}:{case['name']}"
            cases.append(case)
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case names"
    return cases


CASES = load_cases()


# --------------------------------------------------------------------------- running check


def cli() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m`` of the module."""
    script = Path(sys.executable).parent / "sglang-pd-operator"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "sglang_pd_operator.cli"]


#: A hang guard for one ``check`` run, not a speed bound: a batch takes a few seconds on an idle
#: machine and much longer when the runner is loaded; only a process that never ends should fail.
CHECK_HANG_S = 900
#: ``check`` processes at once: more than the machine's cores only makes each one slower.
CHECK_WORKERS = max(1, min(4, os.cpu_count() or 1))


def run_check(paths: list[str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # never let the repo's operator/ shadow the stdlib
    return subprocess.run(
        [*cli(), "check", *paths, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=CHECK_HANG_S
    )


def _catalog_dir(tmp: Path, overrides: dict) -> Path:
    """A copy of kernels/ with ``overrides`` (file -> section -> name -> entry or null) merged in."""
    out = tmp / "catalog"
    shutil.copytree(CATALOG_DIR, out)
    for fname, sections in overrides.items():
        data = yaml.safe_load((out / fname).read_text())
        for section, entries in sections.items():
            for name, entry in entries.items():
                if entry is None:
                    data[section].pop(name)
                else:
                    merged = copy.deepcopy(data[section].get(name, {}))
                    for k, v in entry.items():
                        if isinstance(v, dict) and isinstance(merged.get(k), dict):
                            merged[k] = {**merged[k], **v}
                        else:
                            merged[k] = v
                    data[section][name] = merged
        (out / fname).write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _write_case(case: dict, tmp: Path) -> tuple[Path, list[str]]:
    """The case's spec file and the extra ``check`` arguments (its catalog folder, if any)."""
    work = tmp / case["id"].replace(":", "-")
    work.mkdir(parents=True)
    spec_path = work / "pdd.yaml"
    spec_path.write_text(yaml.safe_dump(build_doc(case["base"], case), sort_keys=False))
    extra: list[str] = []
    if case.get("catalog"):
        extra = ["--catalog-dir", str(_catalog_dir(work, case["catalog"]))]
    return spec_path, extra


def _split_text(stdout: str) -> dict[str, str]:
    """Human output of several files -> {file path: its block} (a block starts at a non-indented line)."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if not line.startswith("  "):
            current = line.split(": ", 1)[0]
            blocks[current] = []
        blocks[current].append(line)
    return {path: "\n".join(lines) + "\n" for path, lines in blocks.items()}


@pytest.fixture(scope="session")
def results(tmp_path_factory) -> dict[str, dict]:
    """Every case through the real ``check``, keyed by case id.

    Cases are batched: one ``check -o json`` and one human-output ``check`` per group of
    files sharing a catalog folder and an expected outcome (all valid, or all refused), so
    the group's exit code is the cases' exit code (0 or 1). Each case gets its own JSON
    document and its own block of human output.
    """
    tmp = tmp_path_factory.mktemp("rules")
    written = {c["id"]: _write_case(c, tmp) for c in CASES}
    groups: dict[tuple, list[str]] = {}
    for c in CASES:
        refused = bool(c["expect"]["errors"])
        groups.setdefault((tuple(written[c["id"]][1]), refused), []).append(c["id"])
    with ThreadPoolExecutor(max_workers=CHECK_WORKERS) as pool:
        runs = {
            key: (
                pool.submit(run_check, [str(written[cid][0]) for cid in cids], "-o", "json", *key[0], cwd=tmp),
                pool.submit(run_check, [str(written[cid][0]) for cid in cids], *key[0], cwd=tmp),
            )
            for key, cids in groups.items()
        }
        out: dict[str, dict] = {}
        for key, cids in groups.items():
            json_run, text_run = (f.result() for f in runs[key])
            docs = json.loads(json_run.stdout)
            docs = docs if isinstance(docs, list) else [docs]
            assert [d["file"] for d in docs] == [str(written[cid][0]) for cid in cids], json_run.stderr
            text = _split_text(text_run.stdout)
            for cid, doc in zip(cids, docs):
                out[cid] = {"json": doc, "exit": json_run.returncode, "text_exit": text_run.returncode,
                            "text": text[str(written[cid][0])]}  # fmt: skip
    return out


def _pairs(items: list) -> set[tuple[str, str]]:
    return {(field, rule) for field, rule in items}


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case, results):
    run = results[case["id"]]
    out = run["json"]
    problems = out["problems"]
    errors = _pairs([p["field"], p["rule"]] for p in problems if p["severity"] == "error")
    warnings = _pairs([p["field"], p["rule"]] for p in problems if p["severity"] == "warning")
    expect = case["expect"]
    assert errors == _pairs(expect["errors"]), "\n".join(p["field"] + ": " + p["message"] for p in problems)
    assert warnings == _pairs(expect["warnings"]), "\n".join(p["field"] + ": " + p["message"] for p in problems)
    assert run["exit"] == run["text_exit"] == (1 if errors else 0)
    assert out["valid"] is (not errors)
    text = "\n".join(p["message"] for p in problems)
    for needle in expect.get("contains", []):
        assert needle in text
    fixes = "\n".join(p["message"].partition(". Fix: ")[2] for p in problems)
    for needle in expect.get("fix_contains", []):
        assert needle in fixes, fixes
    for needle in expect.get("fix_lacks", []):
        assert needle not in fixes, fixes
    if "compatKey" in out and not errors:
        roles = out["roles"]
        assert set(roles) == {"prefill", "decode"}
        assert re.fullmatch(r"[0-9a-f]{10}", out["compatKey"])
        assert roles["prefill"]["kvLayout"] == roles["decode"]["kvLayout"]
    for key, value in (expect.get("roles") or {}).items():
        role, _, field = key.partition(".")
        assert out["roles"][role][field] == value, key


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_human_output_has_one_line_per_problem_field_first_fix_last(case, results):
    run = results[case["id"]]
    out = run["json"]
    lines = run["text"].splitlines()
    head, body = lines[0], lines[1:]
    assert ("refused" in head) == (not out["valid"])
    problem_lines = [ln for ln in body if not re.match(r"^  (prefill|decode): KV layout ", ln)]
    assert len(problem_lines) == len(out["problems"])
    errors_first = sorted(out["problems"], key=lambda p: p["severity"] != "error")
    for line, p in zip(problem_lines, errors_first):
        assert line.startswith(f"  {p['field']}: "), line
        tag = "" if p["severity"] == "error" else "warning: "
        assert line == f"  {p['field']}: {tag}{p['message']}"
        assert line.count(" Fix: ") == 1 and not line.endswith("Fix: "), line
        assert "\n" not in p["message"]


def test_table_covers_every_rule_and_enough_specs():
    from sglang_pd_operator.planning.rules import PAIR_RULES, ROLE_RULES

    rules = {r.__name__ for r in ROLE_RULES + PAIR_RULES}
    triggered = {rule for c in CASES for _, rule in c["expect"]["errors"] + c["expect"]["warnings"]}
    assert rules <= triggered, f"rules without a case: {sorted(rules - triggered)}"
    assert triggered - rules <= {"schema"}, triggered - rules
    assert len(CASES) >= 40
    valid = [c for c in CASES if not c["expect"]["errors"]]
    assert len(valid) >= 8 and len(CASES) - len(valid) >= 30
    assert set(bases()) <= {c["base"] for c in CASES if not c.get("set") and not c.get("unset")}


def test_unreadable_input_exits_2(tmp_path):
    missing = run_check([str(tmp_path / "missing.yaml")], "-o", "json", cwd=tmp_path)
    assert missing.returncode == 2 and "missing.yaml" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: {model: [unclosed\n")
    broken = run_check([str(bad)], "-o", "json", cwd=tmp_path)
    assert broken.returncode == 2 and "bad.yaml" in broken.stderr
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    assert run_check([str(scalar)], cwd=tmp_path).returncode == 2
    directory = run_check([str(tmp_path)], cwd=tmp_path)
    assert directory.returncode == 2


@pytest.mark.parametrize(
    "base, overlay, code",
    [
        ("h200", {}, 0),  # valid
        ("gb300-mega", {}, 0),  # valid with a warning
        ("h200", {"set": {"spec.kvLayout.layout": "v41"}}, 1),  # refused
        ("gb300", {"set": {"spec.kvLayout.pageSize": 0}}, 1),  # refused by the schema
    ],
)
def test_exit_code_of_one_file(tmp_path, base, overlay, code):
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(build_doc(base, overlay)))
    run = run_check([str(path)], "-o", "json", cwd=tmp_path)
    assert run.returncode == code, run.stderr
    assert json.loads(run.stdout)["valid"] is (code == 0)


def test_worst_exit_code_wins_over_several_files(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(build_doc("h200", {})))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(build_doc("h200", {"set": {"spec.kvLayout.layout": "v41"}})))
    assert run_check([str(good)], cwd=tmp_path).returncode == 0
    both = run_check([str(good), str(bad)], "-o", "json", cwd=tmp_path)
    assert both.returncode == 1
    assert [r["valid"] for r in json.loads(both.stdout)] == [True, False]
    assert run_check([str(good), str(tmp_path / "nope.yaml")], cwd=tmp_path).returncode == 2


def _python_without_sglang(tmp: Path, version: str | None = None) -> str:
    """A fresh venv (no pip) whose site-packages holds sglang ``version``'s metadata only, or nothing."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    if version is not None:
        (site,) = venv.glob("lib/python*/site-packages")
        dist = site / f"sglang-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return str(venv / "bin" / "python")


@pytest.mark.parametrize("version, says", [(None, "sglang is not installed for"),
                                           ("0.5.22", "sglang 0.5.22 is installed for")])
def test_check_sglang_without_the_oracle_still_gives_our_verdict(tmp_path, version, says):
    python = _python_without_sglang(tmp_path, version)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(build_doc("h200", {})))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(build_doc("h200", {"set": {"spec.kvLayout.layout": "v41"}})))
    run = run_check([str(good)], "--sglang", "--sglang-python", python, "-o", "json", cwd=tmp_path)
    assert run.returncode == 3, run.stderr  # ours valid, SGLang's verdict missing
    data = json.loads(run.stdout)
    assert data["valid"] is True and data["roles"]["prefill"]["args"]
    assert data["sglang"]["accepted"] is None and says in data["sglang"]["error"], data["sglang"]
    assert "sglang install" in data["sglang"]["error"] and python in data["sglang"]["error"]
    assert "warning: --sglang:" in run.stderr
    text = run_check([str(bad)], "--sglang", "--sglang-python", python, cwd=tmp_path)
    assert text.returncode == 1, text.stderr  # our refusal stands without SGLang's verdict
    assert "SGLang 0.5.23: no verdict: " + says in text.stdout and "kvLayout" in text.stdout


def test_check_sglang_with_something_that_is_not_python(tmp_path):
    run = run_check([str(EXAMPLES / "dsv41-flash-gb300-low-latency.yaml")], "--sglang", "--sglang-python", "/bin/true", "-o", "json", cwd=tmp_path)
    assert run.returncode == 3
    error = json.loads(run.stdout)["sglang"]["error"]
    assert "/bin/true is not a Python interpreter" in error, error
    missing = run_check([str(EXAMPLES / "dsv41-flash-gb300-low-latency.yaml")], "--sglang", "--sglang-python", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 3 and "cannot run" in missing.stdout


def test_unreadable_catalog_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    run = run_check([str(EXAMPLES / "dsv41-flash-gb300-low-latency.yaml")], "--catalog-dir", str(tmp_path / "empty"), cwd=tmp_path)
    assert run.returncode == 2 and "accelerators.yaml: catalog file missing" in run.stderr, run.stderr


def test_overlay_helpers():
    doc = {"spec": {"prefill": {"extraArgs": ["--a"]}}}
    set_path(doc, "spec.prefill.extraArgs[1]", "--b")
    set_path(doc, "spec.decode.env[0]", {"name": "X"})
    set_path(doc, "spec.kvLayout.pageSize", 0)
    unset_path(doc, "spec.prefill.extraArgs[0]")
    assert doc == {
        "spec": {"prefill": {"extraArgs": ["--b"]}, "decode": {"env": [{"name": "X"}]}, "kvLayout": {"pageSize": 0}}
    }
    with pytest.raises(KeyError):
        unset_path(doc, "spec.nothing")


def test_an_alias_bomb_or_a_recursive_alias_is_unreadable_at_once(tmp_path):
    """A fresh user's finding: a 9-level "billion laughs" file grew ``check`` to 3 GB and died
    with a MemoryError traceback (exit 1); kubectl refuses it at once. Aliases expanding past
    100,000 nodes, or an alias inside itself, are unreadable input (exit 2); a few ordinary
    aliases still load."""
    from sglang_pd_operator.api.load import load_documents

    levels = ["a: &a [" + ", ".join(['"lol"'] * 9) + "]"]
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        levels.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("apiVersion: pd.sglang-operator.io/v1alpha1\nkind: PDDeployment\nmetadata: {name: x}\n"
                    + "\n".join(levels) + "\nspec: *i\n")
    run = run_check([str(bomb)], cwd=tmp_path)
    assert run.returncode == 2 and "excessive aliasing" in run.stderr, (run.returncode, run.stderr[-500:])
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        load_documents("kind: PDDeployment\nspec: &s {a: [*s]}\n")
    doc = load_documents("kind: PDDeployment\nx: &v {k: 1}\ny: *v\nz: [*v, *v]\n")[0]
    assert doc["z"] == [{"k": 1}, {"k": 1}]


def test_list_documents_are_expanded_and_an_empty_file_is_unreadable(tmp_path):
    """``kubectl get pdd -o yaml`` prints a ``kind: List``; each item is checked, and a file
    with no object at all is unreadable input (exit 2), not a silent pass."""
    listed = tmp_path / "list.yaml"
    good, bad = build_doc("h200", {}), build_doc("h200", {"set": {"spec.kvLayout.layout": "v41"}})
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [good, bad]}))
    run = run_check([str(listed)], "-o", "json", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert [r["valid"] for r in json.loads(run.stdout)] == [True, False]
    empty = tmp_path / "empty.yaml"
    empty.write_text("---\n# nothing here\n")
    run = run_check([str(empty)], cwd=tmp_path)
    assert run.returncode == 2 and "no object" in run.stderr


def test_other_objects_are_skipped_and_json_has_one_entry_per_pddeployment_or_unreadable_file(tmp_path):
    """A file with a Namespace beside the PDDeployment checks the PDDeployment only; a file
    with no PDDeployment is unreadable input; ``-o json`` is an object for one file with one
    PDDeployment, else a list in which an unreadable file is an entry of its own."""
    good = build_doc("h200", {})
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inference"}}, good]))
    run = run_check([str(both)], "-o", "json", cwd=tmp_path)
    assert run.returncode == 0 and json.loads(run.stdout)["valid"] is True, run.stderr
    assert "skipped v1 Namespace inference" in run.stderr
    only_cm = tmp_path / "cm.yaml"
    only_cm.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
    run = run_check([str(only_cm)], cwd=tmp_path)
    assert run.returncode == 2 and "no PDDeployment" in run.stderr
    run = run_check([str(both), str(tmp_path / "missing.yaml")], "-o", "json", cwd=tmp_path)
    entries = json.loads(run.stdout)
    assert run.returncode == 2 and [e["valid"] for e in entries] == [True, False]
    assert entries[1]["unreadable"] is True and entries[1]["file"].endswith("missing.yaml")


def test_numbers_are_read_as_kubectl_reads_them(tmp_path):
    """``revision: 3e5`` is a number for kubectl (go-yaml), a string for PyYAML's YAML 1.1
    rules; check reads it as kubectl does and refuses it, as the API server would."""
    text = yaml.safe_dump(build_doc("h200", {})).replace("revision: 3f2c1e9", "revision: 3e5")
    assert "revision: 3e5" in text
    path = tmp_path / "rev.yaml"
    path.write_text(text)
    run = run_check([str(path)], "-o", "json", cwd=tmp_path)
    assert run.returncode == 1
    [problem] = json.loads(run.stdout)["problems"]
    assert problem["field"] == "spec.model.revision" and "quote the value" in problem["message"]


class _RefusingOracle:
    """Stands in for the SGLang oracle: the decode role is refused at startup, as
    ``--moe-a2a-backend deepep`` is by SGLang 0.5.23 (tests/contract/test_oracle.py runs the real one)."""

    def judge_plan(self, plan):
        from sglang_pd_operator.oracle import PairVerdict, Refusal, RoleVerdict, Verdict

        refusal = Refusal(stage="validate", type="ValueError", message="MoE A2A requires CUDA MegaMoE", phase="args")
        return Verdict(name=plan.name, namespace=plan.namespace,
                       prefill=RoleVerdict(role="prefill", accelerator="gb300", starts=True, facts={}),
                       decode=RoleVerdict(role="decode", accelerator="gb300", starts=False, refusal=refusal),
                       pair=PairVerdict(pairs=None, indeterminate="decode did not start"))

    def close(self):
        pass


def test_check_sglang_first_line_does_not_say_valid_when_sglang_refuses(monkeypatch):
    """The first line of ``check --sglang`` gives both verdicts when SGLang refuses what the
    operator's rules accept (exit 1); -o json keeps ``valid`` as the operator's rules' verdict."""
    from click.testing import CliRunner

    from sglang_pd_operator import cli as cli_module

    monkeypatch.setattr(cli_module, "_start_oracle", lambda catalog, python: (_RefusingOracle(), None))
    path = str(EXAMPLES / "dsv41-flash-gb300-low-latency.yaml")
    res = CliRunner().invoke(cli_module.main, ["check", "--sglang", path])
    assert res.exit_code == 1, res.output
    first = res.output.splitlines()[0]
    assert ": valid," not in first and "SGLang refuses" in first, first
    assert "SGLang 0.5.23: refused" in res.output
    js = CliRunner().invoke(cli_module.main, ["check", "--sglang", "-o", "json", path])
    data = json.loads(js.output)
    assert js.exit_code == 1 and data["valid"] is True and data["sglang"]["accepted"] is False
    plain = CliRunner().invoke(cli_module.main, ["check", path])  # without --sglang: unchanged
    assert plain.exit_code == 0 and ": valid, compat key " in plain.output.splitlines()[0]
