"""The operator image the chart runs (images/operator/Dockerfile) holds what the operator needs.

There is no container runtime here, so the image's install steps are replayed instead: the
wheel is built from what the build stage copies, installed into an empty folder, and the
installed package (not the repository's editable one) checks and renders every example
with the catalog it carries as package data (no ``SGLANG_PD_CATALOG_DIR``). The
Dockerfile's user and entrypoint must match what the chart's Deployment assumes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, ROOT, images_build

DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
VALUES = ROOT / "charts" / "sglang-pd-operator" / "values.yaml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined (the image build's parser)."""
    return images_build().dockerfile_instructions(DOCKERFILE)


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


def test_user_entrypoint_and_catalog_match_the_chart():
    stage = final_stage()
    values = yaml.safe_load(VALUES.read_text())
    user = [arg for op, arg in stage if op == "USER"]
    uid = values["podSecurityContext"]["runAsUser"]
    assert user == [f"{uid}:{values['podSecurityContext']['runAsGroup']}"], user
    assert ("ENTRYPOINT", '["sglang-pd-operator"]') in stage
    env = " ".join(arg for op, arg in stage if op == "ENV")
    assert "SGLANG_PD_CATALOG_DIR" not in env  # the wheel carries the catalog
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the chart's root filesystem is read-only
    # only the package and its dependencies: no test/contract extras, no compilers
    text = DOCKERFILE.read_text()
    assert "[test]" not in text and "[contract]" not in text
    # Debian's python3 at the pinned versions (images/base/debian.yaml; tests/unit/test_image_builds.py)
    assert [arg for op, arg in final_stage() if op == "FROM"] == ["${DEBIAN_IMAGE}"]
    assert not [arg for op, arg in final_stage() if op == "RUN" and re.search(r"(^| )(gcc|build-essential|python3-pip)(=| |$)", arg)]


def build_stage_copies() -> list[str]:
    """The repository paths the build stage copies into /src (``COPY a b ./`` -> a, b)."""
    ins = instructions()
    first_from = next(i for i, (op, _) in enumerate(ins) if op == "FROM")
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    paths = []
    for op, arg in ins[first_from:last_from]:
        if op == "COPY" and not arg.startswith("--from"):
            paths += arg.split()[:-1]
    return paths


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from only what the build stage copies, installed into an empty folder."""
    tmp = tmp_path_factory.mktemp("image")
    src, wheels, target = tmp / "src", tmp / "wheels", tmp / "site"
    src.mkdir()
    for path in build_stage_copies():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / path).is_dir() else shutil.copy)(ROOT / path, src / path)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(src)],
                   check=True, cwd="/", env={**os.environ, "PYTHONSAFEPATH": "1"})
    (wheel,) = wheels.glob("sglang_pd_operator-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, cwd="/")
    return target


def _run_installed(target: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PD_CATALOG_DIR"}
    env.update(PYTHONPATH=str(target), PYTHONSAFEPATH="1")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd="/", env=env)


def test_installed_package_checks_and_renders_every_example(installed):
    where = _run_installed(installed, "-c", "import sglang_pd_operator, sglang_pd_operator.runtime.main as m; "
                           "from sglang_pd_operator.catalog import default_catalog_dir as d; "
                           "print(sglang_pd_operator.__file__); print(d())")
    assert where.returncode == 0, where.stderr
    package, catalog = where.stdout.split()
    assert package.startswith(str(installed)), "the repository's package was imported, not the wheel"
    assert catalog == str(installed / "sglang_pd_operator" / "kernels"), "the catalog is not the wheel's own copy"
    shipped = sorted(p.relative_to(Path(catalog)) for p in Path(catalog).rglob("*.yaml"))
    assert shipped == sorted(p.relative_to(ROOT / "kernels") for p in (ROOT / "kernels").rglob("*.yaml"))
    assert (installed / "sglang_pd_operator" / "planning" / "data" / "sglang-0.5.23-flags.json").is_file()
    examples = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    check = _run_installed(installed, "-m", "sglang_pd_operator.cli", "check", *examples)
    assert check.returncode == 0, check.stdout + check.stderr
    render = _run_installed(installed, "-m", "sglang_pd_operator.cli", "render", examples[0])
    assert render.returncode == 0 and "kind: Deployment" in render.stdout, render.stderr


def test_the_image_holds_no_dev_tools_and_installs_from_the_lock(installed):
    """The dev cluster, the demo and the KernelBuild stand-in are the dev package's, never the image's."""
    assert "devtools" not in " ".join(build_stage_copies())
    files = [p.relative_to(installed).as_posix() for p in installed.rglob("*") if p.is_file()]
    assert not [f for f in files if "sglang_pd_operator_dev" in f or "devcluster" in f or "standin.py" in f]
    assert not [f for f in files if f.startswith("devtools")]
    (metadata,) = installed.glob("sglang_pd_operator-*.dist-info/METADATA")
    requires = [line for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not [r for r in requires if "cryptography" in r or "jsonpatch" in r], requires
    # the wheels are built at the locked versions
    assert "requirements/lock.txt" in build_stage_copies()
    assert [arg for op, arg in instructions() if op == "RUN" and "pip wheel" in arg and "-c requirements/lock.txt" in arg]
