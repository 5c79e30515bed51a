"""Rules on a role's ``extraArgs`` and ``env``: validated, never silently dropped.

Flags and variables the operator renders from typed fields are refused with the field to
set instead; every other flag is checked against the parser of the pinned SGLang release
(snapshot in planning/data, verified against sglang==0.5.23 by the contract tests).
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..engine_args import MANAGED_ENV, MANAGED_FLAGS
from ..features import parse_flags
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
        fix = f"set {owner} instead" if owner.startswith("spec.") else "remove it; the operator sets it " + owner
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
    """A variable the operator sets from a typed field cannot also come from env."""
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


def chunked_prefill_page_aligned(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A prefill role's chunked prefill size must be a whole number of pages.

    Source: sglang 0.5.23 arg_groups/validation_hook.py check_server_args asserts
    "chunked_prefill_size must be divisible by page_size" on every role but decode, on the
    resolved value: with DP attention, parallel_hook._handle_data_parallelism first
    divides it by the attention-DP size. The page is 256 for DeepSeek-V4 models
    (``RoleInputs.page_size``). Only an explicit ``--chunked-prefill-size`` is checked:
    SGLang's own defaults are its business, and the SGLang oracle judges them.
    """
    if role.role == "decode":
        return []
    args = list(role.inputs.spec.extraArgs)
    value = parse_flags(args).get("chunked_prefill_size")
    try:
        size = int(value)
    except (TypeError, ValueError):
        return []
    if size <= 0:
        return []
    per_rank = size // role.inputs.attention_dp
    page = role.inputs.page_size
    if per_rank % page == 0:
        return []
    index = next(i for i, tok in enumerate(args) if tok.startswith("--chunked-prefill-size"))
    dp_note = f" (SGLang divides it by the attention DP size {role.inputs.attention_dp}: {per_rank})" if role.inputs.attention_dp > 1 else ""
    step = page * role.inputs.attention_dp
    return [
        Problem(
            field=f"spec.{role.role}.extraArgs[{index}]",
            message=f"--chunked-prefill-size {size}{dp_note} is not a multiple of the page size {page}; SGLang refuses "
            "to start (\"chunked_prefill_size must be divisible by page_size\")",
            fix=f"use a multiple of {step}, e.g. {max(step, size // step * step)}",
            rule="chunked_prefill_page_aligned",
        )
    ]
