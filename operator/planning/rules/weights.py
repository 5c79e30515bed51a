"""The weights must leave GPU memory for the KV cache: a lower bound SGLang's memory planning cannot beat.

Source: sglang 0.5.23 mem_cache/kv_cache_configurator.py ``_profile_available_bytes``
(line 3050): after the weights load, the KV budget is the GPU's free memory less
``pre_model_load_memory * (1 - mem_fraction_static)``; when nothing is left SGLang raises
"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=...".
Found by the SGLang oracle's memory stage (issue 23): 19 of the 32 startup-depth false
accepts of 300 generated specs were this refusal, each with weights above the whole GPU.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..memory import gib, quantity_bytes
from ..problems import Problem
from ..structs import RolePlan
from .fields import flag_field

#: Flags under which the bytes on a GPU are not the model build's at tp 1 divided by tp
#: (weights on the host, another dtype or quantization, a pipeline stage's share of the
#: layers): the rule stays silent and leaves them to the SGLang oracle.
_OTHER_WEIGHTS = ("cpu_offload_gb", "offload_group_size", "offload_num_in_group", "offload_mode",
                  "quantization", "dtype", "pp_size", "load_format", "json_model_override_args")


def _set(flags: dict, dest: str) -> bool:
    """``dest`` is given a value that changes the weights on a GPU (pp size 1 does not)."""
    value = flags.get(dest)
    if dest == "pp_size":
        return str(value) not in ("None", "1")
    return value not in (None, False, "auto", "0", 0)


def weights_per_gpu_lower_bound(*, spec: PDDeploymentSpec, role: RolePlan) -> int | None:
    """Bytes at least on each GPU of ``role`` once the weights load, or None when unknown.

    ``deviceWeightBytes[isa] / tp`` (the catalog's figure of SGLang's own model build at tp 1,
    kernels/models.yaml): every weight is split over at most the TP group, never over more
    (attention DP, ``--moe-dense-tp-size``, redundant experts and a draft only add), plus
    the Engram table's TP shard on a model with one (SGLang's default device table and
    peer shards alike: layers/engram.py shard_range; the catalog figure is measured with
    it and the table subtracted, so the sum is what was measured). None without the
    catalog figure, with Paged Experts (experts live on the host), the Engram host table,
    or a flag in :data:`_OTHER_WEIGHTS`.
    """
    model, acc = role.inputs.model, role.inputs.accelerator
    if model is None or acc is None or role.inputs.paged_experts_k is not None:
        return None
    at_tp1 = model.deviceWeightBytes.get(acc.isa)
    if at_tp1 is None:
        return None
    flags = parse_flags(list(role.command.args))
    if any(_set(flags, dest) for dest in _OTHER_WEIGHTS):
        return None
    tp = max(1, role.inputs.parallelism.tp)
    total = at_tp1 // tp
    if model.engram:
        placement = spec.engram.placement if spec.engram is not None else "device"
        if placement == "host" or not model.engramTableBytes:
            return None  # the oracle cannot build the host table's model (no mq broadcaster): no figure to hold
        total += model.engramTableBytes // tp
    return total


def weights_fit_gpu(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Refuse a role whose weights alone fill its GPUs' static memory share.

    Refused when the lower bound of :func:`weights_per_gpu_lower_bound` reaches the GPU's
    memory (``gpuMemory``, the catalog's total per GPU, before the CUDA context takes its
    share) times ``--mem-fraction-static`` (1 when unset: whatever SGLang's default, it is
    below 1). SGLang then raises at memory planning, after minutes of weight loading.
    """
    need = weights_per_gpu_lower_bound(spec=spec, role=role)
    if need is None:
        return []
    acc = role.inputs.accelerator
    assert acc is not None
    gpu = quantity_bytes(acc.gpuMemory)
    flags = parse_flags(list(role.command.args))
    fraction_text = flags.get("mem_fraction_static")
    try:
        fraction = min(1.0, float(fraction_text)) if fraction_text not in (None, False) else 1.0
    except (TypeError, ValueError):
        return []  # extra_args_parse names the value
    budget = int(gpu * fraction)
    if need < budget:
        return []
    tp = role.inputs.parallelism.tp
    fits_at = next((n for n in (2, 4, 8, 16, 32, 64) if n > tp and need * tp // n < budget), None)
    engram = " and the Engram table's shard" if role.inputs.model is not None and role.inputs.model.engram else ""
    share = f" x --mem-fraction-static {fraction:g}" if fraction < 1 else ""
    message = (f"the {role.role} role's weights{engram} take at least {gib(need)} on each GPU ({spec.model.name} at tp "
               f"{tp}), but a {role.inputs.accelerator_name} GPU has {gib(gpu)}{share}: SGLang 0.5.23 refuses at memory "
               "planning after loading the weights (\"Loaded weights leave no GPU memory for the KV cache\", "
               "kv_cache_configurator.py _profile_available_bytes)")
    if fraction < 1 and need < gpu:
        field = flag_field(role, "mem_fraction_static")
        fix = (f"raise --mem-fraction-static well above {need / gpu:.2f} (the weights' share at least; the KV cache "
               f"needs room beyond it), or raise spec.{role.role}.parallelism.tp")
    else:
        field = f"spec.{role.role}.parallelism.tp"
        more = f"tp {fits_at} or more" if fits_at else "a larger tp"
        fix = f"use {more}, or a GPU with more memory" + (", or spec.engram.placement: host" if engram else "")
    return [Problem(field=field, message=message, fix=fix, rule="weights_fit_gpu")]
