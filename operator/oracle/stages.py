"""The stages of one role's startup the oracle runs, and the phase of SGLang's startup each belongs to.

Pure (no torch, no sglang): read by :mod:`.judge` in the caller's process and by
:mod:`.engine_side` in the workers. A refusal's ``stage`` is where the oracle caught it;
its ``phase`` is the part of SGLang's startup that refused, as a person (and the
differential's matrix) groups them: the argument checks ``launch_server`` makes
(``args``), the scheduler's model construction (``model``), the PD peer facts of the KV
cache (``kv``), the draft worker of a speculative role (``speculative``: SGLang builds it
after the target model, before the memory is planned), the scheduler's memory planning and KV pool assembly (``memory``),
the CUDA-graph runner's checks (``graphs``), its PD
queues (``pd-queues``), the transfer backend's manager (``transfer``), and the pair's
bootstrap registration and handshake (``handshake``).
"""

from __future__ import annotations

import traceback
from typing import Any

#: One role's stages, in SGLang's order.
STAGES = ("parse", "resolve", "validate", "model", "kv", "speculative", "memory", "pools", "graphs", "pd-queues", "transfer")
#: stage -> phase (the pair's stages included).
PHASES = {"parse": "args", "resolve": "args", "validate": "args", "model": "model", "kv": "kv",
          "speculative": "speculative", "memory": "memory", "pools": "memory", "graphs": "graphs", "pd-queues": "pd-queues", "transfer": "transfer",
          "bootstrap": "handshake", "handshake": "handshake"}


class OracleLimit(RuntimeError):
    """The oracle cannot run this part of SGLang (a collective across processes, a step that
    needs the GPU): no verdict."""


def sglang_frame(tb) -> str | None:
    """``sglang/<path>:<function>:<line>`` of the innermost traceback frame in SGLang's code."""
    where = None
    for frame, lineno in traceback.walk_tb(tb):
        path = frame.f_code.co_filename
        idx = path.rfind("/sglang/")
        if idx >= 0:
            where = f"{path[idx + 1:]}:{frame.f_code.co_name}:{lineno}"
    return where


#: Messages of the oracle's own stand-ins reaching their edge (the meta device holds no
#: data, the stub CUDA libraries run nothing): the step needs a GPU, not a verdict.
_LIMIT_MARKERS = ("meta tensor", "on meta", "'meta'", "meta device", "CUDA stub library", "no GPU on this machine",
                  "is a GPU kernel the oracle cannot run", "the oracle cannot know", "emulated HIP driver",
                  "No CUDA GPUs are available", "Found no NVIDIA driver", "emulated CUDA driver",
                  "kernel stand-in", "oracle emulated process group", "_EmulatedProcessGroup",
                  "the oracle's emulated",
                  # the ROCm runtime library SGLang loads itself (layers/engram.py _hip_runtime): not on this machine
                  "libamdhip64 is not loaded",
                  # Triton's CUDA driver asked to launch a kernel: no libcuda (no GPU driver) here
                  "libcuda.so cannot found")


def emulation_limit(exc: BaseException) -> str | None:
    """Why ``exc`` is the oracle's emulation reaching its edge (a step that needs the GPU),
    or None when it is SGLang's refusal."""
    text = str(exc)
    if type(exc).__name__ in ("AcceleratorError", "KernelUsed") or any(m in text for m in _LIMIT_MARKERS):
        return f"the step needs what the oracle emulates without (a GPU, kernel or data): {type(exc).__name__}: {text[:300]}"
    return None


#: Variables SGLang reads once, when its modules are imported (name -> where): a worker imports
#: SGLang once, so the pool (pool.WorkerPool.worker) keys its workers by the accelerator and the
#: role's values of these, and a worker that imported SGLang with another value refuses to judge
#: (engine_side._check_import_time_env).
IMPORT_TIME_ENV = {
    "SGLANG_USE_AITER": "layers/moe/token_dispatcher/moriep.py:55 (and the other ROCm kernels' imports)",
    "SGLANG_ENABLE_JIT_DEEPGEMM": "layers/deep_gemm_wrapper/configurer.py:39",
}


class Refusal(Exception):
    """SGLang refused the role or the pair; ``info`` is the JSON-able description."""

    def __init__(self, info: dict[str, Any]):
        super().__init__(info.get("message"))
        self.info = info


def describe(exc: BaseException, stage: str) -> dict[str, Any]:
    """A JSON-able description of an exception SGLang raised at ``stage``."""
    if isinstance(exc, SystemExit):
        return {"stage": stage, "type": "SystemExit", "message": f"argparse exit {exc.code}", "where": None}
    message = str(exc) or exc.__class__.__name__
    info = {"stage": stage, "type": type(exc).__name__, "message": message, "where": sglang_frame(exc.__traceback__)}
    limit = emulation_limit(exc)
    if limit is not None:
        # the SGLang frame the step stopped at: what to emulate next, or which step to name
        info["indeterminate"] = f"{stage}: {limit}" + (f" (at {info['where']})" if info["where"] else "")
    elif isinstance(exc, OracleLimit):
        info["indeterminate"] = message
    elif isinstance(exc, ImportError) and other_vendors_library(exc) is not None:
        # SGLang's refusal: the library it imports is built for the other vendor only, so no image of this one has it
        info["message"] = f"{message} (on the real image too: {other_vendors_library(exc)})"
    elif isinstance(exc, ImportError):
        # A module SGLang imports is missing from the oracle's environment: not a verdict.
        info["indeterminate"] = f"the oracle's environment lacks a module SGLang imports: {message}"
    elif _needs_the_hub(exc):
        # A draft model or tokenizer named by a hub id: the oracle has no network (HF_HUB_OFFLINE=1).
        info["indeterminate"] = f"SGLang wanted files of a model the oracle does not have (no hub access): {message}"
    return info


#: Libraries SGLang imports that are built for one GPU vendor only (module -> (that vendor, the
#: words of SGLang's ImportError, why no image of the other vendor can hold it)). On an emulated
#: pod of the other vendor their ImportError is SGLang's refusal, as it is on the real image; on
#: the library's own vendor the image may hold it, so it stays indeterminate there. The
#: operator's rules a2a_backend_cuda_only and mori_a2a_rocm_only stand on
#: the same facts. The kernel stand-ins serve ``mori`` on ROCm pods only (kernel_standins.install).
VENDOR_ONLY_MODULES: dict[str, tuple[str, str, str]] = {
    "nixl_ep": ("nvidia", "NixlEP is not installed",
                "nixl 1.5.2's nixl_ep loads nixl_ep_cu12 or nixl_ep_cu13 (nixl_ep/__init__.py _load_ep_module): "
                "CUDA builds only"),
    "pplx_kernels": ("nvidia", "pplx-kernels is not installed",
                     "pplx-kernels is a CUDA library (layers/moe/token_dispatcher/pplx.py: built with "
                     "TORCH_CUDA_ARCH_LIST)"),
    "mori": ("amd", "Mori EP is not installed",
             "MoRI (ROCm/mori) is AMD's RDMA and expert-dispatch library, built with ROCm only"),
}


def other_vendors_library(exc: BaseException) -> str | None:
    """Why ``exc`` (an ImportError SGLang raised) is a refusal on the emulated pod: the module is
    one of :data:`VENDOR_ONLY_MODULES` built for the other vendor only; None otherwise."""
    from .emulation import VENDOR

    names = set()
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ImportError):  # NameError and AttributeError carry a .name too
            names.add((seen.name or "").partition(".")[0])
        seen = seen.__cause__ or seen.__context__
    for module, (vendor, words, why) in VENDOR_ONLY_MODULES.items():
        if vendor != VENDOR["name"] and (module in names or words in str(exc)):
            return f"{module} has no build for {VENDOR['name']} GPUs: {why}"
    return None


def _needs_the_hub(exc: BaseException) -> bool:
    """The exception (or one it was raised from) comes from huggingface_hub / transformers trying to fetch."""
    seen: BaseException | None = exc
    while seen is not None:
        module = type(seen).__module__ or ""
        text = str(seen).lower()
        if module.startswith("huggingface_hub") or "hf_hub_offline" in text or "offline mode" in text or (
            isinstance(seen, OSError) and ("huggingface.co" in text or "hugging face hub" in text or "does not appear to have a file named" in text)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
