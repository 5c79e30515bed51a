"""The CUDA driver's virtual-memory API as the emulated GPU answers it (worker side).

SGLang builds some device memory itself through ``cuda.bindings.driver`` (cuda-python)
instead of torch: the Engram table's peer shards (layers/engram.py ``_PeerShards``),
DWDP expert buffers and VMM-backed KV (utils/cuda_vmm_utils.py). Those calls run while
the model is constructed, so the oracle answers them at the library's boundary: this
module is installed as ``cuda.bindings.driver`` when cuda-python is not importable (the
kernel stand-ins cover the rest of ``cuda``). Reservations and mappings succeed and
return addresses that are never dereferenced; ``cuMemCreate`` sizes are counted as
device bytes (:data:`CREATED`, added to the role's resident weights). Exporting or
importing a handle to another process (a collective with peer ranks) raises: the step
is then indeterminate ("emulated CUDA driver").
"""

from __future__ import annotations

import enum
import itertools
import sys
import types
from typing import Any

#: Bytes of live cuMemCreate allocations, by handle.
CREATED: dict[int, int] = {}
_handles = itertools.count(1)
_addresses = itertools.count(1 << 40, 1 << 36)
_mapped: dict[int, int] = {}
GRANULARITY = 2 << 20


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUmemAllocationHandleType(enum.IntEnum):
    CU_MEM_HANDLE_TYPE_NONE = 0
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
    CU_MEM_HANDLE_TYPE_WIN32 = 2
    CU_MEM_HANDLE_TYPE_WIN32_KMT = 4
    CU_MEM_HANDLE_TYPE_FABRIC = 8


class CUmemAllocationType(enum.IntEnum):
    CU_MEM_ALLOCATION_TYPE_INVALID = 0
    CU_MEM_ALLOCATION_TYPE_PINNED = 1


class CUmemLocationType(enum.IntEnum):
    CU_MEM_LOCATION_TYPE_INVALID = 0
    CU_MEM_LOCATION_TYPE_DEVICE = 1


class CUmemAllocationGranularity_flags(enum.IntEnum):  # noqa: N801 (cuda-python's name)
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1


class CUmemAccess_flags(enum.IntEnum):  # noqa: N801
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class CUmemAllocationProp:
    """The allocation properties struct (fields SGLang sets)."""

    def __init__(self) -> None:
        self.type = CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_INVALID
        self.location = types.SimpleNamespace(type=CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID, id=0)
        self.requestedHandleTypes = CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        self.allocFlags = types.SimpleNamespace(gpuDirectRDMACapable=0, compressionType=0, usage=0)


class CUmemAccessDesc:
    """The access descriptor struct."""

    def __init__(self) -> None:
        self.location = types.SimpleNamespace(type=CUmemLocationType.CU_MEM_LOCATION_TYPE_INVALID, id=0)
        self.flags = CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE


class CUdevice_attribute(enum.IntEnum):  # noqa: N801 (cuda-python's name; CUDA's values)
    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 100


_OK = CUresult.CUDA_SUCCESS

#: The node's answer to ``CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES``:
#: 1 where the GPU reads pageable host memory through the CPU's page tables (ATS over
#: NVLink-C2C: a Grace CPU, GB200 / GB300 / GH200 nodes), 0 on x86 hosts. Set by :func:`install`.
HOST_PAGE_TABLES = {"uses": 0}


def grace_host(device_name: str) -> bool:
    """A GPU of a Grace superchip (the catalog's products "NVIDIA GB200", "NVIDIA GB300", "GH200")."""
    return any(part.upper().startswith(("GB", "GH")) for part in device_name.replace("-", " ").split())


def cuDeviceGetAttribute(attrib: Any, device: int) -> tuple:  # noqa: N802
    """The device attribute SGLang's startup asks the driver: whether pageable-memory access
    uses the host's page tables, read by the Engram host table (layers/engram.py
    ``_sorted_host_reads``: whether host reads are sorted, a runtime choice); any other
    attribute is no verdict."""
    if int(attrib) == CUdevice_attribute.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
        return _OK, HOST_PAGE_TABLES["uses"]
    raise RuntimeError(f"emulated CUDA driver: device attribute {attrib!r} is not known to the oracle (no verdict)")


def cuMemGetAllocationGranularity(prop: Any, flag: Any) -> tuple:  # noqa: N802
    return _OK, GRANULARITY


def cuMemCreate(size: int, prop: Any, flags: int) -> tuple:  # noqa: N802
    handle = next(_handles)
    CREATED[handle] = int(size)
    return _OK, handle


def cuMemRelease(handle: int) -> tuple:  # noqa: N802
    CREATED.pop(int(handle), None)
    return (_OK,)


def cuMemAddressReserve(size: int, alignment: int, addr: int, flags: int) -> tuple:  # noqa: N802
    return _OK, next(_addresses)


def cuMemAddressFree(ptr: int, size: int) -> tuple:  # noqa: N802
    return (_OK,)


def cuMemMap(ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple:  # noqa: N802
    _mapped[int(ptr)] = int(handle)
    return (_OK,)


def cuMemUnmap(ptr: int, size: int) -> tuple:  # noqa: N802
    _mapped.pop(int(ptr), None)
    return (_OK,)


def cuMemSetAccess(ptr: int, size: int, desc: Any, count: int) -> tuple:  # noqa: N802
    return (_OK,)


def cuMemRetainAllocationHandle(ptr: int) -> tuple:  # noqa: N802
    return _OK, _mapped.get(int(ptr), 0)


def cuMemGetAllocationPropertiesFromHandle(handle: int) -> tuple:  # noqa: N802
    return _OK, CUmemAllocationProp()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def unsupported(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"emulated CUDA driver: {name} needs a GPU and its peers (no verdict)")

    return unsupported


def created_bytes(since: frozenset[int] = frozenset()) -> int:
    """Device bytes held by live cuMemCreate allocations, those whose handles are not in ``since``
    (a :func:`live_handles` snapshot): what a step allocated, whatever older allocations a
    collection released meanwhile (another role's model leaving a warm worker)."""
    return sum(size for handle, size in CREATED.items() if handle not in since)


def live_handles() -> frozenset[int]:
    """The handles of the live cuMemCreate allocations now (for :func:`created_bytes`)."""
    return frozenset(CREATED)


def install(device_name: str = "") -> bool:
    """Serve this module as ``cuda.bindings.driver`` when cuda-python is a kernel stand-in;
    ``device_name`` (``DeviceFacts.name``) decides :data:`HOST_PAGE_TABLES`.

    Call after ``kernel_standins.install`` and before SGLang is imported. Returns True
    when installed (False: a real cuda-python is importable, it stays).
    """
    import importlib

    HOST_PAGE_TABLES["uses"] = int(grace_host(device_name))

    try:
        bindings = importlib.import_module("cuda.bindings")
    except ImportError:
        return False
    if not type(bindings).__name__ == "_StandInModule":
        return False
    module = sys.modules[__name__]
    sys.modules["cuda.bindings.driver"] = module
    setattr(bindings, "driver", module)
    return True
