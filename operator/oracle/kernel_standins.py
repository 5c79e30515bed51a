"""Import stand-ins for SGLang's GPU kernel packages, which cannot be installed here (worker side).

On a GPU image SGLang's modules import their kernel libraries at import time whenever
the device is CUDA or ROCm (``if _is_cuda: from sgl_kernel import int8_scaled_mm``).
Those libraries (sglang-kernel, flashinfer, DeepGEMM, FlashMLA, DeepEP, aiter ...) are
CUDA/ROCm binaries; on the oracle's CPU machine, under the GPU emulation, the imports
would fail before SGLang reaches its argument checks. None of them is *called* while
arguments are resolved and validated: they are imported for the kernels the model runs.

This module installs a ``sys.meta_path`` finder that answers, for the packages in
:data:`KERNEL_PACKAGES` that are not installed, with a module whose every attribute is a
:class:`KernelStandIn`. Importing and naming them works; calling one, or asking it for
a value, records the access in :data:`CALLS` and raises :class:`KernelUsed`. The oracle
reports every recorded use as "the verdict needed a GPU kernel" instead of trusting it
(``engine_side`` reads :func:`take_calls` after each role), and a contract test asserts
that resolving every example uses none.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from typing import Any

#: Top-level modules of SGLang's GPU kernel dependencies (sglang 0.5.23's Requires-Dist:
#: sglang-kernel, flashinfer-python, sgl-deep-gemm, sgl-flash-mla, sgl-deep-ep,
#: flash-attn-4, quack-kernels, humming-kernels, nvidia-cutlass-dsl, cuda-python; ROCm
#: images add aiter).
KERNEL_PACKAGES = (
    "sgl_kernel", "flashinfer", "deep_gemm", "flash_mla", "deep_ep", "flash_attn", "quack",
    "humming", "cutlass", "cuda", "aiter", "nvshmem", "triton_kernels", "tilelang", "mori",
)  # fmt: skip

CALLS: list[str] = []
#: Capability probes of kernel libraries that SGLang's startup asks to pick a backend,
#: answered from the library's documented support (name -> (answer, what is assumed));
#: each answer used is listed in the verdict's ``assumes`` (:func:`take_answered`).
PROBES: dict[str, tuple[Any, str]] = {
    # sglang/srt/layers/quantization/fp8_utils.py resolve_mxfp8_dense_gemm_backend: FlashInfer's
    # CuTe-DSL MXFP8 GEMM is built for SM100/SM103 (flashinfer gemm mm_mxfp8 backends).
    "flashinfer.mm_mxfp8.is_backend_supported": (
        lambda backend, sm=None, *a, **k: str(backend) in ("cute-dsl", "cutlass") and int(sm or 0) in (100, 103),
        "kernels: FlashInfer's mm_mxfp8 backend support is taken as cute-dsl/cutlass on SM100/SM103 "
        "(layers/quantization/fp8_utils.py resolve_mxfp8_dense_gemm_backend)",
    ),
    # sglang/srt/layers/moe/token_dispatcher/moriep.py:967: MoRI's dispatcher looks up AITER's
    # quantization kernels by type while it is built; the lookup runs no kernel, and what it
    # returns is a kernel (a stand-in here too: calling it is still a kernel use).
    "aiter.get_hip_quant": (
        lambda quant_type, *a, **k: KernelStandIn(f"aiter.get_hip_quant({quant_type!r})"),
        "kernels: AITER's get_hip_quant is taken to have a quantization kernel for each type MoRI's dispatcher "
        "asks for (per_1x128, per_1x32: layers/moe/token_dispatcher/moriep.py:967)",
    ),
}
#: Kernel-library calls SGLang makes only to overlay performance tuning, inside a
#: ``try`` that keeps the library's stock behaviour when they fail
#: (models/deepseek_common/amd/aiter_intree_tune.py install_aiter_intree_tune): their
#: failure here is not recorded as a kernel use.
TUNING_ONLY = frozenset({
    "aiter.ops.triton.utils.config_utils.resolve_config_dir",
    "aiter.ops.mhc.get_gfx_runtime",
})
#: Probes answered since the last :func:`take_answered` (name -> what was assumed).
ANSWERED: dict[str, str] = {}
#: Names of kernel-DSL decorators that take options (``@triton.autotune(configs=...)``).
DECORATOR_FACTORIES = frozenset({"jit", "kernel", "autotune", "heuristics", "compile", "struct", "dsl_user_op"})


class KernelUsed(RuntimeError):
    """SGLang called into a GPU kernel package while the oracle judged arguments."""


class KernelStandIn:
    """Any name of a stand-in kernel module: importable, never usable."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> "KernelStandIn":
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return KernelStandIn(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A kernel *definition* at import (``@cute.jit`` on a function or class, or
        # ``@cute.kernel(...)`` as a decorator factory) is not a kernel run: the decorated
        # object stays as written, and calling it later is SGLang's code, not a stand-in.
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]
        if not args and self._name.rsplit(".", 1)[-1] in DECORATOR_FACTORIES:
            return KernelStandIn(self._name)
        if self._name in PROBES:
            answer, why = PROBES[self._name]
            ANSWERED.setdefault(self._name, why)
            return answer(*args, **kwargs)
        if self._name in TUNING_ONLY:
            raise KernelUsed(f"{self._name} is a GPU kernel library's tuning lookup the oracle cannot run")
        CALLS.append(self._name)
        raise KernelUsed(f"{self._name} is a GPU kernel the oracle cannot run")

    def __bool__(self) -> bool:
        CALLS.append(self._name)
        raise KernelUsed(f"{self._name} was asked for a value the oracle cannot know")

    def __repr__(self) -> str:
        return f"<kernel stand-in {self._name}>"

    def __mro_entries__(self, bases: tuple) -> tuple:
        # `class X(sgl_kernel.SomeBase)`: subclassing a stand-in gives a plain class
        return (object,)


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return KernelStandIn(f"{self.__name__}.{attr}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package: submodules resolve through the finder too
        module.__version__ = "0.0.0+oracle-stand-in"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname.partition(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


#: Kernel packages built for one GPU vendor only (package -> vendor): served only on that vendor's
#: emulated pod. Elsewhere SGLang's import fails as it does on the real image (stages.VENDOR_ONLY_MODULES
#: judges that ImportError as SGLang's refusal): MoRI is AMD's ROCm library.
VENDOR_ONLY: dict[str, str] = {"mori": "amd"}


def install(vendor: str | None = None) -> list[str]:
    """Install the finder for the kernel packages not importable here; returns their names.

    ``vendor``: the emulated GPU's vendor (``nvidia`` | ``amd``); a package of :data:`VENDOR_ONLY`
    built for another vendor is not served. None: every package (no emulated device)."""
    missing = []
    for name in KERNEL_PACKAGES:
        if name in sys.modules or (vendor is not None and VENDOR_ONLY.get(name, vendor) != vendor):
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            missing.append(name)
    if missing:
        sys.meta_path.append(_Finder(set(missing)))
    return missing


def take_calls() -> list[str]:
    """The kernel uses recorded since the last call (and forget them)."""
    calls = list(dict.fromkeys(CALLS))
    CALLS.clear()
    return calls


def take_answered() -> list[str]:
    """What the probes answered since the last call assumed (and forget them)."""
    out = list(ANSWERED.values())
    ANSWERED.clear()
    return out
