"""The CUDA-graph runner's own checks at startup (worker side): the ``graphs`` stage.

After the KV pools are built (:mod:`.scheduler_pd`), ``ModelRunner.initialize`` builds the
attention backends and then ``init_cuda_graphs`` (model_executor/model_runner.py:1170),
whose decode part is ``capture_decode_graph``
(model_executor/model_runner_components/cuda_graph_setup.py:703). This module runs that
function, SGLang's own, on the runner the memory and pool stages filled in:

- its gating (a speculative PD prefill captures no verify graph, the decode backend
  ``disabled`` captures none, non-generation models none);
- the runner class SGLang picks (``ModelRunner._decode_cuda_graph_runner_cls``: the
  decode runner, UNO's for UNO) and that class's ``__init__``
  (model_executor/runner/decode_cuda_graph_runner.py:275) up to the attention backend's
  ``init_cuda_graph_state``: the gather requirements, the capture width
  (``decode_num_tokens_per_req``), the capture batch sizes
  (``get_batch_sizes_to_capture``, runner/base_cuda_graph_runner.py:65: the configured
  sizes filtered by the attention-TP alignment and the request pool, asserted non-empty at
  :104) and the compact ragged-verify check (``SGLANG_RAGGED_VERIFY_MODE`` against
  two-batch overlap, LoRA and ``--disable-cuda-graph-padding``, :411).

The attention backend is the boundary (:class:`AttentionBackendBoundary`): its graph state
is device buffers sized for the kernels, so the runner's ``__init__`` stops there, with
every check before it run; what follows it (the graph buffers, the warmup and the capture,
all kernels) and the prefill and draft graphs are named in the verdict's ``assumes``.
"""

from __future__ import annotations

import traceback
from typing import Any

from .stages import OracleLimit

#: What the stage runs, with the SGLang code each step is (sglang/srt/...).
GRAPH_STEPS = (
    "graphs: capture_decode_graph (model_executor/model_runner_components/cuda_graph_setup.py:703) and the decode "
    "graph runner's __init__ (model_executor/runner/decode_cuda_graph_runner.py:275) up to the attention backend's "
    "init_cuda_graph_state: the capture batch sizes (runner/base_cuda_graph_runner.py:65, asserted non-empty :104), "
    "SGLANG_RAGGED_VERIFY_MODE against two-batch overlap, LoRA and disable-cuda-graph-padding (:411)",
)
#: What it does not run.
ASSUMED = (
    "graphs: the attention backend's graph buffers, the eager runner's warmup and the capture itself (kernels; "
    "cuda_graph_setup.py capture_cuda_graphs), the prefill graph (capture_prefill_graph) and the draft worker's graphs",
)


class _ReachedTheKernels(Exception):
    """Raised by the boundary where the graph runner hands over to the attention kernels."""

    def __init__(self, max_bs: int, max_num_tokens: int) -> None:
        super().__init__(f"init_cuda_graph_state({max_bs}, {max_num_tokens})")
        self.max_bs, self.max_num_tokens = max_bs, max_num_tokens


class NotBuilt:
    """A part of the runner the oracle does not build (``what``, with its SGLang source):
    anything asked of it is :class:`OracleLimit`, no verdict."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise OracleLimit(f"the oracle's emulated runner does not build {self._what} (asked for {name})")


def runner_fields(runner: Any) -> None:
    """Set on ``runner`` what ``ModelRunner.__init__`` sets between the pools and
    ``init_cuda_graphs`` and the graph runner reads: ``is_generation`` (model_runner.py:387),
    the LoRA manager (``maybe_init_lora_manager``, :830: None without LoRA; with LoRA a
    :class:`NotBuilt`, its kernels' buffers), the n-gram embedding manager (SGLang's own
    ``init_ngram_embedding_manager``, :621, tensors on the meta device) and the attention
    backends' names (SGLang's ``resolve_attention_backend_strs``, as
    ``init_attention_backends`` resolves them at :1119; the backends are not built)."""
    from sglang.srt.runtime_context import get_lora

    from .startup import MetaAllocations

    runner.is_generation = runner.model_config.is_generation
    runner.lora_manager = (NotBuilt("the LoRA manager (model_runner.py:1451 init_lora_manager)")
                           if get_lora().enable_lora or runner.spec_algorithm.is_uno() else None)
    with MetaAllocations():
        runner.init_ngram_embedding_manager()
    from sglang.srt.model_executor.model_runner import resolve_attention_backend_strs

    resolved = resolve_attention_backend_strs(model_runner=runner)
    runner.prefill_attention_backend_str, runner.decode_attention_backend_str = resolved.prefill, resolved.decode


class AttentionBackendBoundary:
    """The attention backend as the decode graph runner's ``__init__`` meets it before its
    graph state: no DLLM attention; ``init_cuda_graph_state`` (device buffers sized for the
    kernels) ends the stage. Anything else asked of it is a kernel: :class:`OracleLimit`."""

    dllm_attention = None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        raise _ReachedTheKernels(max_bs, max_num_tokens)

    def __getattr__(self, name: str) -> Any:
        raise OracleLimit(f"the attention backend's {name} is a GPU kernel the oracle cannot run")


def _graph_runner_of(exc: BaseException) -> Any:
    """The graph runner whose ``__init__`` raised ``exc`` (its frame's ``self``)."""
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import BaseCudaGraphRunner

    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        runner = frame.f_locals.get("self")
        if isinstance(runner, BaseCudaGraphRunner):
            return runner
    raise OracleLimit("the graph runner's __init__ reached the attention kernels outside its own frame")


def check_decode_graphs(runner: Any) -> dict[str, Any]:
    """SGLang's ``capture_decode_graph`` on ``runner`` (the target's ``ModelRunner`` after
    :func:`.scheduler_pd.assemble_pools`: its request pool sized) up to the attention kernels.

    Returns {"runner": the graph runner class SGLang chose, or None when it captures no
    decode graph, "configuredBs": the resolved ``cuda_graph_config`` decode sizes,
    "requestPool": the request pool's size, "captureBs": [batch sizes], "maxBs", "maxNumTokens", "capturedReqWidth",
    "raggedVerify": bool}; raises SGLang's refusal (``AssertionError`` "capture_bs=[]",
    ``ValueError`` "Compact ragged verify does not support ...") or :class:`OracleLimit`.
    """
    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup
    from sglang.srt.runtime_context import get_exec

    from .startup import MetaAllocations

    runner_fields(runner)
    runner.attn_backend = AttentionBackendBoundary()
    try:
        with MetaAllocations():  # the runner's static buffers: shapes only
            capture = cuda_graph_setup.capture_decode_graph(model_runner=runner)
    except AttributeError as e:
        if "'ModelRunner' object has no attribute" in str(e):  # a field the oracle's runner lacks: not SGLang's refusal
            raise OracleLimit(f"the oracle's emulated runner lacks what the graph runner reads: {e}") from e
        raise
    except _ReachedTheKernels as reached:
        graph = _graph_runner_of(reached)
        return {
            "runner": type(graph).__name__,
            "configuredBs": list(get_exec().graph.cuda_graph_config.decode.bs),
            "requestPool": int(runner.req_to_token_pool.size),
            "captureBs": list(graph.capture_bs),
            "maxBs": reached.max_bs,
            "maxNumTokens": reached.max_num_tokens,
            "capturedReqWidth": int(graph.captured_req_width),
            "raggedVerify": bool(graph.ragged_verify_mode),
        }
    if capture.runner is not None:
        raise OracleLimit(f"capture_decode_graph built {type(capture.runner).__name__} without the attention backend")
    return {"runner": None, "captureBs": [], "maxBs": 0, "maxNumTokens": 0, "capturedReqWidth": 0,
            "raggedVerify": False}
