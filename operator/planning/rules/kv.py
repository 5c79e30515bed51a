"""KV layout rules: each role's layout must be servable on its GPU, both must agree, and an
explicit layout SGLang replaces is named.

Source: sglang 0.5.23 mem_cache/deepseek_v4_memory_pool.py (select_dsv4_kv_layout,
pd_kv_layout), arg_groups/deepseek_v4_hook.py (attention backend resolution and
assertions), arg_groups/overrides.py (_deepseek_v4_kv_cache_dtype), and
disaggregation/common/conn.py, which raises "KV layout mismatch" at the PD handshake.
"""

from __future__ import annotations

import difflib

from ...catalog import Catalog
from ..engine_args import effective_compressed_option
from ..structs import RolePlan
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
                fix="use fp8_e4m3 or auto for DeepSeek-V4 models (bfloat16 passes this check but only NPUs build "
                "its pool: dsv4_kv_dtype_gpu_pool)",
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
    near = [name for name in catalog.models if name.lower() == spec.model.name.lower()]
    near = near or difflib.get_close_matches(spec.model.name, list(catalog.models), n=1, cutoff=0.8)
    meant = f"; did you mean {near[0]!r} (model ids are case-sensitive)" if near else ""
    return [
        Problem(
            field="spec.model.name",
            message=f"model {spec.model.name!r} is not in the model catalog, so its KV layout, expert counts and "
            f"architecture cannot be checked before pods start{meant}",
            fix=(f"use name: {near[0]}" if near else
                 "add the model to the catalog ConfigMap sglang-pd-operator-catalog (key models.yaml)"),
            rule="kv_layout_predictable",
            severity="warning",
        )
    ]


def dsv4_kv_dtype_gpu_pool(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A DeepSeek-V4 KV cache in bfloat16 is refused on GPUs: the pool stores FP8 pages as uint8.

    Source: sglang 0.5.23 arg_groups/overrides.py ``_deepseek_v4_kv_cache_dtype`` lets
    fp8_e4m3 and bfloat16 through (bfloat16 is what it sets on NPU, "where the pool geometry
    differs"), then mem_cache/deepseek_v4_memory_pool.py:321 ``create_buffer`` asserts
    ``store_dtype == torch.uint8`` when the scheduler builds the pools. Found by the oracle's
    pools stage (issue 23): 6 of 300 generated specs, refused on every role.
    """
    if not role.inputs.is_deepseek_v4 or role.inputs.kv_layout.dtype != "bfloat16":
        return []
    return [
        Problem(
            field=f"{role.inputs.kv_layout_field}.dtype",
            message=f"{role.role}: SGLang 0.5.23 builds a DeepSeek-V4 KV pool only in FP8 on GPUs; with dtype bfloat16 "
            "the pool's store dtype is not uint8 and the scheduler's pool construction asserts "
            "(deepseek_v4_memory_pool.py:321), after the weights load",
            fix="use dtype fp8_e4m3 (or auto, which SGLang resolves to it)",
            rule="dsv4_kv_dtype_gpu_pool",
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
            fix=_kv_mismatch_fix(prefill, decode),
            rule="kv_layouts_match",
        )
    ]


def _kv_mismatch_fix(prefill: RolePlan, decode: RolePlan) -> str:
    """The fix of a KV layout mismatch, worded for the pair's GPUs: on one ISA, make one role's
    kvLayout the other's; across ISAs (a Hopper prefill with a Blackwell decode, say), a layout
    both ISAs build (v4 with flashmla: deepseek_v4_memory_pool.py builds it on SM90 and SM100)."""
    pa, da = prefill.inputs.accelerator, decode.inputs.accelerator
    same_isa = pa is not None and da is not None and pa.isa == da.isa
    if same_isa:
        pb, db = prefill.layout.attention_backend, decode.layout.attention_backend
        what = (f"attentionBackend: {pb} (the prefill's; the decode's is {db})" if pb != db else
                f"layout and compressed to the prefill's (it resolves to {prefill.kv_layout_string})")
        return (f"both roles run on {pa.isa}: give them the same kvLayout, e.g. set spec.decode.kvLayout.{what}, "
                "or the prefill's like the decode's")
    return ("give both roles the same kvLayout.attentionBackend and kvLayout.layout on GPUs that can hold it "
            "(e.g. layout v4 and attentionBackend flashmla on both for a mixed Hopper/Blackwell pair)")


def kv_layout_overridden(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Warn, per role, when an explicit kvLayout.layout or .compressed is not what SGLang builds.

    Source: sglang 0.5.23 mem_cache/deepseek_v4_memory_pool.py ``select_dsv4_kv_layout``:
    with --dsv4-attn-backend flashmla_mega the mode becomes v41 for every
    SGLANG_DSV4_KV_LAYOUT but v41_new (layout v4 with flashmla_mega serves v41); trtllm keeps
    uniform FP8 pools; layout auto off SM100/SM103 and gfx950 returns a v4 main cache and
    drops the compressed option, and ``resolve_compressed_kv_layout`` (same file) pairs a
    v4 main cache only with v4 caches (compressed fp4 with layout auto on H200 builds v4).
    SGLang serves the role, so this is a warning; the operator renders the layout asked
    (SGLang ignores it) and, for a compressed option SGLang drops, SGLang's default
    (``engine_args.effective_compressed_option``: a change SGLang ignores restarts no pod). ``auto`` never warns, nor
    does a value SGLang keeps; a role SGLang refuses (no prediction) is left to
    kv_layout_servable. The roles are compared only to report a finding they share on one
    field once ("prefill and decode ...").
    """
    found: dict[tuple[str, str, str], list[str]] = {}
    for role in (prefill, decode):
        layout, kv, acc = role.layout, role.inputs.kv_layout, role.inputs.accelerator
        if layout is None or acc is None:  # not DeepSeek-V4, unknown model or GPU, or refused
            continue
        main, *caches = layout.pd_string.split(",")
        backend = layout.attention_backend
        via = f"attentionBackend auto resolves to {backend} here, and " if kv.attentionBackend == "auto" else ""
        asked = []  # (field name, value asked, env var rendered, what SGLang builds, why, fix)
        if kv.layout not in ("auto", main):
            if backend == "flashmla_mega":
                why = f"{via}--dsv4-attn-backend flashmla_mega forces v41 for every SGLANG_DSV4_KV_LAYOUT but v41_new"
            elif backend == "trtllm":
                why = f"{via}--dsv4-attn-backend trtllm keeps uniform FP8 pools whatever SGLANG_DSV4_KV_LAYOUT says"
            else:
                why = f"SGLang resolves it for --dsv4-attn-backend {backend} on {acc.isa}"
            change = "another accelerator" if backend in ("flashmla", "auto") else "attentionBackend flashmla"
            fix = f"set layout: {main} (what SGLang uses) or auto, or use {change} to get layout {kv.layout}"
            asked.append(("layout", kv.layout, "SGLANG_DSV4_KV_LAYOUT", kv.layout, f"a {main} main KV cache", why, fix))
        if kv.compressed != "auto" and any(("fp4" in c) != (kv.compressed == "fp4") for c in caches):
            if main == "v4":
                why = (
                    f"the main cache is v4 (layout {kv.layout} on {acc.isa}; the V4.1 layouts need SM100/SM103 or "
                    "gfx950) and a v4 main cache holds only v4 compressed caches, so SGLang drops "
                    f"SGLANG_DSV4_COMPRESSED_KV_LAYOUT={kv.compressed}"
                )
                fix = "set compressed: auto (or fp8), or use an SM100/SM103 or gfx950 accelerator for fp4 caches"
            else:
                why = f"SGLang resolves it for --dsv4-attn-backend {backend} with a {main} main cache"
                fix = "set compressed: auto"
            builds = "compressed caches " + ",".join(caches)
            rendered = effective_compressed_option(kv.compressed, layout)
            asked.append(("compressed", kv.compressed, "SGLANG_DSV4_COMPRESSED_KV_LAYOUT", rendered, builds, why, fix))
        for name, value, env, rendered, builds, why, fix in asked:
            renders = (
                f"the operator renders {env}={value} as asked; SGLang ignores it"
                if rendered == value
                else f"the operator renders {env}={rendered}, SGLang's default, so this value restarts no engine"
            )
            body = (
                f"on {role.inputs.accelerator_name} ({acc.isa}): {name} {value} is set, but SGLang 0.5.23 builds "
                f"{builds} (PD layout {layout.pd_string}): {why} ({renders})"
            )
            found.setdefault((f"{role.inputs.kv_layout_field}.{name}", body, fix), []).append(role.role)
    return [
        Problem(field=field, message=f"{' and '.join(roles)} {body}", fix=fix, rule="kv_layout_overridden",
                severity="warning")  # fmt: skip
        for (field, body, fix), roles in found.items()
    ]


def page_size_overridden(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLang replaces a page size its attention backend cannot page: say so (warning).

    Source: sglang 0.5.23 arg_groups/overrides.py ``_mla_backend_page_constraints`` (trtllm_mha
    pages 16, 32, 64 or 128, else 64) and ``_fa4_page_constraint`` (128 on SM100), with the
    backend SGLang picks itself (``RoleInputs.mha_attention_backend``). The operator renders
    the page size SGLang would use, so the compat key and the handshake check compare what
    runs. DeepSeek-V4's 256 is rules/deepseek_v4.dsv4_page_size.
    """
    inputs = role.inputs
    declared = inputs.kv_layout.pageSize
    if inputs.is_deepseek_v4 or inputs.page_size == declared:
        return []
    backend = inputs.mha_attention_backend
    return [
        Problem(
            field=f"{inputs.kv_layout_field}.pageSize",
            message=f"{role.role} on {inputs.accelerator_name}: SGLang 0.5.23's {backend} attention backend does not "
            f"page by {declared}; it runs pages of {inputs.page_size}, which the operator renders",
            fix=f"set pageSize: {inputs.page_size}",
            rule="page_size_overridden",
            severity="warning",
        )
    ]
