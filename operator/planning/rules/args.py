"""Rules on a role's ``extraArgs`` and ``env``: validated, never silently dropped.

Flags and variables the operator renders from typed fields are refused with the field to
set instead; every other flag is checked against the parser of the pinned SGLang release
(snapshot in planning/data, verified against sglang==0.5.23 by the contract tests).
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..devices import VISIBLE_DEVICES_ENV, visible_gpus
from ..engine_args import MANAGED_ENV, MANAGED_FLAGS
from ..features import parse_flags
from ..sglang_defaults import chunked_prefill_per_rank, chunked_prefill_size
from ..structs import RolePlan
from ..problems import Problem
from ..sglang_flags import validate_args


def extra_args_not_managed(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A flag the operator sets from a typed field cannot also come from extraArgs."""
    problems = []
    for i, tok in enumerate(role.inputs.spec.extraArgs):
        name = tok.partition("=")[0]
        owner = MANAGED_FLAGS.get(name)
        if owner is None:
            continue
        owner = owner.replace("<role>", role.role)
        if owner.startswith("spec."):
            fix = f"set {owner} instead"
        elif owner == "(set by the operator)":
            fix = "remove it"
        else:  # "(always on)", "(set by the operator per role)", "(the operator's config file)"
            fix = "remove it; the operator sets it " + owner
        problems.append(
            Problem(
                field=f"spec.{role.role}.extraArgs[{i}]",
                message=f"{name} is set by the operator",
                fix=fix,
                rule="extra_args_not_managed",
            )
        )
    return problems


def extra_args_parse(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """extraArgs must parse with SGLang 0.5.23's launch_server parser (unknown flags, values, choices)."""
    args = role.inputs.spec.extraArgs
    return [
        Problem(
            field=f"spec.{role.role}.extraArgs[{e.index}]",
            message=e.message,
            fix="correct or remove the flag (see python -m sglang.launch_server --help of 0.5.23)",
            rule="extra_args_parse",
        )
        for e in validate_args(args)
        if args[e.index].partition("=")[0] not in MANAGED_FLAGS
    ]


def env_not_managed(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A variable the operator sets from a typed field (or that only the pod can know) cannot come from env.

    SGLANG_HOST_IP / HOST_IP: the address a rank binds its KV and bootstrap sockets to and
    gives its peers (sglang 0.5.23 utils/network.py get_local_ip_auto reads them first): a
    fixed value is not the pod's IP, and the bind fails ("Cannot assign requested
    address", which the SGLang oracle reproduces). The operator sets SGLANG_HOST_IP from the
    pod IP on every rank of a multi-node replica; SGLang finds the pod IP itself otherwise.
    """
    problems = []
    for i, var in enumerate(role.inputs.spec.env):
        owner = MANAGED_ENV.get(var.name)
        if owner is not None:
            problems.append(
                Problem(
                    field=f"spec.{role.role}.env[{i}]",
                    message=f"{var.name} is set by the operator from {owner}",
                    fix=f"set {owner} instead",
                    rule="env_not_managed",
                )
            )
    return problems


def env_names_unique(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Each variable at most once in a role's ``env``.

    Kubernetes' container ``env`` is a list keyed by name (server-side apply merges it by
    name), so the API server refuses the rendered Deployment with "duplicate entries for key
    [name=...]"; a fresh user's spec passed ``check`` and then failed every reconcile with a
    ServerError. One problem per repeated entry, at the repeat.
    """
    seen: dict[str, int] = {}
    problems = []
    for i, var in enumerate(role.inputs.spec.env):
        if var.name in seen:
            problems.append(Problem(
                field=f"spec.{role.role}.env[{i}]",
                message=f"{var.name} is set twice in the {role.role} role's env (first at env[{seen[var.name]}]); the "
                "API server refuses a container with a repeated variable",
                fix=f"keep one {var.name} entry",
                rule="env_names_unique",
            ))
        else:
            seen[var.name] = i
    return problems


def visible_devices_cover_pod(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A role's ``env`` must not hide GPUs its engine uses (``CUDA_VISIBLE_DEVICES`` and ROCm's variables).

    The pod gets exactly the GPUs its engine uses (one per rank on the node), numbered from 0
    by the device plugin; SGLang places rank ``r`` on GPU ``r`` (entrypoints/engine.py
    ``_launch_scheduler_processes``), so a variable that leaves fewer visible (CUDA's
    semantics: planning/devices.py) fails a scheduler with "CUDA error: invalid device
    ordinal". The SGLang oracle emulates the narrowed count and refuses the same specs
    (tests/contract/test_oracle.py holds the two together). One problem at the variable.
    """
    acc = role.inputs.accelerator
    if acc is None:
        return []
    env = {v.name: v.value for v in role.inputs.spec.env}
    names = [n for n in VISIBLE_DEVICES_ENV.get(acc.vendor, ()) if n in env]
    if not names:
        return []
    need = role.inputs.gpus_per_pod
    seen = visible_gpus(need, env, acc.vendor)
    if seen >= need:
        return []
    i = next(i for i, v in enumerate(role.inputs.spec.env) if v.name in names)
    shown = ", ".join(f"{n}={env[n]!r}" for n in names)
    runtime = "HIP" if acc.vendor == "amd" else "CUDA"
    gpus = "1 GPU" if need == 1 else f"{need} GPUs"
    named = [e.strip() for n in names for e in env[n].split(",") if e.strip() and not e.strip().isdigit()]
    why = (f" ({', '.join(named[:2])} is no device index: the GPUs are the device plugin's pick at scheduling time, "
           "so the operator cannot tell which they are, and counts none)") if named else ""
    return [Problem(
        field=f"spec.{role.role}.env[{i}]",
        message=f"{shown} leaves {seen} of the pod's {gpus} visible{why}; SGLang places one rank per GPU and the "
        f"rank on GPU {seen} fails with '{runtime} error: invalid device ordinal'",
        fix=f"remove {' and '.join(names)}: the device plugin already gives the container exactly its {gpus}, "
        "numbered from 0",
        rule="visible_devices_cover_pod",
    )]


def chunked_prefill_page_aligned(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A prefill role's chunked prefill size, per attention-DP rank, must be a whole number of pages.

    Source: sglang 0.5.23 arg_groups/validation_hook.py check_server_args asserts
    "chunked_prefill_size must be divisible by page_size" on every role but decode, on the
    resolved value: ``--chunked-prefill-size`` or SGLang's default by GPU memory, divided by
    the attention-DP size (planning/sglang_defaults.py). The page is the one SGLang uses
    (``RoleInputs.page_size``: 256 for DeepSeek-V4, the attention backend's for others).
    """
    if role.role == "decode":
        return []
    args = list(role.inputs.spec.extraArgs)
    flags = parse_flags(args)
    per_rank = chunked_prefill_per_rank(role.inputs, flags)
    page = role.inputs.page_size
    if per_rank is None or per_rank <= 0 or page <= 1 or per_rank % page == 0:
        return []
    dp = role.inputs.attention_dp
    explicit = flags.get("chunked_prefill_size") is not None
    size = chunked_prefill_size(role.inputs, flags)
    index = next((i for i, tok in enumerate(args) if tok.startswith("--chunked-prefill-size")), None)
    if index is not None:
        field = f"spec.{role.role}.extraArgs[{index}]"
    elif dp > 1:
        field = f"spec.{role.role}.parallelism.dp"
    else:
        field = f"{role.inputs.kv_layout_field}.pageSize"
    what = f"--chunked-prefill-size {size}" if explicit else f"SGLang's default chunked prefill size on {role.inputs.accelerator_name} ({size})"
    dp_note = f" divided by the attention DP size {dp} ({per_rank})" if dp > 1 else ""
    step = page * dp
    if explicit:
        fix = f"use a multiple of {step}, e.g. {max(step, size // step * step)}"
    else:
        fix = (f"use a pageSize that divides {per_rank}, or set --chunked-prefill-size in "
               f"spec.{role.role}.extraArgs to a multiple of {step} (e.g. {max(step, size // step * step)})")
    return [
        Problem(
            field=field,
            message=f"{what}{dp_note} is not a multiple of the page size {page}; SGLang refuses to start "
            "(\"chunked_prefill_size must be divisible by page_size\")",
            fix=fix,
            rule="chunked_prefill_page_aligned",
        )
    ]


def priority_scheduling_policy(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """``--enable-priority-scheduling`` runs with ``--schedule-policy`` fcfs or lof only.

    Source: sglang 0.5.23 arg_groups/validation_hook.py check_server_args: "To use priority
    scheduling, schedule_policy must be 'fcfs' or 'lof'." (the default policy is fcfs).
    """
    args = list(role.inputs.spec.extraArgs)
    flags = parse_flags(args)
    if flags.get("enable_priority_scheduling") in (None, False):
        return []
    policy = str(flags.get("schedule_policy") or "fcfs")
    if policy in ("fcfs", "lof"):
        return []
    index = next((i for i, tok in enumerate(args) if tok.startswith("--schedule-policy")), None)
    return [
        Problem(
            field=f"spec.{role.role}.extraArgs[{index}]" if index is not None else f"spec.{role.role}.extraArgs",
            message=f"--enable-priority-scheduling with --schedule-policy {policy}: SGLang 0.5.23 runs priority "
            "scheduling with fcfs or lof only and refuses to start",
            fix="use --schedule-policy fcfs or lof, or remove --enable-priority-scheduling",
            rule="priority_scheduling_policy",
        )
    ]
