"""Turn a PDDeployment spec into a :class:`Plan`: resolved roles, commands, compat key, problems.

``build_plan`` is the one entry point of the planning layer: pure (no I/O besides the
catalog passed in), deterministic, and total: it never raises for a bad spec, it returns
every problem it found in ``Plan.problems``. ``render`` turns a plan without errors into
Kubernetes objects; ``check`` prints it; the reconciler refuses to touch anything while
``plan.valid`` is False.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..api.load import SpecError, parse_pddeployment, rule_violations
from ..api.v1alpha1 import PDDeployment, PDDeploymentSpec
from ..catalog import Catalog
from . import compat
from .engine_args import build_engine_command
from .features import features_in_use
from .kvlayout import LayoutInputs, LayoutPrediction, LayoutRefusal, predict_layout, resolve_kv_cache_dtype
from .memory import plan_memory
from .problems import Problem, errors
from .roles import ROLES, Role, RoleInputs, resolve_role
from .rules import run_all_rules
from .structs import Plan, RolePlan
from .transfer import plan_transfer


def _predict(spec: PDDeploymentSpec, inputs: RoleInputs) -> tuple[str, LayoutPrediction | None, str | None]:
    """(resolved kv dtype, layout or None, SGLang's refusal reason or None)."""
    requested = inputs.kv_layout.dtype
    try:
        dtype = resolve_kv_cache_dtype(requested, is_deepseek_v4=inputs.is_deepseek_v4)
    except LayoutRefusal as e:
        return requested, None, str(e)
    if not inputs.is_deepseek_v4 or inputs.accelerator is None or inputs.model is None:
        return dtype, None, None
    layout_inputs = LayoutInputs(
        backend=inputs.kv_layout.attentionBackend,
        layout_env=inputs.kv_layout.layout,
        compressed_env=inputs.kv_layout.compressed,
        isa=inputs.accelerator.isa,
        vendor=inputs.accelerator.vendor,
        model_type=inputs.model.modelType,
        kv_cache_dtype=dtype,
        pd=True,
        attention_tp=inputs.attention_tp,
        compression_ratios=inputs.model.compressionRatios,
    )
    try:
        return dtype, predict_layout(layout_inputs), None
    except LayoutRefusal as e:
        return dtype, None, str(e)


def _compat_inputs(spec: PDDeploymentSpec, inputs: RoleInputs, dtype: str, layout: LayoutPrediction | None) -> dict:
    sp = spec.speculative
    d = spec.disaggregation
    return {
        "model": spec.model.name,
        "revision": spec.model.revision,
        "sglangVersion": inputs.runtime.sglangVersion,
        "image": inputs.runtime.image,
        "kvLayout": layout.pd_string if layout else None,
        "attentionBackend": layout.attention_backend if layout else None,
        "pageSize": inputs.page_size,
        "kvCacheDtype": dtype,
        "transferBackend": spec.transfer.backend,
        "decodeAllocationPolicy": d.decodeAllocationPolicy,
        "samplingMaskMaxTokens": d.samplingMaskMaxTokens,
        "kvChecksum": d.kvChecksum,
        "speculative": sp.model_dump(exclude_none=True) if sp else None,
    }


def plan_role(
    *, spec: PDDeploymentSpec, role: Role, catalog: Catalog, name: str = "", namespace: str = "default"
) -> RolePlan:
    """Resolve one role: inputs, KV dtype and layout, NICs, command, features, memory, compat inputs.

    ``name`` and ``namespace`` (the PDDeployment's) place the Mooncake master the HiCache
    storage tier talks to; the compat key namespaces that tier's keys.
    """
    inputs = resolve_role(spec=spec, role=role, catalog=catalog)
    dtype, layout, refusal = _predict(spec, inputs)
    compat_inputs = _compat_inputs(spec, inputs, dtype, layout)
    transfer = plan_transfer(spec=spec, role=inputs, catalog=catalog)
    command = build_engine_command(
        spec=spec, role=inputs, layout=layout, kv_cache_dtype=dtype, transfer=transfer,
        compat_key=compat.compat_key(compat_inputs), name=name, namespace=namespace,
    )  # fmt: skip
    return RolePlan(
        inputs=inputs,
        kv_cache_dtype=dtype,
        layout=layout,
        layout_refusal=refusal,
        command=command,
        features=features_in_use(command.args, command.env_dict()),
        memory=plan_memory(spec=spec, role=inputs),
        compat_inputs=compat_inputs,
        transfer=transfer,
    )


def plan_object(obj: dict[str, Any], catalog: Catalog) -> tuple[Plan | None, list[Problem]]:
    """Validate and plan one object as read from YAML or the API: (plan or None, every problem).

    The schema first (None and the schema errors when it fails: nothing can be planned),
    then the CRD's CEL rules and every planning rule together, so one run reports every
    problem. A CEL problem on a field a planning rule already refuses is left out (the
    rule's message is the more specific one). Used by ``check``, ``render`` and the
    reconciler alike.
    """
    try:
        pdd = parse_pddeployment(obj)
    except SpecError as e:
        return None, [err.problem() for err in e.errors]
    plan = build_plan(pdd, catalog)
    refused_fields = {p.field for p in errors(plan.problems)}
    extra = [err.problem() for err in rule_violations(obj) if err.field not in refused_fields]
    if extra:
        plan = replace(plan, problems=tuple(sorted([*extra, *plan.problems], key=lambda p: (p.severity != "error", p.field))))
    return plan, list(plan.problems)


def build_plan(pdd: PDDeployment, catalog: Catalog) -> Plan:
    """Plan a PDDeployment: both roles and every problem of every rule.

    Never raises for a bad spec (pydantic validation of the YAML happens before, in
    ``api``); problems carry the field path, the reason and the fix.
    """
    spec = pdd.spec
    prefill, decode = (
        plan_role(spec=spec, role=r, catalog=catalog, name=pdd.name, namespace=pdd.namespace) for r in ROLES
    )
    problems = tuple(run_all_rules(spec=spec, prefill=prefill, decode=decode, catalog=catalog))
    return Plan(
        name=pdd.name,
        namespace=pdd.namespace,
        generation=pdd.generation,
        spec=spec,
        prefill=prefill,
        decode=decode,
        problems=problems,
    )
