"""The ``standin`` recipe in a copy of the operator's build catalog, and the stand-in beside an installed builder.

The operator's catalog (``kernels/builds.yaml``, shipped in its package and image) has no
``standin`` recipe, so no user's KernelBuild can select it. Tests that build without a
GPU take :func:`build_catalog_with_standin` and pass it where the operator's code takes a
build catalog (``kernel_build_inputs(..., builds=...)``, ``spec_inputs(..., builds=...)``);
the request they render runs ``python -m sglang_pd_operator_dev.kernelbuild.standin``,
which an environment with this package installed finds, and a builder copied elsewhere
(``builder --install-to DIR``, as the build pod's init container does) finds once
:func:`install` has put the stand-in beside it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from sglang_pd_operator.kernelbuild.recipes import BuildCatalog, Recipe, builtin_build_catalog

#: The recipe's name, as a KernelBuild's ``spec.recipe`` names it.
STANDIN = "standin"
RECIPE_FILE = Path(__file__).resolve().parent / "standin.yaml"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
#: What :func:`install` copies, relative to this package's folder: the program and the packages holding it.
_INSTALL_FILES = ("__init__.py", "kernelbuild/__init__.py", "kernelbuild/standin.py")


def standin_recipe() -> Recipe:
    """The ``standin`` recipe from ``standin.yaml``; pydantic's ValidationError when the file breaks the schema."""
    return Recipe.model_validate(yaml.safe_load(RECIPE_FILE.read_text()))


def build_catalog_with_standin(base: BuildCatalog | None = None) -> BuildCatalog:
    """``base`` (default: the operator's built-in build catalog) with the ``standin`` recipe added.

    Raises ValueError when ``base`` already has a recipe of that name (the operator's
    catalog must not: tests/unit/test_kernelbuild_builder.py checks it).
    """
    base = base or builtin_build_catalog()
    if STANDIN in base.recipes:
        raise ValueError(f"the build catalog already has a recipe {STANDIN!r}")
    return base.model_copy(update={"recipes": {**base.recipes, STANDIN: standin_recipe()}})


def install(target: Path) -> list[Path]:
    """Copy the stand-in program into ``target``/sglang_pd_operator_dev (beside a builder installed into ``target``)."""
    written = []
    for rel in _INSTALL_FILES:
        dst = target / "sglang_pd_operator_dev" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_PACKAGE_ROOT / rel, dst)
        written.append(dst)
    return written
