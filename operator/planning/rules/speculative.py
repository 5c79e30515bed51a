"""Rules of SGLang 0.5.23's speculative decoding that hold for any model, checked before any pod exists.

DSpark. Source: sglang/srt/arg_groups/speculative_hook.py ``_handle_dspark`` (run during argument
resolution, before weights load): with attention DP the LM head must be data-parallel
too (the operator renders ``--enable-dp-lm-head``, see planning/engine_args.py), the MoE
all-to-all backend must be none, megamoe or mori, a non-none backend (or DP spec/prefill
coordination) needs ``SGLANG_RAGGED_VERIFY_MODE=static``, attention context parallelism
is refused, and ``--speculative-moe-a2a-backend`` must match; pipeline parallelism only
on a PD prefill; a draft model path unless the checkpoint bundles the DSpark draft
(speculative/dspark_components/dspark_config.py ``checkpoint_bundles_dspark_draft``).
DeepSeek-V4.1's own DSpark PD rules are in rules/deepseek_v4.py.

The other rules restate what the rest of the speculative hook refuses (sglang 0.5.23
arg_groups/speculative_hook.py; speculative/spec_info.py ``handle_server_args``):
``handle_speculative_decoding`` (SGLANG_RAGGED_VERIFY_MODE, DP spec/prefill coordination,
the decode radix cache, block verification, the draft window), ``_handle_eagle_family``
(EAGLE / NEXTN / EAGLE3 / STANDALONE: numSteps with --speculative-eagle-topk, the
attention backend of a top-k tree, rejection sampling, STANDALONE without attention DP),
``_handle_ngram`` (no attention DP, a paged tree only on flashinfer), ``_handle_dflash``
and DSpark's verify window. NEXTN is EAGLE by then (``_resolve_speculative_algorithm_alias``).
Where SGLang decides a value itself (the attention backend, auto-chosen speculative
parameters, adaptive speculation), a rule restates it only where it follows from the
spec and the catalog (``_attention_backend``), and stands aside otherwise; algorithms
DeepSeek-V4 refuses outright are rules/deepseek_v4.py's.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import flag_int, parse_flags
from .moe import a2a_backend
from ..problems import Problem
from ..structs import RolePlan
from .fields import env_field, env_true, flag_field

DSPARK_DP_A2A = ("none", "megamoe", "mori")
#: _handle_eagle_family runs these (NEXTN is EAGLE by then).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
#: speculative/ragged_verify.py RaggedVerifyMode: the values read_ragged_verify_mode accepts (exact).
RAGGED_VERIFY_MODES = ("static", "cap-accept", "compact")
RAGGED_VERIFY_ENV = "SGLANG_RAGGED_VERIFY_MODE"
COORDINATION_ENV = "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION"
#: handle_speculative_decoding: the algorithms DP spec/prefill coordination runs.
COORDINATED_ALGORITHMS = ("EAGLE", "EAGLE3", "DSPARK")
#: handle_speculative_decoding: the algorithms a decode radix cache runs with.
DECODE_RADIX_CACHE_ALGORITHMS = ("DSPARK", "EAGLE", "EAGLE3")
#: handle_speculative_decoding: the algorithms --speculative-use-block-verification supports.
BLOCK_VERIFICATION_ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DSPARK")
#: _handle_eagle_family _PAGE_TREE_SPEC_BACKENDS: a top-k > 1 tree over pages > 1.
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
#: arg_groups/fields/spec.py: --speculative-ngram-max-bfs-breadth, NGRAM's top-k.
NGRAM_DEFAULT_BFS_BREADTH = 10
HOPPER_ISA = "sm_90a"
SM100_ISAS = ("sm_100", "sm_103")


# --------------------------------------------------------------------------- helpers


def _dspark(spec: PDDeploymentSpec) -> bool:
    return spec.speculative is not None and spec.speculative.algorithm == "DSPARK"


def _algorithm(spec: PDDeploymentSpec) -> str | None:
    """The algorithm SGLang runs: NEXTN is EAGLE (speculative_hook._resolve_speculative_algorithm_alias;
    a Gemma4 assistant draft, which would make it FROZEN_KV_MTP, is not a model the catalog serves)."""
    sp = spec.speculative
    if sp is None:
        return None
    return "EAGLE" if sp.algorithm == "NEXTN" else sp.algorithm


def _extra_flags(role: RolePlan) -> dict[str, Any]:
    return parse_flags(role.inputs.spec.extraArgs)


def _rendered_flags(role: RolePlan) -> dict[str, Any]:
    """Every flag of the role's rendered command (the operator's and extraArgs), as SGLang parses it."""
    return parse_flags(role.command.args)


def _on(flags: Mapping[str, Any], dest: str) -> bool:
    return flags.get(dest) not in (None, False)


def _int(flags: Mapping[str, Any], dest: str) -> int | None:
    """``flags[dest]`` as an int; None when absent or not a number (args.extra_args_parse refuses those)."""
    return flag_int(flags, dest)


def _float(flags: Mapping[str, Any], dest: str, default: float) -> float:
    value = flags.get(dest)
    if value is None or isinstance(value, bool):
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default








def _adaptive(role: RolePlan) -> bool:
    """--speculative-adaptive: SGLang then picks numSteps and top-k itself (_init_adaptive_speculative_params)."""
    return _on(_extra_flags(role), "speculative_adaptive")


def _owned_by_dsv4(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    """DeepSeek-V4 refuses the algorithm itself (deepseek_v4.dsv4_speculative_algorithm: EAGLE or DSPARK,
    DSPARK only on V4.1): the rules here stand aside, one root cause, one problem."""
    if not role.inputs.is_deepseek_v4 or spec.speculative is None:
        return False
    model = role.inputs.model
    allowed = ("DSPARK",) if model is not None and model.is_deepseek_v41 else ("EAGLE", "DSPARK")
    return spec.speculative.algorithm not in allowed


def _mha_model(role: RolePlan) -> bool:
    """A known model on SGLang's MHA path (not MLA, not DeepSeek-V4): the one _attention_backend restates."""
    model = role.inputs.model
    return model is not None and not model.mla and not role.inputs.is_deepseek_v4


def _attention_backend(role: RolePlan, *, topk: int | None) -> tuple[str | None, bool]:
    """The ``attention_backend`` SGLang resolves, and whether SGLang chose it; (None, True) when it
    cannot be known here (not an MHA model of the catalog, or an unknown accelerator).

    Source: overrides._attention_backend_default: --prefill-attention-backend equal to
    --decode-attention-backend, else --attention-backend, else
    model_override_base.get_default_attn_backend, which for MHA picks fa3 on Hopper and
    trtllm_mha on SM100/SM103 when ``is_no_spec_infer_or_topk_one`` (top-k unset, or 1
    with page size 1; on SM100 also only with the top-k given), aiter on ROCm, flashinfer
    otherwise. ``topk`` is --speculative-eagle-topk as given (the speculative hook sets it
    later, after the backend is chosen).
    """
    flags = _rendered_flags(role)
    prefill, decode = flags.get("prefill_attention_backend"), flags.get("decode_attention_backend")
    if prefill is not None and prefill == decode:
        return str(prefill), False
    if flags.get("attention_backend") is not None:
        return str(flags["attention_backend"]), False
    acc = role.inputs.accelerator
    if acc is None or not _mha_model(role):
        return None, True
    page = role.inputs.page_size
    topk_one = topk is None or (topk == 1 and page == 1)
    if acc.vendor == "amd":
        return "aiter", True
    if acc.isa == HOPPER_ISA and topk_one:
        return "fa3", True
    if acc.isa in SM100_ISAS and topk_one and topk is not None:
        return "trtllm_mha", True
    return "flashinfer", True


def _eagle_topk(spec: PDDeploymentSpec, role: RolePlan) -> int | None:
    """The top-k _handle_eagle_family compares: --speculative-eagle-topk as rendered (the operator sets
    1 for DeepSeek-V4 EAGLE), or 1 when SGLang chooses the parameters (numSteps unset); None when
    unknown (adaptive speculation) or unset (eagle_topk_required refuses that)."""
    topk = _int(_rendered_flags(role), "speculative_eagle_topk")
    if topk is not None:
        return topk
    if spec.speculative.numSteps is None and not _adaptive(role):
        return 1  # _auto_choose_speculative_params: (3, 1, 4) for the catalog's models
    return None


def _problem(field: str, message: str, fix: str, rule: str) -> Problem:
    return Problem(field=field, message=f"{message}; SGLang 0.5.23 refuses it at startup", fix=fix, rule=rule)


# --------------------------------------------------------------------------- DSpark


def dspark_dp_attention(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DSpark with attention DP > 1: MoE all-to-all none / megamoe / mori, static verify with a
    non-none backend or prefill coordination, no attention CP, a matching speculative a2a backend.

    Source: speculative_hook._handle_dspark ("DSpark with dp attention supports
    moe_a2a_backend 'none' ..., 'megamoe', or 'mori'"; "DSpark DP MoE or prefill
    coordination requires SGLANG_RAGGED_VERIFY_MODE=static"; "DSpark with dp attention
    does not support context parallel"; "DSpark ignores --speculative-moe-a2a-backend; with
    dp attention it must match the target moe_a2a_backend").
    """
    if not _dspark(spec) or role.inputs.attention_dp <= 1:
        return []
    flags = parse_flags(role.inputs.spec.extraArgs)
    env = role.command.env_dict()
    a2a = a2a_backend(flags)  # the --moe-runner-backend megamoe alias and waterfill count (rules/moe.py)
    field = f"spec.{role.role}.extraArgs"
    problems = []

    def add(message: str, fix: str, where: str = field) -> None:
        problems.append(Problem(field=where, message=f"DSpark with attention DP: {message}", fix=fix,
                                rule="dspark_dp_attention"))

    if a2a not in DSPARK_DP_A2A:
        add(f"SGLang 0.5.23 supports --moe-a2a-backend none, megamoe or mori, not {a2a}",
            "use --moe-a2a-backend none (built-in TP MoE), megamoe (NVIDIA) or mori (AMD), or turn dpAttention off")
    coordination = env_true(role, COORDINATION_ENV)
    verify = env.get("SGLANG_RAGGED_VERIFY_MODE", "static")
    if (a2a != "none" or coordination) and verify != "static":
        add(f"a MoE all-to-all backend ({a2a}) or DP prefill coordination needs SGLANG_RAGGED_VERIFY_MODE=static, "
            f"not {verify}", "remove SGLANG_RAGGED_VERIFY_MODE (static is the default)", f"spec.{role.role}.env")
    if role.inputs.attention_cp > 1:
        add(f"SGLang 0.5.23 refuses attention context parallelism (attention CP {role.inputs.attention_cp})",
            "remove --attn-cp-size / --enable-prefill-cp, or turn dpAttention off")
    spec_a2a = flags.get("speculative_moe_a2a_backend")
    if spec_a2a is not None and str(spec_a2a) != a2a:
        add(f"--speculative-moe-a2a-backend {spec_a2a} must equal --moe-a2a-backend {a2a} (DSpark ignores it)",
            "remove --speculative-moe-a2a-backend")
    return problems


def dspark_moe_draft_attention_tp(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DSpark with attention DP and a DeepSeek-V4 (MoE) draft needs attention TP 1 (dp = tp).

    Source: sglang 0.5.23 speculative/dspark_components/dspark_worker_v2.py:212,
    ``DSparkWorkerV2.__init__`` ("DSpark + dp attention with a DeepSeek-V4 (MoE) draft
    requires attn_tp == 1 (set --dp-size == --tp)"), on CUDA and ROCm. The draft is the
    DeepSeek-V4 checkpoint's bundled head when no other draft model is named
    (``draft_is_deepseek_v4`` reads the draft path's config). The argument checks accept it;
    the oracle's ``speculative`` stage found it.
    """
    sp = spec.speculative
    if not _dspark(spec) or role.inputs.attention_dp <= 1 or not role.inputs.is_deepseek_v4:
        return []
    if sp.draftModelPath and sp.draftModelPath != spec.model.name:
        return []  # a separate draft checkpoint: its architecture is not in the catalog
    attn_tp = role.inputs.attention_tp
    if attn_tp <= 1:
        return []
    p = role.inputs.parallelism
    return [
        Problem(
            field=f"spec.{role.role}.parallelism.dp",
            message=f"DSpark with attention DP and {spec.model.name}'s DeepSeek-V4 (MoE) draft needs attention TP 1; "
            f"tp {p.tp} over dp {p.dp} gives attention TP {attn_tp}: SGLang 0.5.23's draft worker refuses to start "
            "(dspark_worker_v2.py:212)",
            fix=f"set parallelism.dp to tp ({p.tp}), or turn dpAttention off",
            rule="dspark_moe_draft_attention_tp",
        )
    ]


def dspark_pipeline_parallel(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DSpark runs pipeline parallelism only on a PD prefill (speculative_hook._handle_dspark:
    "DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated serving
    require pp_size == 1")."""
    if not _dspark(spec) or role.role != "decode":
        return []
    pp = parse_flags(role.inputs.spec.extraArgs).get("pp_size")
    if pp is None or str(pp) == "1":
        return []
    return [
        Problem(
            field="spec.decode.extraArgs",
            message=f"DSpark runs pipeline parallelism only on the prefill role; SGLang 0.5.23 refuses --pp-size {pp} "
            "on decode",
            fix="remove --pp-size from the decode role",
            rule="dspark_pipeline_parallel",
        )
    ]


def dspark_draft_model(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DSpark needs a draft model: bundled in the checkpoint (dspark_* keys in its config), or
    ``speculative.draftModelPath`` (speculative_hook._handle_dspark: "DSpark dense speculative
    decoding requires setting --speculative-draft-model-path")."""
    model = role.inputs.model
    if not _dspark(spec) or role.role != "prefill" or model is None or model.dsparkDraftBundled:
        return []
    if spec.speculative.draftModelPath:
        return []
    return [
        Problem(
            field="spec.speculative.draftModelPath",
            message=f"{spec.model.name}'s checkpoint carries no DSpark draft (its config has no dspark_* keys), so "
            "SGLang 0.5.23 needs a draft model path for DSpark",
            fix="set speculative.draftModelPath, or use a model that bundles the DSpark draft (DeepSeek-V4.1)",
            rule="dspark_draft_model",
        )
    ]


# --------------------------------------------------------------------------- every algorithm


def speculative_ragged_verify_mode(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLANG_RAGGED_VERIFY_MODE must be static, cap-accept or compact (exactly) with speculative decoding.

    Source: speculative/spec_info.py SpeculativeAlgorithm.handle_server_args calls
    speculative/ragged_verify.py read_ragged_verify_mode() for every built-in algorithm at
    startup, which raises "invalid SGLANG_RAGGED_VERIFY_MODE=...; expected one of 'static',
    'cap-accept', 'compact'". Without speculative decoding nothing validates it at startup.
    Stands aside where deepseek_v4.dspark_pd_requirements already refuses the value
    (DeepSeek-V4.1 DSpark needs static).
    """
    value = role.command.env_dict().get(RAGGED_VERIFY_ENV)
    if spec.speculative is None or value is None or value in RAGGED_VERIFY_MODES:
        return []
    model = role.inputs.model
    if _dspark(spec) and model is not None and model.is_deepseek_v41 and value.lower() != "static":
        return []
    return [
        _problem(
            env_field(role, RAGGED_VERIFY_ENV),
            f"{RAGGED_VERIFY_ENV}={value!r} is not one of {', '.join(RAGGED_VERIFY_MODES)} (compared exactly)",
            f"remove {RAGGED_VERIFY_ENV} (static is the default), or set it to static, cap-accept or compact",
            "speculative_ragged_verify_mode",
        )
    ]


def spec_prefill_coordination_algorithm(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION on needs single-layer EAGLE (or NEXTN), EAGLE3 or DSPARK.

    Source: speculative_hook.handle_speculative_decoding (run with or without speculative
    decoding) raises "DP spec/prefill coordination requires single-layer EAGLE, EAGLE3 or
    DSPARK" when the variable is true (EnvBool: true / 1 / yes / y) and the algorithm is
    another one, none, or --enable-multi-layer-eagle is set.
    """
    if not env_true(role, COORDINATION_ENV):
        return []
    algorithm = _algorithm(spec)
    multi_layer = _on(_extra_flags(role), "enable_multi_layer_eagle")
    if algorithm in COORDINATED_ALGORITHMS and not multi_layer:
        return []
    what = "multi-layer EAGLE (--enable-multi-layer-eagle)" if multi_layer else (
        f"{spec.speculative.algorithm} speculative decoding" if spec.speculative else "no speculative decoding")
    return [
        _problem(
            env_field(role, COORDINATION_ENV),
            f"{COORDINATION_ENV} coordinates single-layer EAGLE, EAGLE3 or DSPARK only, and this role runs {what}",
            f"remove {COORDINATION_ENV}" + (" or --enable-multi-layer-eagle" if multi_layer else ""),
            "spec_prefill_coordination_algorithm",
        )
    ]


def speculative_decode_radix_cache(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A decode radix cache runs with DSPARK, EAGLE (NEXTN) or EAGLE3 speculative decoding only.

    Source: speculative_hook.handle_speculative_decoding raises
    "--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding
    (--speculative-algorithm ...)" on a decode server with another algorithm.
    """
    algorithm = _algorithm(spec)
    if role.role != "decode" or algorithm is None or algorithm in DECODE_RADIX_CACHE_ALGORITHMS:
        return []
    if not _on(_extra_flags(role), "disaggregation_decode_enable_radix_cache"):
        return []
    return [
        _problem(
            flag_field(role, "disaggregation_decode_enable_radix_cache"),
            f"--disaggregation-decode-enable-radix-cache with {spec.speculative.algorithm} speculative decoding "
            "(a decode radix cache runs with DSPARK, EAGLE, NEXTN or EAGLE3 only)",
            "remove --disaggregation-decode-enable-radix-cache from the decode role",
            "speculative_decode_radix_cache",
        )
    ]


def speculative_block_verification(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """--speculative-use-block-verification supports EAGLE (NEXTN), EAGLE3, DFLASH and DSPARK only.

    Source: speculative_hook.handle_speculative_decoding raises "--speculative-use-block-
    verification only supports EAGLE / EAGLE3 / NEXTN / DFLASH / DSPARK." (also without
    speculative decoding).
    """
    if not _on(_extra_flags(role), "speculative_use_block_verification"):
        return []
    algorithm = _algorithm(spec)
    if algorithm in BLOCK_VERIFICATION_ALGORITHMS:
        return []
    what = f"{spec.speculative.algorithm} speculative decoding" if spec.speculative else "no speculative decoding"
    return [
        _problem(
            flag_field(role, "speculative_use_block_verification"),
            f"--speculative-use-block-verification with {what} (it supports EAGLE, NEXTN, EAGLE3, DFLASH and DSPARK)",
            "remove --speculative-use-block-verification",
            "speculative_block_verification",
        )
    ]


def speculative_draft_window(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """--speculative-draft-window-size must be positive, --speculative-draft-sink-size non-negative
    and given only with a window.

    Source: speculative_hook.handle_speculative_decoding (with any algorithm): "--speculative-
    draft-window-size must be positive", "--speculative-draft-sink-size must be non-negative",
    "--speculative-draft-sink-size requires --speculative-draft-window-size.".
    """
    flags = _extra_flags(role)
    window, sink = _int(flags, "speculative_draft_window_size"), _int(flags, "speculative_draft_sink_size")
    problems = []
    if window is not None and window <= 0:
        problems.append(_problem(
            flag_field(role, "speculative_draft_window_size"),
            f"--speculative-draft-window-size {window} is not positive",
            "use a positive --speculative-draft-window-size, or remove it", "speculative_draft_window"))
    if sink is not None and sink < 0:
        problems.append(_problem(
            flag_field(role, "speculative_draft_sink_size"), f"--speculative-draft-sink-size {sink} is negative",
            "use --speculative-draft-sink-size 0 or more, or remove it", "speculative_draft_window"))
    elif sink is not None and flags.get("speculative_draft_window_size") is None:
        problems.append(_problem(
            flag_field(role, "speculative_draft_sink_size"),
            "--speculative-draft-sink-size without --speculative-draft-window-size",
            "add --speculative-draft-window-size, or remove --speculative-draft-sink-size", "speculative_draft_window"))
    return problems


# --------------------------------------------------------------------------- EAGLE, NEXTN, EAGLE3, STANDALONE


def _eagle_num_steps_problems(spec: PDDeploymentSpec, role: RolePlan) -> list[Problem]:
    sp = spec.speculative
    if _algorithm(spec) not in EAGLE_FAMILY or sp.numSteps is not None or _adaptive(role) or _owned_by_dsv4(spec, role):
        return []
    rule = "eagle_num_steps_required"
    problems = []
    if sp.numDraftTokens is not None:
        problems.append(_problem(
            "spec.speculative.numDraftTokens",
            f"{sp.algorithm} with numDraftTokens {sp.numDraftTokens} but no numSteps (SGLang chooses the draft "
            "parameters itself only when none is given, and asserts that)",
            "set numSteps too (numDraftTokens is numSteps + 1 with top-k 1), or remove numDraftTokens", rule))
    dsv4_eagle = sp.algorithm == "EAGLE" and role.inputs.is_deepseek_v4
    if _on(_extra_flags(role), "speculative_eagle_topk"):
        problems.append(_problem(
            flag_field(role, "speculative_eagle_topk"),
            f"--speculative-eagle-topk with {sp.algorithm} but no numSteps (SGLang chooses the draft parameters "
            "itself only when none is given, and asserts that)",
            "set speculative.numSteps (DeepSeek-V4 EAGLE runs with top-k 1 either way)" if dsv4_eagle
            else "set speculative.numSteps, or remove --speculative-eagle-topk", rule))
    elif dsv4_eagle:
        problems.append(_problem(
            "spec.speculative.numSteps",
            "EAGLE on a DeepSeek-V4 model without numSteps: the operator renders --speculative-eagle-topk 1 (the "
            "only top-k SGLang serves it with), and SGLang chooses the draft parameters itself only when none is "
            "given (it asserts that)",
            "set speculative.numSteps (e.g. 3) and numDraftTokens = numSteps + 1", rule))
    return problems


def eagle_num_steps_required(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """EAGLE / NEXTN / EAGLE3 / STANDALONE without numSteps takes no numDraftTokens and no top-k.

    Source: speculative_hook._handle_eagle_family: without --speculative-num-steps (and
    without --speculative-adaptive) it asserts ``speculative_eagle_topk is None and
    speculative_num_draft_tokens is None`` before _auto_choose_speculative_params picks all
    three. The operator renders --speculative-eagle-topk 1 for DeepSeek-V4 EAGLE
    (planning/engine_args.py), so there numSteps is needed. A problem both roles share is
    reported once.
    """
    return list(dict.fromkeys(_eagle_num_steps_problems(spec, prefill) + _eagle_num_steps_problems(spec, decode)))


def _lacks_topk(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    sp = spec.speculative
    if _algorithm(spec) not in EAGLE_FAMILY or sp.numSteps is None or _adaptive(role) or _owned_by_dsv4(spec, role):
        return False
    return _rendered_flags(role).get("speculative_eagle_topk") is None


def eagle_topk_required(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """EAGLE / NEXTN / EAGLE3 / STANDALONE with numSteps needs --speculative-eagle-topk.

    Source: speculative_hook._handle_eagle_family: with --speculative-num-steps SGLang
    leaves speculative_eagle_topk unset (None) and then compares it,
    ``cfg.speculative_eagle_topk > 1`` (the page-tree backend check), which raises
    TypeError "'>' not supported between instances of 'NoneType' and 'int'" at startup.
    The operator renders the top-k only for DeepSeek-V4 EAGLE (1). Reported once, on
    numSteps, when both roles lack it.
    """
    lacking = [role for role in (prefill, decode) if _lacks_topk(spec, role)]
    if not lacking:
        return []
    sp = spec.speculative
    message = (f"{sp.algorithm} with numSteps {sp.numSteps} and no --speculative-eagle-topk: SGLang leaves the "
               "top-k unset when numSteps is given and fails comparing it (TypeError)")
    if len(lacking) == 2:
        return [_problem(
            "spec.speculative.numSteps", message,
            "add --speculative-eagle-topk 1 (a chain; numDraftTokens becomes numSteps + 1) or a larger top-k to "
            "both roles' extraArgs, or remove numSteps and numDraftTokens so SGLang chooses them",
            "eagle_topk_required")]
    role = lacking[0]
    return [_problem(
        f"spec.{role.role}.extraArgs", f"the {role.role} role: {message}",
        f"add --speculative-eagle-topk to spec.{role.role}.extraArgs (as on the other role)", "eagle_topk_required")]


def eagle_topk_attention_backend(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """An EAGLE top-k > 1 tree: not on trtllm_mha, and over pages > 1 only on flashinfer, fa3 or triton.

    Source: speculative_hook._handle_eagle_family raises "trtllm_mha backend only supports
    topk = 1 for speculative decoding." and "speculative_eagle_topk > 1 with page_size > 1
    is only supported on ('flashinfer', 'fa3', 'triton'); got attention_backend=...". The
    backend is the one given in extraArgs, else SGLang's choice for an MHA model
    (_attention_backend: aiter on ROCm); unknown for other models, where the rule stands
    aside. DeepSeek-V4 refuses top-k > 1 itself (deepseek_v4.dsv4_speculative_algorithm).
    """
    if _algorithm(spec) not in EAGLE_FAMILY or role.inputs.is_deepseek_v4:
        return []
    topk = _eagle_topk(spec, role)
    if topk is None or topk <= 1:
        return []
    flags = _rendered_flags(role)
    given = _int(flags, "speculative_eagle_topk")
    field = flag_field(role, "speculative_eagle_topk")
    fix = "use --speculative-eagle-topk 1"
    named = [b for b in (flags.get("prefill_attention_backend") or flags.get("attention_backend"),
                         flags.get("decode_attention_backend") or flags.get("attention_backend")) if b is not None]
    if "trtllm_mha" in named:
        return [_problem(
            field, f"--speculative-eagle-topk {topk} with the trtllm_mha attention backend (it serves top-k 1 only)",
            f"{fix}, or another attention backend", "eagle_topk_attention_backend")]
    backend, chosen = _attention_backend(role, topk=given)
    page = role.inputs.page_size
    if backend is None or page <= 1 or backend in PAGE_TREE_BACKENDS:
        return []
    how = " (SGLang's choice here)" if chosen else ""
    return [_problem(
        field, f"--speculative-eagle-topk {topk} with page size {page} on the {backend} attention backend{how}: a "
        "top-k tree over pages runs on flashinfer, fa3 or triton only",
        f"{fix}, pageSize 1, or --attention-backend flashinfer / fa3 / triton", "eagle_topk_attention_backend")]


def eagle_rejection_sampling(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Rejection sampling (--speculative-use-rejection-sampling, or block verification with EAGLE /
    EAGLE3) needs EAGLE, NEXTN or EAGLE3, top-k 1 and the default accept thresholds.

    Source: speculative_hook._handle_eagle_family raises "--speculative-use-rejection-sampling
    is only supported for EAGLE / EAGLE3 / NEXTN", "... requires --speculative-eagle-topk=1.",
    "... is incompatible with --speculative-accept-threshold-single / --speculative-accept-
    threshold-acc"; handle_speculative_decoding turns rejection sampling on for block
    verification with EAGLE / EAGLE3. (Its ROCm default applies only where these hold.)
    """
    algorithm = _algorithm(spec)
    if algorithm not in EAGLE_FAMILY:
        return []
    flags = _extra_flags(role)
    explicit = _on(flags, "speculative_use_rejection_sampling")
    block = _on(flags, "speculative_use_block_verification") and algorithm in ("EAGLE", "EAGLE3")
    if not (explicit or block):
        return []
    dest = "speculative_use_rejection_sampling" if explicit else "speculative_use_block_verification"
    field = flag_field(role, dest)
    what = "--speculative-use-rejection-sampling" if explicit else "--speculative-use-block-verification (it turns " \
        "rejection sampling on)"
    rule = "eagle_rejection_sampling"
    if algorithm == "STANDALONE":
        return [_problem(field, f"{what} with STANDALONE speculative decoding (EAGLE, NEXTN and EAGLE3 only)",
                         f"remove {what.split()[0]}", rule)]
    problems = []
    topk = _eagle_topk(spec, role)
    if topk is not None and topk != 1:
        problems.append(_problem(field, f"{what} with --speculative-eagle-topk {topk} (it needs top-k 1)",
                                 "use --speculative-eagle-topk 1", rule))
    if (_float(flags, "speculative_accept_threshold_single", 1.0) != 1.0
            or _float(flags, "speculative_accept_threshold_acc", 1.0) != 1.0):
        problems.append(_problem(field, f"{what} with --speculative-accept-threshold-single / -acc (rejection "
                                 "sampling ignores the thresholds)", "remove the accept thresholds", rule))
    return problems


def speculative_dp_attention(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """STANDALONE and NGRAM speculative decoding run without attention DP.

    Source: speculative_hook._handle_eagle_family ("Currently standalone speculative decoding
    does not support dp attention.") and _handle_ngram ("Currently ngram speculative decoding
    does not support dp attention.").
    """
    algorithm = _algorithm(spec)
    if algorithm not in ("STANDALONE", "NGRAM") or role.inputs.attention_dp <= 1 or _owned_by_dsv4(spec, role):
        return []
    return [_problem(
        f"spec.{role.role}.parallelism.dpAttention",
        f"{algorithm} speculative decoding with DP attention (attention DP {role.inputs.attention_dp}) on the "
        f"{role.role} role", "turn dpAttention off, or use another speculative algorithm", "speculative_dp_attention")]


# --------------------------------------------------------------------------- NGRAM


def ngram_paged_backend(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """NGRAM's tree (top-k = --speculative-ngram-max-bfs-breadth, 10 by default) over pages > 1 runs on
    the flashinfer attention backend only.

    Source: speculative_hook._handle_ngram sets speculative_eagle_topk to the BFS breadth and
    raises "speculative_eagle_topk(N) > 1 with page_size(P) > 1 is unstable and produces
    incorrect results for paged attention backends. This combination is only supported for
    the 'flashinfer' backend." The backend is the one given in extraArgs, else SGLang's
    choice for an MHA model (_attention_backend: fa3 on Hopper unless a top-k is given,
    aiter on ROCm), chosen before the hook sets the top-k; other models: not restated.
    """
    if _algorithm(spec) != "NGRAM" or _owned_by_dsv4(spec, role):
        return []
    flags = _rendered_flags(role)
    breadth = _int(flags, "speculative_ngram_max_bfs_breadth")
    topk = NGRAM_DEFAULT_BFS_BREADTH if breadth is None else breadth
    page = role.inputs.page_size
    if topk <= 1 or page <= 1:
        return []
    backend, chosen = _attention_backend(role, topk=_int(flags, "speculative_eagle_topk"))
    if backend is None or backend == "flashinfer":
        return []
    how = " (SGLang's choice here)" if chosen else ""
    return [_problem(
        role.inputs.kv_layout_field + ".pageSize",
        f"NGRAM's draft tree (top-k {topk}) with page size {page} on the {backend} attention backend{how}: it runs "
        "over pages on flashinfer only",
        "use pageSize 1, or add --attention-backend flashinfer to both roles' extraArgs", "ngram_paged_backend")]


# --------------------------------------------------------------------------- DFLASH and DSpark


def dflash_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DFLASH needs a draft model path; with attention DP --enable-dp-lm-head and no attention CP;
    a --speculative-dflash-block-size equal to numDraftTokens and positive.

    Source: speculative_hook._handle_dflash: "DFLASH speculative decoding requires setting
    --speculative-draft-model-path.", "DFLASH with dp attention requires --enable-dp-lm-head.",
    "DFLASH with dp attention does not support context parallel.", "DFLASH requires
    --speculative-dflash-block-size to be positive", "Both --speculative-num-draft-tokens and
    --speculative-dflash-block-size are set but they differ.". Its pp_size and DP
    coordination refusals are parallel.pipeline_parallel_speculative's and
    spec_prefill_coordination_algorithm's. DeepSeek-V4 refuses DFLASH itself.
    """
    sp = spec.speculative
    if _algorithm(spec) != "DFLASH" or _owned_by_dsv4(spec, role):
        return []
    rule = "dflash_requirements"
    problems = []
    if role.role == "prefill" and not sp.draftModelPath:
        problems.append(_problem("spec.speculative.draftModelPath", "DFLASH without a draft model path",
                                 "set speculative.draftModelPath to the DFLASH draft", rule))
    flags = _extra_flags(role)
    if role.inputs.attention_dp > 1:
        if not _on(flags, "enable_dp_lm_head"):
            problems.append(_problem(
                f"spec.{role.role}.extraArgs", "DFLASH with DP attention without --enable-dp-lm-head",
                f"add --enable-dp-lm-head to spec.{role.role}.extraArgs, or turn dpAttention off", rule))
        if role.inputs.attention_cp != 1:
            problems.append(_problem(
                flag_field(role, "attn_cp_size"),
                f"DFLASH with DP attention and attention CP {role.inputs.attention_cp}",
                "remove --attn-cp-size, or turn dpAttention off", rule))
    block = _int(flags, "speculative_dflash_block_size")
    if block is not None and block <= 0:
        problems.append(_problem(flag_field(role, "speculative_dflash_block_size"),
                                 f"--speculative-dflash-block-size {block} is not positive",
                                 "use a positive --speculative-dflash-block-size, or remove it", rule))
    elif block is not None and sp.numDraftTokens is not None and block != sp.numDraftTokens:
        problems.append(_problem(flag_field(role, "speculative_dflash_block_size"),
                                 f"--speculative-dflash-block-size {block} differs from numDraftTokens "
                                 f"{sp.numDraftTokens} (for DFLASH they must match)",
                                 "remove --speculative-dflash-block-size, or make it equal numDraftTokens", rule))
    return problems


def dspark_checkpoint_gamma(spec: PDDeploymentSpec, catalog: Catalog) -> int | None:
    """The DSpark gamma the checkpoint's own draft config gives (``dspark_block_size``), or None.

    Source: speculative_hook._handle_dspark reads it through dspark_config.read_draft_checkpoint_config
    when --speculative-dspark-block-size is unset; for a bundled draft that is the target's config
    (kernels/hf-configs/, ``text_config`` hoisted by SGLang's config normalizers). None with a
    separate ``draftModelPath`` (its config is not in the catalog) or without the key.
    """
    sp = spec.speculative
    if sp is None or sp.draftModelPath:
        return None
    config = catalog.hf_config(spec.model.name) or {}
    text = config.get("text_config")
    value = config.get("dspark_block_size", text.get("dspark_block_size") if isinstance(text, Mapping) else None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def dspark_verify_window(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DSpark without blockSize: numDraftTokens must be the checkpoint's gamma + 1, and at least 2.

    Source: speculative_hook._handle_dspark: without --speculative-dspark-block-size gamma
    comes from the draft's config (dspark_block_size; for a bundled draft the target's
    config, kernels/hf-configs/), and "DSpark speculative_num_draft_tokens must equal gamma +
    1" / "DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1)". A separate draft
    model's config is not in the catalog: then only the >= 2 check is restated. With
    blockSize the CRD's CEL rule holds numDraftTokens to blockSize + 1.
    """
    sp = spec.speculative
    if not _dspark(spec) or role.role != "prefill" or sp.blockSize is not None or sp.numDraftTokens is None:
        return []
    gamma = dspark_checkpoint_gamma(spec, catalog)
    if gamma is not None and sp.numDraftTokens != gamma + 1:
        message = (f"numDraftTokens {sp.numDraftTokens} with DSpark, but the checkpoint's draft has gamma "
                   f"(dspark_block_size) {gamma}: the verify window is gamma + 1 = {gamma + 1}")
        fix = f"remove numDraftTokens (SGLang uses {gamma + 1}), or set blockSize to numDraftTokens - 1"
    elif gamma is None and sp.numDraftTokens < 2:
        message = f"numDraftTokens {sp.numDraftTokens} with DSpark (the verify window gamma + 1 is at least 2)"
        fix = "remove numDraftTokens, or set blockSize (gamma)"
    else:
        return []
    return [_problem("spec.speculative.numDraftTokens", message, fix, "dspark_verify_window")]


ROLE_RULES = (
    dspark_dp_attention,
    dspark_moe_draft_attention_tp,
    dspark_pipeline_parallel,
    dspark_draft_model,
    dspark_verify_window,
    speculative_ragged_verify_mode,
    spec_prefill_coordination_algorithm,
    speculative_decode_radix_cache,
    speculative_block_verification,
    speculative_draft_window,
    eagle_topk_attention_backend,
    eagle_rejection_sampling,
    speculative_dp_attention,
    ngram_paged_backend,
    dflash_requirements,
)
PAIR_RULES = (eagle_num_steps_required, eagle_topk_required)
