"""Rules SGLang 0.5.23 applies to DeepSeek-V4 / V4.1 at startup, checked before any pod exists.

Sources: arg_groups/model_overrides/deepseek_v4.py (page size 256),
arg_groups/deepseek_v4_hook.py (speculative algorithms; DSpark PD requirements; flags
validate_deepseek_v41_features refuses),
disaggregation/common/conn.py (prefill_complete refuses pools with SWA state);
docs/sglang-0.5.23-facts.md sections d and j.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..structs import RolePlan
from ..problems import Problem
from ..roles import DSV4_PAGE_SIZE
from .moe import a2a_backend

DSPARK_PD_TRANSFER = ("mooncake", "nixl")
DSV4_SPECULATIVE = ("EAGLE", "DSPARK")


def dsv4_page_size(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLang forces page size 256 for DeepSeek-V4 models; a different pageSize is overridden (warning).

    Once per field: the spec-wide ``spec.kvLayout`` is reported with the prefill role, a
    role's own ``kvLayout`` override with that role, and only when that override sets
    ``pageSize`` itself (an override without it carries the schema's default, which the
    user did not write: the operator renders 256 for it all the same).
    """
    shared = role.inputs.kv_layout_field == "spec.kvLayout"
    if (shared and role.role != "prefill") or not role.inputs.is_deepseek_v4:
        return []
    if not shared and "pageSize" not in role.inputs.kv_layout.model_fields_set:
        return []
    if role.inputs.kv_layout.pageSize == DSV4_PAGE_SIZE:
        return []
    return [
        Problem(
            field=f"{role.inputs.kv_layout_field}.pageSize",
            message=f"SGLang 0.5.23 serves DeepSeek-V4 models with page size {DSV4_PAGE_SIZE} (a model override "
            f"declares it and the KV pool asserts it); pageSize {role.inputs.kv_layout.pageSize} is replaced, and the "
            f"operator renders --page-size {DSV4_PAGE_SIZE} on both roles",
            fix=f"set pageSize: {DSV4_PAGE_SIZE}",
            rule="dsv4_page_size",
            severity="warning",
        )
    ]


def dsv4_allocation_policy(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """prefill_complete supports full-attention and DSA pools only; DeepSeek-V4 pools carry SWA state."""
    if role.role != "prefill" or not role.inputs.is_deepseek_v4:
        return []
    if spec.disaggregation.decodeAllocationPolicy != "prefill_complete":
        return []
    return [
        Problem(
            field="spec.disaggregation.decodeAllocationPolicy",
            message="prefill_complete currently supports full-attention and DSA KV pools only; SGLang refuses it for "
            "DeepSeek-V4 models at startup",
            fix="use decodeAllocationPolicy: early",
            rule="dsv4_allocation_policy",
        )
    ]


def dsv4_speculative_algorithm(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4 serves only EAGLE (with top-k 1) and DSPARK speculative decoding; V4.1 only DSPARK.

    Source: deepseek_v4_hook.py: apply_deepseek_v4_defaults asserts the algorithm is EAGLE
    or DSPARK and, for EAGLE, ``speculative_eagle_topk == 1`` (the operator renders
    --speculative-eagle-topk 1; a different value in extraArgs is refused here);
    validate_deepseek_v41_features raises "DeepSeek-V4.1 does not support speculative
    decoding other than DSpark yet".
    """
    sp = spec.speculative
    if sp is None or not role.inputs.is_deepseek_v4:
        return []
    v41 = role.inputs.model is not None and role.inputs.model.is_deepseek_v41
    allowed = ("DSPARK",) if v41 else DSV4_SPECULATIVE
    if sp.algorithm not in allowed:
        if role.role != "prefill":
            return []
        which = "DeepSeek-V4.1 supports only DSPARK" if v41 else "DeepSeek-V4 models support only EAGLE and DSPARK"
        return [
            Problem(
                field="spec.speculative.algorithm",
                message=f"in SGLang 0.5.23 {which} speculative decoding, not {sp.algorithm}",
                fix="use algorithm: DSPARK",
                rule="dsv4_speculative_algorithm",
            )
        ]
    topk = parse_flags(role.inputs.spec.extraArgs).get("speculative_eagle_topk")
    if sp.algorithm != "EAGLE" or topk is None or str(topk) == "1":
        return []
    index = next(i for i, tok in enumerate(role.inputs.spec.extraArgs) if tok.startswith("--speculative-eagle-topk"))
    return [
        Problem(
            field=f"spec.{role.role}.extraArgs[{index}]",
            message=f"SGLang supports EAGLE for DeepSeek-V4 models only with top-k 1, not "
            f"--speculative-eagle-topk {topk}",
            fix="remove --speculative-eagle-topk (the operator sets 1)",
            rule="dsv4_speculative_algorithm",
        )
    ]


def dspark_pd_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4.1 DSpark under PD: static verify, Mooncake or NIXL, DCP=1, CP=1 on decode,
    prefill CP only with --enable-prefill-cp and the interleave strategy.

    Source: deepseek_v4_hook.py validate_deepseek_v41_features raises "DeepSeek-V4.1 DSpark
    PD requires static verify, Mooncake or NIXL, DCP=1, and CP=1 on decode. Prefill CP
    requires --enable-prefill-cp with the interleave strategy." at startup.
    """
    model, sp = role.inputs.model, spec.speculative
    if model is None or not model.is_deepseek_v41 or sp is None or sp.algorithm != "DSPARK":
        return []
    problems = []
    if role.role == "prefill" and spec.transfer.backend not in DSPARK_PD_TRANSFER:
        problems.append(
            Problem(
                field="spec.transfer.backend",
                message=f"DeepSeek-V4.1 DSpark under PD needs the mooncake or nixl transfer backend, not "
                f"{spec.transfer.backend}",
                fix="use transfer.backend: mooncake (or nixl)",
                rule="dspark_pd_requirements",
            )
        )
    env = role.command.env_dict()
    if env.get("SGLANG_RAGGED_VERIFY_MODE", "static").lower() != "static":
        problems.append(
            Problem(
                field=f"spec.{role.role}.env",
                message="DeepSeek-V4.1 DSpark under PD needs static verify; SGLANG_RAGGED_VERIFY_MODE is "
                f"{env['SGLANG_RAGGED_VERIFY_MODE']}",
                fix="remove SGLANG_RAGGED_VERIFY_MODE",
                rule="dspark_pd_requirements",
            )
        )
    flags = parse_flags(role.inputs.spec.extraArgs)
    uses_cp = role.inputs.prefill_cp or str(flags.get("attn_cp_size", "1")) != "1"
    if role.role == "decode" and (role.inputs.decode_cp != 1 or uses_cp):
        problems.append(
            Problem(
                field="spec.decode.extraArgs",
                message="DeepSeek-V4.1 DSpark under PD needs DCP=1 and CP=1 on decode",
                fix="remove --dcp-size / --attn-cp-size / --enable-prefill-cp from the decode role",
                rule="dspark_pd_requirements",
            )
        )
    if role.role == "prefill" and role.inputs.decode_cp != 1:
        problems.append(
            Problem(
                field="spec.prefill.extraArgs",
                message="DeepSeek-V4.1 DSpark under PD needs DCP=1",
                fix="remove --dcp-size from the prefill role",
                rule="dspark_pd_requirements",
            )
        )
    if role.role == "prefill" and uses_cp and not (role.inputs.prefill_cp and flags.get("cp_strategy") == "interleave"):
        problems.append(
            Problem(
                field="spec.prefill.extraArgs",
                message="DeepSeek-V4.1 DSpark under PD runs prefill context parallelism only with --enable-prefill-cp "
                "and the interleave strategy",
                fix="use --enable-prefill-cp --cp-strategy interleave (instead of --attn-cp-size) on the prefill role",
                rule="dspark_pd_requirements",
            )
        )
    return problems


# (flag dest, what SGLang calls it): refused for DeepSeek-V4.1 by validate_deepseek_v41_features.
_DSV41_UNSUPPORTED = (
    ("enable_two_batch_overlap", "two-batch overlap"),
    ("enable_hisparse", "HiSparse"),
)


def _vision_layers(catalog: Catalog, model_name: str) -> int:
    """Vision layers of a DeepSeek-V4.1 checkpoint: its config's ``vision_config.num_hidden_layers``
    (configs/deepseek_v41.py normalize_deepseek_v41_config maps it to ``vision_n_layers``), else 0;
    0 for a checkpoint whose config says ``language_model_only``."""
    config = catalog.hf_config(model_name) or {}
    if config.get("language_model_only"):  # configs/model_config.py is_lm_only: text-only checkpoint
        return 0
    vision = config.get("vision_config") or {}
    return int(vision.get("num_hidden_layers") or config.get("vision_n_layers") or 0)


def dsv41_vision_parallelism(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4.1's vision tower runs only without attention CP and with no MoE all-to-all
    backend but MegaMoE on CUDA.

    Source: models/deepseek_v4.py ``DeepseekV4ForCausalLM.__init__`` (sglang 0.5.23, line
    4684): with ``vision_n_layers > 0`` and not ``--language-model-only`` it raises "V4.1
    vision supports TP/EP/DP without CP or PP; MoE A2A requires CUDA MegaMoE" when
    ``attn_cp_size != 1``, the PP group is wider than 1 (:func:`dsv41_unsupported_features`
    reports PP first), or the a2a backend is neither none nor (on CUDA) megamoe. Found by
    the oracle's model stage (issue 23).
    """
    model = role.inputs.model
    if model is None or not model.is_deepseek_v41 or _vision_layers(catalog, spec.model.name) <= 0:
        return []
    rendered = parse_flags(list(role.command.args))
    if rendered.get("language_model_only") not in (None, False):
        return []
    acc = role.inputs.accelerator
    cuda = acc is None or acc.vendor == "nvidia"
    problems = []
    cp = role.inputs.attention_cp
    if cp != 1:
        field = f"spec.{role.role}.extraArgs"
        problems.append(Problem(
            field=field,
            message=f"DeepSeek-V4.1's vision tower refuses attention context parallelism (attention CP {cp} on the "
            f"{role.role} role): SGLang 0.5.23 raises at model construction",
            fix=f"remove --enable-prefill-cp / --attn-cp-size from the {role.role} role, or add --language-model-only "
            "to serve the text model without vision",
            rule="dsv41_vision_parallelism",
        ))
    a2a = a2a_backend(rendered)
    if not (a2a == "none" or (cuda and a2a == "megamoe")):
        allowed = "none or megamoe" if cuda else "none (MegaMoE is CUDA only)"
        problems.append(Problem(
            field=f"spec.{role.role}.extraArgs",
            message=f"DeepSeek-V4.1's vision tower needs the MoE all-to-all backend {allowed}; the {role.role} role "
            f"resolves to {a2a}: SGLang 0.5.23 raises at model construction",
            fix=f"use --moe-a2a-backend {'megamoe' if cuda else 'none'} on the {role.role} role, or add "
            "--language-model-only to serve the text model without vision",
            rule="dsv41_vision_parallelism",
        ))
    return problems


def dsv41_unsupported_features(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Flags SGLang 0.5.23 refuses for DeepSeek-V4.1 at startup, and encoder replay off V4.1 or on decode.

    Source: deepseek_v4_hook.py validate_deepseek_v41_features: "DeepSeek-V4.1 does not
    support {two-batch overlap, HiSparse, pipeline parallelism} yet";
    --enable-encoder-swa-bounded-replay "requires DeepSeek-V4.1" and "does not support PD
    decode / PD prefill on ROCm yet".
    """
    model = role.inputs.model
    if model is None or not role.inputs.is_deepseek_v4:
        return []
    flags = parse_flags(role.inputs.spec.extraArgs)
    field = f"spec.{role.role}.extraArgs"
    found: list[str] = []
    if model.is_deepseek_v41:
        found += [what for dest, what in _DSV41_UNSUPPORTED if flags.get(dest) not in (None, False)]
        pp = flags.get("pp_size")
        if pp is not None and str(pp) != "1":
            found.append("pipeline parallelism")
    problems = [
        Problem(
            field=field,
            message=f"SGLang 0.5.23 does not support {what} for DeepSeek-V4.1 yet and refuses to start",
            fix=f"remove the {what} flag from the {role.role} role",
            rule="dsv41_unsupported_features",
        )
        for what in found
    ]
    if flags.get("enable_encoder_swa_bounded_replay") not in (None, False):
        acc = role.inputs.accelerator
        if not model.is_deepseek_v41:
            why = "requires DeepSeek-V4.1"
        elif role.role == "decode":
            why = "does not support PD decode (decode receives the SWA window from prefill)"
        elif acc is not None and acc.vendor == "amd":
            why = "does not support PD prefill on ROCm"
        else:
            why = None
        if why:
            problems.append(
                Problem(
                    field=field,
                    message=f"--enable-encoder-swa-bounded-replay {why} in SGLang 0.5.23",
                    fix=f"remove --enable-encoder-swa-bounded-replay from the {role.role} role",
                    rule="dsv41_unsupported_features",
                )
            )
    return problems
