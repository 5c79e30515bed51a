"""The operator image the chart runs (images/operator/Dockerfile) holds what the operator needs.

There is no container runtime here, so the image's install steps are replayed instead: the
wheel is built from the repository as the build stage builds it, installed into an empty
folder, the Dockerfile's own data-copy command is run against it, and the installed
package (not the repository's editable one) checks and renders every example with the
catalog at the image's ``SGLANG_PD_CATALOG_DIR``. The Dockerfile's user and entrypoint
must match what the chart's Deployment assumes.
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
from helpers import EXAMPLES, ROOT

DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
VALUES = ROOT / "charts" / "sglang-pd-operator" / "values.yaml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", "", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


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
    catalog_dir = re.search(r"SGLANG_PD_CATALOG_DIR=(\S+)", env)[1]
    assert ("COPY", f"kernels {catalog_dir}") in stage
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the chart's root filesystem is read-only
    # only the package and its dependencies: no test/contract extras, no compilers
    text = DOCKERFILE.read_text()
    assert "[test]" not in text and "[contract]" not in text and "apt-get" not in text
    assert [arg for op, arg in final_stage() if op == "FROM"] == ["${PYTHON_IMAGE}"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel installed into an empty folder, then the Dockerfile's data-copy step run on it."""
    tmp = tmp_path_factory.mktemp("image")
    wheels, target = tmp / "wheels", tmp / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(ROOT)],
                   check=True, cwd="/", env={**os.environ, "PYTHONSAFEPATH": "1"})
    (wheel,) = wheels.glob("sglang_pd_operator-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, cwd="/")
    # each `COPY operator/... /tmp/...` + the RUN that uses it, with the paths mapped here
    stage = final_stage()
    for i, (op, arg) in enumerate(stage):
        if op == "COPY" and arg.startswith("operator/"):
            src, dst = arg.split()
            shutil.copytree(ROOT / src, tmp / dst.lstrip("/"))
            run = stage[i + 1]
            assert run[0] == "RUN", f"COPY {arg} is not followed by the RUN that installs it"
            command = run[1].split(" && ")[0].replace(dst, str(tmp / dst.lstrip("/")))
            subprocess.run(command.replace("python ", f"{sys.executable} ", 1), shell=True, check=True, cwd="/",
                           env={**os.environ, "PYTHONPATH": str(target), "PYTHONSAFEPATH": "1"})
    return target


def _run_installed(target: Path, *args: str, catalog: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target), "PYTHONSAFEPATH": "1", "SGLANG_PD_CATALOG_DIR": str(catalog)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd="/", env=env)


def test_installed_package_checks_and_renders_every_example(installed, tmp_path):
    catalog = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", catalog)
    where = _run_installed(installed, "-c", "import sglang_pd_operator, sglang_pd_operator.operator_main as m; "
                           "print(sglang_pd_operator.__file__)", catalog=catalog)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(installed)), "the repository's package was imported, not the wheel"
    examples = [str(p) for p in sorted(EXAMPLES.glob("*.yaml"))]
    check = _run_installed(installed, "-m", "sglang_pd_operator.cli", "check", *examples, catalog=catalog)
    assert check.returncode == 0, check.stdout + check.stderr
    render = _run_installed(installed, "-m", "sglang_pd_operator.cli", "render", examples[0], catalog=catalog)
    assert render.returncode == 0 and "kind: Deployment" in render.stdout, render.stderr
