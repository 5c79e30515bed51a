"""requirements/lock.txt pins what the pyprojects' ranges allow, and agrees with the pinned requirement files.

The pyprojects (the operator's, with its ``test`` extra, and the dev tools') keep version
ranges; the lock (written by hack/lock.py) pins every distribution that hack/setup.sh, CI
and the operator image install. A dependency added to a pyproject but not to the lock, a
pin outside its range, or a pin in requirements/*.txt (the contract, lint and SGLang
oracle sets) that differs from the lock's fails here, naming it and the fix.
"""

from __future__ import annotations

from helpers import ROOT, load_script
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK_TOOL = load_script(ROOT / "hack" / "lock.py", "hack_lock")
FIX = "run ./hack/setup.sh --contract, then .venv/bin/python -P hack/lock.py"


def pins(text: str) -> dict[str, str]:
    """canonical name -> version of a lock file's ``name==version`` lines; AssertionError on any other line or a repeat."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name == name.strip() and version.strip() == version, f"not name==version: {line!r}"
        assert canonicalize_name(name) not in out, f"pinned twice: {name}"
        out[canonicalize_name(name)] = version
    return out


def disagreements(requirements: list[tuple[str, str]], locked: dict[str, str]) -> list[str]:
    """What is wrong between ``requirements`` ((requirement, where) pairs) and the ``locked`` pins, one line each."""
    out = []
    for text, where in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name not in locked:
            out.append(f"{req.name} ({where}) is missing from requirements/lock.txt")
        elif req.specifier and not req.specifier.contains(locked[name], prereleases=True):
            out.append(f"{req.name} ({where}) wants {req.specifier}, the lock pins {locked[name]}")
    return out


def test_every_pyproject_dependency_is_locked_within_its_range():
    locked = pins(LOCK_TOOL.LOCK.read_text())
    problems = disagreements(LOCK_TOOL.project_requirements(), locked)
    assert not problems, "\n".join(problems) + f"\n({FIX})"


def test_the_pinned_requirement_files_agree_with_the_lock():
    locked = pins(LOCK_TOOL.LOCK.read_text())
    rows = [(r, rel) for rel in LOCK_TOOL.REQUIREMENT_FILES for r in LOCK_TOOL.file_requirements(rel)]
    assert len(rows) > 40, "the requirement files were not read"
    assert all(str(Requirement(r).specifier).startswith("==") for r, _ in rows), "requirement files pin exactly"
    problems = disagreements(rows, locked)
    assert not problems, "\n".join(problems) + f"\n({FIX})"


def test_the_check_names_a_missing_and_an_out_of_range_dependency():
    problems = disagreements([("kopf>=1.37", "pyproject.toml"), ("pydantic>=2.7", "pyproject.toml")], {"pydantic": "1.10.0"})
    assert problems == ["kopf (pyproject.toml) is missing from requirements/lock.txt",
                        "pydantic (pyproject.toml) wants >=2.7, the lock pins 1.10.0"]


def test_the_lock_is_the_projects_closure_only():
    """Every pin is needed by a root (hack/lock.py's ``# via``), and our own distributions are never pinned."""
    text = LOCK_TOOL.LOCK.read_text()
    locked = pins(text)
    assert not set(locked) & LOCK_TOOL.OURS
    blocks = text.split("\n")
    for i, line in enumerate(blocks):
        if "==" in line and not line.startswith("#"):
            assert blocks[i + 1].strip().startswith("# via "), f"{line}: no `# via` line (hand-edited?)"
