"""What SGLang's PD handshake refuses, checked before any pod exists.

Source: sglang 0.5.23 disaggregation/common/conn.py (the handshake: page size, KV dtype,
KV layout, DSpark layout and attention TP), arg_groups/fields/disagg.py (flags that must
be set the same on both roles), and ../shared/reference/sglang-0.5.23.md.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ..compat import differing_inputs
from ..plan import RolePlan
from ..problems import Problem

# compat input -> (field to change, why it must be equal)
_MUST_EQUAL_FIELDS: dict[str, tuple[str, str]] = {
    "model": ("spec.model.name", "both roles must serve the same model"),
    "revision": ("spec.model.revision", "both roles must serve the same model revision"),
    "sglangVersion": ("spec.runtime.sglangVersion", "an older decode cannot parse a newer handshake (sglang #45075)"),
    "image": ("spec.runtime.image", "both roles must run the same runtime image"),
    "pageSize": ("spec.<role>.kvLayout.pageSize", "conn.py refuses peers whose page sizes differ"),
    "kvCacheDtype": ("spec.<role>.kvLayout.dtype", "conn.py refuses peers whose KV cache dtypes differ"),
    "attentionBackend": (
        "spec.<role>.kvLayout.attentionBackend",
        "both roles must use the same --dsv4-attn-backend (conn.py KV layout check)",
    ),
    "transferBackend": ("spec.transfer.backend", "both roles must use the same transfer backend"),
    "decodeAllocationPolicy": (
        "spec.disaggregation.decodeAllocationPolicy",
        "--disaggregation-decode-allocation-policy must be the same on both roles",
    ),
    "samplingMaskMaxTokens": (
        "spec.disaggregation.samplingMaskMaxTokens",
        "--sampling-mask-max-tokens must be the same on both roles",
    ),
    "kvChecksum": ("spec.disaggregation.kvChecksum", "--disaggregation-enable-kv-checksum must be on both or neither"),
    "speculative": ("spec.speculative", "the DSpark / speculative layout is part of the handshake"),
}


def must_equal_fields(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Every compat input other than the KV layout string must be equal on both roles.

    Source: conn.py (page size, KV dtype), disagg.py help texts (allocation policy,
    sampling mask, KV checksum), seed 003 (prefill and decode upgrade together).
    The KV layout string itself is :func:`..kv.kv_layouts_match`. One problem per field.
    """
    problems = []
    for name in differing_inputs(prefill.compat_inputs, decode.compat_inputs):
        if name == "kvLayout":
            continue
        field, why = _MUST_EQUAL_FIELDS.get(name, (f"spec.{name}", "must be equal on both roles"))
        role_field = field.replace("<role>", "decode")
        problems.append(
            Problem(
                field=role_field,
                message=f"{name} differs between roles (prefill {prefill.compat_inputs[name]!r}, decode "
                f"{decode.compat_inputs[name]!r}): {why}",
                fix=f"set the same value for both roles (compare {field.replace('<role>', 'prefill')})",
                rule="must_equal_fields",
            )
        )
    return problems


def dspark_attention_tp_equal(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """DeepSeek-V4.1 with DSpark: both roles need the same attention TP size.

    Attention TP = tp / (DP-attention size x attention CP) (runtime_context.derive_attn_tp_size).
    DEP on both roles (attention TP 1) or TP on both (attention TP = tp) pass; DEP prefill
    with TP decode is refused by conn.py at the handshake. Source: sglang 0.5.23
    disaggregation/common/conn.py; ../shared/reference/sglang-0.5.23.md.
    """
    model = prefill.inputs.model
    sp = spec.speculative
    if model is None or not model.is_deepseek_v41 or sp is None or sp.algorithm != "DSPARK":
        return []
    a, b = prefill.inputs.attention_tp, decode.inputs.attention_tp
    if a == b:
        return []

    def shape(r: RolePlan) -> str:
        p = r.inputs.parallelism
        kind = "DEP" if p.dpAttention else "TP"
        return f"{kind} (tp {p.tp}, dp {p.dp}, dpAttention {str(p.dpAttention).lower()}: attention TP {r.inputs.attention_tp})"

    return [
        Problem(
            field="spec.decode.parallelism",
            message=f"DeepSeek-V4.1 with DSpark needs the same attention TP size on both roles: prefill is "
            f"{shape(prefill)}, decode is {shape(decode)}; SGLang refuses the pair at the PD handshake",
            fix="use DEP on both roles (dpAttention with dp = tp) or TP on both roles (no dpAttention, same tp)",
            rule="dspark_attention_tp_equal",
        )
    ]


def mxfp8_attention_tp_equal(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """An MXFP8 (block-scale) KV cache on a non-MLA model needs equal attention TP on both roles.

    Source: sglang 0.5.23 disaggregation/common/conn.py (block-scale KV transfer cannot
    re-shard heads); ../shared/reference/sglang-0.5.23.md.
    """
    model = prefill.inputs.model
    if prefill.kv_cache_dtype != "mxfp8" or model is None or model.mla:
        return []
    if prefill.inputs.attention_tp == decode.inputs.attention_tp:
        return []
    return [
        Problem(
            field="spec.decode.parallelism.tp",
            message=f"an mxfp8 KV cache on a non-MLA model needs the same attention TP on both roles (prefill "
            f"{prefill.inputs.attention_tp}, decode {decode.inputs.attention_tp})",
            fix="use the same tp / dpAttention on both roles, or kvLayout.dtype fp8_e4m3",
            rule="mxfp8_attention_tp_equal",
        )
    ]
