"""The build catalog ``kernels/builds.yaml``: build recipes and runtime image builds.

A *recipe* is the list of commands a KernelBuild Job runs inside the runtime image
(compile, warm up, verify) plus what the published cache must and must not contain.
An *image build* names the Dockerfile of a runtime image carrying a vendor plugin; the
plugin's source and version come from ``plugins.yaml`` (the kernel catalog), never from
here, so the catalog stays the one source of versions.

Loaded and checked like :mod:`sglang_pd_operator.catalog` (pydantic, names in errors).
Kept in its own file rather than in ``catalog.py`` because only the kernel build code
reads it.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..catalog import CatalogError, Catalog, default_catalog_dir

BUILDS_FILE = "builds.yaml"
SERVER_ARGS = "{server_args}"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_Entry):
    """One command of a recipe (see the header of kernels/builds.yaml)."""

    name: str = Field(pattern=r"^[a-z0-9][-a-z0-9]*$")
    kind: Literal["run", "serve"]
    argv: tuple[str, ...] = Field(min_length=1)
    probe: str = Field(default="/health_generate", pattern=r"^/")
    verify: bool = False


class Recipe(_Entry):
    """Commands of one build and the checks on what they leave in the cache."""

    description: str = ""
    steps: tuple[Step, ...] = Field(min_length=1)
    expect: tuple[str, ...] = ("**",)
    forbid: tuple[str, ...] = ("**/.staging-*",)
    writable: tuple[str, ...] = ()

    @property
    def verifies(self) -> bool:
        """A verify step runs: a successful build is complete for its flags."""
        return any(s.verify for s in self.steps)

    @property
    def fingerprint(self) -> str:
        """sha256 prefix over everything that changes what the recipe produces (not the description)."""
        body = self.model_dump(mode="json", exclude={"description"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class ImageBuild(_Entry):
    """A runtime image with a vendor plugin built in (images/<name>/Dockerfile)."""

    dockerfile: str
    baseImage: str
    plugin: str
    gitRef: str = "v{version}"


class BuildCatalog(_Entry):
    """All of kernels/builds.yaml."""

    defaults: dict[Literal["nvidia", "amd"], str]
    recipes: dict[str, Recipe]
    images: dict[str, ImageBuild] = Field(default_factory=dict)

    def recipe(self, name: str) -> Recipe | None:
        """The recipe named ``name``, or None."""
        return self.recipes.get(name)

    def default_recipe(self, vendor: str) -> str | None:
        """The recipe name for an accelerator vendor (nvidia, amd), or None."""
        return self.defaults.get(vendor)  # type: ignore[call-overload]


def load_build_catalog(directory: Path | None = None, *, text: str | None = None) -> BuildCatalog:
    """Load ``builds.yaml`` from ``directory`` (default: the kernel catalog folder) or from ``text``.

    Raises :class:`~sglang_pd_operator.catalog.CatalogError` naming the entry when the
    file does not match the schema or a default names a missing recipe.
    """
    if text is None:
        path = (directory or default_catalog_dir()) / BUILDS_FILE
        if not path.is_file():
            raise CatalogError(f"{path}: build catalog missing")
        text = path.read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise CatalogError(f"{BUILDS_FILE}: not valid YAML: {e}") from e
    try:
        catalog = BuildCatalog(**data)
    except (ValidationError, TypeError) as e:
        if isinstance(e, ValidationError):
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise CatalogError(f"{BUILDS_FILE}: entry {loc}: {first['msg']}") from e
        raise CatalogError(f"{BUILDS_FILE}: {e}") from e
    for vendor, name in catalog.defaults.items():
        if name not in catalog.recipes:
            raise CatalogError(f"{BUILDS_FILE}: defaults.{vendor} names recipe {name!r}, which is not defined")
    for name, recipe in catalog.recipes.items():
        for step in recipe.steps:
            if step.kind == "serve" and not any("{port}" in a or a == SERVER_ARGS for a in step.argv):
                raise CatalogError(f"{BUILDS_FILE}: recipes.{name}.{step.name}: a serve step must listen on {{port}}")
    return catalog


@lru_cache(maxsize=1)
def builtin_build_catalog() -> BuildCatalog:
    """The build catalog shipped in ``kernels/`` (cached)."""
    return load_build_catalog()


def image_build_args(name: str, *, builds: BuildCatalog, catalog: Catalog) -> dict[str, str]:
    """The ``docker build --build-arg`` values of image ``name``, from builds.yaml and plugins.yaml.

    BASE_IMAGE, PLUGIN_NAME, PLUGIN_SOURCE (the pip/git source without ``git+``),
    PLUGIN_VERSION, PLUGIN_REF, PLUGIN_ENTRY_POINT and the GPU targets: TORCH_CUDA_ARCH_LIST for NVIDIA
    (sm_100 -> 10.0a, sm_103 -> 10.3a: the arch-specific targets Blackwell kernels need),
    GPU_TARGETS for AMD (gfx950). Raises KeyError naming what is missing.
    """
    image = builds.images[name]
    plugin = catalog.plugin(image.plugin)
    if plugin is None:
        raise KeyError(f"builds.yaml images.{name}.plugin {image.plugin!r} is not in plugins.yaml")
    source = plugin.package.source.removeprefix("git+")
    args = {
        "BASE_IMAGE": image.baseImage,
        "PLUGIN_NAME": image.plugin,
        "PLUGIN_SOURCE": source,
        "PLUGIN_VERSION": plugin.package.version,
        "PLUGIN_REF": image.gitRef.format(version=plugin.package.version),
        "PLUGIN_ENTRY_POINT": plugin.entryPoint,
    }
    if plugin.vendor == "nvidia":
        args["TORCH_CUDA_ARCH_LIST"] = ";".join(_cuda_arch(isa) for isa in plugin.isas)
    else:
        args["GPU_TARGETS"] = ";".join(plugin.isas)
    return args


def _cuda_arch(isa: str) -> str:
    """sm_100 -> 10.0a, sm_103 -> 10.3a, sm_90a -> 9.0a (TORCH_CUDA_ARCH_LIST spelling)."""
    digits = isa.removeprefix("sm_").rstrip("a")
    return f"{digits[:-1]}.{digits[-1]}a"
