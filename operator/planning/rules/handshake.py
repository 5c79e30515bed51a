"""What SGLang's PD handshake refuses, checked before any pod exists.

Source: sglang 0.5.23 disaggregation/common/conn.py (the handshake: page size, KV dtype,
KV layout, DSpark layout and attention TP; the decode allocation policy per request),
arg_groups/fields/disagg.py (flags that must be set the same on both roles),
arg_groups/pd_disaggregation_hook.py (prefill_complete), and
../shared/reference/sglang-0.5.23.md.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..compat import differing_inputs
from ..engine_args import DIST_INIT_PORT, ENGINE_PORT
from ..features import parse_flags
from ..structs import RolePlan
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
    The KV layout string itself is :func:`..kv.kv_layouts_match` (which also covers a
    differing attention backend when the strings differ). One problem per field.
    """
    problems = []
    differing = differing_inputs(prefill.compat_inputs, decode.compat_inputs)
    for name in differing:
        if name == "kvLayout" or (name == "attentionBackend" and "kvLayout" in differing):
            continue  # one root cause, one problem: kv_layouts_match reports the layout mismatch
        field, why = _MUST_EQUAL_FIELDS.get(name, (f"spec.{name}", "must be equal on both roles"))
        # Point at the role whose kvLayout override differs (decode first), else the shared field.
        prefill_only = prefill.inputs.spec.kvLayout is not None and decode.inputs.spec.kvLayout is None
        owner, other = (prefill, decode) if prefill_only else (decode, prefill)
        role_field = field.replace("spec.<role>.kvLayout", owner.inputs.kv_layout_field)
        other_field = field.replace("spec.<role>.kvLayout", other.inputs.kv_layout_field)
        fix = f"set the same value for both roles (compare {other_field})"
        if name == "pageSize" and prefill.inputs.kv_layout.pageSize == decode.inputs.kv_layout.pageSize:
            # Declared alike; SGLang replaces it on one role (its attention backend's pages).
            forced = next(r for r in (prefill, decode) if r.inputs.page_size != r.inputs.kv_layout.pageSize)
            fix = (f"set pageSize: {forced.inputs.page_size}, the page SGLang runs on the {forced.role} role "
                   f"({forced.inputs.accelerator_name}, {forced.inputs.mha_attention_backend or 'its backend'})")
        problems.append(
            Problem(
                field=role_field,
                message=f"{name} differs between roles (prefill {prefill.compat_inputs[name]!r}, decode "
                f"{decode.compat_inputs[name]!r}): {why}",
                fix=fix,
                rule="must_equal_fields",
            )
        )
    return problems


def dspark_attention_tp_equal(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """DeepSeek-V4.1 with DSpark: both roles need the same attention TP size.

    Attention TP = tp / (DP-attention size x attention CP) (runtime_context.derive_attn_tp_size).
    DEP on both roles (attention TP 1) or TP on both (attention TP = tp) pass; DEP prefill
    with TP decode is refused by conn.py at the handshake, unless the prefill uses
    attention CP on an MLA model, decode does not, and prefill attention TP x CP equals
    decode attention TP. Source: sglang 0.5.23 disaggregation/common/conn.py
    (decode_tp_size_aligns_prefill_world_size); ../shared/reference/sglang-0.5.23.md.
    """
    model = prefill.inputs.model
    sp = spec.speculative
    if model is None or not model.is_deepseek_v41 or sp is None or sp.algorithm != "DSPARK":
        return []
    a, b = prefill.inputs.attention_tp, decode.inputs.attention_tp
    if a == b:
        return []
    cp = prefill.inputs.attention_cp
    if cp > 1 and model.mla and decode.inputs.attention_cp == 1 and a * cp == b:
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


def prefill_complete_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """--disaggregation-decode-allocation-policy prefill_complete: Mooncake, attention TP 1, no PP / CP.

    Source: sglang 0.5.23 arg_groups/pd_disaggregation_hook._validate_prefill_complete
    refuses at startup "transfer backends other than Mooncake", "pipeline or attention
    context parallelism", "attention tensor parallelism greater than one" (it compares
    tp_size with dp_size under the deprecated --enable-dp-attention, so with --attn-dp-size
    only tp 1 passes), HiSparse and decode radix cache; conn.py fails every request whose
    peer is not at attention TP1/CP1/PP1. HiCache combinations: rules/kvcache.py; DeepSeek-V4
    pools: rules/deepseek_v4.py.
    """
    if spec.disaggregation.decodeAllocationPolicy != "prefill_complete":
        return []
    problems = []

    def add(field: str, message: str, fix: str) -> None:
        problems.append(
            Problem(
                field=field,
                message=f"prefill_complete does not support {message} in SGLang 0.5.23",
                fix=fix,
                rule="prefill_complete_requirements",
            )
        )

    if role.role == "prefill" and spec.transfer.backend != "mooncake":
        add("spec.transfer.backend", f"the {spec.transfer.backend} transfer backend", "use transfer.backend: mooncake")
    if role.inputs.parallelism.tp != 1:
        add(
            f"spec.{role.role}.parallelism.tp",
            f"attention tensor parallelism (the {role.role} role has tp {role.inputs.parallelism.tp})",
            "use tp 1 on both roles, or decodeAllocationPolicy: early",
        )
    flags = parse_flags(role.inputs.spec.extraArgs)
    pp = str(flags.get("pp_size", "1"))
    if pp != "1" or role.inputs.attention_cp != 1 or role.inputs.decode_cp != 1 or role.inputs.prefill_cp:
        add(f"spec.{role.role}.extraArgs", "pipeline or context parallelism", "remove --pp-size / CP flags")
    if flags.get("enable_hisparse") not in (None, False):
        add(f"spec.{role.role}.extraArgs", "HiSparse", "remove --enable-hisparse")
    if role.role == "decode" and flags.get("disaggregation_decode_enable_radix_cache") not in (None, False):
        add("spec.decode.extraArgs", "a decode radix cache", "remove --disaggregation-decode-enable-radix-cache")
    return problems


#: SGLang's own TCP ports for ZMQ between its processes (server_args.py PortArgs.init_new, 0.5.23):
#: with DP attention on one node from ``--port`` + ZMQ_TCP_PORT_DELTA (233), on a replica
#: spanning nodes from ``--dist-init-addr``'s port + 1; 6 fixed ports plus one per DP rank
#: (at most 64 here: the schema's tp bound).
_ZMQ_PORTS = 6 + 64
_ZMQ_TCP_PORT_DELTA = 233


def bootstrap_port_free(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``spec.disaggregation.bootstrapPort`` must not be a port the prefill pod already uses.

    The prefill's bootstrap server binds it beside SGLang's HTTP server (``--port``,
    engine_args.ENGINE_PORT), node 0's torch.distributed store on a multi-node replica
    (DIST_INIT_PORT) and SGLang's derived ZMQ ports (:data:`_ZMQ_PORTS` from
    ``--port`` + 233 or the store's port + 1). A clash fails twice: the rendered prefill
    Service lists one port twice, which the API server refuses (a fresh user's finding:
    ``bootstrapPort: 30000`` passed ``check`` and ``check --sglang``, then every reconcile
    failed with "duplicate entries for key [port=30000]"), and two servers cannot bind one port.
    """
    if role.role != "prefill":
        return []
    port = spec.disaggregation.bootstrapPort
    taken = {ENGINE_PORT: "SGLang's HTTP port (--port)", DIST_INIT_PORT: "the multi-node torch.distributed store"}
    for base in (ENGINE_PORT + _ZMQ_TCP_PORT_DELTA, DIST_INIT_PORT + 1):
        for p in range(base, base + _ZMQ_PORTS + 1):
            taken.setdefault(p, f"one of SGLang's ZMQ ports ({base}..{base + _ZMQ_PORTS})")
    if port not in taken:
        return []
    return [Problem(
        field="spec.disaggregation.bootstrapPort",
        message=f"bootstrapPort {port} is {taken[port]} on the prefill pods: the bootstrap server cannot bind it and "
        "the prefill Service would list the port twice",
        fix="use another port, e.g. the default 8998",
        rule="bootstrap_port_free",
    )]
