"""Keep the Helm chart in step with the repository, and check that it is.

The chart ``charts/sglang-pd-operator`` carries two things that have another source:

- its CRDs: ``files/crds/*.yaml`` is a byte-for-byte copy of ``crds/`` (itself generated
  from ``operator/api`` by ``sglang-pd-operator crds``). Helm cannot package files from
  outside the chart folder, so the copy is made here rather than by a symlink;
- its version: ``Chart.yaml`` ``version`` and ``appVersion`` equal the Python package
  version (``pyproject.toml`` and ``sglang_pd_operator.__version__``), and CHANGELOG.md
  has a section for it.

Commands (run from anywhere; they never import the package, so the repository's
``operator/`` folder cannot shadow the standard library):

    python hack/chart_check.py sync    # copy crds/ (and crds/policies/) into the chart, set the chart's versions
    python hack/chart_check.py check   # exit 1 and list what is out of step (used by tests)

``tests/unit/test_chart.py`` runs :func:`problems`; the chart tests render the chart with
:func:`helm_template` (helm v3.21.4 from the dev cluster's binaries, built once into a
cache by ``sglang_pd_operator_dev.cluster.build``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "sglang-pd-operator"
CHART_CRDS = CHART / "files" / "crds"
CRDS = ROOT / "crds"
#: (source, chart copy): the CRDs, and the admission policies the chart installs (``sglang-pd-operator crds`` writes both)
COPIES = ((CRDS, CHART_CRDS), (CRDS / "policies", CHART / "files" / "policies"))
CHANGELOG = ROOT / "CHANGELOG.md"


def package_version() -> str:
    """``[project].version`` of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def module_version() -> str | None:
    """``__version__`` of operator/__init__.py, read as text (no import)."""
    m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', (ROOT / "operator" / "__init__.py").read_text(), re.M)
    return m[1] if m else None


def chart_versions() -> tuple[str | None, str | None]:
    """(version, appVersion) of Chart.yaml, read as text so that comments survive ``sync``."""
    text = (CHART / "Chart.yaml").read_text()
    version = re.search(r"^version:\s*\"?([^\"\s]+)\"?\s*$", text, re.M)
    app = re.search(r"^appVersion:\s*\"?([^\"\s]+)\"?\s*$", text, re.M)
    return (version[1] if version else None, app[1] if app else None)


def changelog_versions() -> list[str]:
    """Versions with a ``## [x.y.z]`` section in CHANGELOG.md, newest first."""
    if not CHANGELOG.is_file():
        return []
    return re.findall(r"^## \[([0-9][^\]]*)\]", CHANGELOG.read_text(), re.M)


def problems() -> list[str]:
    """Everything out of step, one line each with the fix; empty when the chart is current."""
    out: list[str] = []
    for source_dir, copy_dir in COPIES:
        sources = {p.name: p for p in sorted(source_dir.glob("*.yaml"))}
        copies = {p.name: p for p in sorted(copy_dir.glob("*.yaml"))} if copy_dir.is_dir() else {}
        where, src = copy_dir.relative_to(ROOT), source_dir.relative_to(ROOT)
        for name in sorted(set(sources) | set(copies)):
            if name not in copies:
                out.append(f"{where}/{name} is missing: run `python hack/chart_check.py sync`")
            elif name not in sources:
                out.append(f"{where}/{name} has no source in {src}/: run `python hack/chart_check.py sync`")
            elif copies[name].read_bytes() != sources[name].read_bytes():
                out.append(f"{where}/{name} differs from {src}/{name}: run `python hack/chart_check.py sync`")
    pkg, mod = package_version(), module_version()
    if mod != pkg:
        out.append(f"sglang_pd_operator.__version__ is {mod}, pyproject.toml says {pkg}: make them equal")
    version, app = chart_versions()
    if version != pkg or app != pkg:
        out.append(f"Chart.yaml has version {version} / appVersion {app}, the package is {pkg}: "
                   "run `python hack/chart_check.py sync`")
    if pkg not in changelog_versions():
        out.append(f"CHANGELOG.md has no `## [{pkg}]` section: describe the release")
    return out


def sync() -> list[str]:
    """Copy crds/ and crds/policies/ into the chart (dropping stale copies) and set the chart's versions; returns what changed."""
    changed: list[str] = []
    for source_dir, copy_dir in COPIES:
        copy_dir.mkdir(parents=True, exist_ok=True)
        sources = {p.name: p for p in source_dir.glob("*.yaml")}
        for stale in copy_dir.glob("*.yaml"):
            if stale.name not in sources:
                stale.unlink()
                changed.append(f"removed {stale.relative_to(ROOT)}")
        for name, src in sorted(sources.items()):
            dst = copy_dir / name
            if not dst.is_file() or dst.read_bytes() != src.read_bytes():
                shutil.copyfile(src, dst)
                changed.append(f"copied {src.relative_to(ROOT)}")
    pkg = package_version()
    chart = CHART / "Chart.yaml"
    text = chart.read_text()
    new = re.sub(r"^version:.*$", f"version: {pkg}", text, count=1, flags=re.M)
    new = re.sub(r"^appVersion:.*$", f'appVersion: "{pkg}"', new, count=1, flags=re.M)
    if new != text:
        chart.write_text(new)
        changed.append(f"Chart.yaml version/appVersion -> {pkg}")
    return changed


def helm_binary(*, log=print) -> Path:
    """helm from the dev cluster's binaries (cache hit, or built once: see docs/dev-cluster.md)."""
    from sglang_pd_operator_dev.cluster.build import ensure_binaries

    return ensure_binaries(log=log).path("helm")


def helm(*args: str, check: bool = True, chart: Path = CHART) -> subprocess.CompletedProcess:
    """Run ``helm ARGS`` (``{chart}`` in ARGS is replaced by the chart folder); raise with stderr on failure."""
    argv = [str(helm_binary(log=lambda _: None)), *(str(chart) if a == "{chart}" else a for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def helm_template(*, values: Sequence[Path | str] = (), sets: Sequence[str] = (), namespace: str = "sglang-system",
                  release: str = "pd", chart: Path = CHART) -> list[dict[str, Any]]:
    """``helm template`` of the chart as a list of objects (``values``: files, ``sets``: ``key=value``)."""
    import yaml

    args = ["template", release, "{chart}", "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args, chart=chart).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def main(argv: list[str]) -> int:
    if argv[1:] == ["sync"]:
        for line in sync() or ["chart already in sync"]:
            print(line)
        return 0
    if argv[1:] == ["check"]:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        return 1 if found else 0
    print(__doc__.split("Commands", 1)[1].split("``tests", 1)[0].strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
