"""HiCache rules: what SGLang 0.5.23 refuses with a hierarchical cache, and Mooncake Store settings.

Sources (sglang 0.5.23): ``arg_groups/pd_disaggregation_hook.py`` (with
``--disaggregation-decode-allocation-policy prefill_complete``, "prefill HiCache other than
L2 write_back" and "decode ... HiCache" are unsupported), ``arg_groups/kv_cache_hook.py``
(``--enable-hierarchical-cache`` and ``--disable-radix-cache`` are mutually exclusive;
decode offload needs a storage backend and excludes ``--disaggregation-decode-retraction-
backup host_pool``), ``arg_groups/kv_shard_hook.py`` (``--enable-kv-cache-sharding`` with a
storage backend is refused). Mooncake's MC_FORCE_TCP turns RDMA off for every Mooncake
engine of the process, the store's included.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..hicache import hicache_spec, storage_backend
from ..structs import RolePlan
from ..problems import Problem


def _renders_hicache(spec: PDDeploymentSpec, role: RolePlan) -> bool:
    hc = hicache_spec(spec)
    return hc is not None and (role.role == "prefill" or hc.decodeOffload)


def hicache_allocation_policy(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """prefill_complete allows only an L2 write_back HiCache on prefill and none on decode."""
    hc = hicache_spec(spec)
    if hc is None or spec.disaggregation.decodeAllocationPolicy != "prefill_complete" or role.role != "prefill":
        return []
    if hc.storage.backend == "none" and hc.writePolicy == "write_back" and not hc.decodeOffload:
        return []
    return [
        Problem(
            field="spec.kvCache.hicache",
            message=(
                "--disaggregation-decode-allocation-policy prefill_complete does not support prefill HiCache other "
                "than L2 write_back, nor decode HiCache offload"
            ),
            fix="use decodeAllocationPolicy: early, or HiCache with writePolicy: write_back and storage backend none",
            rule="hicache_allocation_policy",
        )
    ]


def hicache_extra_args(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """extraArgs that SGLang refuses together with the rendered HiCache flags.

    Sources: arg_groups/hicache_hook.py (radix cache, KV cache sharding, the decode host
    pool; ``resolve_hicache_dcp_compatibility``: with --dcp-size > 1 only DSPARK
    speculative decoding and MLA models).
    """
    if not _renders_hicache(spec, role):
        return []
    flags = parse_flags(role.inputs.spec.extraArgs)
    field = f"spec.{role.role}.extraArgs"
    problems = []
    if role.role == "prefill" and flags.get("disable_radix_cache") not in (None, False):
        problems.append(Problem(
            field=field, message="--disable-radix-cache cannot be combined with HiCache (--enable-hierarchical-cache)",
            fix="remove --disable-radix-cache or spec.kvCache.hicache", rule="hicache_extra_args",
        ))  # fmt: skip
    if storage_backend(spec) is not None and flags.get("enable_kv_cache_sharding") not in (None, False):
        problems.append(Problem(
            field=field, message="--enable-kv-cache-sharding does not support a HiCache storage backend yet",
            fix="remove --enable-kv-cache-sharding or set kvCache.hicache.storage.backend: none",
            rule="hicache_extra_args",
        ))  # fmt: skip
    if role.inputs.decode_cp > 1:
        if spec.speculative is not None and spec.speculative.algorithm != "DSPARK":
            problems.append(Problem(
                field=field, message=f"HiCache with --dcp-size > 1 supports only DSPARK speculative decoding, not "
                f"{spec.speculative.algorithm} (hicache_hook.resolve_hicache_dcp_compatibility)",
                fix="remove --dcp-size, use DSPARK, or remove spec.kvCache.hicache", rule="hicache_extra_args",
            ))  # fmt: skip
        if role.inputs.model is not None and not role.inputs.model.mla:
            problems.append(Problem(
                field=field, message="HiCache with --dcp-size > 1 is only supported for MLA models (the index "
                "translation lives in the MLA host pool)", fix="remove --dcp-size or spec.kvCache.hicache",
                rule="hicache_extra_args",
            ))  # fmt: skip
    if role.role == "decode" and flags.get("disaggregation_decode_retraction_backup") == "host_pool":
        problems.append(Problem(
            field=field,
            message="--disaggregation-decode-retraction-backup host_pool and decode HiCache offload both build a "
            "decode host pool; SGLang refuses the pair",
            fix="remove the retraction backup flag or kvCache.hicache.decodeOffload", rule="hicache_extra_args",
        ))  # fmt: skip
    return problems


def hicache_store_protocol(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """An explicit rdma store protocol does not survive MC_FORCE_TCP, and needs RDMA NICs."""
    hc = hicache_spec(spec)
    mc = hc.storage.mooncake if hc is not None and hc.storage.backend == "mooncake" else None
    if mc is None or mc.protocol != "rdma":
        return []
    if spec.transfer.forceTCP:
        return [
            Problem(
                field="spec.kvCache.hicache.storage.mooncake.protocol",
                message="transfer.forceTCP sets MC_FORCE_TCP=1, which makes the Mooncake Store use TCP as well",
                fix="remove protocol (it follows the transfer) or set protocol: tcp",
                rule="hicache_store_protocol",
                severity="warning",
            )
        ]
    if spec.transfer.backend == "fake" or not (prefill.transfer and prefill.transfer.devices):
        return [
            Problem(
                field="spec.kvCache.hicache.storage.mooncake.protocol",
                message="the Mooncake Store is set to rdma but the pods get no RDMA NICs "
                f"(transfer backend {spec.transfer.backend})",
                fix="remove protocol (tcp is then used) or use an RDMA transfer backend",
                rule="hicache_store_protocol",
                severity="warning",
            )
        ]
    return []

