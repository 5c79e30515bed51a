"""What SGLang 0.5.23 refuses about a role's parallel layout, checked before any pod exists.

Context parallelism (``--attn-cp-size``, ``--enable-prefill-cp`` / ``--cp-strategy``,
``--dcp-size``), the MoE data-parallel width, pipeline parallelism with speculative
decoding, the LM head under data parallelism, the context length against the model's
config, ``SGLANG_RUST_SERVER`` on prefill, and the shape the PD handshake maps rank to
rank (decode CP and PP, decode DCP, prefill KV-cache sharding).

Sources (sglang 0.5.23): arg_groups/parallel_hook.py (handle_context_parallelism,
handle_decode_context_parallelism, handle_data_parallelism), arg_groups/deepseek_v4_hook.py
(validate_deepseek_v4_cp), arg_groups/validation_hook.py (check_pipeline_parallel_compat),
arg_groups/overrides.py (_data_parallelism_defaults, _dp_lm_head_validation),
configs/model_config.py (_derive_context_length), arg_groups/pd_disaggregation_hook.py
(_alias_bootstrap_port_to_api_port), disaggregation/common/conn.py
(try_ensure_parallel_info, _resolve_rank_mapping).

What DeepSeek-V4.1 DSpark refuses outright (CP / DCP / PP) is rules/deepseek_v4.py and
rules/speculative.py: the rules here stand aside there, one root cause, one problem.
Values SGLang derives at startup (the attention backend, a resolved MoE all-to-all
backend) are not restated: only flags in extraArgs, the typed parallelism and the role's
environment are read.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..engine_args import ENGINE_PORT
from ..features import flag_int, parse_flags
from ..problems import Problem
from ..structs import RolePlan
from .fields import env_field, env_true, flag_field

#: --disaggregation-bootstrap-port's default in SGLang 0.5.23 (arg_groups/fields/disagg.py).
SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998
#: Transfer backends whose bootstrap server is a CommonKVBootstrapServer, the registry the
#: embedded Rust server stands in for (managers/disagg_service.rust_server_serves_kv_bootstrap).
RUST_SERVED_BOOTSTRAP = ("mooncake", "nixl", "mori")
#: validate_deepseek_v4_cp: the MoE all-to-all backends DeepSeek-V4 context parallelism runs.
DSV4_CP_A2A = ("none", "deepep", "megamoe", "mori")
#: validate_deepseek_v4_cp: "Context parallel only supports single machine (tp_size <= 8)".
DSV4_CP_MAX_TP = 8
#: utils/hf_transformers/common.py CONTEXT_LENGTH_KEYS, in SGLang's order of preference.
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings",
)  # fmt: skip
CONTEXT_LENGTH_ESCAPES = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI")
DSV4_ARCHITECTURE = "DeepseekV4ForCausalLM"


# --------------------------------------------------------------------------- helpers


def _flags(role: RolePlan) -> dict[str, Any]:
    return parse_flags(role.inputs.spec.extraArgs)


def _int(flags: Mapping[str, Any], dest: str, default: int = 1) -> int:
    """``flags[dest]`` as an int; ``default`` when absent or not a number (args.extra_args_parse refuses those)."""
    return flag_int(flags, dest, default)


def _on(flags: Mapping[str, Any], dest: str) -> bool:
    return flags.get(dest) not in (None, False)








def _is_hip(role: RolePlan) -> bool:
    acc = role.inputs.accelerator
    return acc is not None and acc.vendor == "amd"


def _dsv41_dspark(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    """DeepSeek-V4.1 with DSpark: deepseek_v4.dspark_pd_requirements owns its CP / DCP refusals."""
    model = role.inputs.model
    sp = spec.speculative
    return model is not None and model.is_deepseek_v41 and sp is not None and sp.algorithm == "DSPARK"


def _cp_refused_by_dspark(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    """DSpark refuses this role's attention CP outright: DeepSeek-V4.1 (deepseek_v4.dspark_pd_requirements),
    or attention DP with attention CP (speculative.dspark_dp_attention)."""
    sp = spec.speculative
    if sp is None or sp.algorithm != "DSPARK":
        return False
    return _dsv41_dspark(spec, role) or (role.inputs.attention_dp > 1 and role.inputs.attention_cp > 1)


def _problem(field: str, message: str, fix: str, rule: str) -> Problem:
    return Problem(field=field, message=f"{message}; SGLang 0.5.23 refuses it", fix=fix, rule=rule)


# --------------------------------------------------------------------------- context parallelism


def attention_cp_divides_tp(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--attn-cp-size`` must divide tp, and attention DP x attention CP must divide tp.

    Source: arg_groups/parallel_hook.py handle_context_parallelism asserts "tp_size must be
    divisible by attn_cp_size" and "tp_size must be divisible by attn_dp_size *
    attn_cp_size" on the resolved CP size. With ``--enable-prefill-cp`` on a DeepSeek-V4
    model SGLang sets the CP size to tp / attention DP itself (validate_deepseek_v4_cp,
    :func:`dsv4_prefill_cp`), so only an explicit ``--attn-cp-size`` is checked here; where
    DSpark refuses the CP itself (DeepSeek-V4.1, or attention DP) its rules report it.
    """
    if (role.inputs.prefill_cp and role.inputs.is_deepseek_v4) or _cp_refused_by_dspark(spec, role):
        return []
    cp = _int(_flags(role), "attn_cp_size")
    if cp <= 1:
        return []
    tp, attn_dp = role.inputs.parallelism.tp, role.inputs.attention_dp
    if tp % cp == 0 and tp % (attn_dp * cp) == 0:
        return []
    if tp % cp:
        what = f"--attn-cp-size {cp} does not divide tp {tp}"
    else:
        what = f"attention DP {attn_dp} x --attn-cp-size {cp} does not divide tp {tp}"
    fix = (
        "remove --attn-cp-size (a decode cannot use attention CP at the PD handshake either)"
        if role.role == "decode"
        else f"use an --attn-cp-size that divides tp / attention DP ({tp // attn_dp}), or remove it"
    )
    return [_problem(flag_field(role, "attn_cp_size"), what, fix, "attention_cp_divides_tp")]


def moe_dp_size_consistent(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--moe-dp-size`` > 1 must divide tp, fit ep x moe-dp in tp (equal with ep > 1), run
    without PP, and equal the attention CP size.

    Source: arg_groups/parallel_hook.py handle_context_parallelism: "tp_size must be divisible
    by moe_dp_size", "ep_size * moe_dp_size must be less than or equal to tp_size", "PP is not
    supported with context parallelism", "ep_size * moe_dp_size must be equal to tp_size",
    "attn_cp_size != moe_dp_size is only supported when moe_dp_size == 1".
    """
    flags = _flags(role)
    moe_dp = _int(flags, "moe_dp_size")
    if moe_dp == 1:
        return []
    p = role.inputs.parallelism
    tp, ep, cp, pp = p.tp, p.ep, role.inputs.attention_cp, _int(flags, "pp_size")
    bad = []
    if moe_dp > 1:
        if tp % moe_dp:
            bad.append(f"it does not divide tp {tp}")
        if ep * moe_dp > tp:
            bad.append(f"ep {ep} x moe-dp {moe_dp} exceeds tp {tp}")
        elif ep > 1 and ep * moe_dp != tp:
            bad.append(f"ep {ep} x moe-dp {moe_dp} is not tp {tp}")
        if pp != 1:
            bad.append(f"--pp-size {pp} (no PP with MoE DP)")
    if cp != moe_dp:
        bad.append(f"the attention CP size is {cp}, not {moe_dp}")
    if not bad:
        return []
    return [
        _problem(
            flag_field(role, "moe_dp_size"),
            f"--moe-dp-size {moe_dp} on the {role.role} role: {'; '.join(bad)}",
            "use --moe-dp-size equal to --attn-cp-size (dividing tp, with ep x moe-dp = tp when ep > 1), or remove it",
            "moe_dp_size_consistent",
        )
    ]


def prefill_cp_strategy(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--enable-prefill-cp`` needs ``--cp-strategy``, and on AMD runs for DeepSeek-V4 models only.

    Source: arg_groups/parallel_hook.py handle_context_parallelism raises "Prefill CP on HIP
    is only supported for DeepseekV4ForCausalLM, got ..." and "--cp-strategy must be set when
    --enable-prefill-cp is enabled.". DeepSeek-V4 models are refused earlier and more
    narrowly by validate_deepseek_v4_cp (:func:`dsv4_prefill_cp`).
    """
    model = role.inputs.model
    if not role.inputs.prefill_cp or model is None or role.inputs.is_deepseek_v4:
        return []
    field = flag_field(role, "enable_prefill_cp")
    if _is_hip(role):
        return [
            _problem(
                field,
                f"prefill CP on AMD GPUs runs for DeepseekV4ForCausalLM only, not {model.architecture}",
                f"remove --enable-prefill-cp from the {role.role} role",
                "prefill_cp_strategy",
            )
        ]
    if _flags(role).get("cp_strategy") is None:
        return [
            _problem(
                field,
                "--enable-prefill-cp without --cp-strategy",
                "add --cp-strategy interleave (or zigzag), or remove --enable-prefill-cp",
                "prefill_cp_strategy",
            )
        ]
    return []


def dsv4_prefill_cp(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4 prefill CP: the interleave strategy, one node of at most 8 GPUs, no data
    parallelism, a supported MoE all-to-all backend; on AMD not V4.1 and not two-batch overlap.

    Source: arg_groups/deepseek_v4_hook.py validate_deepseek_v4_cp: "DeepSeekV4 only supports
    interleave/zigzag CP strategy, got ...", "DeepSeekV4 zigzag CP requires the NPU backend",
    "DeepSeekV4 prefill CP on HIP does not support {multiple nodes, DeepSeek-V4.1,
    --enable-two-batch-overlap} yet", "For round-robin split mode, dp attention is not
    supported" (the attention-DP width there is attn-dp x dp, model_override_base.
    context_parallel_attn_dp_size), "Context parallel only supports single machine
    (tp_size <= 8)", "DeepSeekV4 CP supports moe_a2a_backend in ...". Its HIP check of the
    resolved attention backends is not restated (the model override sets dsv4). DeepSeek-V4.1
    with DSpark: the strategy and decode CP are deepseek_v4.dspark_pd_requirements'.
    """
    if not role.inputs.prefill_cp or not role.inputs.is_deepseek_v4:
        return []
    dspark = _dsv41_dspark(spec, role)
    if dspark and role.role == "decode":
        return []
    flags = _flags(role)
    model = role.inputs.model
    p = role.inputs.parallelism
    field = flag_field(role, "enable_prefill_cp")
    found: list[tuple[str, str]] = []
    strategy = flags.get("cp_strategy")
    if not dspark and strategy != "interleave":
        found.append(
            (
                "without a --cp-strategy" if strategy is None else "with --cp-strategy zigzag (NPU only)",
                "add --cp-strategy interleave",
            )
        )
    if _is_hip(role):
        if p.nodes > 1:
            found.append((f"on AMD GPUs across {p.nodes} nodes", "use one node (parallelism.nodes 1)"))
        if model is not None and model.is_deepseek_v41:
            found.append(("on AMD GPUs for DeepSeek-V4.1", "remove --enable-prefill-cp"))
        if _on(flags, "enable_two_batch_overlap"):
            found.append(("on AMD GPUs with --enable-two-batch-overlap", "remove --enable-two-batch-overlap"))
    if p.dp > 1:
        found.append(
            (
                f"with data parallelism (dp {p.dp}{', dpAttention' if p.dpAttention else ''})",
                "use dp 1 on this role",
            )
        )
    if p.tp > DSV4_CP_MAX_TP:
        found.append((f"with tp {p.tp} (single machine only, tp <= {DSV4_CP_MAX_TP})", f"use tp <= {DSV4_CP_MAX_TP}"))
    a2a = flags.get("moe_a2a_backend")
    if a2a is not None and a2a not in DSV4_CP_A2A:
        found.append((f"with --moe-a2a-backend {a2a}", f"use --moe-a2a-backend {' / '.join(DSV4_CP_A2A)}"))
    if not found:
        return []
    if role.role == "decode" and p.tp // max(1, p.dp) > 1:
        # SGLang sets attention CP to tp on this role, which the PD handshake refuses on decode.
        found = [(what, "remove --enable-prefill-cp from the decode role") for what, _ in found]
    return [
        _problem(field, f"DeepSeek-V4 prefill context parallelism {what}", fix, "dsv4_prefill_cp")
        for what, fix in found
    ]


def decode_cp_flags(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--dcp-size`` must be >= 1 and divide tp, and > 1 excludes ``--enable-prefill-cp``;
    ``--dcp-comm-backend`` a2a / fi_a2a and ``--dcp-replicate-q-proj`` need DCP > 1, fi_a2a a
    CUDA GPU, the replication an a2a backend.

    Source: arg_groups/parallel_hook.py handle_decode_context_parallelism ("Decode context
    parallel size ... must be >= 1", "--dcp-size > 1 does not support --enable-prefill-cp.",
    "--dcp-comm-backend ... requires --dcp-size ... > 1", "--dcp-comm-backend fi_a2a ...
    requires Blackwell", "--dcp-replicate-q-proj requires --dcp-size > 1", "... only applies
    to the a2a/fi_a2a DCP communication backend"), and distributed/parallel_state.py
    initialize_model_parallel (:2666, when each scheduler builds its groups):
    "tensor_model_parallel_size (T) must be divisible by decode_context_parallel_size (D)",
    with T the role's --tp-size (parallelism.tp) and D the --dcp-size when above 1
    (runtime_context.parallel_widths_of). DeepSeek-V4.1 with DSpark refuses any DCP
    (deepseek_v4.dspark_pd_requirements).
    """
    if _dsv41_dspark(spec, role):
        return []
    flags = _flags(role)
    dcp = _int(flags, "dcp_size")
    backend = flags.get("dcp_comm_backend")
    field = flag_field(role, "dcp_size")
    found: list[tuple[str, str, str]] = []
    if dcp < 1:
        found.append((field, f"--dcp-size {dcp} is below 1", "use --dcp-size 1 or more"))
    if dcp > 1 and role.inputs.prefill_cp:
        found.append((field, f"--dcp-size {dcp} with --enable-prefill-cp", "use one of the two"))
    tp = role.inputs.parallelism.tp
    if dcp > 1 and tp % dcp:
        sizes = ", ".join(str(d) for d in range(2, tp + 1) if tp % d == 0)
        use = f"use a --dcp-size that divides tp {tp} ({sizes})" if sizes else "remove --dcp-size"
        found.append(
            (field, f"--dcp-size {dcp} does not divide the role's tp {tp} (decode CP groups split the TP group)",
             f"{use}, or raise spec.{role.role}.parallelism.tp to a multiple of {dcp}")
        )  # fmt: skip
    if backend in ("a2a", "fi_a2a") and dcp <= 1:
        found.append(
            (flag_field(role, "dcp_comm_backend"), f"--dcp-comm-backend {backend} without --dcp-size > 1",
             "remove --dcp-comm-backend")
        )  # fmt: skip
    if backend == "fi_a2a" and _is_hip(role):
        found.append(
            (flag_field(role, "dcp_comm_backend"), "--dcp-comm-backend fi_a2a on an AMD GPU",
             "use --dcp-comm-backend a2a or leave it unset")
        )  # fmt: skip
    if _on(flags, "dcp_replicate_q_proj"):
        if dcp <= 1:
            found.append(
                (flag_field(role, "dcp_replicate_q_proj"), "--dcp-replicate-q-proj without --dcp-size > 1",
                 "remove --dcp-replicate-q-proj")
            )  # fmt: skip
        elif backend == "ag_rs":
            found.append(
                (flag_field(role, "dcp_replicate_q_proj"), "--dcp-replicate-q-proj with --dcp-comm-backend ag_rs",
                 "use --dcp-comm-backend a2a, or remove --dcp-replicate-q-proj")
            )  # fmt: skip
    return [_problem(where, what, fix, "decode_cp_flags") for where, what, fix in found]


# --------------------------------------------------------------------------- data / pipeline parallelism


def lm_head_parallelism(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--enable-dp-lm-head`` with dp > 1 needs dpAttention; ``--enable-tp-lm-head-all-to-all``
    needs full DP attention (dp = tp), no attention CP and no DP LM head.

    Source: arg_groups/overrides.py _data_parallelism_defaults turns --enable-dp-lm-head off
    when there is one DP rank, then _dp_lm_head_validation (run by parallel_hook.
    handle_data_parallelism) asserts "--enable-dp-lm-head requires attention DP
    (--attn-dp-size)." and, for an explicit --enable-tp-lm-head-all-to-all, "... requires
    attention DP", "... incompatible with --enable-dp-lm-head", "... requires tp_size ==
    attn_dp_size", "... requires attn_cp_size == 1". The operator renders --enable-dp-lm-head
    only with DSpark and DP attention.
    """
    flags = _flags(role)
    p = role.inputs.parallelism
    attn_dp = role.inputs.attention_dp
    dp_lm_head = _on(flags, "enable_dp_lm_head") and p.dp > 1  # one DP rank: SGLang turns it off
    problems = []
    if dp_lm_head and attn_dp == 1:
        problems.append(
            _problem(
                flag_field(role, "enable_dp_lm_head"),
                f"--enable-dp-lm-head with dp {p.dp} replicas but no DP attention",
                "remove --enable-dp-lm-head, or turn parallelism.dpAttention on",
                "lm_head_parallelism",
            )
        )
    if flags.get("enable_tp_lm_head_all_to_all") is True:
        bad = []
        if attn_dp == 1:
            bad.append("no DP attention")
        elif p.tp != attn_dp:
            bad.append(f"attention DP {attn_dp} is not tp {p.tp}")
        if dp_lm_head and attn_dp > 1:
            bad.append("--enable-dp-lm-head")
        if role.inputs.attention_cp != 1:
            bad.append(f"attention CP {role.inputs.attention_cp}")
        if bad:
            problems.append(
                _problem(
                    flag_field(role, "enable_tp_lm_head_all_to_all"),
                    f"--enable-tp-lm-head-all-to-all with {', '.join(bad)}",
                    "remove --enable-tp-lm-head-all-to-all (it needs dpAttention with dp = tp)",
                    "lm_head_parallelism",
                )
            )
    return problems


def pipeline_parallel_speculative(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--pp-size`` > 1: speculative decoding only EAGLE (single-layer) on the prefill role or
    DSpark on the prefill role, neither with SGLANG_ENABLE_PP_SPEC; no ``--min-free-slots-delay``.

    Source: arg_groups/validation_hook.py check_pipeline_parallel_compat: "SGLANG_ENABLE_PP_SPEC
    does not support DSPARK PD prefill", "Pipeline parallelism currently only supports EAGLE
    (non-multi-layer) speculative decoding", "SGLANG_ENABLE_PP_SPEC is not compatible with
    --disaggregation-mode", "PP + speculative decoding (MTP) is only supported on prefill
    nodes", "--min-free-slots-delay is not supported with pipeline parallelism". NEXTN is
    EAGLE by then (speculative_hook). Stands aside where another rule refuses the pipeline
    or the algorithm itself: DeepSeek-V4.1 (deepseek_v4.dsv41_unsupported_features), DSpark
    on decode (speculative.dspark_pipeline_parallel), other algorithms than EAGLE / DSpark
    on DeepSeek-V4 (deepseek_v4.dsv4_speculative_algorithm).
    """
    flags = _flags(role)
    pp = _int(flags, "pp_size")
    model = role.inputs.model
    if pp <= 1 or (model is not None and model.is_deepseek_v41):
        return []
    field = flag_field(role, "pp_size")
    problems = []
    if flags.get("min_free_slots_delay") is not None:
        problems.append(
            _problem(
                flag_field(role, "min_free_slots_delay"),
                f"--min-free-slots-delay with --pp-size {pp}",
                "remove --min-free-slots-delay",
                "pipeline_parallel_speculative",
            )
        )
    sp = spec.speculative
    if sp is None:
        return problems
    algorithm = "EAGLE" if sp.algorithm == "NEXTN" else sp.algorithm
    pp_spec = env_true(role, "SGLANG_ENABLE_PP_SPEC")
    if algorithm == "DSPARK":
        if role.role == "prefill" and pp_spec:
            problems.append(
                _problem(
                    env_field(role, "SGLANG_ENABLE_PP_SPEC"),
                    f"SGLANG_ENABLE_PP_SPEC on a DSpark prefill with --pp-size {pp}",
                    "remove SGLANG_ENABLE_PP_SPEC",
                    "pipeline_parallel_speculative",
                )
            )
        return problems
    if role.inputs.is_deepseek_v4 and sp.algorithm != "EAGLE":
        return problems  # deepseek_v4.dsv4_speculative_algorithm: DeepSeek-V4 runs EAGLE and DSpark only
    if algorithm != "EAGLE" or _on(flags, "enable_multi_layer_eagle"):
        what = "multi-layer EAGLE" if algorithm == "EAGLE" else f"{sp.algorithm} speculative decoding"
        problems.append(
            _problem(
                field,
                f"--pp-size {pp} with {what} (pipeline parallelism runs single-layer EAGLE only)",
                "remove --pp-size, or use speculative algorithm EAGLE",
                "pipeline_parallel_speculative",
            )
        )
    elif pp_spec:
        problems.append(
            _problem(
                env_field(role, "SGLANG_ENABLE_PP_SPEC"),
                f"SGLANG_ENABLE_PP_SPEC with --pp-size {pp} under PD disaggregation",
                "remove SGLANG_ENABLE_PP_SPEC",
                "pipeline_parallel_speculative",
            )
        )
    elif role.role == "decode":
        problems.append(
            _problem(
                field,
                f"--pp-size {pp} with speculative decoding on the decode role (PP with EAGLE runs on prefill only)",
                "remove --pp-size from the decode role",
                "pipeline_parallel_speculative",
            )
        )
    return problems


# --------------------------------------------------------------------------- model and environment


def _context_length_of(config: Mapping[str, Any]) -> int:
    """utils/hf_transformers/common.get_context_length on the text config (text_config lifted)."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = {**config, **text}
    factor: float = 1
    rope = config.get("rope_scaling")
    if isinstance(rope, Mapping) and rope:
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if value is not None:
            return int(factor * value)
    return 2048


def context_length_within_model(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--context-length`` must not exceed the context length the model's config gives,
    unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (or SGLANG_IS_IN_CI) is set true.

    Source: configs/model_config.py _derive_context_length raises "User-specified
    context_length (N) is greater than the derived context_length (M)" with the derived value
    from utils/hf_transformers/common.get_context_length (the first of max_sequence_length,
    seq_length, max_seq_len, model_max_length, max_position_embeddings, times the rope
    scaling factor unless the scaling names original_max_position_embeddings or is llama3).
    The config is the catalog's copy (kernels/hf-configs/).
    """
    wanted = _int(_flags(role), "context_length", 0)
    config = catalog.hf_config(spec.model.name)
    if wanted <= 0 or config is None:
        return []
    derived = _context_length_of(config)
    if wanted <= derived or any(env_true(role, name) for name in CONTEXT_LENGTH_ESCAPES):
        return []
    return [
        _problem(
            flag_field(role, "context_length"),
            f"--context-length {wanted} is longer than {spec.model.name}'s context length {derived} (from its config)",
            f"use --context-length {derived} or less, or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in "
            f"spec.{role.role}.env if the model really serves longer sequences",
            "context_length_within_model",
        )
    ]


def rust_server_bootstrap_port(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLANG_RUST_SERVER on prefill serves the bootstrap registry on the API port: bootstrapPort
    must then be SGLang's default (8998) or the API port.

    Source: arg_groups/pd_disaggregation_hook.py _alias_bootstrap_port_to_api_port (prefill,
    SGLANG_RUST_SERVER true, a transfer backend whose bootstrap server the Rust server ports:
    mooncake, nixl, mori) raises "SGLANG_RUST_SERVER serves the PD KV bootstrap registry on
    the api port itself; --disaggregation-bootstrap-port N conflicts with --port P" unless the
    port is the field's default or --port (the operator renders --port 30000 and
    --disaggregation-bootstrap-port from spec.disaggregation.bootstrapPort).
    """
    if role.role != "prefill" or spec.transfer.backend not in RUST_SERVED_BOOTSTRAP:
        return []
    port = spec.disaggregation.bootstrapPort
    if port in (SGLANG_DEFAULT_BOOTSTRAP_PORT, ENGINE_PORT) or not env_true(role, "SGLANG_RUST_SERVER"):
        return []
    return [
        _problem(
            env_field(role, "SGLANG_RUST_SERVER"),
            f"SGLANG_RUST_SERVER on the prefill role serves the KV bootstrap registry on the API port {ENGINE_PORT}, "
            f"which conflicts with disaggregation.bootstrapPort {port}",
            f"remove SGLANG_RUST_SERVER, or set disaggregation.bootstrapPort {SGLANG_DEFAULT_BOOTSTRAP_PORT}",
            "rust_server_bootstrap_port",
        )
    ]


# --------------------------------------------------------------------------- the PD handshake


def decode_attention_cp_one(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """The decode role must run without attention context parallelism.

    Source: disaggregation/common/conn.py _resolve_rank_mapping asserts "Decode cp size (N)
    should be equal to 1" at the PD handshake, on the resolved CP size (``--attn-cp-size``,
    or tp / attention DP for a DeepSeek-V4 model with ``--enable-prefill-cp``). Not repeated
    where a startup rule already refuses the decode's CP flags (:func:`attention_cp_divides_tp`,
    :func:`dsv4_prefill_cp`, deepseek_v4.dspark_pd_requirements, speculative.dspark_dp_attention).
    """
    cp = decode.inputs.attention_cp
    if cp == 1 or _cp_refused_by_dspark(spec, decode):
        return []
    if attention_cp_divides_tp(spec=spec, role=decode, catalog=None) or dsv4_prefill_cp(
        spec=spec, role=decode, catalog=None
    ):
        return []
    implicit = decode.inputs.prefill_cp and decode.inputs.is_deepseek_v4  # SGLang sets CP = tp / attention DP
    dest, flag = ("enable_prefill_cp", "--enable-prefill-cp") if implicit else ("attn_cp_size", "--attn-cp-size")
    return [
        _problem(
            flag_field(decode, dest),
            f"the decode role runs attention CP {cp} (from {flag}); the PD handshake maps decode ranks only "
            "without CP",
            "remove the CP flag from the decode role (prefill may keep it)",
            "decode_attention_cp_one",
        )
    ]


def decode_pp_matches_prefill(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Decode ``--pp-size`` must equal prefill's or be 1.

    Source: disaggregation/common/conn.py _resolve_rank_mapping asserts "Decode pp size (N)
    should be equal to prefill pp size (M) or 1". With speculative decoding (or on
    DeepSeek-V4.1) a decode PP is refused at startup already (:func:`pipeline_parallel_speculative`,
    speculative.dspark_pipeline_parallel, deepseek_v4.dsv41_unsupported_features).
    """
    d, p = _int(_flags(decode), "pp_size"), _int(_flags(prefill), "pp_size")
    if d in (1, p):
        return []
    model = decode.inputs.model
    if spec.speculative is not None or (model is not None and model.is_deepseek_v41):
        return []
    return [
        _problem(
            flag_field(decode, "pp_size"),
            f"decode --pp-size {d} differs from prefill's {p} and is not 1; the PD handshake maps decode PP ranks "
            "only onto an equal prefill PP",
            f"use --pp-size {p} or 1 on the decode role",
            "decode_pp_matches_prefill",
        )
    ]


def decode_dcp_handshake(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """A decode with ``--dcp-size`` > 1 needs an MLA model, a prefill without attention CP and
    without ``--enable-kv-cache-sharding``.

    Source: disaggregation/common/conn.py try_ensure_parallel_info raises "PD decode DCP
    requires an MLA or hybrid-MLA KV pool.", "PD decode DCP currently requires prefill
    attention CP=1, got N", "PD decode DCP does not support a prefill with
    --enable-kv-cache-sharding." at the PD handshake. MLA is the catalog's ModelFacts.mla.
    DeepSeek-V4.1 with DSpark refuses DCP at startup (deepseek_v4.dspark_pd_requirements).
    """
    dcp = decode.inputs.decode_cp
    model = decode.inputs.model
    if dcp <= 1 or model is None or _dsv41_dspark(spec, decode):
        return []
    field = flag_field(decode, "dcp_size")
    problems = []
    if not model.mla:
        problems.append(
            _problem(
                field,
                f"decode --dcp-size {dcp} on {spec.model.name}, which has no MLA KV pool; PD decode DCP needs one",
                "remove --dcp-size from the decode role",
                "decode_dcp_handshake",
            )
        )
        return problems
    if prefill.inputs.attention_cp != 1:
        problems.append(
            _problem(
                field,
                f"decode --dcp-size {dcp} with prefill attention CP {prefill.inputs.attention_cp}; PD decode DCP needs "
                "prefill attention CP 1",
                "remove the CP flags from the prefill role, or --dcp-size from the decode role",
                "decode_dcp_handshake",
            )
        )
    if _on(_flags(prefill), "enable_kv_cache_sharding"):
        problems.append(
            _problem(
                flag_field(prefill, "enable_kv_cache_sharding"),
                f"prefill --enable-kv-cache-sharding with decode --dcp-size {dcp}",
                "remove --enable-kv-cache-sharding from the prefill role, or --dcp-size from the decode role",
                "decode_dcp_handshake",
            )
        )
    return problems


def dcp_topology_supported(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Prefill and decode DCP sizes must be equal, or prefill DCP 1 with a larger decode DCP on an MLA model.

    Source: disaggregation/common/conn.py ``requires_dcp_relayout`` raises "Unsupported PD
    DCP topology: P -> D" for any other pair. It runs when a decode rank registers with a
    prefill rank, so SGLang starts both roles and fails the first transfer (the oracle
    stops at the registration message, which is why this rule is listed in
    tests/contract/stricter_by_design.yaml).
    """
    p_dcp, d_dcp = prefill.inputs.decode_cp, decode.inputs.decode_cp
    model = prefill.inputs.model
    if p_dcp == d_dcp or (p_dcp == 1 and d_dcp > 1 and (model is None or model.mla)):
        return []
    if _dsv41_dspark(spec, prefill) or prefill.inputs.prefill_cp:
        return []  # dspark_pd_requirements / decode_cp_flags refuse the prefill's DCP already
    if p_dcp == 1 and d_dcp > 1:
        return []  # decode_dcp_handshake refuses DCP on a model without an MLA pool
    return [
        _problem(
            flag_field(prefill, "dcp_size"),
            f"prefill --dcp-size {p_dcp} with decode DCP {d_dcp}: SGLang relays KV between DCP sizes only from "
            "prefill DCP 1 to a larger decode DCP, and fails every transfer with \"Unsupported PD DCP topology\"",
            "use the same --dcp-size on both roles, or remove it from the prefill role",
            "dcp_topology_supported",
        )
    ]


def kv_sharding_attention_tp_equal(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """A prefill with ``--enable-kv-cache-sharding`` and no attention CP, on an MLA model, needs
    the decode's attention TP size.

    Source: disaggregation/common/conn.py _resolve_rank_mapping asserts "MLA KV cache sharding
    requires equal prefill/decode attn TP sizes" (every decode rank pulls from every prefill
    TP rank). The other TP mappings there (equal, decode larger, prefill larger) assert
    nothing.
    """
    model = decode.inputs.model
    if model is None or not model.mla or not _on(_flags(prefill), "enable_kv_cache_sharding"):
        return []
    if prefill.inputs.attention_cp != 1 or prefill.inputs.attention_tp == decode.inputs.attention_tp:
        return []
    if decode.inputs.decode_cp > 1 and not _dsv41_dspark(spec, decode):
        return []  # decode_dcp_handshake refuses the sharding first
    return [
        _problem(
            flag_field(prefill, "enable_kv_cache_sharding"),
            f"prefill --enable-kv-cache-sharding on an MLA model with attention TP {prefill.inputs.attention_tp} on "
            f"prefill and {decode.inputs.attention_tp} on decode",
            "use the same attention TP on both roles, or remove --enable-kv-cache-sharding",
            "kv_sharding_attention_tp_equal",
        )
    ]


ROLE_RULES = (
    attention_cp_divides_tp,
    moe_dp_size_consistent,
    prefill_cp_strategy,
    dsv4_prefill_cp,
    decode_cp_flags,
    lm_head_parallelism,
    pipeline_parallel_speculative,
    context_length_within_model,
    rust_server_bootstrap_port,
)
PAIR_RULES = (
    decode_attention_cp_one,
    decode_pp_matches_prefill,
    decode_dcp_handshake,
    dcp_topology_supported,
    kv_sharding_attention_tp_equal,
)
