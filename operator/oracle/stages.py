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
        info["indeterminate"] = f"{stage}: {limit}"
    elif isinstance(exc, OracleLimit):
        info["indeterminate"] = message
    elif isinstance(exc, ImportError):
        # A module SGLang imports is missing from the oracle's environment: not a verdict.
        info["indeterminate"] = f"the oracle's environment lacks a module SGLang imports: {message}"
    elif _needs_the_hub(exc):
        # A draft model or tokenizer named by a hub id: the oracle has no network (HF_HUB_OFFLINE=1).
        info["indeterminate"] = f"SGLang wanted files of a model the oracle does not have (no hub access): {message}"
    return info


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
