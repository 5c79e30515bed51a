"""The rules: pure functions, one rule each, returning every problem with field, reason and fix.

Role rules take ``(*, spec, role, catalog)`` and run once per role; pair rules take
``(*, spec, prefill, decode)`` and compare the roles. ``run_all_rules`` runs all of
them and returns every problem, in a stable order, never just the first.
"""

from __future__ import annotations

from typing import Callable

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..structs import RolePlan
from ..problems import Problem
from . import (args, autoscaling, deepseek_v4, dsv4_memory, engram, handshake, kv, kvcache, moe, multinode, paged_experts, parallel, placement,
               plugins, runtime, speculative, transfer, updates, weights)

ROLE_RULES: tuple[Callable[..., list[Problem]], ...] = (
    placement.accelerator_known,
    placement.replica_fits_node,
    placement.replica_fits_nvlink_clique,
    *multinode.ROLE_RULES,
    placement.parallelism_consistent,
    placement.parallelism_divides_model,
    placement.memory_fits_node,
    weights.weights_fit_gpu,
    dsv4_memory.dsv4_swa_pool_cap,
    dsv4_memory.dsv4_swa_pool_cap_margin,
    kv.kv_layout_predictable,
    kv.kv_layout_servable,
    kv.dsv4_kv_dtype_gpu_pool,
    kv.page_size_overridden,
    deepseek_v4.dsv4_page_size,
    deepseek_v4.dsv4_allocation_policy,
    deepseek_v4.dsv4_speculative_algorithm,
    deepseek_v4.dspark_pd_requirements,
    deepseek_v4.dsv41_unsupported_features,
    deepseek_v4.dsv41_vision_parallelism,
    *speculative.ROLE_RULES,
    *moe.ROLE_RULES,
    *parallel.ROLE_RULES,
    handshake.prefill_complete_requirements,
    handshake.bootstrap_port_free,
    args.extra_args_not_managed,
    args.extra_args_parse,
    args.env_not_managed,
    args.env_names_unique,
    args.visible_devices_cover_pod,
    args.chunked_prefill_page_aligned,
    args.priority_scheduling_policy,
    plugins.plugin_in_catalog,
    plugins.plugin_matches_gpu,
    plugins.plugin_tp_size,
    plugins.plugin_model,
    plugins.plugin_features,
    plugins.plugin_no_weight_updates,
    plugins.one_plugin_flag,
    paged_experts.paged_experts_single_gpu,
    paged_experts.paged_experts_flags,
    paged_experts.paged_experts_moe_method,
    paged_experts.paged_experts_resident_count,
    paged_experts.paged_experts_host_memory,
    engram.engram_model,
    engram.engram_peer_shards,
    engram.engram_memory,
    transfer.transfer_backend_vendor,
    transfer.transfer_devices_exist,
    transfer.transfer_rail_class_known,
    transfer.transfer_numa_local,
    transfer.transfer_nixl_devices,
    transfer.transfer_mori_devices,
    transfer.staging_buffer_requirements,
    transfer.staging_buffer_non_mla,
    transfer.mooncake_thread_pool_queue_size,
    transfer.mooncake_failed_session_probe,
    kvcache.hicache_allocation_policy,
    kvcache.hicache_extra_args,
)

PAIR_RULES: tuple[Callable[..., list[Problem]], ...] = (
    kv.kv_layouts_match,
    kv.kv_layout_overridden,
    handshake.must_equal_fields,
    handshake.dspark_attention_tp_equal,
    handshake.mxfp8_attention_tp_equal,
    transfer.transfer_tcp_fallback,
    transfer.transfer_rails_reach,
    transfer.transfer_force_tcp_backend,
    kvcache.hicache_store_protocol,
    *speculative.PAIR_RULES,
    *moe.PAIR_RULES,
    *parallel.PAIR_RULES,
    updates.in_place_update_surges,
    runtime.image_tag_matches_version,
    autoscaling.autoscaling_budget_fits,
)


def run_all_rules(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan, catalog: Catalog) -> list[Problem]:
    """Every problem of every rule, deduplicated, errors before warnings, then by field."""
    found: list[Problem] = []
    for role in (prefill, decode):
        for rule in ROLE_RULES:
            found += rule(spec=spec, role=role, catalog=catalog)
    for rule in PAIR_RULES:
        found += rule(spec=spec, prefill=prefill, decode=decode)
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda p: (p.severity != "error", p.field))
