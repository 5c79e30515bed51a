"""The weights must leave GPU memory for the KV cache: a lower bound SGLang's memory planning cannot beat.

Source: sglang 0.5.23 mem_cache/kv_cache_configurator.py ``_profile_available_bytes``
(line 3050): after the weights load, the KV budget is the GPU's free memory less
``pre_model_load_memory * (1 - mem_fraction_static)``; when nothing is left SGLang raises
"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=...".
Found by the SGLang oracle's memory stage (issue 23): 19 of the 32 startup-depth false
accepts of 300 generated specs were this refusal, each with weights above the whole GPU.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..memory import gib, quantity_bytes
from ..problems import Problem
from ..sglang_defaults import decode_graph_max_bs_lower_bound, mem_fraction_static_upper_bound
from ..structs import RolePlan
from .fields import flag_field

#: Flags under which the bytes on a GPU are not the model build's at tp 1 divided by tp
#: (weights on the host, another dtype or quantization, a pipeline stage's share of the
#: layers): the rule stays silent and leaves them to the SGLang oracle.
_OTHER_WEIGHTS = ("cpu_offload_gb", "offload_group_size", "offload_num_in_group", "offload_mode",
                  "quantization", "dtype", "pp_size", "load_format", "json_model_override_args")


#: The catalog's figures are SGLang's build under its default options; other KV layouts, MoE
#: runners and attention backends hold a little less on a GPU (up to 0.5 % in the differential's
#: corpus: DeepSeek-V4.1 with FP4 compressed KV under flashmla_mega; flashmla_mega itself adds a
#: 512 MiB workspace on SM100/SM103). The bound takes this fraction off the model's bytes;
#: tests/contract/test_oracle_differential.py test_weights_lower_bound_holds holds it to every build.
BUILD_VARIANCE = 0.01


def _set(flags: dict, dest: str) -> bool:
    """``dest`` is given a value that changes the weights on a GPU (pp size 1 does not)."""
    value = flags.get(dest)
    if dest == "pp_size":
        return str(value) not in ("None", "1")
    return value not in (None, False, "auto", "0", 0)


def _split_lower_bound(device: Mapping[str, int], replicated: Mapping[str, int], attention: Mapping[str, int],
                       isa: str, tp: int, attention_tp: int, lm_head: int = 0) -> int | None:
    """Bytes at least on one GPU of a build whose tp-1 figure is ``device[isa]``: what every GPU holds
    whole (``replicated``), plus what attention DP splits over the attention-TP group only
    (``attention``, when ``attention_tp`` < ``tp``), plus the rest split over ``tp``; None without
    ``device[isa]``. ``lm_head``: more bytes split like ``attention`` (the LM head under
    --enable-dp-lm-head). Figures missing for ``isa`` count 0, which only lowers the bound."""
    at_tp1 = device.get(isa)
    if at_tp1 is None:
        return None
    whole = min(at_tp1, replicated.get(isa, 0))
    attn = min(at_tp1 - whole, attention.get(isa, 0) + lm_head) if attention_tp < tp else 0
    return whole + attn // max(1, attention_tp) + (at_tp1 - whole - attn) // tp


def _tp_and_attention_tp(role: RolePlan) -> tuple[int, int]:
    """(tp, the attention-TP size at most): tp over the operator's attention DP; attention CP only
    shrinks it further (roles.py attention_tp), which only adds bytes."""
    tp = max(1, role.inputs.parallelism.tp)
    return tp, max(1, tp // max(1, role.inputs.attention_dp))


def _target_split(role: RolePlan, flags: Mapping[str, Any]) -> int | None:
    """:func:`_split_lower_bound` of the target model's catalog figures on ``role`` (its TP, its attention-TP,
    the LM head's bytes under --enable-dp-lm-head), before :data:`BUILD_VARIANCE`; None without the figure.
    ``role`` has a model and an accelerator."""
    model, acc = role.inputs.model, role.inputs.accelerator
    assert model is not None and acc is not None
    tp, attention_tp = _tp_and_attention_tp(role)
    lm_head = model.lmHeadWeightBytes if _set(flags, "enable_dp_lm_head") else 0
    return _split_lower_bound(model.deviceWeightBytes, model.replicatedWeightBytes, model.attentionWeightBytes,
                              acc.isa, tp, attention_tp, lm_head)


def weights_per_gpu_lower_bound(*, spec: PDDeploymentSpec, role: RolePlan) -> int | None:
    """Bytes at least on each GPU of ``role`` once the target model's weights load, or None when unknown.

    ``replicated + attention / attention_tp + (deviceWeightBytes[isa] - replicated - attention) / tp``
    (the catalog's figures of SGLang's own model build at tp 1, of what it holds whole on every GPU,
    and of what attention DP splits over the attention-TP group only, kernels/models.yaml; the
    attention term only under attention DP, with the LM head's ``lmHeadWeightBytes`` under
    --enable-dp-lm-head): less :data:`BUILD_VARIANCE` of it (options other than
    the default build's hold a little less); every weight is split over at most the TP group,
    never over more (``--moe-dense-tp-size``, redundant experts and a draft only add), plus
    the Engram table's TP shard on a model with one (SGLang's default device table and
    peer shards alike: layers/engram.py shard_range; the catalog figure is measured with
    it and the table subtracted, so the sum is what was measured; an even share, which the
    rank holding the most rows reaches at least, and SGLang plans with the least free memory
    of the TP group), nothing for the Engram host table (host memory registered with CUDA,
    layers/engram.py _HostTable). None without the catalog figure, with Paged Experts
    (experts live on the host), or a flag in :data:`_OTHER_WEIGHTS`.
    """
    model, acc = role.inputs.model, role.inputs.accelerator
    if model is None or acc is None or role.inputs.paged_experts_k is not None:
        return None
    flags = parse_flags(list(role.command.args))
    if any(_set(flags, dest) for dest in _OTHER_WEIGHTS):
        return None
    split = _target_split(role, flags)
    if split is None:
        return None
    tp = _tp_and_attention_tp(role)[0]
    total = int(split * (1 - BUILD_VARIANCE))
    if model.engram:
        placement = spec.engram.placement if spec.engram is not None else "device"
        if placement != "host":  # the host table is registered host memory, not a GPU's
            if not model.engramTableBytes:
                return None
            total += model.engramTableBytes // tp
    return total


#: Flags that give the DSpark draft other weights than the checkpoint's bundled head: the
#: draft bound is then 0.
_OTHER_DRAFT = ("speculative_draft_model_path", "speculative_draft_model_quantization", "speculative_draft_load_format",
                "speculative_draft_model_revision")


def draft_weights_per_gpu_lower_bound(*, spec: PDDeploymentSpec, role: RolePlan) -> int:
    """Bytes at least on each GPU of ``role`` for the DSpark draft the checkpoint bundles; 0 when none is known.

    SGLang 0.5.23 counts the draft's weights in the KV budget (kv_cache_configurator.py
    ``_profile_available_bytes``: "If using speculative decoding, draft weights are now counted").
    The catalog's ``dsparkDraftWeightBytes`` (measured by the SGLang oracle's speculative stage)
    under the same split as :func:`weights_per_gpu_lower_bound`, less :data:`BUILD_VARIANCE`.
    Only for ``spec.speculative.algorithm: DSPARK`` with the bundled draft
    (``dsparkDraftBundled``, no ``draftModelPath``, no flag of :data:`_OTHER_DRAFT` or
    :data:`_OTHER_WEIGHTS`); anything else counts 0, which only lowers the bound.
    """
    sp, model, acc = spec.speculative, role.inputs.model, role.inputs.accelerator
    if sp is None or sp.algorithm != "DSPARK" or sp.draftModelPath or model is None or acc is None:
        return 0
    figures = model.dsparkDraftWeightBytes
    if not model.dsparkDraftBundled or figures is None:
        return 0
    flags = parse_flags(list(role.command.args))
    if any(_set(flags, dest) for dest in _OTHER_WEIGHTS + _OTHER_DRAFT):
        return 0
    tp, attention_tp = _tp_and_attention_tp(role)
    split = _split_lower_bound(figures.deviceWeightBytes, figures.replicatedWeightBytes, figures.attentionWeightBytes,
                               acc.isa, tp, attention_tp)
    return int((split or 0) * (1 - BUILD_VARIANCE))


def weights_bound_slack(*, spec: PDDeploymentSpec, role: RolePlan) -> int:
    """Bytes :func:`weights_per_gpu_lower_bound` and :func:`draft_weights_per_gpu_lower_bound` take
    off the catalog's figures (:data:`BUILD_VARIANCE` of each split): how far under SGLang's build
    the two bounds may sit. 0 when neither bound is known."""
    if weights_per_gpu_lower_bound(spec=spec, role=role) is None:  # also None without a model or accelerator
        return 0
    split = _target_split(role, parse_flags(list(role.command.args))) or 0
    draft = draft_weights_per_gpu_lower_bound(spec=spec, role=role)
    return int(split * BUILD_VARIANCE + draft * BUILD_VARIANCE / (1 - BUILD_VARIANCE))


def pre_model_load_memory_upper_bound(role: RolePlan) -> int | None:
    """Bytes at most free on one GPU of ``role`` before the weights load (SGLang's
    ``pre_model_load_memory``, bootstrap.measure_pre_model_load_memory: torch.cuda.mem_get_info):
    the catalog's ``gpuMemory`` less its ``cudaContextMemory``; None without an accelerator."""
    acc = role.inputs.accelerator
    if acc is None:
        return None
    return quantity_bytes(acc.gpuMemory) - quantity_bytes(acc.cudaContextMemory)


def weights_fit_gpu(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Refuse a role whose weights alone fill its GPUs' static memory share.

    Refused when the lower bound of :func:`weights_per_gpu_lower_bound` plus the DSpark draft's
    (:func:`draft_weights_per_gpu_lower_bound`) reaches the GPU's memory free before the weights
    (:func:`pre_model_load_memory_upper_bound`: ``gpuMemory`` less ``cudaContextMemory``) times the
    fraction of :func:`~..sglang_defaults.mem_fraction_static_upper_bound`:
    ``--mem-fraction-static`` when set, else at least SGLang's own default for the role
    (memory_hook.py ``handle_gpu_memory_settings``). SGLang then raises at memory planning,
    after minutes of weight loading.
    """
    need = weights_per_gpu_lower_bound(spec=spec, role=role)
    gpu = pre_model_load_memory_upper_bound(role)
    if need is None or gpu is None:
        return []
    draft = draft_weights_per_gpu_lower_bound(spec=spec, role=role)
    need += draft
    flags = parse_flags(list(role.command.args))
    fraction = mem_fraction_static_upper_bound(role.inputs, flags, {e.name: e.value for e in role.inputs.spec.env})
    if fraction is None:
        return []
    explicit = flags.get("mem_fraction_static") is not None
    budget = int(gpu * fraction)
    if need < budget:
        return []
    tp = role.inputs.parallelism.tp
    fits_at = next((n for n in (2, 4, 8, 16, 32, 64) if n > tp and need * tp // n < budget), None)
    on_gpu = spec.engram is None or spec.engram.placement != "host"
    engram = " and the Engram table's shard" if role.inputs.model is not None and role.inputs.model.engram and on_gpu else ""
    if draft:
        engram += " and the DSpark draft's"
    if explicit:
        share = f" x --mem-fraction-static {fraction:g}" if fraction < 1 else ""
    else:
        share = (f" x SGLang's default --mem-fraction-static for this role, at most {fraction:.3f} (the GPU less "
                 "its reserve for activations and CUDA graphs: memory_hook.py handle_gpu_memory_settings)")
    message = (f"the {role.role} role's weights{engram} take at least {gib(need)} on each GPU ({spec.model.name} at tp "
               f"{tp}), but a {role.inputs.accelerator_name} GPU has {gib(gpu)} free before they load (its memory less "
               f"{role.inputs.accelerator.cudaContextMemory} for the driver and CUDA context){share}: SGLang 0.5.23 refuses at memory "
               "planning after loading the weights (\"Loaded weights leave no GPU memory for the KV cache\", "
               "kv_cache_configurator.py _profile_available_bytes)")
    more = f"tp {fits_at} or more" if fits_at else "a larger tp"
    if explicit and fraction < 1 and need < gpu:
        field = flag_field(role, "mem_fraction_static")
        fix = (f"raise --mem-fraction-static well above {need / gpu:.2f} (the weights' share at least; the KV cache "
               f"needs room beyond it), or raise spec.{role.role}.parallelism.tp")
    else:
        field = f"spec.{role.role}.parallelism.tp"
        fix = f"use {more}, or a GPU with more memory" + (", or spec.engram.placement: host" if engram else "")
        if not explicit and need < gpu:
            fix += (f"; or set --mem-fraction-static in spec.{role.role}.extraArgs well above {need / gpu:.2f}, "
                    "which takes GPU memory from activations and CUDA graphs")
    max_bs = decode_graph_max_bs_lower_bound(role.inputs, flags)
    if not explicit and max_bs and role.inputs.attention_dp > 1 and fraction < 0.5:
        field = f"spec.{role.role}.parallelism.dp"
        message += (f"; SGLang's default fraction reserves the decode CUDA graphs' padding for attention DP, "
                    f"at least {max_bs} batch x {role.inputs.attention_dp} DP ranks x 3 MiB (memory_hook.py "
                    "reserve_for_graph_mb)")
        fix = (f"set a smaller --cuda-graph-max-bs-decode or --max-running-requests in spec.{role.role}.extraArgs "
               f"(the graphs' batch is {max_bs}), or a smaller spec.{role.role}.parallelism.dp")
    return [Problem(field=field, message=message, fix=fix, rule="weights_fit_gpu")]
