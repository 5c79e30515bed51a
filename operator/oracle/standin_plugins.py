"""Stand-ins for the vendor kernel plugins, built from the operator's plugin catalog (worker side).

The plugin packages (sgl-nvidia-mega, sgl-amd-mono) are not on PyPI and need their GPU;
SGLang's startup check of a plugin flag (srt/kernel_plugins/{nvidia,amd}/binding.py
``handle_nvidia_megakernel`` / ``handle_amd_monokernel``) runs SGLang's own code on the
*spec* a plugin registers. The oracle therefore installs, for every plugin in the
catalog, a general SGLang plugin (entry point group ``sglang.srt.plugins``, named as the
real one: ``nvidia_megakernel`` / ``amd_monokernel``) whose spec carries exactly what
``kernels/plugins.yaml`` records: ISAs, TP sizes, dtypes, decode graph backends, the
``model_type`` it is built for, and the accepted features. SGLang's binding then decides.

A feature the catalog marks ``unknown`` is accepted by the stand-in (the operator warns
about it; a refusal there would be a guess), and the verdict says so
(``assumed_features``). The AMD spec's step widths are not in the catalog; the stand-in
covers 1..256 rows in powers of two (an assumption, reported too).

:func:`install_distribution` writes the ``.dist-info`` that makes ``importlib.metadata``
list the entry points; :func:`register_nvidia` / :func:`register_amd` are the entry points
SGLang's ``load_plugins`` calls.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PLUGINS_ENV = "SGLANG_PD_ORACLE_PLUGINS"
DIST_NAME = "sglang_pd_operator_oracle_plugins"
AMD_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_MODULE = __name__


def install_distribution(directory: Path, plugins: dict[str, Any]) -> None:
    """Write the stand-in distribution into ``directory`` and put it on ``sys.path``.

    ``plugins`` is the catalog's plugins section (name -> entry as a dict); it is kept in
    the environment variable :data:`PLUGINS_ENV` for the entry points.
    """
    dist = directory / f"{DIST_NAME}-0.0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 0.0.0\n")
    vendors = {entry.get("vendor") for entry in plugins.values()}
    lines = ["[sglang.srt.plugins]"]
    if "nvidia" in vendors:
        lines.append(f"nvidia_megakernel = {_MODULE}:register_nvidia")
    if "amd" in vendors:
        lines.append(f"amd_monokernel = {_MODULE}:register_amd")
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    os.environ[PLUGINS_ENV] = json.dumps(plugins)
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def _catalog(vendor: str) -> list[tuple[str, dict[str, Any]]]:
    plugins = json.loads(os.environ.get(PLUGINS_ENV, "{}"))
    return [(name, entry) for name, entry in sorted(plugins.items()) if entry.get("vendor") == vendor]


def _features(enum: Any, entry: dict[str, Any]) -> frozenset:
    accepted = {k for k, v in (entry.get("features") or {}).items() if v in ("accepted", "unknown")}
    return frozenset(member for member in enum if member.name.lower() in accepted)


def assumed_features(entry: dict[str, Any]) -> list[str]:
    """The catalog features the stand-in accepts without evidence (``unknown``)."""
    return sorted(k for k, v in (entry.get("features") or {}).items() if v == "unknown")


def _build_refused(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("the oracle's stand-in plugin spec cannot build kernels")


def _hf_requirements(entry: dict[str, Any]) -> dict[str, Any]:
    model_types = entry.get("modelTypes") or []
    return {"model_type": model_types[0]} if len(model_types) == 1 else {}


def register_nvidia() -> None:
    """Entry point ``nvidia_megakernel``: register a MegakernelSpec per catalog NVIDIA plugin."""
    from sglang.kernels.plugin_kernels.nvidia import spec as nv

    module = sys.modules[_MODULE]
    for name, entry in _catalog("nvidia"):
        spec = nv.MegakernelSpec(
            name=f"{name} (catalog stand-in)",
            requires=nv.Requirements(
                isas=frozenset(entry.get("isas") or ()),
                tp_sizes=frozenset(entry.get("tpSizes") or ()),
                dtypes=frozenset(entry.get("dtypes") or ()),
                decode_graph_backends=frozenset(entry.get("decodeGraphBackends") or ("full", "disabled")),
                hf_config=_hf_requirements(entry),
            ),
            features=_features(nv.Feature, entry),
            numerics=nv.Numerics(kind=nv.NumericsKind.BITWISE),
            max_rows=max(AMD_WIDTHS),
            build=_build_refused,
            api_version=nv.MEGAKERNEL_API_VERSION,
        )
        attr = "NVIDIA_" + name.replace("-", "_").upper()
        setattr(module, attr, spec)
        for arch in entry.get("architectures") or ():
            if arch not in nv.registered_architectures():
                nv.register(architecture=arch, path=f"{_MODULE}:{attr}")


def register_amd() -> None:
    """Entry point ``amd_monokernel``: register a MonoSpec per catalog AMD plugin."""
    from sglang.kernels.plugin_kernels.amd import spec as amd

    module = sys.modules[_MODULE]
    for name, entry in _catalog("amd"):
        limits = amd.DeviceLimits(widths=AMD_WIDTHS, tp_sizes=tuple(entry.get("tpSizes") or ()), resident_blocks=0)
        spec = amd.MonoSpec(
            name=f"{name} (catalog stand-in)",
            devices={isa: limits for isa in entry.get("isas") or ()},
            features=_features(amd.Feature, entry),
            requires=amd.Requirements(dtypes=frozenset(entry.get("dtypes") or ()), hf_config=_hf_requirements(entry)),
            numerics=amd.Numerics(kind=amd.NumericsKind.BITWISE),
            model_disable_reasons=lambda *_a: [],
            build=_build_refused,
            api_version=amd.MONOKERNEL_API_VERSION,
        )
        attr = "AMD_" + name.replace("-", "_").upper()
        setattr(module, attr, spec)
        for arch in entry.get("architectures") or ():
            if not amd.spec_registered(backend=amd.BACKEND, architectures=[arch]):
                amd.register(backend=amd.BACKEND, architecture=arch, path=f"{_MODULE}:{attr}")
