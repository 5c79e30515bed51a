"""KV layout rules: each role's layout must be servable on its GPU, and both must agree.

Source: sglang 0.5.23 mem_cache/deepseek_v4_memory_pool.py (select_dsv4_kv_layout,
pd_kv_layout), arg_groups/deepseek_v4_hook.py (attention backend resolution and
assertions), arg_groups/overrides.py (_deepseek_v4_kv_cache_dtype), and
disaggregation/common/conn.py, which raises "KV layout mismatch" at the PD handshake.
"""

from __future__ import annotations

from ...catalog import Catalog
from ..plan import RolePlan
from ..problems import Problem
from ...api.v1alpha1 import PDDeploymentSpec


def kv_layout_servable(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLang must be able to build the role's KV pool with the requested backend and layout.

    Source: deepseek_v4_hook.py asserts (flashmla_mega needs DeepSeek-V4.1 on SM100/SM103;
    trtllm needs SM100/SM103, fp8_e4m3 and no PD) and select_dsv4_kv_layout raises (V4.1
    layouts need SM100/SM103 or gfx950 with aiter_sparse; v41_new not on HIP; V4 main cache
    with compressed fp4). One problem naming the field most likely to need a change.
    """
    if role.layout_refusal is None:
        return []
    reason = role.layout_refusal.rstrip(".")
    kv = role.inputs.kv_layout_field
    acc = role.inputs.accelerator
    where = f"{role.inputs.accelerator_name} ({acc.isa})" if acc else role.inputs.accelerator_name
    if "kv_cache_dtype" in reason or "is not supported for DeepseekV4ForCausalLM" in reason:
        return [
            Problem(
                field=f"{kv}.dtype",
                message=f"{role.role}: SGLang refuses KV cache dtype {role.inputs.kv_layout.dtype!r} ({reason})",
                fix="use fp8_e4m3, bfloat16 or auto for DeepSeek-V4 models",
                rule="kv_layout_servable",
            )
        ]
    if "trtllm does not support PD" in reason:
        field, fix = f"{kv}.attentionBackend", "use attentionBackend auto, flashmla or flashmla_mega (trtllm has no PD)"
    elif "attn-backend" in reason:
        field, fix = f"{kv}.attentionBackend", "use attentionBackend auto or flashmla, or an SM100/SM103 accelerator"
    elif "pairs with V4" in reason:
        field, fix = f"{kv}.compressed", "use compressed auto or fp8 with a v4 main layout, or layout v41"
    else:
        field, fix = f"{kv}.layout", "use layout auto (v41 where the GPU supports it, else v4) or v4"
    return [
        Problem(
            field=field,
            message=f"{role.role} on {where}: SGLang refuses this KV layout: {reason}",
            fix=fix,
            rule="kv_layout_servable",
        )
    ]


def kv_layout_predictable(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Warn when the model is unknown, so the PD KV layout cannot be predicted.

    Source: the layout depends on the model's HF model_type and compression ratios
    (deepseek_v4_memory_pool.py); the operator does not guess them.
    """
    if role.inputs.model is not None or role.role != "prefill":
        return []
    return [
        Problem(
            field="spec.model.name",
            message=f"model {spec.model.name!r} is not in the model catalog, so its KV layout, expert counts and "
            "architecture cannot be checked before pods start",
            fix="add the model to the catalog ConfigMap sglang-pd-operator-catalog (key models.yaml)",
            rule="kv_layout_predictable",
            severity="warning",
        )
    ]


def kv_layouts_match(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Both roles must resolve to the same PD KV layout string.

    Source: sglang 0.5.23 disaggregation/common/conn.py raises "KV layout mismatch ...
    must use the same --dsv4-attn-backend and SGLANG_DSV4_KV_LAYOUT" at the PD handshake,
    after both sides loaded their weights; the strings come from pd_kv_layout().
    Returns one problem when both layouts are known and differ.
    """
    a, b = prefill.kv_layout_string, decode.kv_layout_string
    if a is None or b is None or a == b:
        return []
    field = "spec.decode.kvLayout" if decode.inputs.spec.kvLayout else (
        "spec.decode.accelerator" if decode.inputs.spec.accelerator else "spec.prefill.accelerator"
    )
    if prefill.inputs.spec.kvLayout:
        field = "spec.prefill.kvLayout"
    return [
        Problem(
            field=field,
            message=(
                f"KV layout mismatch: prefill resolves to {a} ({prefill.layout.attention_backend} on "
                f"{prefill.inputs.accelerator_name}), decode to {b} ({decode.layout.attention_backend} on "
                f"{decode.inputs.accelerator_name}); SGLang's decode refuses the pair at the first request, after "
                "loading weights"
            ),
            fix="give both roles the same kvLayout.attentionBackend and kvLayout.layout on GPUs that can hold it "
            "(e.g. layout v4 and attentionBackend flashmla on both for a mixed Hopper/Blackwell pair)",
            rule="kv_layouts_match",
        )
    ]
