"""The scheduler's draft worker: the speculative stage of one role's startup (worker side).

SGLang builds the draft worker right after the target model and before the KV memory is
planned (``Scheduler.init_model_worker`` -> ``maybe_init_draft_worker``,
managers/scheduler.py:1035): the draft's weights are resident when the memory is measured.
This module runs, on rank 0 in the scheduler's emulated context:

``speculative``
    the real ``maybe_init_draft_worker`` on a scheduler stand-in carrying the target worker
    (:class:`TargetWorker`): ``SpeculativeAlgorithm.create_worker`` (speculative/spec_info.py:311)
    picks the worker class (``DSparkWorkerV2``, ``EAGLEWorkerV2``, ``MultiLayerEagleWorkerV2``,
    ``StandaloneWorkerV2`` ...), whose real ``__init__`` runs: its own checks (DSpark with DP
    attention and a DeepSeek-V4 draft needs attn_tp 1, dspark_worker_v2.py:212; EAGLE's
    rejection sampling needs topk 1, eagle_worker_v2.py:196 ...), the draft's parallel layout
    (speculative/draft_parallel.py) and its draft ``TpModelWorker`` (managers/tp_worker.py:283),
    whose own ``__init__`` runs with one part replaced, :meth:`DraftModelWorker._init_model_runner`:
    the draft's ``ModelConfig`` is SGLang's (``TpModelWorker._init_model_config``,
    managers/tp_worker.py:465: the draft checkpoint or the target's bundled head), and the
    draft model is built by SGLang's loader on the meta device as the target's is
    (:func:`.startup.build_model`), its weights' bytes counted.

What does not run here is named in the verdict's ``assumes``: the draft's weights, its
attention backends and CUDA graphs, its KV pool (``alloc_memory_pool`` of the draft
worker), and any part of the worker's ``__init__`` after a step the emulation cannot carry
(a kernel, a collective): the step is named, the stage's checks before it ran.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Iterator

from .stages import OracleLimit, emulation_limit, sglang_frame

#: Steps of the speculative stage, with the SGLang code each one is (sglang/srt/...).
SPEC_STEPS = (
    "speculative: the scheduler's MoE/GEMM flags the draft is built under (init_moe_gemm_config, "
    "managers/scheduler.py:558)",
    "speculative: Scheduler.maybe_init_draft_worker (managers/scheduler.py:1035): "
    "SpeculativeAlgorithm.create_worker (speculative/spec_info.py:311)",
    "speculative: the draft worker's __init__ (DSparkWorkerV2 speculative/dspark_components/dspark_worker_v2.py:174, "
    "EAGLEWorkerV2 speculative/eagle_worker_v2.py:1306 -> EagleDraftWorker :178) with its checks and draft parallel "
    "layout (speculative/draft_parallel.py)",
    "speculative: the draft TpModelWorker.__init__ (managers/tp_worker.py:283): the draft's ModelConfig "
    "(_init_model_config, :465) and the draft model built on the meta device (model_loader/loader.py:285)",
)
ASSUMED = (
    "speculative: the draft's weights, attention backends and CUDA graphs, and its KV pool "
    "(draft worker alloc_memory_pool, init_attention_backends, init_cuda_graphs)",
)


class _Stop(Exception):
    """Raised by the stand-ins where the worker's ``__init__`` reaches a step the emulation cannot carry."""


def draft_worker_class():
    """:class:`DraftModelWorker`, defined once SGLang is importable (it subclasses TpModelWorker)."""
    global DraftModelWorker
    if "DraftModelWorker" in globals():
        return DraftModelWorker
    from sglang.srt.managers.tp_worker import TpModelWorker

    class DraftModelWorker(TpModelWorker):  # noqa: F811
        """SGLang's ``TpModelWorker`` for the draft with its model runner replaced: the draft
        model built on the meta device (``built`` lists (model, facts) of each runner)."""

        built: list[tuple[Any, dict[str, Any]]] = []

        def _init_model_runner(self) -> None:
            from sglang.srt.model_executor.model_runner import ModelRunner
            from sglang.srt.runtime_context import get_device, get_spec
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

            from .startup import build_model

            model, facts, _ = build_model(self.server_args, model_config=self.model_config,
                                          load_format=get_spec().speculative_draft_load_format, draft=True)
            runner = ModelRunner.__new__(ModelRunner)
            runner.model_config = self.model_config
            runner.server_args = self.server_args
            runner.model = model
            runner.device = get_device().device
            runner.gpu_id = self.gpu_id
            runner.is_draft_worker = True
            runner.draft_model_idx = None
            runner.spec_algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
            runner.dtype = self.model_config.dtype
            runner.init_spec_aux_hidden_state()
            self._model_runner = runner
            type(self).built.append((model, facts))

    globals()["DraftModelWorker"] = DraftModelWorker
    return DraftModelWorker


class TargetWorker:
    """The target's ``TpModelWorker`` as the draft worker's ``__init__`` reads it: its model
    runner (the memory stage's runner, its model built), model config, device and seed."""

    def __init__(self, runner: Any, random_seed: int) -> None:
        self.model_runner = runner
        self.model_config = runner.model_config
        self.device = runner.device
        self.random_seed = random_seed
        self.preloaded_weights_bytes = 0


@contextlib.contextmanager
def _draft_workers_built_here() -> Iterator[type]:
    """Every module that constructs the draft's ``TpModelWorker`` by name gets :class:`DraftModelWorker`."""
    import importlib

    cls = draft_worker_class()
    cls.built = []
    modules = []
    for name in ("sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.draft_worker_common",
                 "sglang.srt.speculative.dspark_components.dspark_worker_v2",
                 "sglang.srt.speculative.multi_layer_eagle_worker_v2", "sglang.srt.speculative.standalone_worker_v2",
                 "sglang.srt.speculative.frozen_kv_mtp_worker_v2", "sglang.srt.speculative.dflash_worker_v2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if "TpModelWorker" in vars(module):
            modules.append((module, module.TpModelWorker))
            module.TpModelWorker = cls
    # DSparkWorkerV2's default argument names the class itself
    saved_defaults = []
    try:
        from sglang.srt.speculative.dspark_components import dspark_worker_v2 as dspark

        init = dspark.DSparkWorkerV2.__init__
        saved_defaults.append((init, init.__defaults__))
        init.__defaults__ = tuple(cls if d is not None and isinstance(d, type) and d.__name__ == "TpModelWorker" else d
                                  for d in (init.__defaults__ or ()))
    except ImportError:
        pass
    try:
        yield cls
    finally:
        for module, real in modules:
            module.TpModelWorker = real
        for fn, defaults in saved_defaults:
            fn.__defaults__ = defaults


def build_draft_worker(server_args: Any, runner: Any) -> tuple[dict[str, Any] | None, int, list[str]]:
    """SGLang's ``maybe_init_draft_worker`` for rank 0 on the target ``runner`` (model built).

    Returns (facts or None for a role without speculative decoding, the draft's resident
    device bytes, assumed steps). Facts: {"algorithm", "worker" (class, None when the
    worker's ``__init__`` stopped at the emulation's edge), "draftArchitecture",
    "draftWeightBytes", "draftParameters"}. Raises SGLang's refusal; a step of the worker's
    ``__init__`` the emulation cannot carry (a kernel, a collective, a meta tensor's data)
    ends the stage there and is named in the assumed steps (the checks before it ran).
    """
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from .startup import MetaAllocations

    algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    if algorithm.is_none():
        return None, 0, []
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.server_args = server_args
    scheduler.spec_algorithm = algorithm
    scheduler.nccl_port = 0
    scheduler.tp_worker = TargetWorker(runner, random_seed=server_args.random_seed or 0)
    # The scheduler sets the MoE/GEMM runtime flags once, before its model worker
    # (managers/scheduler.py:558 init_moe_gemm_config), and the draft is built under them in
    # the same process: its a2a backend (e.g. megamoe) decides whether the draft's shared
    # experts are replicated or TP-split (models/deepseek_v2.py:874). This stage runs in a
    # fresh rank context, so the step is run again here on the target's model config.
    scheduler.model_config = runner.model_config
    scheduler.init_moe_gemm_config()
    scheduler.ipc_channels = types.SimpleNamespace(send_to_tokenizer=types.SimpleNamespace(send_output=None))
    assumed = list(ASSUMED)
    from .kernel_standins import CALLS, take_calls

    before = take_calls()  # kernels the earlier stages used stay recorded for the role's verdict
    with _draft_workers_built_here() as cls, MetaAllocations():
        try:
            scheduler.maybe_init_draft_worker()
        except Exception as e:
            why = str(e) if isinstance(e, OracleLimit) else emulation_limit(e)
            if why is None:
                CALLS.extend(before)
                raise  # SGLang's refusal
            # the emulation's edge (a kernel, a collective, a meta tensor's data): the checks
            # before it ran, the rest of the draft worker is assumed
            where = "after its draft model was built" if cls.built else "before its draft model was built"
            assumed.append(f"speculative: the draft worker's __init__ {where}, from {sglang_frame(e.__traceback__)} "
                           f"on: {why[:240]}")
    used = take_calls()
    if used:
        # a kernel the worker's __init__ calls (a warm-up, a buffer fill): what ran before it
        # stands, what it computes is assumed
        assumed.append(f"speculative: the draft worker's __init__ called GPU kernels the oracle cannot run: "
                       f"{', '.join(used)}")
    CALLS.extend(before)
    built = cls.built
    if getattr(scheduler, "draft_worker", None) is None and not built:
        return {"algorithm": str(get_spec().speculative_algorithm), "worker": None}, 0, assumed
    model, facts = built[-1] if built else (None, {})
    draft_bytes = sum(f.get("weightBytes", 0) for _, f in built)
    return {
        "algorithm": str(get_spec().speculative_algorithm),
        "worker": type(getattr(scheduler, "draft_worker", None)).__name__ if getattr(scheduler, "draft_worker", None)
        is not None else None,
        "draftArchitecture": facts.get("architecture"),
        "draftWeightBytes": draft_bytes,
        "draftParameters": sum(f.get("parameters", 0) for _, f in built),
    }, draft_bytes, assumed

