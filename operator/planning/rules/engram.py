"""Engram placement rules (DeepSeek-V4.1).

Source: sglang 0.5.23 layers/engram.py ``EngramEmbedding``: by default (``device``) the
table's rows are sharded over the TP group in device memory; with
SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 (``host``) one shared copy per node lives in host
memory; SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS=1 (``peerShards``) splits the rows over the
GPUs and each reads its peers' rows over NVLink, but only when tp > 1 and the device is
CUDA: elsewhere the variable is ignored and the default TP-sharded device table is used.
Seed 004 (SGLang vs DeepInfer) describes the three placements.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..structs import RolePlan
from ..problems import Problem


def _no_engram(role: RolePlan) -> bool:
    """The model is known to have no Engram table (engram_model warns; nothing else applies)."""
    return role.inputs.model is not None and not role.inputs.model.engram


def engram_model(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Engram placement is meaningful only for a model with an Engram table (DeepSeek-V4.1)."""
    model = role.inputs.model
    if spec.engram is None or role.role != "prefill" or model is None or model.engram:
        return []
    return [
        Problem(
            field="spec.engram",
            message=f"{spec.model.name} has no Engram table; spec.engram has no effect",
            fix="remove spec.engram",
            rule="engram_model",
            severity="warning",
        )
    ]


def engram_peer_shards(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Peer shards are honoured only with tp > 1 on CUDA (layers/engram.py EngramEmbedding).

    Elsewhere SGLang silently falls back to the TP-sharded device table: on ROCm (MI355X,
    MI350X) or with tp 1 the placement would not be what the spec says, so it is refused
    with the placement that does run. An accelerator without NVLink / xGMI cannot read
    peers' rows at all.
    """
    if spec.engram is None or spec.engram.placement != "peerShards" or _no_engram(role):
        return []
    acc = role.inputs.accelerator
    tp = role.inputs.parallelism.tp
    problems = []
    if acc is not None and acc.vendor != "nvidia":
        problems.append(
            Problem(
                field="spec.engram.placement",
                message=f"SGLang 0.5.23 honours peerShards only on CUDA; on {role.inputs.accelerator_name} "
                f"({acc.vendor}) it is ignored and the Engram table stays in device memory, sharded over the TP group",
                fix="use placement device (the same table the role would get) or host",
                rule="engram_peer_shards",
            )
        )
    elif tp < 2:
        problems.append(
            Problem(
                field="spec.engram.placement",
                message=f"peerShards splits the Engram table over the TP group, but the {role.role} role has tp {tp}; "
                "SGLang 0.5.23 ignores it there and keeps the whole table in device memory",
                fix="use placement host or device, or tp > 1",
                rule="engram_peer_shards",
            )
        )
    if acc is not None and acc.nvlinkDomain < 2:
        problems.append(
            Problem(
                field="spec.engram.placement",
                message=f"peerShards reads peers over NVLink/xGMI; {role.inputs.accelerator_name} has no such domain",
                fix="use placement host or device",
                rule="engram_peer_shards",
            )
        )
    return problems


def engram_memory(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Host placement needs host memory sized for the table; device placement must fit GPU memory.

    The table size comes from the model catalog (engramTableBytes); when it is unknown the
    operator warns instead of guessing.
    """
    if spec.engram is None or spec.engram.placement == "peerShards" or _no_engram(role):
        return []
    model = role.inputs.model
    table = model.engramTableBytes if model is not None else None
    if table:
        if spec.engram.placement == "device" and role.inputs.accelerator is not None:
            from ..memory import quantity_bytes

            gpu = quantity_bytes(role.inputs.accelerator.gpuMemory)
            tp = role.inputs.parallelism.tp
            per_gpu = table // tp  # rows are sharded over the TP group (EngramEmbedding shard_range)
            if per_gpu > gpu // 4:
                return [
                    Problem(
                        field="spec.engram.placement",
                        message=f"the Engram table ({table >> 30} GiB) sharded over tp {tp} puts {per_gpu >> 30} GiB on "
                        f"each GPU, over a quarter of {role.inputs.accelerator_name} memory, and shrinks the KV cache",
                        fix="use placement host (one copy in host memory), or a larger tp",
                        rule="engram_memory",
                        severity="warning",
                    )
                ]
        return []
    if spec.engram.placement == "host":
        if role.inputs.spec.resources.memory is not None:
            return []
        msg = "the Engram host table size is not in the model catalog, so the pod's memory request does not include it"
        fix = f"set spec.{role.role}.resources.memory, or add engramTableBytes to the model catalog"
    else:
        msg = "the Engram table size is not in the model catalog; a full copy per GPU may not fit beside the KV cache"
        fix = "use placement peerShards, or add engramTableBytes to the model catalog"
    return [Problem(field="spec.engram.placement", message=msg, fix=fix, rule="engram_memory", severity="warning")]
