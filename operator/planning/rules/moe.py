"""Rules of SGLang 0.5.23's MoE / expert-parallel startup checks.

What SGLang refuses while it resolves and validates a role's arguments, before weights
load: EPLB without expert parallelism and a replica-varying dispatch without an
all-to-all backend (arg_groups/parallel_hook.py ``handle_eplb_and_dispatch``), a
``--moe-dense-tp-size`` other than 1 or the TP size (validation_hook.py
``check_server_args``), two-batch overlap on the TP-MoE path without attention DP
(validation_hook.py ``check_two_batch_overlap``), the requirements of the FlashInfer,
pplx, MoRI and DeepEP v2 all-to-all backends (moe_hook.py ``handle_a2a_moe``,
``validate_deepep_v2_dispatch_token_budget``) and of MegaMoE (mega_moe_hook.py
``check_mega_moe_compat``, ``validate_mega_moe_token_budget``).

The all-to-all backend a role runs is the one SGLang resolves: ``--moe-a2a-backend``,
except that ``--moe-runner-backend megamoe`` is an alias of ``--moe-a2a-backend megamoe``
(mega_moe_hook.handle_moe_runner_backend_alias) and ``--enable-waterfill`` forces
``deepep`` (overrides._a2a_backend_overrides). Every backend but none spans the TP group
with expert parallelism (overrides._a2a_ep_size sets ep_size = tp_size).

Some checks read values SGLang derives. The rules restate the derivations that are plain
tables: the chunked prefill size and decode CUDA graph batch size SGLang picks from the
GPU memory (memory_hook.handle_gpu_memory_settings; ``gpuMemory`` of the accelerator
catalog), the per-DP-rank division of the chunked prefill size
(parallel_hook.handle_data_parallelism), the running-request caps (256 for DeepSeek-V4,
deepseek_v4_hook.apply_deepseek_v4_defaults; 48 with speculative decoding,
speculative_hook) and the verify width of speculative decoding. Where a value comes
from a resolution these rules cannot follow (the MoE runner SGLang picks for ``auto``
under ``--quantization``, ``--cuda-graph-bs-decode`` lists, DWDP, elastic EP scale-up),
only what the user set explicitly is checked, and the SGLang oracle judges the rest.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import as_int, parse_flags
from ..problems import Problem
from ..sglang_defaults import MAX_PREFILL_TOKENS_DEFAULT, chunked_prefill_per_rank, gpu_memory_mib
from ..sglang_flags import flag_table
from ..structs import RolePlan
from .fields import env_bool

#: Backends that make expert parallelism span the TP group (overrides._A2A_EP_SPANNING_BACKENDS).
EP_SPANNING_A2A = frozenset(
    {"megamoe", "deepep", "deepep_v2", "mooncake", "nixl", "ascend_fuseep", "flashinfer", "flashinfer_megamoe", "mori",
     "pplx"}
)  # fmt: skip
#: MoE runners FlashInfer's all-to-all runs with (moe_hook.handle_a2a_moe).
FLASHINFER_A2A_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl", "flashinfer_trtllm", "flashinfer_trtllm_routed",
                          "deep_gemm")  # fmt: skip
#: Architectures whose MoE blocks have no fused-MoE fallback under megamoe, so the token
#: budget applies (mega_moe_hook.MEGA_MOE_NO_FALLBACK_ARCHS, as far as the catalog's models go).
MEGA_MOE_NO_FALLBACK_ARCHS = frozenset(
    {"DeepseekV4ForCausalLM", "InternS2PreviewForConditionalGeneration", "MellumForCausalLM", "Qwen2MoeForCausalLM",
     "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
     "Qwen3_5MoeForConditionalGeneration"}
)  # fmt: skip
#: Defaults of sglang/srt/environ.py.
DEEPEP_V2_CAPACITY_ENV, DEEPEP_V2_CAPACITY_DEFAULT = "SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128
PPLX_CAPACITY_ENV, PPLX_CAPACITY_DEFAULT = "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128
MORI_CAPACITY_ENV, MORI_CAPACITY_DEFAULT = "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 4096
MEGA_MOE_CAPACITY_ENV, MEGA_MOE_CAPACITY_DEFAULT = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", 8192
DSV4_MAX_RUNNING_REQUESTS = 256  # deepseek_v4_hook.apply_deepseek_v4_defaults
SPECULATIVE_MAX_RUNNING_REQUESTS = 48  # speculative_hook, every algorithm
_OFF = (None, False, "false", "False", "0")


# --------------------------------------------------------------------------- what a role resolves to
def _flags(role: RolePlan) -> dict[str, Any]:
    return parse_flags(role.inputs.spec.extraArgs)


def _on(flags: Mapping[str, Any], key: str) -> bool:
    return flags.get(key) not in _OFF


def _int(value: Any) -> int | None:
    return as_int(value)


def a2a_backend(flags: Mapping[str, Any]) -> str:
    """The all-to-all backend SGLang resolves: the megamoe runner alias, then waterfill's deepep."""
    a2a = str(flags.get("moe_a2a_backend") or "none")
    if str(flags.get("moe_runner_backend")) == "megamoe":
        return "megamoe"
    if _on(flags, "enable_waterfill") and a2a not in ("deepep", "megamoe"):
        return "deepep"
    return a2a


def _runner(flags: Mapping[str, Any]) -> str:
    """--moe-runner-backend as written (auto when absent; the megamoe alias resolves to auto)."""
    runner = str(flags.get("moe_runner_backend") or "auto")
    return "auto" if runner == "megamoe" else runner


def _untracked(flags: Mapping[str, Any]) -> bool:
    """DWDP and elastic-EP scale-up rewrite the MoE settings (parallel_hook.handle_dwdp /
    handle_elastic_ep); these rules leave such roles to the SGLang oracle."""
    return (_int(flags.get("dwdp_size")) or 1) > 1 or flags.get("ep_join_mode") == "scale"


def _field(role: RolePlan, *dests: str) -> str:
    """Path of the last extraArgs token that sets one of ``dests`` (any alias), else of extraArgs."""
    table = flag_table()
    args = role.inputs.spec.extraArgs
    found = None
    for i, tok in enumerate(args):
        if not tok.startswith("--"):
            continue
        name = tok.partition("=")[0]
        info = table.get(name)
        dest = info.dest if info is not None else name[2:].replace("-", "_")
        if dest in dests:
            found = i
    base = f"spec.{role.role}.extraArgs"
    return base if found is None else f"{base}[{found}]"


def _env(role: RolePlan, name: str, default: int) -> tuple[int | None, str]:
    """An integer variable of the role's env (None when it does not parse) and its field path."""
    env = role.inputs.spec.env
    for i, var in enumerate(env):
        if var.name == name:
            return _int(var.value), f"spec.{role.role}.env[{i}]"
    return default, f"spec.{role.role}.env"






def _max_running_requests(spec: PDDeploymentSpec, role: RolePlan, flags: Mapping[str, Any]) -> int | None:
    """--max-running-requests, else SGLang's caps: 256 for DeepSeek-V4, 48 with speculative decoding."""
    explicit = _int(flags.get("max_running_requests"))
    if explicit is not None:
        return explicit
    if role.inputs.is_deepseek_v4:
        return DSV4_MAX_RUNNING_REQUESTS
    if spec.speculative is not None:
        return SPECULATIVE_MAX_RUNNING_REQUESTS
    return None


def _decode_graph_max_bs(role: RolePlan, flags: Mapping[str, Any]) -> int | None:
    """The largest decode CUDA graph batch of memory_hook.handle_gpu_memory_settings; None when unknown.

    --cuda-graph-max-bs-decode, else by GPU memory and TP size (8 below 20 GiB; below 60
    GiB 32 or 48 under TP 4 and 160 from TP 4; 256 under TP 4 and 512 from TP 4 below 160
    GiB; else 512), capped by an explicit --max-running-requests.
    """
    if flags.get("cuda_graph_bs_decode") is not None:
        return None  # an explicit list
    # Paged Experts caps the captured sizes at K // top_k only while the model is built
    # (paged_experts/method.py make_for_layer): argument resolution still sees this default.
    explicit = flags.get("cuda_graph_max_bs_decode")
    if explicit is not None:
        return _int(explicit)
    mib = gpu_memory_mib(role.inputs)
    if mib is None:
        return None
    tp = role.inputs.parallelism.tp
    if mib < 20 * 1024:
        bs = 8
    elif mib < 35 * 1024:
        bs = 48 if tp < 4 else 160
    elif mib < 60 * 1024:
        bs = 32 if tp < 4 else 160
    elif mib < 160 * 1024:
        bs = 256 if tp < 4 else 512
    else:
        bs = 512
    mrr = _int(flags.get("max_running_requests"))
    return min(bs, mrr) if mrr is not None else bs


def _tokens_per_request(spec: PDDeploymentSpec, role: RolePlan, flags: Mapping[str, Any]) -> int:
    """At least how many tokens one request runs in a decode / verify step: 1 without speculative
    decoding; DSpark's verify width (block size + 1, speculative_hook._handle_dspark, at least 2);
    EAGLE-family steps + 1 with top-k 1 (_handle_eagle_family; the operator renders top-k 1 for
    DeepSeek-V4). A lower bound, so a budget exceeded with it is exceeded in SGLang too."""
    sp = spec.speculative
    if sp is None:
        return 1
    if sp.algorithm == "DSPARK":
        return sp.blockSize + 1 if sp.blockSize is not None else max(2, sp.numDraftTokens or 2)
    topk = _int(flags.get("speculative_eagle_topk")) or (1 if role.inputs.is_deepseek_v4 else None)
    if sp.algorithm in ("EAGLE", "EAGLE3", "NEXTN") and topk == 1:
        return sp.numSteps + 1 if sp.numSteps is not None else 2
    return 1


def _problem(field: str, message: str, fix: str, rule: str) -> Problem:
    return Problem(field=field, message=message, fix=fix, rule=rule)


# --------------------------------------------------------------------------- expert parallelism
def eplb_needs_expert_parallelism(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--enable-eplb`` needs an expert-parallel size above 1.

    Source: sglang 0.5.23 arg_groups/parallel_hook.py ``handle_eplb_and_dispatch``:
    ``assert resolved_view(server_args).ep_size > 1`` when EPLB is on (outside elastic-EP
    scale-up). The resolved ep_size is ``parallelism.ep``, or the TP size when an
    all-to-all backend is on (overrides._a2a_ep_size). A Paged Experts role is left to
    rules/paged_experts.py, which refuses EPLB there whatever the EP size.
    """
    flags = _flags(role)
    if not _on(flags, "enable_eplb") or _untracked(flags) or role.inputs.paged_experts_k is not None:
        return []  # Paged Experts refuses EPLB itself (rules/paged_experts.py)
    p = role.inputs.parallelism
    a2a = a2a_backend(flags)
    ep = p.tp if a2a in EP_SPANNING_A2A else p.ep
    if ep > 1:
        return []
    why = f"parallelism.ep is {p.ep}"
    if a2a in EP_SPANNING_A2A:
        why = f"--moe-a2a-backend {a2a} sets it to the TP size {p.tp}"
    return [
        _problem(
            _field(role, "enable_eplb"),
            f"--enable-eplb rebalances experts across expert-parallel ranks, and this {role.role} role has an "
            f"expert-parallel size of 1 ({why}); SGLang 0.5.23 refuses to start (assert ep_size > 1 in "
            "handle_eplb_and_dispatch)",
            f"set spec.{role.role}.parallelism.ep above 1 (ep = tp for full expert parallelism), or remove --enable-eplb",
            "eplb_needs_expert_parallelism",
        )
    ]  # fmt: skip


def ep_dispatch_needs_a2a_backend(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--ep-dispatch-algorithm static`` or ``lp`` needs an all-to-all backend.

    Source: parallel_hook.handle_eplb_and_dispatch: with moe_a2a_backend none every EP
    rank runs the MoE over the same tokens, so "--ep-dispatch-algorithm {static|lp} picks a
    different physical replica per rank, which only holds up when an a2a backend routes
    each token to a single rank. Use --ep-dispatch-algorithm dynamic with
    --moe-a2a-backend none." (SGLang's own default there is dynamic.)
    """
    flags = _flags(role)
    algorithm = flags.get("ep_dispatch_algorithm")
    if algorithm not in ("static", "lp") or a2a_backend(flags) != "none" or _untracked(flags):
        return []
    return [
        _problem(
            _field(role, "ep_dispatch_algorithm"),
            f"--ep-dispatch-algorithm {algorithm} picks a different expert replica on each rank, which only works when "
            "an all-to-all backend routes each token to one rank; without --moe-a2a-backend SGLang 0.5.23 refuses it",
            "use --ep-dispatch-algorithm dynamic (SGLang's default with EPLB), or set a --moe-a2a-backend",
            "ep_dispatch_needs_a2a_backend",
        )
    ]  # fmt: skip


def moe_dense_tp_size_supported(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-dense-tp-size`` must be 1 or the TP size.

    Source: validation_hook.py ``check_server_args``: "moe_dense_tp_size only supports
    None, 1, or tp_size currently". DeepSeek-V4 prefill context parallelism sets it to 1
    whatever was asked (deepseek_v4_hook.validate_deepseek_v4_cp), so it is not checked there.
    """
    flags = _flags(role)
    raw = flags.get("moe_dense_tp_size")
    size = _int(raw)
    tp = role.inputs.parallelism.tp
    if raw is None or size is None or size in (1, tp) or _untracked(flags):
        return []
    if role.inputs.is_deepseek_v4 and role.inputs.prefill_cp:
        return []
    return [
        _problem(
            _field(role, "moe_dense_tp_size"),
            f"--moe-dense-tp-size {size} is neither 1 nor the role's TP size {tp}; SGLang 0.5.23 refuses it "
            "(\"moe_dense_tp_size only supports None, 1, or tp_size currently\")",
            f"use --moe-dense-tp-size 1 or {tp}, or remove it",
            "moe_dense_tp_size_supported",
        )
    ]  # fmt: skip


def two_batch_overlap_needs_dp_attention(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Two-batch overlap without an all-to-all backend needs attention DP.

    Source: validation_hook.py ``check_two_batch_overlap``: "When enabling two batch
    overlap without an EP a2a backend (moe_a2a_backend='none'), attention DP
    (--attn-dp-size) is required (DeepSeek-V4 non-EP DP TBO path)." Single-batch overlap
    is not part of this check. DeepSeek-V4.1 refuses two-batch overlap before this check
    (deepseek_v4_hook; rules/deepseek_v4.py dsv41_unsupported_features), so it is not
    reported twice.
    """
    flags = _flags(role)
    if not _on(flags, "enable_two_batch_overlap") or a2a_backend(flags) != "none" or _untracked(flags):
        return []
    if role.inputs.attention_dp > 1 or (role.inputs.model is not None and role.inputs.model.is_deepseek_v41):
        return []  # DeepSeek-V4.1 refuses two-batch overlap outright (rules/deepseek_v4.py)
    return [
        _problem(
            _field(role, "enable_two_batch_overlap"),
            "--enable-two-batch-overlap without an expert all-to-all backend overlaps the attention-DP gathers, so "
            f"it needs attention DP; the {role.role} role has none and SGLang 0.5.23 refuses to start",
            f"set spec.{role.role}.parallelism.dpAttention with dp > 1, set a --moe-a2a-backend, or remove "
            "--enable-two-batch-overlap",
            "two_batch_overlap_needs_dp_attention",
        )
    ]  # fmt: skip


# --------------------------------------------------------------------------- all-to-all backends
def flashinfer_a2a_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend flashinfer``: attention DP equal to TP, a FlashInfer-capable MoE runner,
    chunked prefill.

    Source: moe_hook.py ``handle_a2a_moe`` ("Flashinfer MoE A2A requires --attn-dp-size
    equal to --tp-size, except for Muse Spark ..."; "FlashInfer MoE A2A is supported with
    flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm, flashinfer_trtllm_routed, or
    deep_gemm.") and ``validate_flashinfer_a2a_token_budget`` ("FlashInfer MoE A2A requires
    chunked prefill ..."). With ``--moe-runner-backend auto`` the catalog's models keep
    auto under an all-to-all backend (their model overrides pick a runner only with none),
    which the runner check refuses; with ``--quantization`` set SGLang may pick one, so
    auto is not checked then.
    """
    flags = _flags(role)
    if a2a_backend(flags) != "flashinfer" or _untracked(flags):
        return []
    p = role.inputs.parallelism
    a2a_field = _field(role, "moe_a2a_backend")
    problems = []
    if not (role.inputs.attention_dp > 1 and role.inputs.attention_dp == p.tp):
        problems.append(_problem(
            a2a_field,
            f"FlashInfer's MoE all-to-all needs attention DP across the whole TP group (attention DP "
            f"{role.inputs.attention_dp}, tp {p.tp}); SGLang 0.5.23 refuses it",
            f"set spec.{role.role}.parallelism to dpAttention with dp = tp ({p.tp}), or use another --moe-a2a-backend",
            "flashinfer_a2a_requirements",
        ))  # fmt: skip
    runner = _runner(flags)
    if runner not in FLASHINFER_A2A_RUNNERS and not (runner == "auto" and flags.get("quantization") is not None):
        where = _field(role, "moe_runner_backend") if runner != "auto" else a2a_field
        problems.append(_problem(
            where,
            f"FlashInfer's MoE all-to-all runs with the {', '.join(FLASHINFER_A2A_RUNNERS)} MoE runners, and this role's "
            f"runner resolves to {runner}; SGLang 0.5.23 refuses it",
            "add --moe-runner-backend deep_gemm (or a flashinfer_* runner)",
            "flashinfer_a2a_requirements",
        ))  # fmt: skip
    size = _int(flags.get("chunked_prefill_size"))
    if role.role != "decode" and size is not None and size <= 0:
        problems.append(_problem(
            _field(role, "chunked_prefill_size"),
            f"FlashInfer's MoE all-to-all dispatches each prefill through a fixed workspace, so it needs chunked "
            f"prefill; --chunked-prefill-size {size} disables it and SGLang 0.5.23 refuses to start",
            "use a positive --chunked-prefill-size, or remove it",
            "flashinfer_a2a_requirements",
        ))  # fmt: skip
    return problems


def pplx_a2a_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend pplx``: low-latency mode, attention DP of 2 or more, the deep_gemm
    runner, and a dispatch budget that holds a prefill chunk.

    Source: moe_hook.py ``handle_a2a_moe``: "moe_a2a_backend='pplx' only supports
    low-latency mode; set --deepep-mode to 'low_latency' or 'auto'."; "moe_a2a_backend='pplx'
    requires attention DP with at least 2 groups (--attn-dp-size >= 2)."; "... is only
    supported with --moe-runner-backend deep_gemm (or auto)."; off the decode role with
    chunked prefill on, "SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 128) must be
    >= the per-rank pplx dispatch tokens (chunked_prefill_size, or the decode cuda-graph
    batch size)" -- the per-DP-rank chunked prefill size, SGLang's default by GPU memory
    when not set, and an explicit --cuda-graph-max-bs-decode.
    """
    flags = _flags(role)
    if a2a_backend(flags) != "pplx" or _untracked(flags):
        return []
    a2a_field = _field(role, "moe_a2a_backend")
    problems = []

    def add(where: str, message: str, fix: str) -> None:
        problems.append(_problem(where, f"--moe-a2a-backend pplx: {message}", fix, "pplx_a2a_requirements"))

    if flags.get("deepep_mode") == "normal":
        add(_field(role, "deepep_mode"), "pplx has only a low-latency mode; SGLang 0.5.23 refuses --deepep-mode normal",
            "use --deepep-mode low_latency or auto")
    if role.inputs.attention_dp < 2:
        add(a2a_field, f"pplx needs at least 2 attention-DP groups and the {role.role} role has "
            f"{role.inputs.attention_dp}; SGLang 0.5.23 refuses it",
            f"set spec.{role.role}.parallelism to dpAttention with dp >= 2, or use another --moe-a2a-backend")
    runner = _runner(flags)
    if runner not in ("deep_gemm", "auto"):
        add(_field(role, "moe_runner_backend"), f"pplx runs the deep_gemm MoE runner only, not {runner}",
            "use --moe-runner-backend deep_gemm or auto")
    chunk = chunked_prefill_per_rank(role.inputs, flags)
    capacity, env_field = _env(role, PPLX_CAPACITY_ENV, PPLX_CAPACITY_DEFAULT)
    if role.role != "decode" and chunk is not None and chunk > 0 and capacity is not None:
        required = max(chunk, _int(flags.get("cuda_graph_max_bs_decode")) or 0)
        if required > capacity:
            add(env_field, f"each rank dispatches up to {required} tokens (the per-DP-rank chunked prefill size"
                f"{' or --cuda-graph-max-bs-decode' if flags.get('cuda_graph_max_bs_decode') else ''}) and "
                f"{PPLX_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 refuses to start",
                f"set {PPLX_CAPACITY_ENV} to at least {required}, or lower --chunked-prefill-size")
    return problems


def mori_dispatch_budget(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend mori``: the per-rank dispatch buffer must hold a prefill chunk.

    Source: moe_hook.py ``handle_a2a_moe``: off the decode role with chunked prefill on,
    "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096) must be >= the per-rank
    MoRI dispatch tokens (chunked_prefill_size by default)" -- the per-DP-rank chunked
    prefill size (required_mori_dispatch_tokens_per_rank), SGLang's default by GPU memory
    when not set.
    """
    flags = _flags(role)
    if role.role == "decode" or a2a_backend(flags) != "mori" or _untracked(flags):
        return []
    chunk = chunked_prefill_per_rank(role.inputs, flags)
    capacity, env_field = _env(role, MORI_CAPACITY_ENV, MORI_CAPACITY_DEFAULT)
    if chunk is None or chunk <= 0 or capacity is None or chunk <= capacity:
        return []
    return [
        _problem(
            env_field,
            f"--moe-a2a-backend mori: each rank dispatches up to {chunk} prefill tokens (the per-DP-rank chunked prefill "
            f"size) and {MORI_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 refuses to start",
            f"set {MORI_CAPACITY_ENV} to at least {chunk}, or lower --chunked-prefill-size to {capacity} per DP rank",
            "mori_dispatch_budget",
        )
    ]


def deepep_v2_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend deepep_v2``: the deep_gemm runner, no two-batch / single-batch overlap,
    no enforced shared-expert fusion, and not the speculative draft's backend.

    Source: moe_hook.py ``handle_a2a_moe`` ("DeepEP v2 MoE currently supports only
    --moe-runner-backend deep_gemm."; "DeepEP v2 MoE has not implemented the TBO/SBO overlap
    hooks yet."; "DeepEP v2 MoE has not validated fused shared experts yet.") and
    ``validate_deepep_v2_speculative_draft`` ("DeepEP v2 MoE is not validated as a
    speculative draft backend."): a draft without --speculative-moe-a2a-backend inherits
    the target's backend (NGRAM has no draft model).
    """
    flags = _flags(role)
    if a2a_backend(flags) != "deepep_v2" or _untracked(flags):
        return []
    problems = []

    def add(where: str, message: str, fix: str) -> None:
        problems.append(_problem(where, f"--moe-a2a-backend deepep_v2: {message}", fix, "deepep_v2_requirements"))

    runner = _runner(flags)
    if runner not in ("deep_gemm", "auto"):
        add(_field(role, "moe_runner_backend"), f"DeepEP v2 runs the deep_gemm MoE runner only, not {runner}; SGLang "
            "0.5.23 refuses it", "use --moe-runner-backend deep_gemm or auto")
    for dest, flag in (("enable_two_batch_overlap", "--enable-two-batch-overlap"),
                       ("enable_single_batch_overlap", "--enable-single-batch-overlap")):
        if _on(flags, dest):
            add(_field(role, dest), f"DeepEP v2 has no two-batch / single-batch overlap hooks; SGLang 0.5.23 refuses "
                f"{flag}", f"remove {flag}, or use --moe-a2a-backend deepep")
    if _on(flags, "enforce_shared_experts_fusion"):
        add(_field(role, "enforce_shared_experts_fusion"), "DeepEP v2 has not validated fused shared experts; SGLang "
            "0.5.23 refuses --enforce-shared-experts-fusion", "remove --enforce-shared-experts-fusion")
    draft = flags.get("speculative_moe_a2a_backend")
    if spec.speculative is not None and spec.speculative.algorithm != "NGRAM" and (draft in (None, "deepep_v2")):
        add(_field(role, "speculative_moe_a2a_backend", "moe_a2a_backend"),
            f"the {spec.speculative.algorithm} draft model would run DeepEP v2 too "
            f"({'inherited from --moe-a2a-backend' if draft is None else '--speculative-moe-a2a-backend deepep_v2'}), "
            "which SGLang 0.5.23 has not validated and refuses", "add --speculative-moe-a2a-backend none (or deepep)")
    return problems


def deepep_v2_dispatch_budget(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepEP v2's per-rank dispatch buffer must hold a prefill chunk and the largest decode graph.

    Source: moe_hook.py ``validate_deepep_v2_dispatch_token_budget``: off the decode role,
    "DeepEP v2 per-rank prefill budget exceeds SGLANG_DEEPEP_V2_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
    (the per-DP-rank chunked prefill size, or --max-prefill-tokens with chunking off,
    split over the tp / attention-DP ranks it is scattered to:
    required_deepep_v2_prefill_tokens_per_rank); off the prefill role with decode CUDA
    graphs, "DeepEP v2 per-rank decode CUDA graph exceeds ..." (the largest decode graph
    batch, capped by the running requests per attention-DP rank, times the tokens per
    request: _decode_graph_dispatch_tokens_per_rank). The capacity defaults to 128
    (environ.py). Chunked prefill size, graph batch size and request caps are SGLang's
    defaults when not set (see the module docstring); pipeline parallelism's dynamic
    chunking grows the chunk to --max-prefill-tokens or 1.25 chunks
    (overrides.max_prefill_buffer_tokens).
    """
    flags = _flags(role)
    if a2a_backend(flags) != "deepep_v2" or _untracked(flags):
        return []
    capacity, env_field = _env(role, DEEPEP_V2_CAPACITY_ENV, DEEPEP_V2_CAPACITY_DEFAULT)
    if capacity is None:
        return []
    p = role.inputs.parallelism
    problems = []
    if role.role == "prefill":
        chunk = chunked_prefill_per_rank(role.inputs, flags)
        max_prefill = _int(flags.get("max_prefill_tokens")) or MAX_PREFILL_TOKENS_DEFAULT
        ceiling = chunk if chunk is not None and chunk > 0 else None
        if chunk is not None and chunk <= 0:
            ceiling = max_prefill
        elif chunk is not None and _on(flags, "enable_dynamic_chunking") and (_int(flags.get("pp_size")) or 1) > 1:
            ceiling = max(chunk, max_prefill, -(-chunk * 5 // 4))  # overrides.max_prefill_buffer_tokens
        scatter = max(1, p.tp // role.inputs.attention_dp)
        if ceiling is not None and -(-ceiling // scatter) > capacity:
            required = -(-ceiling // scatter)
            problems.append(_problem(
                env_field,
                f"DeepEP v2 dispatches up to {required} prefill tokens per rank (a {ceiling}-token chunk per attention-DP "
                f"rank over {scatter} ranks) and {DEEPEP_V2_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 refuses to start",
                f"set {DEEPEP_V2_CAPACITY_ENV} to at least {required}, or lower --chunked-prefill-size",
                "deepep_v2_dispatch_budget",
            ))  # fmt: skip
    if role.role == "decode" and not _on(flags, "disable_cuda_graph"):
        graph_bs = _decode_graph_max_bs(role, flags)
        tokens = _tokens_per_request(spec, role, flags)
        mrr = _max_running_requests(spec, role, flags)
        if graph_bs is not None:
            if mrr is not None:
                graph_bs = min(graph_bs, max(1, mrr // role.inputs.attention_dp))
            if graph_bs * tokens > capacity:
                problems.append(_problem(
                    env_field,
                    f"DeepEP v2's largest decode CUDA graph dispatches at least {graph_bs * tokens} tokens per rank "
                    f"({graph_bs} requests x {tokens} tokens) and {DEEPEP_V2_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 "
                    "refuses to start",
                    f"set {DEEPEP_V2_CAPACITY_ENV} to at least {graph_bs * tokens}, or lower --cuda-graph-max-bs-decode "
                    "/ --max-running-requests",
                    "deepep_v2_dispatch_budget",
                ))  # fmt: skip
    return problems


# --------------------------------------------------------------------------- MegaMoE
def megamoe_compat(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """MegaMoE has no two-batch / single-batch overlap and needs an SM90 / SM100-class GPU or ROCm.

    Source: mega_moe_hook.py ``check_mega_moe_compat``: "--moe-a2a-backend megamoe has no
    two-batch / single-batch overlap decomposition; disable --enable-two-batch-overlap and
    --enable-single-batch-overlap."; "--moe-a2a-backend megamoe needs a CUDA SM90 GPU
    (block-FP8 experts) or an SM100-class GPU (MXFP4 / NVFP4 experts) ...". The GPU class
    is the accelerator catalog's ``isa``.
    """
    flags = _flags(role)
    if a2a_backend(flags) != "megamoe" or _untracked(flags):
        return []
    problems = []
    where = _field(role, "moe_a2a_backend", "moe_runner_backend")
    for dest, flag in (("enable_two_batch_overlap", "--enable-two-batch-overlap"),
                       ("enable_single_batch_overlap", "--enable-single-batch-overlap")):
        if _on(flags, dest):
            problems.append(_problem(
                _field(role, dest),
                f"MegaMoE's fused kernel has no two-batch / single-batch overlap split; SGLang 0.5.23 refuses {flag} "
                "with --moe-a2a-backend megamoe",
                f"remove {flag}, or use another --moe-a2a-backend",
                "megamoe_compat",
            ))  # fmt: skip
    acc = role.inputs.accelerator
    if acc is not None and acc.vendor == "nvidia" and not (acc.isa.startswith("sm_90") or acc.isa.startswith("sm_10")):
        problems.append(_problem(
            where,
            f"MegaMoE runs DeepGEMM kernels that need an SM90 or SM100-class GPU, and {role.inputs.accelerator_name} is "
            f"{acc.isa}; SGLang 0.5.23 refuses --moe-a2a-backend megamoe there",
            "use another --moe-a2a-backend on this accelerator, or an H100 / H200 / B200-class accelerator",
            "megamoe_compat",
        ))  # fmt: skip
    return problems


def megamoe_token_budget(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """MegaMoE's per-rank token capacity must hold each rank's prefill chunk and decode / verify step.

    Source: mega_moe_hook.py ``validate_mega_moe_token_budget`` (CUDA, for the
    architectures with no fused-MoE fallback: DeepSeek-V4, Qwen3-MoE): off the prefill
    role, "... with MegaMoE requires SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK to
    cover the largest decode / verify forward on one rank" (decode graph batch, capped by
    the running requests per attention-DP rank aligned to the attention TP, times the tokens
    per request); off the decode role, "... requires chunked prefill to be enabled" and
    "... to cover each rank's effective prefill token budget": the chunked prefill size,
    already divided per attention-DP rank, divided again by the attention-DP size and
    aligned to the attention TP size (or split over attention CP with prefill CP; pure TP
    aligned to TP / attention CP). The capacity defaults to 8192 (environ.py).
    """
    flags = _flags(role)
    acc = role.inputs.accelerator
    model = role.inputs.model
    if a2a_backend(flags) != "megamoe" or _untracked(flags) or acc is None or acc.vendor != "nvidia":
        return []
    if model is None or model.architecture not in MEGA_MOE_NO_FALLBACK_ARCHS:
        return []
    capacity, env_field = _env(role, MEGA_MOE_CAPACITY_ENV, MEGA_MOE_CAPACITY_DEFAULT)
    if capacity is None:
        return []
    p = role.inputs.parallelism
    dp, cp = role.inputs.attention_dp, role.inputs.attention_cp
    problems = []

    def add(where: str, message: str, fix: str) -> None:
        problems.append(_problem(where, f"{spec.model.name} with MegaMoE: {message}", fix, "megamoe_token_budget"))

    if role.role == "decode":
        graph_bs = _decode_graph_max_bs(role, flags)
        tokens = _tokens_per_request(spec, role, flags)
        mrr = _max_running_requests(spec, role, flags)
        if graph_bs is not None and not _on(flags, "disable_cuda_graph"):
            if mrr is not None:
                align = max(1, p.tp // dp)
                graph_bs = min(graph_bs, -(-(mrr // dp) // align) * align)
            if graph_bs * tokens > capacity:
                add(env_field, f"the largest decode / verify step runs at least {graph_bs * tokens} tokens on one rank and "
                    f"{MEGA_MOE_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 refuses to start",
                    f"set {MEGA_MOE_CAPACITY_ENV} to at least {graph_bs * tokens}, or lower --cuda-graph-max-bs-decode / "
                    "--max-running-requests")
        return problems
    if _on(flags, "enable_dynamic_chunking") and (_int(flags.get("pp_size")) or 1) > 1:
        return problems
    chunk = chunked_prefill_per_rank(role.inputs, flags)
    if chunk is None:
        return problems
    if chunk <= 0:
        add(_field(role, "chunked_prefill_size"), "MegaMoE needs chunked prefill to bound a prefill forward; SGLang 0.5.23 "
            f"refuses --chunked-prefill-size {flags.get('chunked_prefill_size')}", "use a positive --chunked-prefill-size")
        return problems
    if role.inputs.prefill_cp:
        local, align, how = -(-chunk // cp), 1, f"split over attention CP {cp}"
    elif dp > 1:
        local, align, how = chunk // dp, max(1, p.tp // dp // cp), f"divided by attention DP {dp} once more"
    else:
        local, align, how = chunk, max(1, p.tp // cp), "pure TP"
    if local <= 0:
        add(_field(role, "chunked_prefill_size"), f"the per-rank prefill chunk is {local} tokens ({how}); SGLang 0.5.23 "
            "refuses a chunk that is not positive", "raise --chunked-prefill-size")
        return problems
    required = -(-local // align) * align
    if required > capacity:
        add(env_field, f"each rank's prefill chunk needs {required} tokens (per-DP-rank chunked prefill size {chunk}, "
            f"{how}, aligned to {align}) and {MEGA_MOE_CAPACITY_ENV} is {capacity}; SGLang 0.5.23 refuses to start",
            f"set {MEGA_MOE_CAPACITY_ENV} to at least {required}, or lower --chunked-prefill-size")
    return problems


# --------------------------------------------------------------------------- all-to-all dispatchers (model build)
def _has_moe_layers(role: RolePlan) -> bool:
    """The model has routed experts, so SGLang builds an all-to-all dispatcher in each MoE layer
    (layers/moe/fused_moe_triton/layer.py create_moe_dispatcher)."""
    model = role.inputs.model
    return model is not None and model.routedExperts > 0


def _mori_epv2(role: RolePlan, flags: Mapping[str, Any], use_aiter: bool) -> bool:
    """Whether SGLang picks MoRI EPv2 (moe_hook._resolve_mori_ep_v2): SGLANG_MORI_EP_V2 set and true
    forces it, set and false forces EPv1; unset, EPv2 unless _mori_epv2_unsupported_reason finds
    tp > 8 (off gfx1250), SGLANG_USE_AITER off, MORI_ENABLE_SDMA on, a --dtype other than
    bfloat16, or a model other than DeepSeek-V4. A ``--dtype auto`` is taken as bfloat16 (the
    catalog's DeepSeek-V4 checkpoints), so the rule leans to EPv2, where it refuses nothing."""
    env = role.command.env_dict()
    if "SGLANG_MORI_EP_V2" in env:
        return env_bool(role, "SGLANG_MORI_EP_V2", True)
    acc = role.inputs.accelerator
    return (
        use_aiter
        and (role.inputs.parallelism.tp <= 8 or (acc is not None and acc.isa == "gfx1250"))
        and env.get("MORI_ENABLE_SDMA", "false").lower() not in ("true", "1")
        and str(flags.get("dtype") or "auto") in ("auto", "bfloat16")
        and role.inputs.is_deepseek_v4
    )


def mori_ep_v1_needs_aiter(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """MoRI's EPv1 dispatcher runs only on ROCm with AITER (``SGLANG_USE_AITER``).

    Source: layers/moe/token_dispatcher/moriep.py: ``get_hip_quant`` is imported only when
    ``_use_aiter`` (SGLANG_USE_AITER true and a HIP build, :55-58), and
    ``_MoriEPv1DispatcherImplBase.__init__`` calls it unconditionally (:967), so building an
    EPv1 dispatcher (both its normal and low-latency modes) anywhere else raises "NameError:
    name 'get_hip_quant' is not defined" while the model is built. EPv1 is the MoriEPDispatcher
    SGLang picks when SGLANG_MORI_EP_V2 is false (:1625), which moe_hook._resolve_mori_ep_v2
    sets unless EPv2 is supported (:func:`_mori_epv2`). Found by the SGLang oracle's model stage;
    only models with routed experts build a dispatcher.
    """
    flags = _flags(role)
    if a2a_backend(flags) != "mori" or _untracked(flags) or not _has_moe_layers(role):
        return []
    acc = role.inputs.accelerator
    use_aiter = env_bool(role, "SGLANG_USE_AITER", False)
    if acc is None or acc.vendor != "amd" or use_aiter or _mori_epv2(role, flags, use_aiter):
        return []  # off ROCm: mori_a2a_rocm_only
    return [
        _problem(
            _field(role, "moe_a2a_backend"),
            "--moe-a2a-backend mori builds MoRI's EPv1 dispatcher in every MoE layer, which quantizes with AITER's "
            "get_hip_quant, and SGLANG_USE_AITER is not set to true; SGLang 0.5.23 fails while it builds the model "
            "(NameError: name 'get_hip_quant' is not defined, moriep.py)",
            f"set SGLANG_USE_AITER=1 in spec.{role.role}.env",
            "mori_ep_v1_needs_aiter",
        )
    ]  # fmt: skip


def mori_a2a_rocm_only(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend mori`` on an accelerator that is not AMD's: MoRI is AMD's ROCm library,
    so no CUDA image holds it, and the dispatcher each MoE layer builds imports it.

    Source: layers/moe/token_dispatcher/moriep.py: ``_MoriEPv1DispatcherImplBase.__init__``
    raises ImportError("Mori EP is not installed. Please install.") when ``import mori`` fails
    (:958), EPv2's ``__init__`` ImportError("MORI EPv2 requires a MORI build with cco and
    dispatch_combine_v2", :1369). Found by the SGLang oracle's model stage once it served MoRI's
    stand-in on ROCm pods only (oracle/kernel_standins.py ``VENDOR_ONLY``; stages.py
    ``VENDOR_ONLY_MODULES``). Only models with routed experts build a dispatcher.
    """
    flags = _flags(role)
    acc = role.inputs.accelerator
    if a2a_backend(flags) != "mori" or _untracked(flags) or acc is None or acc.vendor == "amd" or not _has_moe_layers(role):
        return []
    return [
        _problem(
            _field(role, "moe_a2a_backend"),
            f"--moe-a2a-backend mori dispatches experts with MoRI, AMD's ROCm library, and "
            f"{role.inputs.accelerator_name} is not an AMD GPU: no CUDA image holds MoRI, so SGLang 0.5.23 fails "
            "with ImportError while it builds the model (moriep.py: \"Mori EP is not installed\", or with "
            "SGLANG_MORI_EP_V2 \"MORI EPv2 requires a MORI build with cco and dispatch_combine_v2\")",
            "use --moe-a2a-backend deepep (or another CUDA all-to-all backend) on this accelerator, or run MoRI on an "
            "AMD accelerator with SGLANG_USE_AITER=1",
            "mori_a2a_rocm_only",
        )
    ]  # fmt: skip


#: All-to-all backends whose dispatcher imports a CUDA-only library while the model is built,
#: with the library, where SGLang imports it, and why it cannot exist on a ROCm image.
CUDA_ONLY_A2A: dict[str, tuple[str, str, str]] = {
    "nixl": ("NixlEP (nixl_ep)", "token_dispatcher/nixl.py _load_nixl_ep, called by NixlEPDispatcher.__init__",
             "nixl 1.5.2's nixl_ep loads nixl_ep_cu12 or nixl_ep_cu13, CUDA builds only"),
    "pplx": ("pplx-kernels (pplx_kernels)", "token_dispatcher/pplx.py _PplxDispatcherImpl.__init__",
             "a CUDA library SGLang's own message says to build with TORCH_CUDA_ARCH_LIST"),
}


def a2a_backend_cuda_only(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend nixl`` or ``pplx`` on an AMD accelerator: the dispatcher each MoE layer
    builds imports a CUDA-only library, so SGLang 0.5.23 fails with ImportError while it builds
    the model ("NixlEP is not installed ..." / "pplx-kernels is not installed ...").

    Source: layers/moe/token_dispatcher/nixl.py ``_load_nixl_ep`` (from
    ``NixlEPDispatcher.__init__``), token_dispatcher/pplx.py ``_PplxDispatcherImpl.__init__``
    (:data:`CUDA_ONLY_A2A`). The SGLang oracle reaches both imports at its model stage and
    judges the ImportError as SGLang's refusal on an emulated ROCm pod
    (oracle/stages.py ``VENDOR_ONLY_MODULES``). Only models with routed experts build a dispatcher.
    """
    flags = _flags(role)
    a2a = a2a_backend(flags)
    acc = role.inputs.accelerator
    if a2a not in CUDA_ONLY_A2A or _untracked(flags) or acc is None or acc.vendor != "amd" or not _has_moe_layers(role):
        return []
    library, where, why = CUDA_ONLY_A2A[a2a]
    return [
        _problem(
            _field(role, "moe_a2a_backend"),
            f"--moe-a2a-backend {a2a} builds a dispatcher in every MoE layer that imports {library} ({where}), "
            f"which has no ROCm build ({why}); on {role.inputs.accelerator_name} SGLang 0.5.23 fails with "
            "ImportError while it builds the model",
            "use --moe-a2a-backend mori (with SGLANG_USE_AITER=1) or none on an AMD accelerator",
            "a2a_backend_cuda_only",
        )
    ]


def mooncake_a2a_low_latency_only(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-a2a-backend mooncake`` has only a low-latency dispatcher: ``--deepep-mode low_latency``.

    Source: layers/moe/token_dispatcher/mooncake.py ``MooncakeEPDispatcher.__init__``
    (:344): ``if self.deepep_mode.enable_normal(): raise NotImplementedError``, true for
    ``normal`` and for ``auto`` (layers/moe/utils.py DeepEPMode.enable_normal), the default of
    ``--deepep-mode``; no argument hook resolves ``auto`` for mooncake (moe_hook.handle_a2a_moe
    does so for deepep, mori and pplx only). Raised while the model is built, in each MoE
    layer; found by the SGLang oracle's model stage.
    """
    flags = _flags(role)
    if a2a_backend(flags) != "mooncake" or _untracked(flags) or not _has_moe_layers(role):
        return []
    mode = str(flags.get("deepep_mode") or "auto")
    if mode == "low_latency":
        return []
    where = _field(role, "deepep_mode") if flags.get("deepep_mode") is not None else _field(role, "moe_a2a_backend")
    return [
        _problem(
            where,
            f"Mooncake EP has only a low-latency dispatcher, and --deepep-mode {mode}"
            f"{' (the default)' if flags.get('deepep_mode') is None else ''} enables the normal one; SGLang 0.5.23 "
            "fails while it builds the model (NotImplementedError in mooncake.py MooncakeEPDispatcher)",
            "add --deepep-mode low_latency, or use another --moe-a2a-backend",
            "mooncake_a2a_low_latency_only",
        )
    ]  # fmt: skip


#: Backends whose MoE layers SGLang builds as DeepEPMoE (ep_moe/layer.py get_moe_impl_class, :352);
#: mori is left out: on CUDA its EPv1 dispatcher fails first (mori_ep_v1_needs_aiter), EPv2 is FusedMoE.
_DEEPEP_MOE_A2A = ("deepep", "mooncake", "nixl", "pplx")


def _jit_deepgemm_off(role: RolePlan) -> tuple[str, str] | None:
    """Why deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM is False on this role's CUDA GPU, with the field to
    name; None when it is on or the catalog cannot tell. configurer.py ``_compute_enable_deep_gemm``
    (:32-52): off when SGLANG_ENABLE_JIT_DEEPGEMM is false or the compute capability is below 9.0;
    SM120/121 also need DeepGEMM's SM120 APIs, which the catalog cannot tell (left to the oracle)."""
    acc = role.inputs.accelerator
    if acc is None or acc.vendor != "nvidia":
        return None  # HIP and NPU builds skip the assertions
    if not env_bool(role, "SGLANG_ENABLE_JIT_DEEPGEMM", True):
        found = [i for i, v in enumerate(role.inputs.spec.env) if v.name == "SGLANG_ENABLE_JIT_DEEPGEMM"]
        where = f"spec.{role.role}.env" + (f"[{found[-1]}]" if found else "")
        return where, "SGLANG_ENABLE_JIT_DEEPGEMM turns JIT DeepGEMM off"
    digits = "".join(ch for ch in acc.isa.removeprefix("sm_") if ch.isdigit())
    if acc.isa.startswith("sm_") and digits and int(digits) < 90:
        return "", f"{role.inputs.accelerator_name} ({acc.isa}) is below SM90, where SGLang has no JIT DeepGEMM"
    return None


def deepep_moe_needs_deep_gemm(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepEP-style MoE layers need JIT DeepGEMM for quantized experts in low-latency mode, and for
    unquantized BF16 experts on the deep_gemm runner.

    Source: layers/moe/ep_moe/layer.py ``DeepEPMoE.__init__``, built for --moe-a2a-backend
    deepep, mooncake, nixl and pplx (``get_moe_impl_class``, :352): on CUDA, unless the MoE runner
    is humming or flashinfer_cutedsl with modelopt_fp4/modelopt_mixed (:103, :118-123), it asserts
    ``deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM`` (:176, "DeepEP <mode> mode requires deep_gemm") when
    the deepep mode enables low latency (``auto`` or ``low_latency``; pplx resolves auto to
    low_latency, moe_hook.handle_a2a_moe) and the layer has a quant config (the checkpoint's
    ``quantization_config`` or --quantization), and (:144, "Unquantized DeepEP MoE requires
    DeepGEMM BF16") for BF16 experts without one on the deep_gemm runner (explicit, or pplx's auto)
    under deepep or pplx. ENABLE_JIT_DEEPGEMM (deep_gemm_wrapper/configurer.py:39) is off below
    SM90 (l40s, sm_89) and with SGLANG_ENABLE_JIT_DEEPGEMM false. Mooncake and NIXL refuse
    ``auto``/``normal`` in their dispatchers first (:func:`mooncake_a2a_low_latency_only`), so only
    their ``low_latency`` reaches :176; ``--deepep-mode normal`` avoids it under deepep. Raised
    while the model is built; found by the SGLang oracle's model stage.
    """
    flags = parse_flags(list(role.command.args))
    a2a = a2a_backend(flags)
    if a2a not in _DEEPEP_MOE_A2A or _untracked(flags) or not _has_moe_layers(role):
        return []
    off = _jit_deepgemm_off(role)
    if off is None:
        return []
    mode = str(flags.get("deepep_mode") or "auto")
    runner = _runner(flags)
    if a2a == "pplx":
        if mode == "normal" or role.inputs.attention_dp < 2 or runner not in ("deep_gemm", "auto"):
            return []  # refused by the argument checks first (pplx_a2a_requirements)
        runner, mode = "deep_gemm", "low_latency"
    config = catalog.hf_config(spec.model.name)
    quant = flags.get("quantization")
    if quant in _OFF:
        if config is None:
            return []
        quant = (config.get("quantization_config") or {}).get("quant_method") or None
    if runner == "humming" or (runner == "flashinfer_cutedsl" and quant in ("modelopt_fp4", "modelopt_mixed")):
        return []
    where, why = off
    if quant is not None:
        low_latency = mode == "low_latency" if a2a in ("mooncake", "nixl") else mode != "normal"
        if not low_latency:
            return []
        check = f"which asserts JIT DeepGEMM for quantized ({quant}) experts in --deepep-mode {mode} (layer.py:176)"
        avoid = "add --deepep-mode normal (decode then runs without CUDA graphs)" if a2a == "deepep" else None
    else:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        dtype = str(flags.get("dtype") or "auto")
        bf16 = dtype == "bfloat16" or (dtype == "auto" and (text.get("torch_dtype") or config.get("torch_dtype")
                                                           or text.get("dtype")) == "bfloat16")
        if a2a not in ("deepep", "pplx") or runner != "deep_gemm" or not bf16:
            return []
        check = ("which asserts JIT DeepGEMM for unquantized BF16 experts on the deep_gemm MoE runner"
                 f"{' (pplx resolves auto to it)' if _runner(flags) == 'auto' else ''} (layer.py:144)")
        avoid = "remove --moe-runner-backend deep_gemm" if a2a == "deepep" else None
    if where:
        fixes = [f"remove SGLANG_ENABLE_JIT_DEEPGEMM=false from spec.{role.role}.env"]
    else:
        fixes = ["use an SM90+ accelerator (H100, H200, B200, GB200, GB300)"]
        where = (_field(role, "moe_a2a_backend") if flags.get("moe_a2a_backend") == a2a
                 else _field(role, "enable_waterfill"))
    fixes += [avoid] if avoid else []
    fixes.append("use --moe-a2a-backend none")
    backend = (f"--moe-a2a-backend {a2a}" if flags.get("moe_a2a_backend") == a2a
               else "--enable-waterfill (which forces --moe-a2a-backend deepep)")
    return [
        _problem(
            where,
            f"{backend} builds every MoE layer as DeepEPMoE, {check}; {why}, so SGLang 0.5.23 "
            "fails while it builds the model",
            ", or ".join(fixes),
            "deepep_moe_needs_deep_gemm",
        )
    ]  # fmt: skip


def single_batch_overlap_not_on_sm90(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--enable-single-batch-overlap`` is refused on SM90 (Hopper) GPUs.

    Source: layers/moe/utils.py ``initialize_moe_config`` (:509), run by every scheduler
    whatever the model: with SBO on, CUDA and compute capability major 9, "SBO (single
    batch overlap) is not supported on SM90 GPUs with latest sgl-deep-gemm wheel. Please try
    removing --enable-single-batch-overlap argument." The GPU class is the accelerator
    catalog's ``isa`` (sm_90a: H100, H200). With --moe-a2a-backend megamoe or deepep_v2 the
    argument checks refuse SBO first (:func:`megamoe_compat`, :func:`deepep_v2_requirements`).
    """
    flags = _flags(role)
    acc = role.inputs.accelerator
    if not _on(flags, "enable_single_batch_overlap") or acc is None or acc.vendor != "nvidia":
        return []
    if not acc.isa.startswith("sm_90") or a2a_backend(flags) in ("megamoe", "deepep_v2"):
        return []
    return [
        _problem(
            _field(role, "enable_single_batch_overlap"),
            f"--enable-single-batch-overlap on {role.inputs.accelerator_name} ({acc.isa}): SGLang 0.5.23's DeepGEMM "
            "wheel has no single-batch overlap on SM90 GPUs, and it refuses to start (initialize_moe_config)",
            "remove --enable-single-batch-overlap, or use an SM100-class accelerator (B200, GB200, GB300)",
            "single_batch_overlap_not_on_sm90",
        )
    ]  # fmt: skip


def _moe_tp(role: RolePlan, flags: Mapping[str, Any]) -> int:
    """The MoE TP width SGLang resolves: TP over the expert-parallel width (every all-to-all
    backend but none spans the TP group with EP, overrides._a2a_ep_size), over the MoE DP width."""
    p = role.inputs.parallelism
    ep = p.tp if a2a_backend(flags) in EP_SPANNING_A2A else max(1, p.ep)
    moe_dp = _int(flags.get("moe_dp_size")) or 1
    return max(1, p.tp // max(1, ep) // max(1, moe_dp))


#: Runners whose resolution turns shared-experts fusion off (overrides._moe_runner_fusion_disable).
_FUSION_OFF_RUNNERS = ("lora_triton", "lora_cutedsl", "lora_marlin", "flashinfer_cutedsl", "flashinfer_trtllm",
                       "experimental_sgl_trtllm", "flashinfer_trtllm_routed")  # fmt: skip


def _env_on(role: RolePlan, name: str) -> bool:
    """An ``EnvBool`` of sglang/srt/environ.py (default off) as the role's env sets it."""
    value = None
    for var in role.inputs.spec.env:
        if var.name == name:
            value = str(var.value).lower()
    return value in ("true", "1", "yes", "y")


def _shared_experts_block_width(spec: PDDeploymentSpec, role: RolePlan, flags: Mapping[str, Any],
                                config: Mapping[str, Any], text: Mapping[str, Any]) -> list[Problem]:
    """DeepSeek-V4's shared experts: an FP8 block-quantized MLP split over the whole TP group.

    models/deepseek_v2.py ``DeepseekV2MoE.__init__`` (:864-897, the MoE block of
    models/deepseek_v4.py) builds the shared experts as a ``DeepseekV2MLP`` of intermediate
    size ``moe_intermediate_size * n_shared_experts`` unless they are fused into the routed
    experts. It replicates them (``parallel_group="replicated"``) under every all-to-all
    backend but none (the list at :874-887 is EP_SPANNING_A2A) or with
    SGLANG_SHARED_EXPERT_TP1 (the FP4 all-gather term needs ``--quantization modelopt_fp4``),
    and otherwise splits them over ``parallel_group="tp"``: the full ``--tp-size``
    (layers/linear.py ``_resolve_linear_group``), not the attention TP, not the MoE TP
    (expert parallelism does not shard them) and not ``--moe-dense-tp-size`` (dense layers
    only). They are fused only with ``--enforce-shared-experts-fusion`` at MoE EP 1
    (models/deepseek_v4.py ``shared_experts_fusion_disable_reason``, :4864) and no runner
    that turns fusion off (arg_groups/overrides.py ``_moe_runner_fusion_disable``).
    layers/quantization/fp8.py ``Fp8LinearMethod.validate_block_quant_shapes`` (:570-609)
    then needs each merged gate/up slice to be a multiple of block_n (":606 Weight
    output_partition_size = 36 is not divisible by weight quantization block_n = 32") and,
    at TP > 1, the down projection's input slice a multiple of block_k.
    """
    if not role.inputs.is_deepseek_v4 or flags.get("quantization") not in (None, False, "fp8"):
        return []
    quant = config.get("quantization_config") or {}
    block = quant.get("weight_block_size")
    ignored = quant.get("ignored_layers") or quant.get("modules_to_not_convert") or []
    if quant.get("quant_method") != "fp8" or not block or len(block) != 2 or any("shared_experts" in str(x)
                                                                                   for x in ignored):
        return []
    n_shared = _int(text.get("n_shared_experts") or config.get("n_shared_experts"))
    inter = _int(text.get("moe_intermediate_size") or config.get("moe_intermediate_size"))
    if not n_shared or not inter:
        return []
    p = role.inputs.parallelism
    a2a = a2a_backend(flags)
    moe_ep = p.tp if a2a in EP_SPANNING_A2A else max(1, p.ep)
    if (_on(flags, "enforce_shared_experts_fusion") and not _on(flags, "disable_shared_experts_fusion")
            and _runner(flags) not in _FUSION_OFF_RUNNERS and moe_ep == 1):
        return []  # fused into the routed experts: no separate MLP
    replicated = a2a in EP_SPANNING_A2A or _env_on(role, "SGLANG_SHARED_EXPERT_TP1")
    tp = 1 if replicated else max(1, p.tp)
    width = inter * n_shared
    block_n, block_k = int(block[0]), int(block[1])

    def fits(t: int) -> bool:
        return width % t == 0 and (width // t) % block_n == 0 and (t == 1 or (width // t) % block_k == 0)

    if fits(tp):
        return []
    best = max((t for t in (2**i for i in range(tp.bit_length())) if fits(t)), default=None)
    where = f"the whole TP group of {tp} (expert parallelism does not shard them)" if tp > 1 else "every rank"
    how = (f"{width} does not split into {tp} equal slices" if width % tp else
           f"each rank's slice ({width} / {tp} = {width // tp}) is not a multiple of the checkpoint's FP8 block "
           f"{block_n}x{block_k}")
    fix = (f"use tp {best} or another tp at which {width} / tp is a multiple of {max(block_n, block_k)}, or an "
           "all-to-all backend (--moe-a2a-backend, under which SGLang replicates the shared experts), or set "
           f"SGLANG_SHARED_EXPERT_TP1=1 in spec.{role.role}.env" if tp > 1 else
           "use a checkpoint whose shared experts' width is a multiple of its FP8 block")
    return [
        _problem(
            f"spec.{role.role}.parallelism.tp",
            f"{spec.model.name}'s shared experts (intermediate size {width}) are split over {where}, and {how}; "
            "SGLang 0.5.23 refuses it while it builds the model (linear.py divide / fp8.py "
            "Fp8LinearMethod.validate_block_quant_shapes)",
            fix,
            "quantized_moe_block_width",
        )
    ]


def quantized_moe_block_width(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Each rank's slice of a quantized MoE's intermediate size must fit the kernel's blocks.

    SGLang refuses, while it builds the model (after every argument check passed):

    - an FP8 block-quantized checkpoint (``quantization_config.weight_block_size``
      [block_n, block_k]) whose per-rank MoE intermediate size (``moe_intermediate_size``
      over the MoE TP width) is not a multiple of block_n, or of block_k with MoE TP > 1:
      layers/quantization/fp8.py ``Fp8MoEMethod.create_weights`` ("The output_size of
      gate's and up's weight = 192 is not divisible by weight quantization block_n = 128");
    - DeepSeek-V4 FP4 experts on SM90, where the resolution picks the ``flashinfer_mxfp4``
      MoE runner for ``auto`` without an all-to-all backend (model_overrides/deepseek_v4.py)
      and FlashInfer's CUTLASS MXFP4 method needs hidden and per-rank intermediate sizes
      in multiples of 128 (layers/quantization/mxfp4_flashinfer_cutlass_moe.py
      ``create_weights``);
    - DeepSeek-V4's FP8 block-quantized shared experts at a TP whose slice is not a
      multiple of the block (:func:`_shared_experts_block_width`; fp8.py:606
      ``validate_block_quant_shapes``), found by the oracle's differential run.

    Found by the SGLang oracle's model stage (docs/sglang-oracle.md). Sizes come from the
    catalog's copy of the model's config.json.
    """
    model = role.inputs.model
    config = catalog.hf_config(spec.model.name)
    flags = _flags(role)
    if model is None or config is None or not model.routedExperts or _untracked(flags):
        return []
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    shared = _shared_experts_block_width(spec, role, flags, config, text)
    inter = _int(text.get("moe_intermediate_size") or config.get("moe_intermediate_size"))
    hidden = _int(text.get("hidden_size") or config.get("hidden_size"))
    moe_tp = _moe_tp(role, flags)
    if not inter or inter % moe_tp:
        return shared  # parallelism_divides_model refuses the division itself
    per_rank = inter // moe_tp
    quant = config.get("quantization_config") or {}
    block = quant.get("weight_block_size") if quant.get("quant_method") == "fp8" else None
    bad = None
    if block and model.bytesPerExpertParam == 1 and len(block) == 2:
        block_n, block_k = int(block[0]), int(block[1])
        if per_rank % block_n or (moe_tp > 1 and per_rank % block_k):
            bad = (f"each rank's slice of the MoE intermediate size ({inter} over MoE TP {moe_tp} = {per_rank}) is "
                   f"not a multiple of the checkpoint's FP8 block {block_n}x{block_k}; SGLang 0.5.23 refuses it while "
                   "it builds the model (fp8.py Fp8MoEMethod.create_weights)")
    acc = role.inputs.accelerator
    if (bad is None and role.inputs.is_deepseek_v4 and model.bytesPerExpertParam == 0.5 and acc is not None
            and acc.isa == "sm_90a" and _runner(flags) == "auto" and a2a_backend(flags) == "none"
            and not any(v.name == "SGLANG_DSV4_FP4_DEQUANT" and str(v.value).lower() in ("1", "true")
                        for v in role.inputs.spec.env)
            and (per_rank % 128 or (hidden or 0) % 128)):
        bad = (f"FP4 experts on {acc.isa} run FlashInfer's CUTLASS MXFP4 MoE, which needs the per-rank MoE "
               f"intermediate size ({inter} over MoE TP {moe_tp} = {per_rank}) and the hidden size ({hidden}) in "
               "multiples of 128; SGLang 0.5.23 refuses it while it builds the model "
               "(mxfp4_flashinfer_cutlass_moe.py create_weights)")
    if bad is None:
        return shared
    return [
        _problem(
            f"spec.{role.role}.parallelism.ep",
            bad,
            "use expert parallelism (parallelism.ep = tp) so each rank holds whole experts, or a smaller tp",
            "quantized_moe_block_width",
        )
    ] + shared


ROLE_RULES = (
    eplb_needs_expert_parallelism,
    ep_dispatch_needs_a2a_backend,
    moe_dense_tp_size_supported,
    two_batch_overlap_needs_dp_attention,
    flashinfer_a2a_requirements,
    pplx_a2a_requirements,
    mori_dispatch_budget,
    deepep_v2_requirements,
    deepep_v2_dispatch_budget,
    megamoe_compat,
    megamoe_token_budget,
    quantized_moe_block_width,
    mori_ep_v1_needs_aiter,
    mori_a2a_rocm_only,
    a2a_backend_cuda_only,
    mooncake_a2a_low_latency_only,
    deepep_moe_needs_deep_gemm,
    single_batch_overlap_not_on_sm90,
)
PAIR_RULES: tuple = ()
