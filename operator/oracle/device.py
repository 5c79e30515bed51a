"""What an emulated GPU looks like to SGLang: the device facts of one catalog accelerator.

Pure (no torch, no sglang). :func:`device_facts` turns an
:class:`~sglang_pd_operator.catalog.Accelerator` into a :class:`DeviceFacts`, the JSON-able
description the oracle's worker process installs before it imports SGLang
(``emulation.install``): the answers ``torch.cuda`` gives (availability, device count,
compute capability, name, total memory, the ROCm ``gcnArchName``), the CUDA or HIP version
``torch.version`` reports, and the total memory ``nvidia-smi`` / ``rocminfo`` print.

Where the values come from: compute capability per ISA is NVIDIA's (sm_103 -> 10.3,
sm_100 -> 10.0, sm_90a -> 9.0, sm_89 -> 8.9); ROCm's torch reports gfx950 as 9.5 and
gfx942 as 9.4 with ``gcnArchName`` carrying the gfx name, which is what SGLang's
``is_gfx95_supported`` and the AMD plugin binding read (sglang/srt/utils/common.py,
srt/kernel_plugins/amd/binding.py ``device_isa``). The CUDA version is that of the
runtime images the operator targets (``-cu130``); the HIP version is a ROCm 7 release.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..catalog import Accelerator
from ..planning.memory import quantity_bytes

#: ISA -> (major, minor) as torch.cuda.get_device_capability() reports it.
CAPABILITY: dict[str, tuple[int, int]] = {
    "sm_103": (10, 3),
    "sm_100": (10, 0),
    "sm_90a": (9, 0),
    "sm_89": (8, 9),
    "gfx950": (9, 5),
    "gfx942": (9, 4),
}
#: torch.version.cuda of the CUDA 13 runtime images (lmsysorg/sglang:v0.5.23-cu130).
CUDA_VERSION = "13.0"
#: torch.version.hip of a ROCm 7 runtime image.
HIP_VERSION = "7.0.51831"
#: gcnArchName suffixes ROCm reports for the Instinct parts.
_GCN_SUFFIX = ":sramecc+:xnack-"


@dataclass(frozen=True)
class DeviceFacts:
    """One node type's GPUs as torch and the vendor tools describe them.

    ``vendor``: nvidia | amd; ``isa``: the catalog ISA; ``capability``: (major, minor);
    ``count``: GPUs per node (``torch.cuda.device_count()``); ``name``: the device name;
    ``total_memory``: bytes per GPU; ``gcn_arch``: ROCm's gcnArchName ("" on CUDA);
    ``cuda_version`` / ``hip_version``: ``torch.version.cuda`` / ``.hip`` (None when not
    that vendor); ``rdma_devices``: the node's RDMA NICs (the catalog's rails), which
    SGLang lists under ``/sys/class/infiniband`` to validate ``--disaggregation-ib-device``;
    ``cpus``: the node's CPUs (catalog ``cpus``), what ``os.cpu_count()`` answers in a pod
    (a container sees the node's CPUs), which the Mooncake prefill sizes its default
    transfer thread pool from (disaggregation/mooncake/conn.py:326); ``context_memory``: bytes
    the driver and CUDA context take of each GPU before SGLang allocates (catalog
    ``cudaContextMemory``), never free to ``torch.cuda.mem_get_info``.
    """

    vendor: str
    isa: str
    capability: tuple[int, int]
    count: int
    name: str
    total_memory: int
    gcn_arch: str
    cuda_version: str | None
    hip_version: str | None
    rdma_devices: tuple[str, ...] = ()
    cpus: int | None = None
    context_memory: int = 1 << 30

    @property
    def key(self) -> str:
        """A stable identity: one oracle worker serves one set of facts."""
        return f"{self.vendor}-{self.isa}-{self.count}x{self.total_memory >> 20}MiB"

    @property
    def memory_mib(self) -> int:
        """Total memory per GPU in MiB, as ``nvidia-smi --query-gpu=memory.total`` prints it."""
        return self.total_memory >> 20

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_json` reads it back."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DeviceFacts":
        """The inverse of :meth:`to_json` (lists become tuples)."""
        return cls(**{**data, "capability": tuple(data["capability"]),
                      "rdma_devices": tuple(data.get("rdma_devices") or ())})


def device_facts(acc: Accelerator) -> DeviceFacts:
    """The :class:`DeviceFacts` of one catalog accelerator.

    Raises ``ValueError`` for an ISA with no known compute capability (the catalog's
    schema allows only the ISAs in :data:`CAPABILITY`).
    """
    if acc.isa not in CAPABILITY:
        raise ValueError(f"no compute capability known for ISA {acc.isa!r}; known: {sorted(CAPABILITY)}")
    hip = acc.vendor == "amd"
    return DeviceFacts(
        vendor=acc.vendor,
        isa=acc.isa,
        capability=CAPABILITY[acc.isa],
        count=acc.gpusPerNode,
        name=acc.gpuProduct.replace("-", " ").replace("_", " "),
        total_memory=quantity_bytes(acc.gpuMemory),
        gcn_arch=acc.isa + _GCN_SUFFIX if hip else "",
        cuda_version=None if hip else CUDA_VERSION,
        hip_version=HIP_VERSION if hip else None,
        rdma_devices=tuple(rail.device for rail in acc.rails),
        cpus=acc.cpus,
        context_memory=quantity_bytes(acc.cudaContextMemory),
    )
