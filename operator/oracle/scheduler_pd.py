"""What a scheduler builds after its memory plan: the KV pools, the PD queues and the transfer engine's manager (worker side).

Runs in the oracle worker after :mod:`.startup` built the role's model on the meta device
and planned its memory, in the order ``Scheduler.__init__`` does (managers/scheduler.py):

``pools`` (``ModelRunner.alloc_memory_pool``, model_runner.py:971)
    ``KVCacheConfigurator._derive_pool_sizes`` and ``_init_pools``
    (mem_cache/kv_cache_configurator.py:528, :585) on the resolved memory plan: SGLang's
    own pool classes (req-to-token, token-to-KV, the allocator; DeepSeek-V4's compressed
    and state pools) with every tensor on
    the meta device (:class:`.startup.MetaAllocations`), then the runner's fields set as
    ``alloc_memory_pool`` sets them.
``pd-queues`` (``Scheduler.init_disaggregation``, managers/scheduler.py:1505)
    the real method on a scheduler carrying what it reads (:func:`scheduler_standin`):
    the metadata buffers, ``DecodeTransferQueue`` and ``DecodePreallocQueue``
    (disaggregation/decode.py:387) or ``PrefillBootstrapQueue`` (disaggregation/prefill.py:174),
    whose ``_init_kv_manager`` assembles the transfer's ``KVArgs`` from the pools
    (buffer lengths, layer ids, state types, page size). The manager class the queue asks
    for is recorded here (its arguments kept) and built by the next stage, unless the queue
    goes on to use the manager (``SGLANG_DISAGG_STAGING_BUFFER``: the staging tensors and
    the decode's ``DecodeStagingHandler``): then the real manager is built there and then,
    as SGLang builds it inline (:class:`_ManagerRequest`), a refusal of its ``__init__``
    still tagged ``transfer``.
``transfer`` (the backend's ``KVManager.__init__``)
    SGLang's real manager class of the role's backend (``MooncakeKVManager``,
    ``NixlKVManager``, ``FakeKVManager`` ...) on those arguments. For Mooncake the shared
    engine is made by SGLang's own ``maybe_init_shared_mooncake_transfer_engine``
    (distributed/device_communicators/mooncake_transfer_engine.py:315: the NICs of the
    GPU from ``--disaggregation-ib-device`` or the emulated sysfs) with only the native
    ``mooncake.engine.TransferEngine`` replaced (:class:`TransferEngineStandIn`, which
    answers as the library does on success and records the calls). For MoRI only the
    native ``mori.io.IOEngine`` is replaced (:class:`MoriIOEngineStandIn`).

What does not run here (named in the verdict's ``assumes``): the registration with the
bootstrap server (the pair's ``bootstrap`` stage does it with the real server), the
managers' background loops (threads are not started: they serve requests, they check
nothing at startup), a backend whose Python package is not installed in the oracle
(NIXL), and, for a speculative role, the draft worker's KV pool the queue would
transfer too.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Iterator

from .stages import OracleLimit, Refusal, describe

#: Steps of the stages this module runs, with the SGLang code each one is (sglang/srt/...).
POOL_STEPS = (
    "pools: KVCacheConfigurator._derive_pool_sizes, _init_pools on the meta device (mem_cache/kv_cache_configurator.py:528, :585)",
)
QUEUE_STEPS = (
    "pd-queues: Scheduler.init_disaggregation (managers/scheduler.py:1505): MetadataBuffers, "
    "PrefillBootstrapQueue (disaggregation/prefill.py:174) or DecodeTransferQueue, DecodePreallocQueue "
    "(disaggregation/decode.py:2530, :387) with the KVArgs of _init_kv_manager",
)
TRANSFER_STEPS = (
    "transfer: the backend's KVManager.__init__ (disaggregation/<backend>/conn.py; Mooncake's engine by "
    "maybe_init_shared_mooncake_transfer_engine, device_communicators/mooncake_transfer_engine.py:315)",
)
ASSUMED = (
    "transfer: registration with the bootstrap server inside KVManager.__init__ (run by the pair's bootstrap stage)",
    "transfer: the manager's background threads (bootstrap, transfer, heartbeat loops) are not started",
)


class TransferEngineStandIn:
    """``mooncake.engine.TransferEngine``, the native library SGLang's Mooncake wrapper calls:
    every call succeeds as the library's does (``0``), with a loopback RPC port; ``calls``
    records them (name, arguments). Its method names are checked against the installed
    library's symbols (tests/contract/test_oracle.py)."""

    RPC_PORT = 17777
    calls: list[tuple[Any, ...]] = []

    def __init__(self) -> None:
        self.calls.append(("TransferEngine",))

    def initialize(self, hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        self.calls.append(("initialize", hostname, metadata_server, protocol, device_name))
        return 0

    def get_rpc_port(self) -> int:
        return self.RPC_PORT

    def register_memory(self, ptr: int, length: int) -> int:
        self.calls.append(("register_memory", length))
        return 0

    def unregister_memory(self, ptr: int) -> int:
        return 0

    def batch_register_memory(self, ptrs: list[int], lengths: list[int]) -> int:
        self.calls.append(("batch_register_memory", len(ptrs)))
        return 0

    def batch_unregister_memory(self, ptrs: list[int]) -> int:
        return 0

    def get_engine(self) -> "TransferEngineStandIn":
        return self


#: The method names of the stand-in that SGLang's wrapper calls at startup (the drift test reads them).
STANDIN_METHODS = ("initialize", "get_rpc_port", "register_memory", "unregister_memory", "batch_register_memory",
                   "batch_unregister_memory", "get_engine")


@contextlib.contextmanager
def mooncake_engine_standin() -> Iterator[list[tuple[Any, ...]]]:
    """``mooncake.engine`` answers with :class:`TransferEngineStandIn` (the real module needs
    libcudart); SGLang's shared engine is reset before and after."""
    from sglang.srt.distributed.device_communicators import mooncake_transfer_engine as mte

    saved = sys.modules.get("mooncake.engine")
    module = types.ModuleType("mooncake.engine")
    module.TransferEngine = TransferEngineStandIn
    TransferEngineStandIn.calls = []
    sys.modules["mooncake.engine"] = module
    mte._mooncake_transfer_engine = None
    try:
        yield TransferEngineStandIn.calls
    finally:
        mte._mooncake_transfer_engine = None
        if saved is None:
            sys.modules.pop("mooncake.engine", None)
        else:
            sys.modules["mooncake.engine"] = saved


class _MoriDesc:
    """An ``EngineDesc`` or ``MemoryDesc`` of the MoRI stand-in: its fields, with ``pack`` /
    ``unpack`` as round-trip bytes (a ``repr`` of the fields, not MoRI's wire format: the
    oracle never sends a descriptor to a peer)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def pack(self) -> bytes:
        return repr(sorted(self.__dict__.items())).encode()

    @classmethod
    def unpack(cls, blob: bytes) -> "_MoriDesc":
        import ast

        return cls(**dict(ast.literal_eval(blob.decode())))


class MoriIOEngineStandIn:
    """``mori.io.IOEngine``, the native RDMA engine of AMD's MoRI (ROCm/mori, python/mori/io/
    engine.py over the C++ ``mori::io::IOEngine``) that SGLang's ``MoriKVManager`` builds in
    ``_init_engine`` (disaggregation/mori/conn.py:449) and registers its KV, aux and state
    buffers with (``_register_local_buffers``, :492). MoRI is a ROCm build (no wheel on
    PyPI), so the oracle has no library to run: every call answers as the library does on
    success (``create_backend`` returns; ``get_engine_desc`` gives a fixed non-zero port, so
    SGLang's ``assert actual_port > 0`` passes by construction, nothing is bound;
    ``register_memory`` a descriptor) and ``calls`` records them. What the library would
    check is not: the RDMA devices SGLang puts in ``MORI_RDMA_DEVICES`` from
    ``--disaggregation-ib-device`` and the backend settings (``SGLANG_MORI_QP_PER_TRANSFER``,
    ``SGLANG_MORI_POST_BATCH_SIZE``, ``SGLANG_MORI_NUM_WORKERS``): :data:`MORI_ASSUMED`. The names SGLang uses are held to SGLang's own module by
    tests/contract/test_oracle.py (``test_mori_engine_standin_covers_what_sglang_calls``)."""

    RPC_PORT = 17778
    calls: list[tuple[Any, ...]] = []

    def __init__(self, key: str, config: Any) -> None:
        self.calls.append(("IOEngine", key))
        self._desc = _MoriDesc(key=key, host=getattr(config, "host", ""), port=getattr(config, "port", 0) or self.RPC_PORT)

    def create_backend(self, backend_type: Any, config: Any) -> None:
        self.calls.append(("create_backend", backend_type))

    def get_engine_desc(self) -> _MoriDesc:
        self.calls.append(("get_engine_desc",))
        return self._desc

    def register_memory(self, ptr: int, length: int, device_id: int, location: Any) -> _MoriDesc:
        self.calls.append(("register_memory", length, device_id, location))
        return _MoriDesc(addr=int(ptr), size=int(length), device_id=int(device_id), loc=str(location))

    def deregister_memory(self, desc: Any) -> None:
        self.calls.append(("deregister_memory",))

    def register_remote_engine(self, desc: Any) -> None:
        self.calls.append(("register_remote_engine",))


def _mori_values() -> dict[str, Any]:
    """The plain values of ``mori.io`` / ``mori.cpp`` SGLang's MoRI module names (configs, enums,
    descriptors): small Python types standing for the library's bindings."""
    import enum

    class BackendType(enum.Enum):
        RDMA = 1

    class PollCqMode(enum.Enum):
        POLLING = 0
        EVENT = 1

    class MemoryLocationType(enum.Enum):
        CPU = 0
        GPU = 1

    class StatusCode(enum.Enum):
        SUCCESS = 0
        INIT = 1
        IN_PROGRESS = 2
        ERR_BEGIN = 3

    def io_engine_config(host: str = "", port: int = 0, **kw: Any) -> _MoriDesc:
        return _MoriDesc(host=host, port=port, **kw)

    def rdma_backend_config(*args: Any, **kw: Any) -> tuple[Any, ...]:
        return (*args, *sorted(kw.items()))

    return {"IOEngine": MoriIOEngineStandIn, "IOEngineConfig": io_engine_config,
            "RdmaBackendConfig": rdma_backend_config, "BackendType": BackendType, "PollCqMode": PollCqMode,
            "MemoryLocationType": MemoryLocationType, "StatusCode": StatusCode, "EngineDesc": _MoriDesc,
            "MemoryDesc": _MoriDesc, "TransferStatus": object}


#: What a verdict that ran the MoRI stand-in assumes (listed in its ``assumes``).
MORI_ASSUMED = ("transfer: MoRI's native engine (mori.io.IOEngine) is stood in: the RDMA devices in MORI_RDMA_DEVICES "
                "(from --disaggregation-ib-device) and SGLANG_MORI_QP_PER_TRANSFER / _POST_BATCH_SIZE / _NUM_WORKERS "
                "are taken as the library accepts them, and its port is a fixed one (disaggregation/mori/conn.py:449 "
                "_init_engine)")

#: The names of ``mori.io`` / ``mori.cpp`` the stand-in supplies (the drift test reads them).
MORI_NAMES = ("IOEngine", "IOEngineConfig", "RdmaBackendConfig", "BackendType", "PollCqMode", "MemoryLocationType",
              "StatusCode", "EngineDesc", "MemoryDesc", "TransferStatus")


@contextlib.contextmanager
def mori_engine_standin(manager_cls: Any) -> Iterator[list[tuple[Any, ...]]]:
    """Inside the block, the module of ``manager_cls`` (SGLang's ``disaggregation/mori/conn.py``,
    imported with the kernel stand-in of ``mori``) sees :class:`MoriIOEngineStandIn` and
    :func:`_mori_values` for the names it imported from ``mori.io`` and ``mori.cpp``; restored
    after. Any other class: nothing changes."""
    module = sys.modules.get(getattr(manager_cls, "__module__", ""))
    if module is None or not module.__name__.endswith("disaggregation.mori.conn"):
        yield []
        return
    values = _mori_values()
    saved = {name: module.__dict__.get(name) for name in MORI_NAMES}
    MoriIOEngineStandIn.calls = []
    module.__dict__.update(values)
    try:
        yield MoriIOEngineStandIn.calls
    finally:
        module.__dict__.update(saved)


def assemble_pools(runner: Any, config: Any) -> dict[str, Any]:
    """SGLang's KV pools for ``config`` (the memory stage's MemoryPoolConfig) on the meta
    device; sets the runner's pool fields as ``ModelRunner.alloc_memory_pool`` does.
    Returns {"reqToTokenPool", "tokenToKVPool", "allocator" (class names), "poolBytes"
    (device bytes of the pools), "hostPoolBytes"}; raises SGLang's refusal."""
    from .startup import MetaAllocations

    configurator = runner.kv_cache_configurator
    meta = MetaAllocations()
    with meta, _kv_copy_warmup_not_launched() as warmups:
        sizes = configurator._derive_pool_sizes(config=config)
        pools = configurator._init_pools(sizes=sizes, req_to_token_pool=runner.req_to_token_pool,
                                         token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)
    runner.max_total_num_tokens = sizes.max_total_num_tokens
    runner.max_running_requests = sizes.max_running_requests
    runner.req_to_token_pool = pools.req_to_token_pool
    runner.token_to_kv_pool = pools.token_to_kv_pool
    runner.token_to_kv_pool_allocator = pools.token_to_kv_pool_allocator
    runner.memory_pool_config = config
    if runner.is_hybrid_swa:
        runner.full_max_total_num_tokens = sizes.full_max_total_num_tokens
        runner.swa_max_total_num_tokens = sizes.swa_max_total_num_tokens
    runner._oracle_pool_sizes = sizes
    return {
        "reqToTokenPool": type(pools.req_to_token_pool).__name__,
        "tokenToKVPool": type(pools.token_to_kv_pool).__name__,
        "allocator": type(pools.token_to_kv_pool_allocator).__name__,
        "poolBytes": meta.device_bytes,
        "hostPoolBytes": meta.host_bytes,
        # popped by the caller into the role's assumes
        "assumes": [WARMUP_ASSUMED] if warmups else [],
    }


#: What :func:`_kv_copy_warmup_not_launched` leaves out, as the verdict lists it.
WARMUP_ASSUMED = ("pools: the KV-copy kernel's warmup launch (mem_cache/memory_pool.py:2420 "
                  "copy_all_layer_kv_cache_func, a Triton kernel; its tile config is SGLang's, from the pool's strides)")


@contextlib.contextmanager
def _kv_copy_warmup_not_launched() -> Iterator[list[str]]:
    """The MHA pool's KV-copy warmup is not launched; the launches are recorded.

    With ``enable_kv_cache_copy`` (a speculative role, kv_cache_configurator.py:2545)
    ``MHATokenToKVPool._init_kv_copy_and_warmup`` (mem_cache/memory_pool.py:2375) computes
    the copy's tile config from its buffers' byte stride (which runs) and then launches
    ``copy_all_layer_kv_cache_func`` once on slot 0 onto itself (:2420): a Triton kernel,
    launched only to compile it, whose result changes nothing and which checks nothing
    (the launch needs the GPU driver). The module name the pool calls answers with a
    recorder for the block."""
    from sglang.srt.mem_cache import memory_pool

    launched: list[str] = []
    real = memory_pool.copy_all_layer_kv_cache_func

    def warmup(*args: Any, **kwargs: Any) -> None:
        launched.append("copy_all_layer_kv_cache_func")

    memory_pool.copy_all_layer_kv_cache_func = warmup
    try:
        yield launched
    finally:
        memory_pool.copy_all_layer_kv_cache_func = real


def scheduler_standin(server_args: Any, runner: Any) -> Any:
    """A ``Scheduler`` (SGLang's class, its ``__init__`` not run) carrying what
    ``init_disaggregation`` and the PD queues read, from the runner's pools: as
    ``Scheduler.__init__`` sets them after ``build_kv_cache`` (managers/scheduler.py:574-612),
    without a draft worker, a tree cache, the Rust frontend, HiSparse or metrics."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator.page_interleave import page_interleave_shard_size

    s = Scheduler.__new__(Scheduler)
    s.server_args = server_args
    s.model_config = runner.model_config
    s.draft_worker = None
    s.spec_algorithm = runner.spec_algorithm
    s.req_to_token_pool = runner.req_to_token_pool
    s.token_to_kv_pool_allocator = runner.token_to_kv_pool_allocator
    s.tree_cache = None
    s.max_total_num_tokens = runner.max_total_num_tokens
    s.max_running_requests = runner.max_running_requests
    s.scheduler_stage_metrics = None
    s.enable_unified_memory = False
    s.rust_server = None
    s.random_seed = server_args.random_seed
    s.enable_hisparse = False
    s.hisparse_coordinator = None
    s.kv_shard_widening = page_interleave_shard_size(runner.token_to_kv_pool_allocator)
    s.tp_worker = types.SimpleNamespace(model_runner=runner, is_hybrid_swa=runner.is_hybrid_swa)
    return s


class _ManagerRequest:
    """The transfer manager a PD queue's ``_init_kv_manager`` asked for: its arguments kept,
    the real manager built by the ``transfer`` stage (:func:`build_manager`).

    A queue that goes on to use its manager after building it (SGLang does with
    ``SGLANG_DISAGG_STAGING_BUFFER``: ``set_kv_buffer_tensors`` in ``_init_kv_manager``,
    disaggregation/decode.py:790 and prefill.py:374, and ``DecodeStagingHandler.create``
    reading ``_staging_ctx`` and ``kv_buffer_tensors``, decode.py:2807, common/staging_handler.py:152;
    with a decode host-receive threshold below 1, ``supports_host_destination``, decode.py:774)
    gets the real one there and then, as on a GPU, where the queue builds its manager inline:
    the first attribute the request does not hold builds the backend's real manager
    (:func:`_construct_manager`, its refusal tagged ``transfer``) and every later read or write
    goes to it. When the manager cannot be built here (a speculative role, whose manager
    carries the draft's KV pool; a backend whose package is not installed) the queue cannot
    go on: no verdict (:class:`OracleLimit`), never a refusal of the recorder's making."""

    _OWN = frozenset({"kv_args", "mode", "server_args", "is_mla_backend", "kwargs", "oracle_manager", "oracle_facts"})

    def __init__(self, kv_args: Any, mode: Any, server_args: Any, is_mla_backend: bool = False, **kwargs: Any):
        self.kv_args = kv_args
        self.mode = mode
        self.server_args = server_args
        self.is_mla_backend = is_mla_backend
        self.kwargs = kwargs
        #: the real manager once the queue used it (built in the pd-queues stage) and its facts
        self.oracle_manager: Any = None
        self.oracle_facts: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        # only for names the request does not hold: the queue is using its manager
        if name.startswith("__") or name in _ManagerRequest._OWN:
            raise AttributeError(name)
        if self.oracle_manager is None:
            self._oracle_build(name)
        return getattr(self.oracle_manager, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _ManagerRequest._OWN or self.__dict__.get("oracle_manager") is None:
            object.__setattr__(self, name, value)
        else:
            setattr(self.oracle_manager, name, value)

    def _oracle_build(self, name: str) -> None:
        from sglang.srt.runtime_context import get_spec

        algorithm = str(get_spec().speculative_algorithm or "").upper()
        why = f"the PD queue uses its transfer manager after building it (reads {name!r})"
        if algorithm not in ("", "NONE"):
            raise OracleLimit(f"{why}; the oracle does not build the manager of a speculative role ({algorithm}): "
                              "the draft worker's KV pool, which the manager carries too, is not built")
        try:
            manager, self.oracle_facts = _construct_manager(self.server_args, self)
        except Refusal:
            raise
        except OracleLimit as e:
            raise OracleLimit(f"{why}, and it cannot be built here: {e}") from e
        except Exception as e:  # the manager's own refusal: the transfer stage's, as build_manager tags it
            raise Refusal(describe(e, "transfer")) from None
        real = getattr(manager, "set_kv_buffer_tensors", None)
        if real is not None:
            def set_kv_buffer_tensors(k_buffers: Any, v_buffers: Any, *args: Any, **kwargs: Any) -> Any:
                return real(_on_gpu(k_buffers), _on_gpu(v_buffers), *args, **kwargs)

            manager.set_kv_buffer_tensors = set_kv_buffer_tensors
        self.oracle_manager = manager

    def oracle_close(self) -> None:
        _close(self.__dict__.get("oracle_manager"))


def _on_gpu(tensors: Any) -> Any:
    """The KV pool's buffers as the staging path sees them on a GPU: on the role's device
    (``cuda:<gpu_id>``; the pool classes allocate them on ``cuda``, the scheduler's current
    device, which ``get_device().gpu_id`` names, as ``init_staging_allocator`` does for its
    ring buffer, common/staging_handler.py:784).

    The oracle builds the pools on the meta device, whose tensors have no device index, and
    ``DecodeStagingHandler.__init__`` asserts one (common/staging_handler.py:114: "KV buffers
    must be on an indexed device") before it takes the device's module and index, an
    assertion a CUDA tensor always passes. Each meta buffer is handed on as an alias of
    itself (same shape, dtype and meta storage; an operation on it gives a plain meta
    tensor) whose ``device`` is that GPU. Other tensors pass unchanged."""
    import torch
    from sglang.srt.runtime_context import get_device

    device = torch.device(torch.device(get_device().device or "cuda").type, get_device().gpu_id or 0)
    out = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_meta and not isinstance(t, _MetaOnGpu()):
            t = t.as_subclass(_MetaOnGpu())
            t._oracle_device = device
        out.append(t)
    return type(tensors)(out) if isinstance(tensors, (list, tuple)) else out


def _MetaOnGpu() -> type:  # noqa: N802 (a class made once torch is imported)
    """``torch.Tensor`` whose ``device`` is the GPU it stands on (:func:`_on_gpu`)."""
    global _META_ON_GPU
    if _META_ON_GPU is None:
        import torch

        class MetaOnGpu(torch.Tensor):
            __torch_function__ = torch._C._disabled_torch_function_impl

            @property
            def device(self) -> Any:  # type: ignore[override]
                return self._oracle_device

        _META_ON_GPU = MetaOnGpu
    return _META_ON_GPU


_META_ON_GPU: Any = None


def build_queues(server_args: Any, runner: Any) -> tuple[Any, _ManagerRequest, dict[str, Any]]:
    """``Scheduler.init_disaggregation`` on :func:`scheduler_standin` under the meta device.
    Returns (scheduler, the manager request, facts {"queue", "kvArgs": {...}}); raises SGLang's refusal."""
    from sglang.srt.disaggregation import decode, prefill, utils
    from .startup import MetaAllocations

    requests: list[_ManagerRequest] = []
    real = utils.get_kv_class

    def get_kv_class(backend: Any, kind: Any) -> Any:
        if kind == utils.KVClassType.MANAGER:
            requests.append(None)  # type: ignore[arg-type]

            def record(*args: Any, **kwargs: Any) -> _ManagerRequest:
                req = _ManagerRequest(*args, **kwargs)
                requests[-1] = req
                return req
            return record
        return real(backend, kind)

    scheduler = scheduler_standin(server_args, runner)
    saved = (prefill.get_kv_class, decode.get_kv_class)
    prefill.get_kv_class = decode.get_kv_class = get_kv_class
    try:
        with MetaAllocations():
            scheduler.init_disaggregation()
    finally:
        prefill.get_kv_class, decode.get_kv_class = saved
        for made in requests:
            if made is not None:
                made.oracle_close()
    queue = scheduler.disagg_prefill_bootstrap_queue or scheduler.disagg_decode_prealloc_queue
    if queue is None or not requests or requests[-1] is None:
        raise OracleLimit("the PD queue made no transfer manager (not a PD role?)")
    req = requests[-1]
    kv = req.kv_args
    handler = getattr(scheduler.disagg_decode_transfer_queue, "staging_handler", None)
    facts = {
        "queue": type(queue).__name__,
        "kvArgs": {"kvBuffers": len(kv.kv_data_lens), "kvItemBytes": int(sum(kv.kv_item_lens)),
                   "stateTypes": [getattr(t, "value", str(t)) for t in (getattr(kv, "state_types", None) or [])],
                   "pageSize": kv.page_size, "auxBuffers": len(kv.aux_data_lens)},
        # the manager built by the queue itself (it used it: SGLANG_DISAGG_STAGING_BUFFER) and
        # the decode's staging handler made on it (None without staging)
        "managerBuiltByQueue": req.oracle_facts is not None,
        "stagingHandler": None if handler is None else type(handler).__name__,
    }
    return scheduler, req, facts


@contextlib.contextmanager
def _no_background_threads() -> Iterator[list[str]]:
    """Threads a KV manager starts for its loops (a method of a ``...KVManager`` class, or a
    function defined in one) are not started inside the block; their names are recorded.
    Other threads (SGLang's ``run_with_deadline`` around the engine's initialisation) run."""
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        target = getattr(self, "_target", None)
        owner = type(getattr(target, "__self__", None)).__name__
        if "KVManager" in getattr(target, "__qualname__", "") or "KVManager" in owner:
            started.append(getattr(target, "__qualname__", self.name))
            return
        real_start(self)

    threading.Thread.start = start
    try:
        yield started
    finally:
        threading.Thread.start = real_start


def build_manager(server_args: Any, req: _ManagerRequest) -> dict[str, Any]:
    """The role's backend's real KV manager on the queue's arguments (see the module docstring);
    the facts of the one the queue built already when it used it (:class:`_ManagerRequest`).

    Returns {"manager", "engineCalls", "threadsNotStarted"}; raises SGLang's refusal, or
    :class:`OracleLimit` when the backend's package is not installed here."""
    if req.oracle_facts is not None:
        return req.oracle_facts
    manager, facts = _construct_manager(server_args, req)
    _close(manager)
    return facts


def _construct_manager(server_args: Any, req: _ManagerRequest) -> tuple[Any, dict[str, Any]]:
    """``cls(kv_args, mode, server_args, is_mla_backend, **kwargs)`` of the role's backend,
    with the native Mooncake engine replaced, the bootstrap registration and the background
    threads not run, and the node's CPUs. Returns (the manager, its facts); a manager whose
    ``__init__`` raised has its sockets closed."""
    from sglang.srt.disaggregation import utils
    from sglang.srt.disaggregation.common import conn as common
    from sglang.srt.runtime_context import get_device, get_disagg

    backend = utils.TransferBackend(get_disagg().disaggregation_transfer_backend)
    try:
        cls = utils.get_kv_class(backend, utils.KVClassType.MANAGER)
    except ImportError as e:
        from .stages import other_vendors_library

        if other_vendors_library(e) is not None:  # no image of this vendor has it: SGLang's refusal
            raise
        raise OracleLimit(f"the {backend.value} transfer backend's package is not installed in the oracle ({e})") from e
    register = common.CommonKVManager.register_to_bootstrap
    manager = None
    from .emulation import node_cpus

    with (mooncake_engine_standin() as calls, mori_engine_standin(cls) as mori_calls, _no_background_threads() as threads,
          node_cpus()):
        common.CommonKVManager.register_to_bootstrap = lambda self: None
        try:
            if backend == utils.TransferBackend.MOONCAKE:
                from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
                    maybe_init_shared_mooncake_transfer_engine,
                )

                maybe_init_shared_mooncake_transfer_engine(gpu_id=get_device().gpu_id)
            # constructed in two steps so that a refused __init__ still has its sockets closed
            # (a zmq context collected with an open socket blocks its finalizer forever)
            manager = cls.__new__(cls)
            manager.__init__(req.kv_args, req.mode, server_args, req.is_mla_backend, **req.kwargs)
        except BaseException:
            _close(manager)
            raise
        finally:
            common.CommonKVManager.register_to_bootstrap = register
        facts = {"manager": type(manager).__name__, "engineCalls": [c[0] for c in calls + mori_calls],
                 "threadsNotStarted": sorted(set(threads)),
                 "engineStoodIn": ("mori.io.IOEngine" if mori_calls else "mooncake.engine.TransferEngine" if calls
                                   else None)}
    return manager, facts


def _close(manager: Any) -> None:
    """Release the sockets a manager (or a manager whose ``__init__`` raised) bound: its zmq
    contexts destroyed with linger 0 (no thread of it runs). Both of them: ``MoriKVManager``
    (disaggregation/mori/conn.py:399) makes a context of its own over the one
    ``CommonKVManager.__init__`` bound ``server_socket`` in (common/conn.py:394-401); the
    common one, left unreferenced with an open socket, blocked the next thread that collected
    it in ``Context.term`` (the oracle's bootstrap server: a MoRI pair was never tried). On a
    pod the manager lives as long as the process, so this is the oracle's concern only."""
    if manager is None:
        return
    socket_ = manager.__dict__.get("server_socket")
    contexts = [getattr(socket_, "context", None), manager.__dict__.get("_zmq_ctx")]
    for ctx in contexts:
        if ctx is not None:
            with contextlib.suppress(Exception):
                ctx.destroy(linger=0)
