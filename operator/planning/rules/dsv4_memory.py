"""DeepSeek-V4.1's SWA pool in cap mode must leave room for the full KV pool: a sound lower bound.

SGLang 0.5.23 sizes a DeepSeek-V4 role's SWA pool from the request cap ("cap mode") when it
knows ``max_running_requests``: the cap's bytes are fixed, taken from the KV budget before
the full pool, and when nothing is left SGLang raises at memory planning, after minutes of
weight loading (sglang/srt/model_executor/pool_configurator.py:1678-1685
``DSV4PoolConfigurator.calculate_pool_sizes``: "The DSV4 SWA pool cap (... tokens, ... GB)
leaves no room for the full KV pool within the available ... GB"). Found by the SGLang
oracle's differential: 9 of 2,486 generated specs (DeepSeek-V4.1-Flash prefill roles whose
weights leave a few GB per GPU, with the default 256 requests and the radix cache's prefix
tails).

The rule refuses only when an UPPER bound of the KV budget is below a LOWER bound of the
cap's fixed bytes, so SGLang surely refuses; every step that is not known exactly is bounded
in the safe direction, and the rule stays silent wherever cap mode is not certain.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import as_int, parse_flags
from ..problems import Problem
from ..sglang_defaults import chunked_prefill_size, mem_fraction_static_upper_bound
from ..structs import RolePlan
from .fields import env_value
from .speculative import dspark_checkpoint_gamma
from .weights import (draft_weights_per_gpu_lower_bound, pre_model_load_memory_upper_bound, weights_bound_slack,
                      weights_per_gpu_lower_bound)

GIB = 1 << 30

#: arg_groups/deepseek_v4_hook.py:138-142 ``apply_deepseek_v4_defaults``: max_running_requests
#: unset becomes 256 for DeepseekV4ForCausalLM. It runs from model_hook.py:258-265
#: (``handle_model_specific_adjustments``, pipeline.py:225), before the speculative hook's 48
#: (speculative_hook.py:852-856, pipeline.py:306), which then finds it set.
DSV4_DEFAULT_MAX_RUNNING_REQUESTS = 256
#: environ.py:730 ``SGLANG_SWA_EVICTION_INTERVAL = EnvInt(128)``.
DEFAULT_SWA_EVICTION_INTERVAL = 128
#: Bytes of one token of a DeepSeek-V4 main (SWA) cache by layout, at most its page stride over
#: the page size (kernels/ops/attention/dsv4/kv_layout.py:50-105 ``data_bytes + scale_bytes``;
#: ``page_bytes`` only pads up). The trtllm backend prices ``attn_head_dim`` instead
#: (pool_configurator.py:1104-1105, 1356-1357): 512 for both catalog models.
LAYOUT_TOKEN_BYTES = {"v4": 576 + 8, "v41": 512 + 16, "v41_new": 512 + 16}
TRTLLM_TOKEN_BYTES = 512

#: Flags under which the cap, the layers on a GPU or the pool configurator are not what this
#: rule restates: the rule stays silent. ``swa_full_tokens_ratio``: ratio mode
#: (pool_configurator.py:1049-1054, 1331-1332); ``enable_encoder_swa_bounded_replay``: the SWA
#: cap is 0 or priced on draft layers only (pool_configurator.py:1200, 1243-1247, 1375-1378);
#: ``pp_size``: a stage holds fewer layers (1118, 1167); ``json_model_override_args`` and
#: ``config``: model or flags the operator does not see; ``enable_hisparse``: HiSparse pools;
#: ``enable_kv_cache_sharding``: a KV pool sharded over attention-TP ranks.
_SILENT_FLAGS = ("swa_full_tokens_ratio", "enable_encoder_swa_bounded_replay", "pp_size",
                 "json_model_override_args", "config", "enable_hisparse", "enable_kv_cache_sharding")

#: Flags that turn the prefill role's radix cache off (or may): the prefix tails are then 0
#: (pool_configurator.py:1315-1317). SGLang 0.5.23 declares disable_radix_cache=True for a
#: DeepSeek-V4 role only from these (attention_hook.py:556-561 --enable-mis, :580-661
#: deterministic inference, also from --rl-on-policy-target; model_hook.py:845-850 embedding
#: mode) besides the PD decode side (pd_disaggregation_hook.py:98-127).
_RADIX_OFF_FLAGS = ("disable_radix_cache", "enable_mis", "enable_deterministic_inference", "rl_on_policy_target",
                    "is_embedding", "prefill_only_disable_kv_cache", "radix_cache_backend")


@dataclass(frozen=True)
class SwaCapBound:
    """A lower bound of the SWA cap SGLang reserves on each GPU of a role in cap mode.

    ``tokens``: cap tokens (page-aligned); ``bytes_per_token``: bytes of one SWA token over the
    role's layers; ``max_running_requests``: the value SGLang runs with; ``prefix_tails``: the
    radix headroom's tails counted.
    """

    tokens: int
    bytes_per_token: float
    max_running_requests: int
    prefix_tails: int

    @property
    def bytes(self) -> int:
        """``tokens x bytes_per_token``, rounded down."""
        return int(self.tokens * self.bytes_per_token)


def _set(flags: dict, dest: str) -> bool:
    value = flags.get(dest)
    if dest == "pp_size":
        return str(value) not in ("None", "1")
    return value not in (None, False)


def _sliding_window(catalog: Catalog, model: str) -> int | None:
    """The model's ``sliding_window`` (kernels/hf-configs/, DeepSeek-V4.1 under ``text_config``)."""
    config = catalog.hf_config(model)
    if not config:
        return None
    text = config.get("text_config") or config
    window = text.get("sliding_window")
    return window if isinstance(window, int) and window > 0 else None


def _attention_dp_upper_bound(role: RolePlan, flags: dict) -> int | None:
    """At least the attention-DP size SGLang runs ``role`` with (the operator's ``--attn-dp-size``, or one
    in extraArgs, or the deprecated ``--enable-dp-attention --dp-size``: parallel_hook.py); None when unreadable."""
    sizes = [max(1, role.inputs.attention_dp)]
    for dest in ("attn_dp_size",) + (("dp_size",) if _set(flags, "enable_dp_attention") else ()):
        if flags.get(dest) is not None:
            size = as_int(flags[dest])
            if size is None or size < 1:
                return None
            sizes.append(size)
    return max(sizes)


def swa_cap_lower_bound(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> SwaCapBound | None:
    """A lower bound of the SWA cap of ``role`` when SGLang 0.5.23 surely sizes its SWA pool in cap mode, else None.

    Cap mode (pool_configurator.py:1328-1351 ``_resolve_swa_cap_tokens``) needs: no operator
    ``--swa-full-tokens-ratio`` (1331, via 1049-1054 ``_operator_swa_full_tokens_ratio``), not the
    unified ring (1333-1335; HIP with SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton only:
    layers/attention/dsv4/unified_kv_gate.py:13-15), a known max_running_requests (1336-1338,
    1141-1145; DeepSeek-V4 defaults it to 256: :data:`DSV4_DEFAULT_MAX_RUNNING_REQUESTS`), a
    sliding window, and on a non-decode role a chunked prefill size above 0 (1339-1343); encoder
    SWA bounded replay (off unless --enable-encoder-swa-bounded-replay, fields/exec_.py:165-169)
    changes the cap (1243-1247). Only DeepSeek-V4.1 (model_type deepseek_v41): for DeepSeek-V4
    the model override declares ``swa_full_tokens_ratio`` 0.1 (model_overrides/deepseek_v4.py:45-49),
    which may count as the operator's ratio (kv_cache_hook.py:415-420), so the rule stays silent.

    The cap (compute_swa_request_cap, pool_configurator.py:924-970, and 1345-1351):
    ``ceil_align(per_request x num_reqs + tail + prefix_tails x (window + page), page)`` with
    ``per_request = window + eviction_interval x draft_tokens + page + decode_alloc`` (937-954),
    ``num_reqs = max(1, max_running_requests // attn_dp)`` (956), ``tail`` = ``chunks_in_flight x
    chunked_prefill_size + page`` off the decode side (963-968) and ``(window + page) x
    extra_slots`` on it (958-961). Bounded below by: ``draft_tokens`` = gamma + 1 for DSpark
    (speculative_hook.py:806-840: blockSize, else numDraftTokens, else the checkpoint's
    ``dspark_block_size``, rules/speculative.py dspark_checkpoint_gamma), at least 2 (848), else 1;
    ``decode_alloc`` = page without speculative decoding (939), else 0; one chunk in flight;
    extra slots 0; the chunk of ``sglang_defaults.chunked_prefill_size`` (memory_hook.py:89-180)
    divided by the attention-DP size (parallel_hook.py:331; kv_shard_hook.py:289-292 only rounds it up). ``prefix_tails`` (1309-1326): ``--swa-prefix-tails`` when given, else
    ``4 x max_running_requests per worker`` with the radix cache on (a PD prefill role without a
    flag of :data:`_RADIX_OFF_FLAGS`; a PD decode role only with
    --disaggregation-decode-enable-radix-cache, pd_disaggregation_hook.py:98-127), else 0.

    Bytes per SWA token (1372-1388 ``_get_bytes_per_swa_token``): the main layout's bytes per
    token (1353-1370, :data:`LAYOUT_TOKEN_BYTES`) x the model's layers (1118, 1167: the
    stage's slice of compress_ratios, num_hidden_layers at pp 1) x (layers + 1) / layers with
    speculative decoding (1250-1257); the c4 compress state term (>= 0) is left out.
    """
    inputs = role.inputs
    model, acc = inputs.model, inputs.accelerator
    if model is None or acc is None or not inputs.is_deepseek_v4 or not model.is_deepseek_v41:
        return None
    if role.layout is None:
        return None
    if role.layout.attention_backend == "trtllm":
        token_bytes = TRTLLM_TOKEN_BYTES
    else:
        token_bytes = LAYOUT_TOKEN_BYTES.get(role.layout.main_layout)
        if token_bytes is None:
            return None
    env = role.command.env_dict()
    if "SGLANG_HACK_FLASHMLA_BACKEND" in env:
        return None  # the unified ring on HIP: no paged SWA cap
    flags = parse_flags(list(role.command.args))
    if any(_set(flags, dest) for dest in _SILENT_FLAGS) or inputs.prefill_cp:
        return None
    window = _sliding_window(catalog, spec.model.name)
    if window is None:
        return None
    page = inputs.page_size

    text = flags.get("max_running_requests")
    mrr = as_int(text) if text is not None else DSV4_DEFAULT_MAX_RUNNING_REQUESTS
    if mrr is None or mrr <= 0:
        return None
    attn_dp = _attention_dp_upper_bound(role, flags)
    if attn_dp is None:
        return None
    per_worker = max(1, mrr // attn_dp)

    decode = role.role == "decode"
    if decode:
        tail = 0
    else:
        chunk = chunked_prefill_size(inputs, flags)
        if chunk is None or chunk <= 0 or chunk // attn_dp <= 0:
            return None  # no chunked prefill (or none left per rank): ratio mode
        tail = chunk // attn_dp + page

    interval = max(1, env_value(role, "SGLANG_SWA_EVICTION_INTERVAL", int, DEFAULT_SWA_EVICTION_INTERVAL))
    sp = spec.speculative
    speculative = sp is not None or flags.get("speculative_algorithm") is not None
    if sp is not None and sp.algorithm == "DSPARK":
        if sp.blockSize is not None:
            gamma = sp.blockSize
        elif sp.numDraftTokens is not None:
            gamma = sp.numDraftTokens - 1
        else:
            gamma = dspark_checkpoint_gamma(spec, catalog) or 1
        draft_tokens = max(2, gamma + 1)
    else:
        draft_tokens = 1
    decode_alloc = 0 if speculative else page
    per_request = window + interval * draft_tokens + page + decode_alloc

    tails_text = flags.get("swa_prefix_tails")
    if tails_text is not None:
        tails = as_int(tails_text)
        if tails is None or tails < 0:
            return None
    elif any(_set(flags, dest) for dest in _RADIX_OFF_FLAGS):
        tails = 0
    elif decode and not _set(flags, "disaggregation_decode_enable_radix_cache"):
        tails = 0
    else:
        tails = 4 * per_worker

    raw = per_request * per_worker + tail + tails * (window + page)
    tokens = -(-raw // page) * page
    layers = model.numLayers
    per_token = token_bytes * layers * ((layers + 1) / layers if sp is not None else 1.0)
    return SwaCapBound(tokens=tokens, bytes_per_token=per_token, max_running_requests=mrr, prefix_tails=tails)


def available_kv_bytes_upper_bound(*, spec: PDDeploymentSpec, role: RolePlan) -> int | None:
    """At least the KV budget SGLang 0.5.23 computes on each GPU of ``role``; None when unknown.

    mem_cache/kv_cache_configurator.py:2990-3060 ``_profile_available_bytes``: the free memory
    after the weights (the least over the ranks, 3000-3004) less ``pre_model_load_memory x (1 -
    mem_fraction_static)`` (3007) and a multimodal reservation (>= 0, 3038). The free memory is at
    most ``pre_model_load_memory`` less the loaded weights (target and draft), and
    ``pre_model_load_memory`` at most ``rules/weights.py pre_model_load_memory_upper_bound`` (the
    catalog's ``gpuMemory`` less ``cudaContextMemory``), so the budget is at most ``free x fraction
    - weights - draft``, with the fraction's upper bound of
    ``sglang_defaults.mem_fraction_static_upper_bound`` and the lower bounds of
    ``rules/weights.py`` for the target's weights and the bundled DSpark draft's.
    """
    weights = weights_per_gpu_lower_bound(spec=spec, role=role)
    free = pre_model_load_memory_upper_bound(role)
    if weights is None or free is None:
        return None
    flags = parse_flags(list(role.command.args))
    fraction = mem_fraction_static_upper_bound(role.inputs, flags, {e.name: e.value for e in role.inputs.spec.env})
    if fraction is None:
        return None
    return int(free * fraction) - weights - draft_weights_per_gpu_lower_bound(spec=spec, role=role)


#: What :func:`available_kv_bytes_upper_bound` and :func:`swa_cap_lower_bound` leave out besides the
#: weights' build variance: the multimodal reservation (kv_cache_configurator.py
#: mm_runtime_reservation_gb, SGLANG_VLM_CACHE_SIZE_MB = 100 for DeepSeek-V4.1's vision tower), the
#: compress-state and SWA-ring pools beside the cap (pool_configurator.py:1648-1666) and the cap's
#: terms bounded below (chunks in flight, the resolved attention DP). Sized from the differential:
#: the widest gap between the bounds and SGLang's figures over the corpus's refusals at this site
#: was 1.43 GB, of which the build variance covered 1.04 GB.
UNMODELLED_BYTES = 512 << 20


def _swa_figures(spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> tuple[SwaCapBound, int] | None:
    """(the cap's lower bound, the KV budget's upper bound) of a role in surely-cap mode, else None."""
    cap = swa_cap_lower_bound(spec=spec, role=role, catalog=catalog)
    if cap is None:
        return None
    available = available_kv_bytes_upper_bound(spec=spec, role=role)
    if available is None or available <= 0:
        return None  # weights_fit_gpu's refusal, or unknown
    return cap, available


def _requests_phrase(role: RolePlan, cap: SwaCapBound) -> str:
    explicit = parse_flags(list(role.command.args)).get("max_running_requests") is not None
    requests = (f"--max-running-requests {cap.max_running_requests}" if explicit else
                f"SGLang's default of {cap.max_running_requests} running requests for DeepSeek-V4 "
                "(deepseek_v4_hook.py apply_deepseek_v4_defaults)")
    tails = (f" and {cap.prefix_tails} radix prefix tails of one window each" if cap.prefix_tails else "")
    return requests + tails


def _swa_fix(role: RolePlan, cap: SwaCapBound) -> str:
    return (f"raise spec.{role.role}.parallelism.tp, or set a lower --max-running-requests "
            f"(below {cap.max_running_requests}) or --swa-prefix-tails in spec.{role.role}.extraArgs, "
            "or use a GPU with more memory")


def dsv4_swa_pool_cap(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Refuse a DeepSeek-V4.1 role whose SWA cap surely leaves no room for the full KV pool.

    Refused when the cap's bytes (:func:`swa_cap_lower_bound`, at least) reach the KV budget
    (:func:`available_kv_bytes_upper_bound`, at most): SGLang's fixed bytes (pool_configurator.py
    1659-1667: the cap's ``_get_swa_fixed_bytes``, 1448-1455, plus state pools >= 0) then take the
    whole budget, ``full_token`` is 0 and SGLang raises (1678-1685). A budget at or below 0 is
    ``weights_fit_gpu``'s refusal and is left to it.
    """
    figures = _swa_figures(spec, role, catalog)
    if figures is None or figures[0].bytes < figures[1]:
        return []
    cap, available = figures
    inputs = role.inputs
    message = (f"the {role.role} role's SWA pool cap ({_requests_phrase(role, cap)}) takes at least {cap.tokens} "
               f"tokens, {cap.bytes / GIB:.2f} GiB on each GPU, but at most {available / GIB:.2f} GiB is left for the "
               f"KV cache once {spec.model.name}'s weights are loaded at tp {inputs.parallelism.tp} on a "
               f"{inputs.accelerator_name} GPU: SGLang 0.5.23 refuses at memory planning after loading the weights "
               "(\"The DSV4 SWA pool cap ... leaves no room for the full KV pool\", pool_configurator.py "
               "DSV4PoolConfigurator.calculate_pool_sizes)")
    return [Problem(field=f"spec.{role.role}.parallelism.tp", message=message, fix=_swa_fix(role, cap),
                    rule="dsv4_swa_pool_cap")]


def dsv4_swa_pool_cap_margin(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Refuse a DeepSeek-V4.1 role whose SWA cap comes within the bounds' own slack of the KV budget.

    :func:`dsv4_swa_pool_cap` refuses only what SGLang surely refuses. Between its two bounds lie
    bytes the operator cannot know before SGLang builds the model: the weights' build variance
    (rules/weights.py ``weights_bound_slack``) and :data:`UNMODELLED_BYTES`. When the cap's lower
    bound plus that slack reaches the budget's upper bound, SGLang 0.5.23 may start the role with
    a nearly empty full KV pool or refuse it at memory planning (pool_configurator.py:1678-1685)
    after minutes of weight loading; the operator refuses it rather than guess. Stricter than
    SGLang on purpose (tests/contract/stricter_by_design.yaml); the in-cluster SGLang oracle
    judges such a spec exactly.
    """
    figures = _swa_figures(spec, role, catalog)
    if figures is None or figures[0].bytes >= figures[1]:
        return []  # out of cap mode, or dsv4_swa_pool_cap's sure refusal
    cap, available = figures
    slack = weights_bound_slack(spec=spec, role=role) + UNMODELLED_BYTES
    if cap.bytes + slack < available:
        return []
    inputs = role.inputs
    message = (f"the {role.role} role's SWA pool cap ({_requests_phrase(role, cap)}) takes at least "
               f"{cap.bytes / GIB:.2f} GiB on each GPU and at most {available / GIB:.2f} GiB is left for the KV cache "
               f"once {spec.model.name}'s weights are loaded at tp {inputs.parallelism.tp} on a "
               f"{inputs.accelerator_name} GPU: within {slack / GIB:.2f} GiB, which the operator cannot know before "
               "SGLang builds the model (the weights' build variance, the multimodal reservation, the state pools). "
               "SGLang 0.5.23 may refuse it at memory planning after loading the weights (\"The DSV4 SWA pool cap ... "
               "leaves no room for the full KV pool\") or start it with almost no full KV pool; the operator refuses "
               "within this margin")
    return [Problem(field=f"spec.{role.role}.parallelism.tp", message=message, fix=_swa_fix(role, cap),
                    rule="dsv4_swa_pool_cap_margin")]
