"""Engram placement rules (DeepSeek-V4.1).

Source: seed 004 (SGLang vs DeepInfer): SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 keeps one
copy of the table per node in host memory; SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS=1 splits
it over the GPUs, each reading its peers' rows directly over NVLink.
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
    """Peer shards need more than one GPU per replica and an NVLink / xGMI domain."""
    if spec.engram is None or spec.engram.placement != "peerShards" or _no_engram(role):
        return []
    acc = role.inputs.accelerator
    problems = []
    if role.inputs.gpus_per_replica < 2:
        problems.append(
            Problem(
                field="spec.engram.placement",
                message=f"peerShards splits the Engram table over a replica's GPUs, but the {role.role} replica has "
                f"{role.inputs.gpus_per_replica} GPU",
                fix="use placement host or device, or more than one GPU per replica",
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
            if table > gpu // 4:
                return [
                    Problem(
                        field="spec.engram.placement",
                        message=f"a full Engram copy per GPU ({table >> 30} GiB) takes over a quarter of "
                        f"{role.inputs.accelerator_name} memory and shrinks the KV cache",
                        fix="use placement peerShards or host",
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
