"""Rules SGLang 0.5.23 applies to DeepSeek-V4 / V4.1 at startup, checked before any pod exists.

Sources: arg_groups/model_overrides/deepseek_v4.py (page size 256),
arg_groups/deepseek_v4_hook.py (speculative algorithms; DSpark PD requirements),
disaggregation/common/conn.py (prefill_complete refuses pools with SWA state);
docs/sglang-0.5.23-facts.md sections d and j.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..plan import RolePlan
from ..problems import Problem
from ..roles import DSV4_PAGE_SIZE

DSPARK_PD_TRANSFER = ("mooncake", "nixl")
DSV4_SPECULATIVE = ("EAGLE", "DSPARK")


def dsv4_page_size(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLang forces page size 256 for DeepSeek-V4 models; a different pageSize is overridden (warning)."""
    if role.role != "prefill" or not role.inputs.is_deepseek_v4 or role.inputs.kv_layout.pageSize == DSV4_PAGE_SIZE:
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
    """DeepSeek-V4 serves only EAGLE and DSPARK speculative decoding (deepseek_v4_hook.py assertion)."""
    sp = spec.speculative
    if role.role != "prefill" or sp is None or not role.inputs.is_deepseek_v4 or sp.algorithm in DSV4_SPECULATIVE:
        return []
    return [
        Problem(
            field="spec.speculative.algorithm",
            message=f"SGLang supports only EAGLE and DSPARK speculative decoding for DeepSeek-V4 models, not {sp.algorithm}",
            fix="use algorithm: DSPARK",
            rule="dsv4_speculative_algorithm",
        )
    ]


def dspark_pd_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """DeepSeek-V4.1 DSpark under PD: static verify, Mooncake or NIXL, DCP=1 and CP=1 on decode.

    Source: deepseek_v4_hook.py raises "DeepSeek-V4.1 DSpark PD requires static verify,
    Mooncake or NIXL, DCP=1, and CP=1 on decode" at startup.
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
    if role.role == "decode" and (role.inputs.decode_cp > 1 or role.inputs.attention_cp > 1):
        problems.append(
            Problem(
                field="spec.decode.extraArgs",
                message="DeepSeek-V4.1 DSpark under PD needs DCP=1 and CP=1 on decode",
                fix="remove --dcp-size / --attn-cp-size from the decode role",
                rule="dspark_pd_requirements",
            )
        )
    return problems
