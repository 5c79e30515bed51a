"""Turn a PDDeployment spec into a :class:`Plan`: resolved roles, commands, compat key, problems.

``build_plan`` is the one entry point of the planning layer: pure (no I/O besides the
catalog passed in), deterministic, and total: it never raises for a bad spec, it returns
every problem it found in ``Plan.problems``. ``render`` turns a plan without errors into
Kubernetes objects; ``check`` prints it; the reconciler refuses to touch anything while
``plan.valid`` is False.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from ..api.load import FieldError, SpecError, parse_pddeployment, rule_violations
from ..api.v1alpha1 import PDDeployment, PDDeploymentSpec, SLOSpec
from ..catalog import Catalog
from . import compat
from .buckets import BUCKET_ROLE, replace_bucket_args
from .engine_args import build_engine_command
from .features import features_in_use, parse_flags
from .kvlayout import LayoutInputs, LayoutPrediction, LayoutRefusal, predict_layout, resolve_kv_cache_dtype
from .memory import plan_memory
from .problems import Problem, errors
from .roles import ROLES, Role, RoleInputs, resolve_role
from .size import spec_size_problem
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


def _attention_shape_constrained(spec: PDDeploymentSpec, roles: dict[str, RoleInputs], dtype: str) -> bool:
    """The handshake compares the two roles' attention TP / CP: DeepSeek-V4.1 DSpark (a model with
    ratio-2 caches: disaggregation/utils.get_dsv41_spec_layout, conn.py "requires the same TP
    size"), an MXFP8 KV cache on a non-MLA model (conn.py), prefill_complete (TP1/CP1/PP1 peers,
    CommonKVReceiver.init), prefill KV cache sharding (_resolve_rank_mapping)."""
    model = roles["prefill"].model
    sp = spec.speculative
    if sp is not None and sp.algorithm == "DSPARK" and model is not None and 2 in model.compressionRatios:
        return True
    if dtype == "mxfp8" and model is not None and not model.mla:
        return True
    if spec.disaggregation.decodeAllocationPolicy == "prefill_complete":
        return True
    return parse_flags(roles["prefill"].spec.extraArgs).get("enable_kv_cache_sharding") not in (None, False)


def pair_shape(spec: PDDeploymentSpec, catalog: Catalog, dtype: str) -> dict[str, dict[str, int]]:
    """The parallel shape of both roles that SGLang's handshake compares: pipeline and decode-context
    parallel sizes always (conn.py _resolve_rank_mapping: decode PP equal to prefill's or 1;
    requires_dcp_relayout: DCP sizes), attention TP and CP where the pair constrains them
    (:func:`_attention_shape_constrained`). The same value on both roles, so a change of it
    starts a new compat group instead of rolling prefill and decode into a pair SGLang refuses.
    A role spanning nodes adds its node count (see below).
    """
    roles = {r: resolve_role(spec=spec, role=r, catalog=catalog) for r in ROLES}
    shape = {r: {"pp": i.pipeline_parallel, "dcp": i.decode_cp} for r, i in roles.items()}
    for r, i in roles.items():
        if i.multi_node:
            # Nodes per replica decide the workload (Deployment or LeaderWorkerSet group) and
            # every rank's placement: a change of them starts a new group beside the serving
            # one (paired rollout) instead of replacing pods in place. Absent for one node, so
            # single-node compat keys are what they were.
            shape[r]["nodes"] = i.nodes
    if _attention_shape_constrained(spec, roles, dtype):
        for r, i in roles.items():
            shape[r].update(attentionTP=i.attention_tp, attentionCP=i.attention_cp)
    return shape


def _compat_inputs(spec: PDDeploymentSpec, inputs: RoleInputs, dtype: str, layout: LayoutPrediction | None,
                   shape: dict[str, dict[str, int]]) -> dict:
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
        "pairShape": shape,
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
    compat_inputs = _compat_inputs(spec, inputs, dtype, layout, pair_shape(spec, catalog, dtype))
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


#: Most CEL verdicts a :class:`RuleMemo` keeps (a few hundred bytes each).
RULE_MEMO_SIZE = 4096


class RuleMemo:
    """The CEL verdict of each stored generation of an object, so a reconcile does not evaluate it again.

    The CRD's CEL rules read only the object (its spec and name), which the API server
    never changes for one ``(uid, generation)``: evaluating them with cel-python costs
    about 80 ms per PDDeployment, the rest of planning about 6 ms. Keeps at most ``size``
    verdicts (least recently used dropped). Thread-safe.
    """

    def __init__(self, size: int = RULE_MEMO_SIZE) -> None:
        self.size = size
        self._verdicts: dict[tuple[str, int, str], list[FieldError]] = {}
        self._lock = threading.Lock()

    def violations(self, obj: dict[str, Any]) -> list[FieldError]:
        """``rule_violations(obj)``, remembered by (uid, generation, name) when the object has a uid and generation."""
        meta = obj.get("metadata") or {}
        uid, generation = meta.get("uid"), meta.get("generation")
        if not uid or generation is None:
            return rule_violations(obj)
        key = (str(uid), int(generation), str(meta.get("name")))
        with self._lock:
            found = self._verdicts.pop(key, None)
            if found is not None:
                self._verdicts[key] = found  # most recently used last
                return found
        found = rule_violations(obj)
        with self._lock:
            while len(self._verdicts) >= self.size:
                del self._verdicts[next(iter(self._verdicts))]
            self._verdicts[key] = found
        return found


def schema_problem(error: FieldError) -> Problem:
    """A schema or CEL error of ``api.load`` as a Problem (rule ``schema``), the shape ``check`` and status report."""
    return Problem(field=error.field, message=error.message, fix=error.fix, rule="schema")


def plan_object(obj: dict[str, Any], catalog: Catalog, *, rule_memo: RuleMemo | None = None,
                default_queue: str | None = None) -> tuple[Plan | None, list[Problem]]:
    """Validate and plan one object as read from YAML or the API: (plan or None, every problem).

    The schema first (None and the schema errors when it fails: nothing can be planned),
    then the CRD's CEL rules and every planning rule together, so one run reports every
    problem. A CEL problem on a field a planning rule already refuses is left out (the
    rule's message is the more specific one). Used by ``check``, ``render`` and the
    reconciler alike; the reconciler passes a ``rule_memo`` (objects read from the API
    server have a uid and a generation). ``default_queue``: see :func:`build_plan`.
    A spec too large for the record each workload keeps of it is refused too
    (``planning.size``, rule ``spec_size``), with whatever else is wrong.
    """
    too_large = spec_size_problem(obj)
    try:
        pdd = parse_pddeployment(obj)
    except SpecError as e:
        return None, [schema_problem(err) for err in e.errors] + ([too_large] if too_large else [])
    plan = build_plan(pdd, catalog, default_queue=default_queue)
    refused_fields = {p.field for p in errors(plan.problems)}
    found = rule_memo.violations(obj) if rule_memo is not None else rule_violations(obj)
    extra = [schema_problem(err) for err in found if err.field not in refused_fields]
    if too_large is not None:
        extra.append(too_large)
    if extra:
        plan = replace(plan, problems=tuple(sorted([*extra, *plan.problems], key=lambda p: (p.severity != "error", p.field))))
    return plan, list(plan.problems)


def build_plan(pdd: PDDeployment, catalog: Catalog, *, default_queue: str | None = None) -> Plan:
    """Plan a PDDeployment: both roles and every problem of every rule.

    Never raises for a bad spec (pydantic validation of the YAML happens before, in
    ``api``); problems carry the field path, the reason and the fix. ``default_queue``:
    the operator's default Kueue LocalQueue (``--default-queue-name``; None: none), used
    where ``spec.scheduling.queueName`` is unset (:func:`with_queue_compat`).
    """
    spec = pdd.spec
    prefill, decode = (
        plan_role(spec=spec, role=r, catalog=catalog, name=pdd.name, namespace=pdd.namespace) for r in ROLES
    )
    problems = tuple(run_all_rules(spec=spec, prefill=prefill, decode=decode, catalog=catalog))
    return with_queue_compat(Plan(
        name=pdd.name,
        namespace=pdd.namespace,
        generation=pdd.generation,
        spec=spec,
        prefill=prefill,
        decode=decode,
        problems=problems,
        default_queue=default_queue,
    ))


#: The compat input naming the Kueue LocalQueue of a queued plan (docs/compat-key.md).
QUEUE_COMPAT_INPUT = "kueueQueue"


def with_bucket_targets(plan: Plan, slo: SLOSpec | None, problem: Problem | None = None) -> Plan:
    """``plan`` with the decode role's ``--bucket-*`` flags rendered for ``slo`` instead of ``spec.slo``.

    The compat key, features and every other argument stay as they are (the flags are not
    a compat input: planning/buckets.py); ``problem``, when given, is added to the plan's
    problems (a warning that says whose targets the buckets follow). Pure.
    """
    role = plan.role(BUCKET_ROLE)
    command = replace(role.command, args=replace_bucket_args(role.command.args, slo, BUCKET_ROLE))
    problems = plan.problems if problem is None else (*plan.problems, problem)
    return replace(plan, problems=problems, **{BUCKET_ROLE: replace(role, command=command)})


def with_queue_compat(plan: Plan) -> Plan:
    """``plan`` with its Kueue queue in both roles' compat inputs when :attr:`Plan.queued` (pure).

    Kueue's LeaderWorkerSet webhook refuses to add, change or remove the queue label of a
    running LeaderWorkerSet (pkg/controller/jobs/leaderworkerset, queue name immutable), so
    a group's queue is fixed for its life: another queue, from the spec or from the
    operator's default, is another compat group (a paired rollout), never an in-place
    update Kueue would refuse. Absent when nothing is queued, so every other key is
    unchanged. Merged after the roles are planned, like the kernel digest
    (``kernelbuild.gate.with_kernel_compat``): the engine's arguments (the HiCache tag)
    keep the key of SGLang's own inputs.
    """
    if not plan.queued:
        return plan
    extra = {QUEUE_COMPAT_INPUT: plan.queue_name}
    return replace(plan, prefill=replace(plan.prefill, compat_inputs={**plan.prefill.compat_inputs, **extra}),
                   decode=replace(plan.decode, compat_inputs={**plan.decode.compat_inputs, **extra}))
