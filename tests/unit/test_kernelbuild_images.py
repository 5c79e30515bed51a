"""The runtime-image Dockerfiles and the kernel catalog agree, and the Dockerfiles pass hadolint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild.images import dockerfile_arg_defaults, main
from sglang_pd_operator.kernelbuild.recipes import builtin_build_catalog, image_build_args

IMAGES = sorted(builtin_build_catalog().images)
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))


def test_every_plugin_has_a_runtime_image():
    plugins = {image.plugin for image in builtin_build_catalog().images.values()}
    assert plugins == set(builtin_catalog().plugins), (
        "a plugin in plugins.yaml has no image in builds.yaml (or the reverse)"
    )


@pytest.mark.parametrize("name", IMAGES)
def test_dockerfile_defaults_equal_the_catalog(name):
    image = builtin_build_catalog().images[name]
    declared = dockerfile_arg_defaults(ROOT / image.dockerfile)
    wanted = image_build_args(name, builds=builtin_build_catalog(), catalog=builtin_catalog())
    for key, value in wanted.items():
        assert declared.get(key) == value, (
            f"{image.dockerfile}: ARG {key}={declared.get(key)!r}, catalog says {value!r}"
        )


def test_nvidia_targets_are_the_plugins_isas():
    args = image_build_args("sglang-nvidia", builds=builtin_build_catalog(), catalog=builtin_catalog())
    assert args["TORCH_CUDA_ARCH_LIST"] == "10.0a;10.3a"  # sm_100, sm_103 (plugins.yaml isas)
    assert (
        image_build_args("sglang-rocm", builds=builtin_build_catalog(), catalog=builtin_catalog())["GPU_TARGETS"]
        == "gfx950"
    )


def test_build_args_command_prints_flags(capsys):
    assert main(["build-args", "sglang-nvidia"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "--build-arg PLUGIN_NAME=sgl-nvidia-mega" in out
    assert main(["build-args", "nope"]) == 2


def _hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.is_file()), None
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_is_clean(dockerfile):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed: pip install -r requirements/lint.txt")
    proc = subprocess.run([exe, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_images_run_as_documented():
    op = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    assert "USER 65532" in op and "COPY kernels ./kernels" in op  # the catalog is package data
    for name in ("sglang-nvidia", "sglang-rocm"):
        text = (ROOT / "images" / name / "Dockerfile").read_text()
        assert "sglang_pd_operator.kernelbuild.builder" in text and "SGLANG_JIT_CACHE_DIR" in text
