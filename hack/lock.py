"""Write requirements/lock.txt: every distribution the project installs, pinned to the version installed here.

The lock is a pip constraints file (``pip install -c requirements/lock.txt ...``): pyproject
files keep version ranges, the lock pins what CI (``hack/setup.sh``), the demo and the
operator image (``images/operator/Dockerfile``) install. Its roots are

- the operator's dependencies and its ``test`` extra (``pyproject.toml``);
- the dev tools' dependencies (``devtools/pyproject.toml``);
- the contract, lint and SGLang oracle sets (``requirements/*.txt``, which ``-r`` the
  oracle's ``operator/oracle/requirements/*.txt``); their own ``==`` pins stay where they
  are and must agree with the lock (tests/unit/test_lock.py).

Each root is followed through the installed distributions' metadata (markers evaluated
for this interpreter; extras as requested), except the packages installed ``--no-deps``
(``requirements/contract-nodeps.txt``), whose declared CUDA trees are never installed.

Run it with the environment that ``hack/setup.sh --contract`` made and tested:
    .venv/bin/python -P hack/lock.py            # rewrite the lock
    .venv/bin/python -P hack/lock.py --check    # exit 1 when the lock differs from this environment
To move a dependency: widen its range in a pyproject, install it into .venv
(``.venv/bin/pip install -U NAME``), run the tests, then this script.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"
#: Our own distributions (installed editable from this checkout, never pinned).
OURS = {"sglang-pd-operator", "sglang-pd-operator-dev"}
REQUIREMENT_FILES = ("requirements/contract.txt", "requirements/contract-nodeps.txt", "requirements/lint.txt")
NO_DEPS_FILE = "requirements/contract-nodeps.txt"
HEADER = """\
# Exact versions of every distribution the project installs (a pip constraints file).
# Written by hack/lock.py from an environment made by `hack/setup.sh --contract` on Linux,
# CPython 3.11, whose tests pass; do not edit by hand. Used by hack/setup.sh (CI, the demo)
# and images/operator/Dockerfile: `pip install -c requirements/lock.txt ...`. The pyproject
# files keep ranges; tests/unit/test_lock.py fails when a dependency is missing here or its
# pin is outside the range, or when a pin in requirements/*.txt disagrees.
"""


def project_requirements() -> list[tuple[str, str]]:
    """(requirement string, where it comes from) of both pyprojects (the operator's ``test`` extra included)."""
    out = []
    for path, extras in ((ROOT / "pyproject.toml", ("test",)), (ROOT / "devtools" / "pyproject.toml", ())):
        project = tomllib.loads(path.read_text())["project"]
        where = str(path.relative_to(ROOT))
        out += [(r, where) for r in project.get("dependencies", [])]
        for extra in extras:
            out += [(r, f"{where} [{extra}]") for r in project["optional-dependencies"][extra]]
    return [(r, w) for r, w in out if canonicalize_name(Requirement(r).name) not in OURS]


def file_requirements(rel: str) -> list[str]:
    """The requirement lines of a pip requirements file, ``-r`` includes followed."""
    path = ROOT / rel
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            included = (path.parent / line[2:].strip()).resolve().relative_to(ROOT)
            out += file_requirements(str(included))
        else:
            out.append(line)
    return out


def closure() -> dict[str, tuple[str, set[str]]]:
    """canonical name -> (installed version, who needs it); raises SystemExit naming a root that is not installed."""
    roots = project_requirements()
    for rel in REQUIREMENT_FILES:
        roots += [(r, rel) for r in file_requirements(rel)]
    no_deps = {canonicalize_name(Requirement(r).name) for r in file_requirements(NO_DEPS_FILE)}
    found: dict[str, tuple[str, set[str]]] = {}
    todo = [(Requirement(r), via) for r, via in roots]
    while todo:
        req, via = todo.pop()
        name = canonicalize_name(req.name)
        if name in OURS:
            continue
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise SystemExit(f"lock: {req.name} (needed by {via}) is not installed here; run ./hack/setup.sh --contract")
        version = dist.version
        if name in found:
            found[name][1].add(via)
            if not req.extras:
                continue
        else:
            found[name] = (version, {via})
        if name in no_deps:
            continue
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is not None:
                env = default_environment()
                if not any(dep.marker.evaluate({**env, "extra": e}) for e in (req.extras or {""})):
                    continue
            todo.append((dep, name))
    return found


def render(found: dict[str, tuple[str, set[str]]]) -> str:
    """The lock file's text: the header, then ``name==version`` with the distributions that need it."""
    lines = [HEADER]
    for name in sorted(found):
        version, via = found[name]
        lines.append(f"{name}=={version}")
        lines.append(f"    # via {', '.join(sorted(via))}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when the lock differs from this environment")
    args = p.parse_args(argv)
    text = render(closure())
    if args.check:
        if LOCK.read_text() != text:
            print(f"lock: {LOCK.relative_to(ROOT)} differs from this environment; run .venv/bin/python -P hack/lock.py",
                  file=sys.stderr)
            return 1
        return 0
    LOCK.write_text(text)
    print(f"lock: wrote {LOCK.relative_to(ROOT)} ({text.count('==')} distributions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
