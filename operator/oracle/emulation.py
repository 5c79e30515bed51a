"""Make this process look, to SGLang, like one node of a catalog accelerator (worker side).

Runs only inside an oracle worker process (``worker.py``), and :func:`install` must run
*before* SGLang is imported: SGLang evaluates device probes at import time
(``_is_hip = is_hip()`` in many modules, ``lru_cache``-d ``is_sm100_supported``), so the
emulation sits below SGLang, at the answers SGLang's own probes read:

- ``torch.cuda``: ``is_available`` (True), ``device_count``, ``get_device_capability``,
  ``get_device_name``, ``get_device_properties`` (name, total_memory, major, minor,
  gcnArchName, multi_processor_count), ``mem_get_info``, ``current_device``;
- ``torch.version.cuda`` / ``torch.version.hip``;
- ``/sys/class/infiniband``: the node's RDMA NICs (the catalog's rails), for SGLang's
  ``validate_ib_devices`` (arg_groups/validation_hook.py), which lists that directory;
- the vendor tools SGLang shells out to for memory: ``nvidia-smi
  --query-gpu=memory.total`` (utils/common.py ``get_nvgpu_memory_capacity``) and
  ``rocminfo`` (``get_amdgpu_memory_capacity``), as small scripts on ``PATH`` that print
  the catalog's memory.

SGLang's probes (``is_cuda``, ``is_sm100_supported``, ``get_device_sm``,
``is_gfx95_supported``, the plugin bindings' ``device_isa``) then compute their answers
from these, with their own code. Nothing is allocated on a device: the oracle never runs
a kernel. :func:`verify` reads SGLang's platform context back after import and raises
:class:`EmulationDrift` when SGLang sees something else than what was installed (a
probe that reads a source this module does not emulate).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import stat
import types
from pathlib import Path
from typing import Any, Iterator

from .device import DeviceFacts


#: Third-party libraries imported before the emulation, with the real (CPU) machine's view:
#: apache-tvm-ffi, which SGLang's JIT kernel loaders import, builds or patches CUDA stream
#: support at import when torch reports a GPU, and fails on this CPU-only torch. The
#: oracle compiles no kernel, so what tvm_ffi learned about the host does not matter.
HOST_IMPORTS_FIRST = ("tvm_ffi",)


class EmulationDrift(RuntimeError):
    """SGLang's platform facts disagree with the emulated device (a probe reads elsewhere)."""


def _props(facts: DeviceFacts) -> types.SimpleNamespace:
    major, minor = facts.capability
    return types.SimpleNamespace(
        name=facts.name,
        total_memory=facts.total_memory,
        major=major,
        minor=minor,
        gcnArchName=facts.gcn_arch or f"sm_{major}{minor}",
        multi_processor_count=160,
        L2_cache_size=128 << 20,
        is_integrated=False,
        is_multi_gpu_board=False,
        warp_size=64 if facts.vendor == "amd" else 32,
    )


def _write_tool(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _nvidia_smi(facts: DeviceFacts) -> str:
    """An ``nvidia-smi`` that answers the queries SGLang makes, one line per GPU."""
    major, minor = facts.capability
    answers = {
        "memory.total": str(facts.memory_mib),
        "name": facts.name,
        "compute_cap": f"{major}.{minor}",
    }
    cases = "\n".join(
        f'  *"--query-gpu={q}"*) for i in $(seq ${{{GPU_COUNT_ENV}:-{facts.count}}}); do echo "{a}"; done; exit 0;;'
        for q, a in answers.items()
    )
    return (
        "#!/bin/sh\n# emulated by sglang-pd-operator's SGLang oracle (no GPU here)\n"
        f'case "$*" in\n{cases}\n  *) echo "emulated nvidia-smi: unsupported query: $*" >&2; exit 9;;\nesac\n'
    )


def _rocminfo(facts: DeviceFacts) -> str:
    """A ``rocminfo`` whose agents carry the gfx name and a global pool of the GPU's memory (KB)."""
    kb = facts.total_memory >> 10
    agent = (
        f"  Name:                    {facts.isa}\\n"
        "  Pool Info:\\n  Pool 1\\n    Segment:                 GLOBAL; FLAGS: COARSE GRAINED\\n"
        f"    Size:                    {kb}({kb:#x}) KB\\n"
    )
    return (
        "#!/bin/sh\n# emulated by sglang-pd-operator's SGLang oracle (no GPU here)\n"
        f'for i in $(seq ${{{GPU_COUNT_ENV}:-{facts.count}}}); do printf "{agent}"; done\n'
    )


IB_SYSFS = "/sys/class/infiniband"
#: The variable the emulated vendor tools read their GPU count from (the pod's, :func:`pod_gpus`).
GPU_COUNT_ENV = "SGLANG_PD_ORACLE_POD_GPUS"


def _emulate_sysfs(devices: tuple[str, ...]) -> None:
    """Answer ``os.listdir`` / ``os.path.isdir`` / ``os.path.exists`` for IB_SYSFS from the catalog."""
    real_listdir, real_isdir, real_exists = os.listdir, os.path.isdir, os.path.exists
    entries = {IB_SYSFS: list(devices), **{f"{IB_SYSFS}/{d}": [] for d in devices}}

    def listdir(path: Any = ".") -> list[str]:
        key = os.fspath(path).rstrip("/") if not isinstance(path, int) else None
        if key in entries:
            return list(entries[key])
        return real_listdir(path)

    def isdir(path: Any) -> bool:
        key = os.fspath(path).rstrip("/") if not isinstance(path, int) else None
        if key is not None and key.startswith(IB_SYSFS):
            return key in entries and bool(devices)
        return real_isdir(path)

    def exists(path: Any) -> bool:
        key = os.fspath(path).rstrip("/") if not isinstance(path, int) else None
        if key is not None and key.startswith(IB_SYSFS):
            return key in entries and bool(devices)
        return real_exists(path)

    os.listdir, os.path.isdir, os.path.exists = listdir, isdir, exists



class DeviceMemory:
    """The emulated GPU's memory as the CUDA driver reports it: ``total`` per GPU (the
    catalog's), less the driver and CUDA context, less what is resident (:meth:`resident`)."""

    def __init__(self) -> None:
        self.total = 0
        self.context = 1 << 30  # the catalog's cudaContextMemory (emulation.install)
        self._resident: int | None = None

    @property
    def allocated(self) -> int:
        """Bytes held on the device now (the role's weights while its memory is planned)."""
        return self._resident or 0

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """(free, total) bytes as ``torch.cuda.mem_get_info`` reports them."""
        used = self._resident or 0
        return max(0, self.total - self.context - used), self.total

    @contextlib.contextmanager
    def resident(self, nbytes: int) -> Iterator[None]:
        """While the block runs, the device holds exactly ``nbytes`` (one role's weights;
        the worker keeps several roles' meta models, which a pod would not)."""
        saved = self._resident
        self._resident = nbytes
        try:
            yield
        finally:
            self._resident = saved


#: The one emulated device of this worker process (emulation.install wires mem_get_info to it).
DEVICE = DeviceMemory()


class _Stream:
    """A CUDA stream of the emulated GPU: work is never queued, so every wait returns at once."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.priority = kwargs.get("priority", 0)

    def wait_stream(self, *args: Any) -> None:
        return None

    def wait_event(self, *args: Any) -> None:
        return None

    def record_event(self, *args: Any) -> "_Event":
        return _Event()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Event(_Stream):
    """A CUDA event of the emulated GPU."""

    def record(self, *args: Any) -> None:
        return None

    def wait(self, *args: Any) -> None:
        return None

    def elapsed_time(self, *args: Any) -> float:
        return 0.0


#: Host memory registrations made with the emulated CUDA runtime (``cudaHostRegister``), in
#: order: (address, bytes). Append-only: a caller sums the ones made during its step.
HOST_REGISTERED: list[tuple[int, int]] = []


class _CudaRuntime:
    """``torch.cuda.cudart()``, the CUDA runtime's host-memory registration as the driver
    answers it when the pages can be pinned: ``cudaHostRegister`` returns ``cudaSuccess``
    (0) and the range is recorded in :data:`HOST_REGISTERED`; ``cudaHostUnregister`` returns 0.

    SGLang's startup registers host memory while the model is built: the Engram host table
    (``SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE``, layers/engram.py:729 ``_HostTable.__init__``)
    pins the table it mapped (``int(err) != 0`` is its refusal), then reads the address
    kernels use (the host address itself on CUDA, UVA). Whether the node has the host memory
    to pin is not emulated (the operator's host-memory rules judge it, planning/memory.py):
    the verdict lists the registered bytes under ``assumes`` (startup.build_model). The
    runtime's other calls (the profiler's, HiCache's host pools, not run) are no verdict."""

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 (the runtime's name)
        HOST_REGISTERED.append((int(ptr), int(size)))
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
        return 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"the oracle's emulated CUDA runtime has no {name} (no GPU on this machine)")


_CUDART = _CudaRuntime()


class HipRuntime:
    """The HIP runtime library (``libamdhip64``) as SGLang calls it through ctypes, for what the
    emulated ROCm device answers: ``hipHostGetDevicePointer`` maps a host range registered with
    :class:`_CudaRuntime` (``cudaHostRegister`` is hipHostRegister under ROCm's torch) to its device
    address, the host address itself (a mapped pinned range is addressed in the unified space),
    and returns hipSuccess (0); an address never registered returns hipErrorInvalidValue (1).
    SGLang reads it for the Engram host table on ROCm (layers/engram.py:636 ``_hip_runtime``,
    :672 ``_registered_device_ptr``). Its other functions are no verdict."""

    def hipHostGetDevicePointer(self, out: Any, host_ptr: int, flags: int) -> int:  # noqa: N802 (HIP's name)
        address = int(host_ptr or 0)
        if not any(start <= address < start + size for start, size in HOST_REGISTERED):
            return 1
        out._obj.value = address  # ctypes.byref(c_void_p()): the pointer it wraps
        return 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"the oracle's emulated HIP runtime has no {name} (no GPU on this machine)")


def _emulate_cuda_runtime(cuda: Any) -> None:
    """The CUDA runtime calls SGLang's scheduler makes before a kernel runs: streams and
    events (``get_stream``, model constructors' alternate streams), ``set_device``
    (model_runner.py), ``synchronize``, ``empty_cache`` and the allocator's counters
    (read from :data:`DEVICE`); host-memory registration (``cudart()``, :class:`_CudaRuntime`)."""
    cuda.cudart = lambda: _CUDART
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.ExternalStream = _Stream
    cuda.set_device = lambda device: None
    cuda.current_stream = lambda device=None: _Stream()
    cuda.default_stream = lambda device=None: _Stream()
    cuda.stream = lambda stream=None: contextlib.nullcontext(stream)
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.memory_allocated = lambda device=None: DEVICE.allocated
    cuda.memory_reserved = lambda device=None: DEVICE.allocated
    cuda.max_memory_allocated = lambda device=None: DEVICE.allocated
    cuda.reset_peak_memory_stats = lambda device=None: None


def _emulate_triton_driver(facts: DeviceFacts) -> None:
    """Triton's active driver answers for the emulated GPU's target without its native runtime.

    On ROCm, SGLang's modules ask at import ``triton.runtime.driver.active.get_current_target()``
    (e.g. kernels/ops/attention/rocm_mla_decode_rope.py ``is_hip``), which loads
    ``libamdhip64.so`` (triton/backends/amd/driver.py). The emulated driver gives the target
    (``GPUTarget("hip", "gfx950", 64)``) and raises on anything that needs the runtime.
    CUDA's driver is left as it is (SGLang's CUDA imports do not reach it).
    """
    if facts.vendor != "amd":
        return
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    target = GPUTarget("hip", facts.isa, 64)

    class EmulatedHIPDriver:
        def is_active(self) -> bool:
            return True

        def get_current_target(self) -> GPUTarget:
            return target

        def get_current_device(self) -> int:
            return 0

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device("cuda", 0)

        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(f"the oracle's emulated HIP driver has no {name} (no ROCm runtime here)")

    driver.set_active(EmulatedHIPDriver())


#: The pod being judged: ``gpus`` is the count of GPUs the device plugin gives it
#: (``torch.cuda.device_count()``, ``nvidia-smi``'s lines); the node's count until a role sets it.
POD: dict[str, int] = {"gpus": 0, "node": 0, "cpus": 0, "visible": 0}
#: The emulated device's vendor (``DeviceFacts.vendor``): which visibility variables its runtime reads.
VENDOR: dict[str, str] = {"name": "nvidia"}


def node_cpus():
    """A context in which ``os.cpu_count()`` answers the node's CPUs (``DeviceFacts.cpus``).

    ``os.cpu_count()`` in a container reports the node's CPUs (cgroup limits do not change
    it); SGLang reads it at startup only in disaggregation/mooncake/conn.py:326, the Mooncake
    prefill's default transfer thread pool (``min(max(4, cpus // 2 // 8), 12)``), which
    conn.py:336 asserts covers the transfer queues. Scoped to the transfer stage: the
    worker's own thread pools keep the real machine's count. Without a count (facts of an
    older caller) the real answer is kept.
    """

    @contextlib.contextmanager
    def scope():
        real = os.cpu_count
        if POD["cpus"]:
            os.cpu_count = lambda: POD["cpus"]
        try:
            yield
        finally:
            os.cpu_count = real

    return scope()


def pod_gpus(count: int | None, env: dict[str, str] | None = None):
    """A context in which the emulated pod has ``count`` GPUs (None: the node's count).

    In a Kubernetes pod the NVIDIA / AMD device plugin exposes only the GPUs the container
    requests, numbered from 0 (the container runtime mounts those device nodes; no
    ``CUDA_VISIBLE_DEVICES`` is set): SGLang's ``torch.cuda.device_count()``
    (entrypoints/engine.py GPU placement, utils/common.py ``get_available_gpu_memory``)
    and ``nvidia-smi`` (``get_nvgpu_memory_capacity``) see that many. ``env``: the
    container's variables; a ``CUDA_VISIBLE_DEVICES`` (or ROCm's) among them narrows what
    CUDA enumerates, as the driver does (planning/devices.py); ``nvidia-smi`` still lists
    every device of the container.
    """
    import contextlib

    from ..planning.devices import visible_gpus

    @contextlib.contextmanager
    def scope():
        saved, saved_visible = POD["gpus"], POD["visible"]
        POD["gpus"] = count if count else POD["node"]
        POD["visible"] = visible_gpus(POD["gpus"], env or {}, VENDOR["name"])
        os.environ[GPU_COUNT_ENV] = str(POD["gpus"])
        try:
            yield
        finally:
            POD["gpus"], POD["visible"] = saved, saved_visible
            os.environ[GPU_COUNT_ENV] = str(saved)

    return scope()


def install(facts: DeviceFacts, tools_dir: Path) -> None:
    """Emulate ``facts`` for the rest of this process (call before importing SGLang).

    ``tools_dir`` receives the emulated ``nvidia-smi`` / ``rocminfo`` and is put first on
    ``PATH``. Raises ``RuntimeError`` when SGLang was imported already (its import-time
    probes would keep the real machine's answers).
    """
    import sys

    if any(name == "sglang" or name.startswith("sglang.") for name in sys.modules):
        raise RuntimeError("emulation.install must run before sglang is imported")
    import torch

    for name in HOST_IMPORTS_FIRST:
        importlib.import_module(name)

    props = _props(facts)
    cuda = torch.cuda
    cuda.is_available = lambda: True
    POD["gpus"] = POD["node"] = POD["visible"] = facts.count
    VENDOR["name"] = facts.vendor
    POD["cpus"] = facts.cpus or 0
    cuda.device_count = lambda: POD.get("visible", POD["gpus"])
    cuda.get_device_capability = lambda device=None: facts.capability
    cuda.get_device_name = lambda device=None: facts.name
    cuda.get_device_properties = lambda device=None: props
    DEVICE.total = facts.total_memory
    DEVICE.context = facts.context_memory
    cuda.mem_get_info = DEVICE.mem_get_info
    cuda.current_device = lambda: 0
    _emulate_cuda_runtime(cuda)
    torch.version.cuda = facts.cuda_version
    torch.version.hip = facts.hip_version

    _emulate_triton_driver(facts)
    _emulate_sysfs(facts.rdma_devices)
    tools_dir.mkdir(parents=True, exist_ok=True)
    if facts.vendor == "nvidia":
        _write_tool(tools_dir, "nvidia-smi", _nvidia_smi(facts))
    else:
        _write_tool(tools_dir, "rocminfo", _rocminfo(facts))
    os.environ["PATH"] = f"{tools_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def verify(facts: DeviceFacts) -> None:
    """Check that SGLang's own probes see the emulated device; raise :class:`EmulationDrift` if not.

    Reads sglang/srt/runtime_context.py ``get_platform()`` (whose facts come from the
    probes of utils/common.py) and ``get_device_memory_capacity``.
    """
    from sglang.srt.runtime_context import get_platform
    from sglang.srt.utils.common import get_device_memory_capacity, is_gfx95_supported

    platform = get_platform()
    major, _ = facts.capability
    expected = {
        "is_cuda": facts.vendor == "nvidia",
        "is_hip": facts.vendor == "amd",
        "is_sm100": facts.vendor == "nvidia" and major == 10,
        "is_sm90": facts.vendor == "nvidia" and major == 9,
        "is_blackwell": facts.vendor == "nvidia" and major in (10, 11, 12),
    }
    seen = {name: bool(getattr(platform, name)) for name in expected}
    seen_gfx95 = bool(is_gfx95_supported())
    memory_mib = get_device_memory_capacity("cuda")
    problems = [f"{k}: SGLang sees {seen[k]}, emulated {v}" for k, v in expected.items() if seen[k] != v]
    if seen_gfx95 != (facts.isa == "gfx950"):
        problems.append(f"is_gfx95_supported: SGLang sees {seen_gfx95}, emulated {facts.isa}")
    if memory_mib is None or abs(float(memory_mib) - facts.memory_mib) > 1:
        problems.append(f"device memory: SGLang sees {memory_mib} MiB, emulated {facts.memory_mib} MiB")
    if problems:
        raise EmulationDrift("the emulated GPU is not what SGLang sees: " + "; ".join(problems))
