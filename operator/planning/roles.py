"""Resolve each role's settings from the shared spec and the role's overrides.

A role (prefill or decode) takes the spec-level accelerator, KV layout, runtime and
Paged Experts settings unless the role overrides them. The result, :class:`RoleInputs`,
is what every rule reads and what the SGLang arguments are built from. Catalog lookups
that fail are recorded as ``None`` here; the rules turn them into problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api.v1alpha1 import (
    KVLayoutSpec,
    ParallelismSpec,
    PDDeploymentSpec,
    RoleSpec,
    RuntimeSpec,
)
from ..catalog import Accelerator, Catalog, KernelPlugin, ModelFacts
from .features import parse_flags

Role = Literal["prefill", "decode"]
DSV4_PAGE_SIZE = 256


def _int_flag(args: list[str], dest: str, default: int) -> int:
    """The integer value SGLang's ``dest`` gets from an argument list (any alias, ``--f N`` or ``--f=N``)."""
    value = parse_flags(args).get(dest)
    try:
        number = int(value) if value is not None else default
    except (TypeError, ValueError):
        return default
    return number if number >= 1 else default  # a width below 1 is refused by SGLang's parser checks


ROLES: tuple[Role, Role] = ("prefill", "decode")


@dataclass(frozen=True)
class RoleInputs:
    """One role's settings after overrides, with catalog entries looked up.

    ``accelerator_field`` is the spec path the accelerator came from (for problems);
    ``plugin`` is the catalog entry of the vendor plugin when this role renders it
    (plugins cover decode steps only, so prefill never does).
    """

    role: Role
    spec: RoleSpec
    accelerator_name: str
    accelerator_field: str
    accelerator: Accelerator | None
    kv_layout: KVLayoutSpec
    kv_layout_field: str
    runtime: RuntimeSpec
    parallelism: ParallelismSpec
    paged_experts_k: int | None
    paged_experts_field: str
    plugin_name: str
    plugin: KernelPlugin | None
    model: ModelFacts | None
    speculative_algorithm: str | None = None

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica uses: tp x pp x (dp when DP attention is off), per SGLang's process layout.

        Source: sglang 0.5.23 entrypoints/engine.py places tp x pp schedulers per engine
        (``_calculate_rank_ranges``); the DP controller (managers/data_parallel_controller.py)
        starts each system-DP replica tp x pp GPUs further. ``--pp-size`` comes from extraArgs.
        """
        p = self.parallelism
        return p.tp * self.pipeline_parallel * (1 if p.dpAttention else p.dp)

    @property
    def nodes(self) -> int:
        """Nodes one replica spans (``parallelism.nodes``; ``--nnodes``): its pods, one per node."""
        return self.parallelism.nodes

    @property
    def multi_node(self) -> bool:
        """A replica spans more than one node (a LeaderWorkerSet group instead of one Deployment pod)."""
        return self.parallelism.nodes > 1

    @property
    def gpus_per_pod(self) -> int:
        """GPUs one pod of the role requests: the replica's GPUs over its nodes (at least 1).

        Source: sglang 0.5.23 entrypoints/engine.py ``_calculate_rank_ranges`` gives node k
        tp x pp / nnodes schedulers (TP ranks [k*tp/N, (k+1)*tp/N) when pp is 1), one GPU
        each; check_server_args requires (tp x pp) % nnodes == 0 (rules/multinode.py).
        """
        return max(1, self.gpus_per_replica // self.nodes)

    @property
    def pipeline_parallel(self) -> int:
        """``--pp-size`` (or its alias) in extraArgs, 1 when absent."""
        return _int_flag(self.spec.extraArgs, "pp_size", 1)

    @property
    def attention_dp(self) -> int:
        """Attention DP size: dp with DP attention on, else 1 (runtime_context attn_dp_size)."""
        return self.parallelism.dp if self.parallelism.dpAttention else 1

    @property
    def prefill_cp(self) -> bool:
        """``--enable-prefill-cp`` is in extraArgs."""
        return parse_flags(self.spec.extraArgs).get("enable_prefill_cp") not in (None, False)

    @property
    def attention_cp(self) -> int:
        """Attention CP size: ``--attn-cp-size`` (or its alias) in extraArgs, 1 when absent.

        For DeepSeek-V4 models with ``--enable-prefill-cp``, SGLang sets it to
        tp / attention DP whatever the flag says (deepseek_v4_hook.validate_deepseek_v4_cp).
        """
        if self.prefill_cp and self.is_deepseek_v4:
            return max(1, self.parallelism.tp // self.attention_dp)
        return _int_flag(self.spec.extraArgs, "attn_cp_size", 1)

    @property
    def decode_cp(self) -> int:
        """Decode context parallel size from ``--dcp-size`` (or its alias) in extraArgs (1 when absent)."""
        return _int_flag(self.spec.extraArgs, "dcp_size", 1)

    @property
    def attention_tp(self) -> int:
        """Attention TP size = tp / attention DP / attention CP (runtime_context.derive_attn_tp_size)."""
        return max(1, self.parallelism.tp // self.attention_dp // self.attention_cp)

    @property
    def page_size(self) -> int:
        """The page size SGLang will use, after its own overrides.

        - DeepSeek-V4 models: 256 on CUDA and HIP. Source: sglang 0.5.23
          arg_groups/model_overrides/deepseek_v4.py declares page_size 256 (declarations
          win over --page-size) and the DeepSeek-V4 pool asserts "In paged swa mode,
          page_size must be 256" (kv_cache_configurator.py).
        - Models without MLA whose attention backend is (or SGLang picks) ``trtllm_mha``:
          16, 32, 64 or 128, anything else becomes 64; ``fa4`` on SM100: 128
          (arg_groups/overrides.py ``_mla_backend_page_constraints``, ``_fa4_page_constraint``).
          SGLang picks ``trtllm_mha`` for an MHA model on SM100/SM103 when no backend is set
          and speculative decoding is off or runs with top-k 1
          (model_override_base.py ``get_default_attn_backend``).
        - Otherwise the spec's pageSize.
        The SGLang oracle reports the page size SGLang resolves; the differential test
        compares.
        """
        if self.is_deepseek_v4:
            return DSV4_PAGE_SIZE
        declared = self.kv_layout.pageSize
        if self.model is None or self.model.mla or self.accelerator is None:
            return declared
        backend = self.mha_attention_backend
        if backend == "trtllm_mha":
            return declared if declared in (16, 32, 64, 128) else 64
        if backend == "fa4" and self.accelerator.is_blackwell:
            return 128
        return declared

    @property
    def mha_attention_backend(self) -> str | None:
        """The attention backend of an MHA model: extraArgs' ``--attention-backend`` (or the decode /
        prefill ones), else the one SGLang 0.5.23 picks on SM100/SM103 (``trtllm_mha``), else None.

        Source: arg_groups/model_override_base.py get_default_attn_backend (1.2: trtllm_mha on
        SM100/SM103 without speculative decoding or with top-k 1).
        """
        flags = parse_flags(self.spec.extraArgs)
        for key in ("attention_backend", "decode_attention_backend", "prefill_attention_backend"):
            if flags.get(key) not in (None, True, False):
                return str(flags[key])
        if self.accelerator is None or not self.accelerator.is_blackwell:
            return None
        topk = flags.get("speculative_eagle_topk")
        if self.speculative_algorithm is None or str(topk) == "1":
            return "trtllm_mha"
        return None

    @property
    def is_deepseek_v4(self) -> bool:
        """The model is served by SGLang's DeepSeek-V4 family code (its KV layouts apply)."""
        return self.model is not None and self.model.architecture == "DeepseekV4ForCausalLM"


def resolve_role(*, spec: PDDeploymentSpec, role: Role, catalog: Catalog) -> RoleInputs:
    """Merge ``spec.<role>`` overrides over the shared spec and look up catalog entries."""
    rs: RoleSpec = getattr(spec, role)
    acc_name = rs.accelerator or spec.accelerator
    acc_field = f"spec.{role}.accelerator" if rs.accelerator else "spec.accelerator"
    paged = rs.pagedExperts or spec.pagedExperts
    paged_field = f"spec.{role}.pagedExperts" if rs.pagedExperts else "spec.pagedExperts"
    plugin_name = spec.kernels.plugin
    plugin = catalog.plugin(plugin_name) if plugin_name != "none" else None
    renders_plugin = plugin is not None and role in plugin.roles
    return RoleInputs(
        role=role,
        spec=rs,
        accelerator_name=acc_name,
        accelerator_field=acc_field,
        accelerator=catalog.accelerator(acc_name),
        kv_layout=rs.kvLayout or spec.kvLayout,
        kv_layout_field=f"spec.{role}.kvLayout" if rs.kvLayout else "spec.kvLayout",
        runtime=spec.runtime,
        parallelism=rs.parallelism,
        paged_experts_k=paged.residentExperts if paged else None,
        paged_experts_field=paged_field,
        plugin_name=plugin_name if renders_plugin else "none",
        plugin=plugin if renders_plugin else None,
        model=catalog.model(spec.model.name),
        speculative_algorithm=spec.speculative.algorithm if spec.speculative else None,
    )
