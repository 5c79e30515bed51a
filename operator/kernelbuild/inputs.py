"""What a role's kernel cache depends on: KernelBuild inputs, their hash and the build's name (pure).

The hash covers exactly what changes the compiled kernels, so equal inputs reuse a
finished build and a change of any of them makes a new one:

- the runtime image and SGLang version (SGLang's JIT cache key includes the compilers and
  the torch / DeepGEMM / FlashInfer versions in the image: kernels/jit/utils/compile/
  cache.py ``_environment_fingerprint``);
- the accelerator (its ISA, and its SM count: DeepGEMM specializes by it);
- the vendor plugin and its version (decode only; plugins cover decode steps);
- model name and revision (weights' shapes and quantization decide GEMM shapes);
- the role, the GPUs of one replica and the role's SGLang flags and environment as the
  PDDeployment renders them, minus flags that only address the server (host, port,
  served name, metrics, bootstrap port, RDMA devices) or the weights' location
  (``--model-path``: the Job mounts the same source at the same path);
- the build recipe and a fingerprint of its commands.

Left out on purpose: where the weights are, storage, retry, retention, resources and pod
annotations — changing them must not throw away a finished build.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..api.kernelbuild import KernelBuildSpec
from ..api.v1alpha1 import API_VERSION
from ..catalog import Catalog
from ..planning.memory import gib
from ..planning.structs import Plan
from ..planning.roles import Role
from .recipes import BuildCatalog, Recipe, builtin_build_catalog

DOMAIN = "pd.sglang-operator.io"
LABEL_KERNELBUILD = f"{DOMAIN}/kernelbuild"
LABEL_INPUT_HASH = f"{DOMAIN}/kernel-inputs"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_CREATED_BY = f"{DOMAIN}/created-by"
CREATED_BY_AUTO = "kernels-cache-auto"
HASH_LENGTH = 32
NAME_HASH_LENGTH = 10

# Flags that address the server or the weights' location, not the kernels, with the
# number of values each takes. The build Job renders its own --model-path/--revision/
# --host/--port; RDMA devices are dropped (the Job runs Mooncake over TCP).
NON_KERNEL_FLAGS: dict[str, int] = {
    "--model-path": 1,
    "--model": 1,
    "--revision": 1,
    "--host": 1,
    "--port": 1,
    "--served-model-name": 1,
    "--enable-metrics": 0,
    "--disaggregation-bootstrap-port": 1,
    "--disaggregation-ib-device": 1,
    "--config": 1,
    # a pod's place in a multi-node replica ($(LWS_...) references): every rank runs the same kernels
    "--node-rank": 1,
    "--dist-init-addr": 1,
}
# Environment that does not change kernels: the cache location itself (the Job and the
# pods set it), transfer and credentials.
NON_KERNEL_ENV = frozenset(
    {"SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "MC_FORCE_TCP", "HF_HOME", "HF_TOKEN", "SGLANG_CRASH_ON_JIT_COMPILE"}
)
NON_KERNEL_ENV_PREFIXES = ("MOONCAKE_", "MC_", "NCCL_IB_", "UCX_")


class KernelBuildError(ValueError):
    """A KernelBuild spec that cannot be resolved (unknown recipe, accelerator or plugin); names the field."""

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}")
        self.field, self.message = field_path, message


def _groups(args: list[str] | tuple[str, ...]) -> list[list[str]]:
    """Split a flag list into [flag, values...] groups (values never start with ``--``)."""
    groups: list[list[str]] = []
    for tok in args:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


def kernel_args(args: list[str] | tuple[str, ...]) -> list[str]:
    """``args`` without the flags in :data:`NON_KERNEL_FLAGS` (``--f v`` and ``--f=v`` forms)."""
    out: list[str] = []
    for group in _groups(args):
        flag = group[0].split("=", 1)[0]
        if flag in NON_KERNEL_FLAGS:
            continue
        out += group
    return out


def kernel_env(env: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """The role's environment that can change kernels, last value per name, in first-seen order."""
    kept: dict[str, str] = {}
    for name, value in env:
        if name in NON_KERNEL_ENV or name.startswith(NON_KERNEL_ENV_PREFIXES):
            continue
        kept[name] = value
    return [{"name": k, "value": v} for k, v in kept.items()]


@dataclass(frozen=True)
class ResolvedBuild:
    """A KernelBuild spec with its defaults resolved against the catalogs."""

    recipe_name: str
    recipe: Recipe
    plugin_version: str | None
    vendor: str | None


def resolve(spec: KernelBuildSpec, *, builds: BuildCatalog, catalog: Catalog | None) -> ResolvedBuild:
    """Resolve the recipe (spec.recipe, else the vendor's default) and the plugin version.

    ``catalog`` is needed only when the spec leaves the recipe or the plugin version to a
    default. Raises :class:`KernelBuildError` naming the field when something is unknown.
    """
    acc = catalog.accelerator(spec.accelerator) if catalog is not None else None
    if catalog is not None and acc is None:
        raise KernelBuildError("spec.accelerator", f"{spec.accelerator!r} is not in the accelerator catalog")
    name = spec.recipe
    if name is None:
        if acc is None:
            raise KernelBuildError("spec.recipe", "no recipe given and no catalog to pick the vendor's default")
        name = builds.default_recipe(acc.vendor)
        if name is None:
            raise KernelBuildError("spec.recipe", f"no default build recipe for vendor {acc.vendor!r} in builds.yaml")
    recipe = builds.recipe(name)
    if recipe is None:
        raise KernelBuildError(
            "spec.recipe", f"recipe {name!r} is not in kernels/builds.yaml ({', '.join(sorted(builds.recipes))})"
        )
    version = spec.plugin.version
    if spec.plugin.name != "none" and version is None:
        plugin = catalog.plugin(spec.plugin.name) if catalog is not None else None
        if plugin is None:
            raise KernelBuildError(
                "spec.plugin.version", f"no version given and {spec.plugin.name!r} is not in the catalog"
            )
        version = plugin.package.version
    if spec.plugin.name != "none" and acc is not None:
        plugin = catalog.plugin(spec.plugin.name) if catalog is not None else None
        if plugin is not None and acc.isa not in plugin.isas:
            raise KernelBuildError(
                "spec.plugin.name",
                f"{spec.plugin.name} supports {', '.join(plugin.isas)}, not {acc.isa} ({spec.accelerator})",
            )
    return ResolvedBuild(recipe_name=name, recipe=recipe, plugin_version=version, vendor=acc.vendor if acc else None)


def hashed_inputs(spec: KernelBuildSpec, resolved: ResolvedBuild) -> dict[str, Any]:
    """The canonical inputs of a build: exactly what :func:`input_hash` covers."""
    env: dict[str, str] = {}
    for e in spec.env:
        env[e.name] = e.value
    return {
        "image": spec.runtime.image,
        "sglangVersion": spec.runtime.sglangVersion,
        "accelerator": spec.accelerator.lower(),
        "plugin": spec.plugin.name,
        "pluginVersion": resolved.plugin_version if spec.plugin.name != "none" else None,
        "model": spec.model.name,
        "revision": spec.model.revision,
        "role": spec.role,
        "gpus": spec.gpus,
        "args": list(spec.args),
        "env": dict(sorted(env.items())),
        "recipe": resolved.recipe_name,
        "recipeFingerprint": resolved.recipe.fingerprint,
    }


def input_hash(inputs: dict[str, Any]) -> str:
    """A 32-hex-digit sha256 prefix of the canonical JSON of ``inputs`` (sorted keys)."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def differing_inputs(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Names of the hashed inputs that differ between two builds (for messages)."""
    a, b = a or {}, b or {}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def build_name(*, accelerator: str, role: str, digest: str) -> str:
    """``<accelerator>-<role>-<hash10>``, e.g. ``gb300-decode-3f2a9c01bd`` (at most 40 characters)."""
    acc = re.sub(r"[^a-z0-9-]+", "-", accelerator.lower()).strip("-")[:20] or "acc"
    return f"{acc}-{role}-{digest[:NAME_HASH_LENGTH]}"


@dataclass(frozen=True)
class KernelBuildInputs:
    """One role's kernel build: the KernelBuild spec, its hashed inputs, hash and name."""

    name: str
    role: Role
    input_hash: str
    inputs: dict[str, Any] = field(hash=False)
    spec: KernelBuildSpec = field(hash=False)

    def manifest(self, namespace: str, *, auto: bool = True) -> dict[str, Any]:
        """The KernelBuild object to create (``auto``: labelled as created by ``kernels.cache: auto``).

        No owner reference: a build is shared by every PDDeployment of the namespace with
        the same inputs and outlives them; retention deletes it once unused.
        """
        labels = {
            "app.kubernetes.io/managed-by": "sglang-pd-operator",
            LABEL_INPUT_HASH: self.input_hash,
            LABEL_ROLE: self.role,
        }
        if auto:
            labels[LABEL_CREATED_BY] = CREATED_BY_AUTO
        return {
            "apiVersion": API_VERSION,
            "kind": "KernelBuild",
            "metadata": {"name": self.name, "namespace": namespace, "labels": labels},
            "spec": self.spec.model_dump(mode="json", exclude_none=True, exclude_defaults=False),
        }


def spec_inputs(
    spec: KernelBuildSpec, *, builds: BuildCatalog | None = None, catalog: Catalog | None = None
) -> tuple[ResolvedBuild, dict[str, Any], str]:
    """(resolved defaults, hashed inputs, input hash) of a KernelBuild spec (the reconciler's view)."""
    resolved = resolve(spec, builds=builds or builtin_build_catalog(), catalog=catalog)
    inputs = hashed_inputs(spec, resolved)
    return resolved, inputs, input_hash(inputs)


def kernel_build_inputs(
    plan: Plan, role: Role, *, builds: BuildCatalog | None = None, recipe: str | None = None
) -> KernelBuildInputs:
    """The KernelBuild a PDDeployment role needs, from its plan (pure).

    The spec carries every default resolved (recipe, plugin version), so its hash needs
    no catalog lookups and equals what the KernelBuild reconciler computes for it.
    ``recipe`` overrides the vendor default (tests use ``standin``, with ``builds`` holding it). Raises
    :class:`KernelBuildError` when the role's accelerator is unknown (an invalid plan).
    """
    builds = builds or builtin_build_catalog()
    rp = plan.role(role)
    ri = rp.inputs
    acc = ri.accelerator
    if acc is None:
        raise KernelBuildError(ri.accelerator_field, f"{ri.accelerator_name!r} is not in the accelerator catalog")
    recipe_name = recipe or builds.default_recipe(acc.vendor)
    if recipe_name is None or builds.recipe(recipe_name) is None:
        raise KernelBuildError("spec.kernels.cache", f"no build recipe {recipe_name!r} for vendor {acc.vendor}")
    spec_model = plan.spec.model
    plugin: dict[str, Any] = {"name": "none"}
    if ri.plugin is not None:
        plugin = {"name": ri.plugin_name, "version": plan.spec.kernels.version or ri.plugin.package.version}
    spec = KernelBuildSpec.model_validate(
        {
            "role": role,
            "runtime": ri.runtime.model_dump(mode="json"),
            "accelerator": ri.accelerator_name.lower(),
            "plugin": plugin,
            "model": {
                "name": spec_model.name,
                "revision": spec_model.revision,
                "source": spec_model.source.model_dump(mode="json", exclude_none=True),
            },
            "gpus": ri.gpus_per_pod,  # one pod's GPUs: a multi-node replica's ranks each build the same kernels
            "args": kernel_args(rp.command.args),
            "env": kernel_env(rp.command.env),
            "recipe": recipe_name,
            "resources": {"memory": gib(rp.memory.host_bytes), "sharedMemory": rp.memory.shm}
            | ({"cpu": ri.spec.resources.cpu} if ri.spec.resources.cpu else {}),
        }
    )
    resolved, inputs, digest = spec_inputs(spec, builds=builds)
    return KernelBuildInputs(
        name=build_name(accelerator=spec.accelerator, role=role, digest=digest),
        role=role,
        input_hash=digest,
        inputs=inputs,
        spec=spec,
    )
