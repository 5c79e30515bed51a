"""The deeper part of one role's startup: SGLang's model construction and memory planning (worker side).

After :mod:`.engine_side` has run SGLang's argument resolution and validation, this
module runs what a scheduler process does next, in SGLang's order
(``managers/scheduler.py`` -> ``model_executor/model_runner.py`` ``ModelRunner.__init__``),
on rank 0 of the role's first node, as far as it can go without a GPU:

``model`` (``ModelRunner.load_model`` -> ``model_loader/loader.py``)
    ``build_load_config`` (the load format and loader options SGLang resolved),
    ``_get_quantization_config`` (the checkpoint's quantization method, its minimum
    compute capability and activation dtypes, checked against the emulated GPU) and
    ``_initialize_model``: the real model class of the architecture, with its real
    layers and the quantization methods' real ``create_weights``, built with every
    tensor on PyTorch's meta device (:class:`MetaAllocations`). Then
    ``check_quantized_moe_compatibility`` (model_runner.py) on the built config.
``memory`` (``ModelRunner.init_kv_cache_configurator`` -> ``mem_cache/kv_cache_configurator.py``)
    the KV cache dtype (``configure_kv_cache_dtype``), layer indices, and the real
    ``KVCacheConfigurator._resolve_memory_pool_config``: ``_profile_available_bytes``
    with the emulated GPU's free memory after the weights (:data:`DEVICE`), then the
    pool configurator's sizes (``pool_configurator.py``) and the request count. Its
    refusals: "Loaded weights leave no GPU memory for the KV cache",
    "Not enough memory. Please try to increase --mem-fraction-static".

What is emulated, at the boundary SGLang reads it from:

- the process groups: :class:`EmulatedGroup` is SGLang's ``GroupCoordinator`` with this
  rank's place and the group's width (what the layers read: ``world_size``,
  ``rank_in_group``, ``ranks``); a collective on it is answered only for the
  reductions every rank of a symmetric role answers alike (:func:`emulated_collectives`);
  the TP group's shared-memory broadcaster is rank 0's, the writer, which gets back what
  it broadcasts (:class:`EmulatedMessageQueue`: the Engram host table's memfd, layers/engram.py:740);
- the CUDA runtime: streams, events and ``set_device`` are accepted (emulation.py),
  ``cudaHostRegister`` succeeds (the Engram host table; the pinned bytes are listed under
  ``assumes``), and ``torch.cuda.mem_get_info`` reports the pod's GPU memory less what the driver and
  CUDA context take (the catalog's ``cudaContextMemory``) and less the live meta allocations;
- device tensors made from host data keep their values (:class:`MetaAllocations`);
- the Engram hasher's tokenizer (the model's tokenizer files are not in the catalog).

What does not run, and is listed in the verdict's ``assumes``: weight loading itself
and ``process_weights_after_loading`` (there are no weights), the other ranks (taken
to be shaped as rank 0: same widths, same layers up to the pipeline split), the KV pools'
storage (:mod:`.scheduler_pd` builds them on the meta device), the HiCache tree, the
draft worker's weights, backends and KV pool (:mod:`.speculative` builds its model),
attention backends and CUDA graph capture (kernels), NCCL/custom all-reduce initialisation.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from .emulation import DEVICE
from .stages import OracleLimit

#: Steps of a role's startup this module runs, with the SGLang code each one is.
MODEL_STEPS = (
    "model: Scheduler.init_moe_gemm_config (managers/scheduler.py:991)",
    "model: initialize_model_parallel, groups emulated (distributed/parallel_state.py:2566)",
    "model: build_load_config (model_executor/model_runner_components/load_model_utils.py:200)",
    "model: get_model_loader, the loader's option checks (model_loader/loader.py:4162)",
    "model: _get_quantization_config (model_loader/loader.py:174)",
    "model: _initialize_model on the meta device, quantization create_weights (model_loader/loader.py:285)",
    "model: check_quantized_moe_compatibility (model_executor/model_runner.py:1253)",
)
MEMORY_STEPS = (
    "memory: configure_kv_cache_dtype (model_executor/model_runner.py:1551)",
    "memory: resolve_layer_indices (model_executor/model_runner_components/layer_setup.py:140)",
    "memory: KVCacheConfigurator._resolve_memory_pool_config (mem_cache/kv_cache_configurator.py:3174)",
)
#: Steps that do not run here, as the verdict lists them.
ASSUMED_STEPS = (
    "model: weight loading and process_weights_after_loading (no weights; model_loader/loader.py)",
    "model: ranks other than rank 0 of node 0 are shaped as rank 0",
    "pools: the pools' storage (built on the meta device: shapes and bytes, nothing allocated; kv_cache_configurator.py _init_pools)",
    "memory: the HiCache radix tree and host pools (mem_cache/kv_cache_builder.py build_kv_cache)",
    "kernels: attention backends, NCCL / custom all-reduce (model_runner.py init_attention_backends)",
)


class MetaAllocations:
    """A torch function mode: every tensor SGLang puts on the GPU (or in pinned host memory)
    is made on the meta device instead, and its bytes are counted (``device_bytes``: every
    device allocation, temporaries included).

    Factory functions (``torch.empty``, ``zeros``, ``full`` ...) with no device or a CUDA
    device, and ``Tensor.to("cuda")`` / ``.cuda()``, give meta tensors counted on
    :data:`DEVICE`; with ``pin_memory=True`` they give meta tensors counted as host bytes
    (``host_bytes``). CPU tensors with data (``torch.tensor([...])``) stay on the CPU.

    A device tensor SGLang makes from host data (``torch.tensor(values, device="cuda")``,
    ``cpu_tensor.to("cuda")``; small ones, up to :data:`VALUES_KEPT` elements) is a meta
    tensor that keeps those values (``_oracle_values``, on the CPU): reading them back
    (``item``, ``tolist``, ``int()``; also of an element taken by index, or after ``.cpu()``,
    which keeps the meta tensor) answers what the GPU would hold, since nothing wrote to it. SGLang reads such values at startup: the MHA
    pool's byte stride of its first KV buffer (mem_cache/memory_pool.py:2397
    ``_init_kv_copy_and_warmup``, ``data_strides[0].item()``, with
    ``enable_kv_cache_copy``: a speculative role), which sizes its KV-copy tiles. Any other
    read of a meta tensor's data stays the emulation's edge (no verdict).
    """

    #: Most elements of a device tensor made from host data whose values are kept.
    VALUES_KEPT = 1 << 16
    #: Methods reading a tensor's values back to the host.
    READS = frozenset({"item", "tolist", "__int__", "__float__", "__index__", "__bool__"})

    FACTORIES = frozenset({
        "empty", "zeros", "ones", "full", "empty_strided", "rand", "randn", "randint", "arange",
        "empty_like", "zeros_like", "ones_like", "full_like", "linspace", "eye", "tensor", "as_tensor",
    })  # fmt: skip

    def __init__(self) -> None:
        from torch.overrides import TorchFunctionMode

        outer = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return outer._dispatch(func, args, dict(kwargs or {}))

        self.mode = _Mode()
        self.host_bytes = 0
        self.device_bytes = 0

    @staticmethod
    def _is_gpu(device: Any) -> bool:
        # a bare index is the accelerator's device of that index (torch: ``device=0`` is cuda:0),
        # e.g. ``torch.zeros(n, device=torch.cuda.current_device())`` (token_dispatcher/moriep.py:1686)
        if isinstance(device, int) and not isinstance(device, bool):
            return True
        text = str(device)
        return text.startswith("cuda") or text == "meta"

    def _count(self, tensor: Any, *, host: bool) -> Any:
        import torch

        if not isinstance(tensor, torch.Tensor) or not tensor.is_meta:
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        if host:
            self.host_bytes += nbytes
        else:
            self.device_bytes += nbytes
        return tensor

    @classmethod
    def _keep_values(cls, meta: Any, values: Any) -> Any:
        """``meta`` (made from the host tensor ``values``) keeps a CPU copy of small values."""
        import torch

        if (isinstance(meta, torch.Tensor) and meta.is_meta and isinstance(values, torch.Tensor)
                and not values.is_meta and values.numel() <= cls.VALUES_KEPT):
            with contextlib.suppress(Exception):  # values the CPU cannot hold in that dtype: not kept
                meta._oracle_values = values.detach().to("cpu", dtype=meta.dtype, copy=True).reshape(meta.shape)
        return meta

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        import torch

        name = getattr(func, "__name__", "")
        if name in self.FACTORIES:
            device = kwargs.get("device")
            pinned = bool(kwargs.pop("pin_memory", False))
            if name in ("tensor", "as_tensor", "empty_like", "zeros_like", "ones_like", "full_like") and device is None:
                if name in ("tensor", "as_tensor"):
                    return func(*args, **kwargs)
                src = args[0] if args else None
                if not (isinstance(src, torch.Tensor) and src.is_meta):
                    return func(*args, **kwargs)
            if pinned or device is None or self._is_gpu(device):
                kwargs["device"] = "meta"
                made = self._count(func(*args, **kwargs), host=pinned)
                if name in ("tensor", "as_tensor") and args and not (isinstance(args[0], torch.Tensor) and args[0].is_meta):
                    with contextlib.suppress(Exception):  # values torch cannot take on the CPU: not kept
                        self._keep_values(made, func(*args, **{**kwargs, "device": "cpu"}))
                return made
            return func(*args, **kwargs)
        first = args[0] if args else None
        values = getattr(first, "_oracle_values", None) if isinstance(first, torch.Tensor) and first.is_meta else None
        if values is not None:
            if name in self.READS:
                return getattr(values, name)()
            if name == "__getitem__":
                out = func(*args, **kwargs)
                index = args[1] if len(args) > 1 else None
                parts = index if isinstance(index, tuple) else (index,)
                if not any(isinstance(p, torch.Tensor) for p in parts):
                    self._keep_values(out, values[index])
                return out
        if name == "cpu" and isinstance(first, torch.Tensor) and first.is_meta:
            return first
        if name in ("to", "cuda") and isinstance(first, torch.Tensor):
            target = [a for a in args[1:] if not isinstance(a, torch.dtype)] + [kwargs.get("device")]
            if name == "cuda" or any(a is not None and self._is_gpu(a) for a in target):
                t = first
                dtype = next((a for a in args[1:] if isinstance(a, torch.dtype)), kwargs.get("dtype") or t.dtype)
                if t.is_meta:
                    return t if dtype == t.dtype else t.to(dtype)
                return self._keep_values(self._count(torch.empty_like(t, device="meta", dtype=dtype), host=False), t)
        return func(*args, **kwargs)

    def __enter__(self) -> "MetaAllocations":
        import torch

        # A device pointer SGLang mapped itself (cuda_driver: VMM) becomes meta storage of its size,
        # remembered so that resident_bytes does not count it again (cuda_driver.created_bytes has it).
        self._from_pointer = torch._C._construct_storage_from_data_pointer

        def from_pointer(pointer: int, device: Any, nbytes: int) -> Any:
            storage = torch.UntypedStorage(nbytes, device="meta")
            VMM_STORAGES[storage._cdata] = storage  # held: its address is never reused by another storage
            return storage

        torch._C._construct_storage_from_data_pointer = from_pointer
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        self.mode.__exit__(*exc)
        torch._C._construct_storage_from_data_pointer = self._from_pointer


def emulated_group_class():
    """:class:`EmulatedGroup`, defined once SGLang is importable (it subclasses GroupCoordinator)."""
    global EmulatedGroup
    if "EmulatedGroup" in globals():
        return EmulatedGroup
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    class EmulatedGroup(GroupCoordinator):  # noqa: F811
        """SGLang's GroupCoordinator for a group whose other members are not in this process:
        its width, this rank's place and the global ranks; no communicator."""

        def __init__(self, name: str, ranks: list[int], rank: int,
                     use_message_queue_broadcaster: bool = False) -> None:  # no super(): no torch.distributed
            self.unique_name = f"oracle:{name}"
            self.ranks = list(ranks)
            self.rank = rank
            self.world_size = len(ranks)
            self.rank_in_group = self.ranks.index(rank)
            self.local_rank = rank
            self.device_group = self.cpu_group = _EmulatedProcessGroup(self.ranks, self.rank_in_group)
            self.use_pynccl = False
            self.use_custom_allreduce = False
            self.local_size = 0
            # as GroupCoordinator.__init__ (parallel_state.py:562-567): a shared-memory broadcaster
            # for a group asked to have one (the TP group, SGLANG_USE_MESSAGE_QUEUE_BROADCASTER,
            # parallel_state.py:2690) wider than one rank; its writer is rank 0 of the group
            self.use_message_queue_broadcaster = use_message_queue_broadcaster
            self.mq_broadcaster = (EmulatedMessageQueue(self.unique_name, self.rank_in_group)
                                   if use_message_queue_broadcaster and self.world_size > 1 else None)

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            raise OracleLimit(f"the oracle's emulated {self.unique_name} group has no {name}")

    globals()["EmulatedGroup"] = EmulatedGroup
    return EmulatedGroup


class EmulatedMessageQueue:
    """The TP group's shared-memory broadcaster (SGLang's ``MessageQueue``,
    distributed/device_communicators/shm_broadcast.py) as rank 0 of the group holds it.

    ``GroupCoordinator.__init__`` makes one with ``MessageQueue.create_from_process_group(
    cpu_group, 1 << 22, 6)`` (parallel_state.py:565), whose writer is the group's rank 0
    (``writer_rank=0``); ``GroupCoordinator.broadcast_object`` sends through it
    (parallel_state.py:1577, ``src`` must be 0). On the writer, ``MessageQueue.broadcast_object``
    (shm_broadcast.py:479) enqueues the pickled object for the readers and returns the object
    itself: rank 0 sees its own broadcast. That is what this answers; the readers (the other
    ranks, shaped as rank 0 and not run here) are not served, and a reader's receive is no
    verdict (:class:`OracleLimit`). SGLang's startup broadcasts through it while the model is
    built: the Engram host table's shared layout sends rank 0's memfd (pid, fd)
    (layers/engram.py:740, ``_HostTable._open_shared_fd``)."""

    def __init__(self, group_name: str, rank_in_group: int) -> None:
        self.group_name = group_name
        self._is_writer = rank_in_group == 0

    def broadcast_object(self, obj: Any = None) -> Any:
        if self._is_writer:
            return obj
        raise OracleLimit(f"the oracle's emulated {self.group_name} message queue: a reader rank receives rank 0's "
                          "broadcast, which does not run here")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise OracleLimit(f"the oracle's emulated {self.group_name} message queue has no {name}")


class _EmulatedProcessGroup:
    """The torch.distributed group handle of an :class:`EmulatedGroup`: its global ``ranks`` and this
    process's place in them. ``size()`` and ``rank()`` answer as ``torch.distributed.ProcessGroup``'s do
    (the group's width; this rank's index in it): SGLang's dispatchers size themselves from them
    (token_dispatcher/flashinfer.py:167-168 ``ep_size``, ``ep_rank``; deepep.py:240 asserts the experts
    divide over ``group.size()``)."""

    def __init__(self, ranks: list[int] | tuple[int, ...] = (0,), rank_in_group: int = 0) -> None:
        self.ranks = tuple(ranks)
        self.rank_in_group = rank_in_group

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        return self.rank_in_group

    def same_node_as(self, source_rank: int, ranks_per_node: int) -> list[bool]:
        """Which of the group's ranks share a node with its ``source_rank``-th rank, with global
        ranks laid out node by node, ``ranks_per_node`` to a pod (a multi-node replica's node
        rank k runs global ranks k x ranks_per_node onwards: the pod's ``--node-rank``)."""
        node = self.ranks[source_rank] // ranks_per_node
        return [rank // ranks_per_node == node for rank in self.ranks]

    def __repr__(self) -> str:
        return "<oracle emulated process group>"


def _same_node_standin(real: Any) -> Any:
    """SGLang's ``in_the_same_node_as(pg, source_rank)`` (distributed/parallel_state.py:3390), a
    collective over shared memory, answered for an emulated group from the pod layout: the ranks
    on one node are ``tp x pp / nnodes`` consecutive global ranks (runtime_context's parallel
    config); any other group goes to SGLang's own."""

    def in_the_same_node_as(pg: Any, source_rank: int = 0) -> list[bool]:
        if not isinstance(pg, _EmulatedProcessGroup):
            return real(pg, source_rank=source_rank)
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        per_node = max(1, parallel.tp_size * parallel.pp_size // max(1, parallel.nnodes))
        return pg.same_node_as(source_rank, per_node)

    return in_the_same_node_as


@contextlib.contextmanager
def emulated_collectives() -> Iterator[None]:
    """``torch.distributed`` answers the collectives SGLang's startup makes on an emulated group.

    A MIN/MAX reduction or a broadcast over ranks that are all shaped as rank 0 returns
    rank 0's value; the call is made on an emulated group's handle only (any other group goes
    to torch). SGLang's ``in_the_same_node_as`` is answered from the pod layout
    (:func:`_same_node_standin`). ``is_initialized`` answers True inside the block.
    """
    import torch.distributed as dist

    saved = {n: getattr(dist, n) for n in ("all_reduce", "broadcast", "barrier", "is_initialized")}

    def _ours(group: Any) -> bool:
        return isinstance(group, _EmulatedProcessGroup)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        if _ours(group):
            return None
        return saved["all_reduce"](tensor, op=op, group=group, async_op=async_op)

    def broadcast(tensor, src=0, group=None, async_op=False):
        if _ours(group):
            return None
        return saved["broadcast"](tensor, src=src, group=group, async_op=async_op)

    def barrier(group=None, **kw):
        if _ours(group):
            return None
        return saved["barrier"](group=group, **kw)

    dist.all_reduce, dist.broadcast, dist.barrier = all_reduce, broadcast, barrier
    dist.is_initialized = lambda: True
    from sglang.srt.distributed import parallel_state as ps

    real_same_node = ps.in_the_same_node_as
    standin = _same_node_standin(real_same_node)
    bound = [m for m in list(sys.modules.values()) if getattr(m, "in_the_same_node_as", None) is real_same_node]
    for module in bound:  # parallel_state and the modules that imported the name
        module.in_the_same_node_as = standin
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)
        for module in bound:
            module.in_the_same_node_as = real_same_node


@contextlib.contextmanager
def _model_parallel_groups(parallel: Any, world_rank: int) -> Iterator[None]:
    """SGLang's own ``initialize_model_parallel`` (distributed/parallel_state.py:2566) lays out
    this rank's groups, with each group made an :class:`EmulatedGroup` at
    ``init_model_parallel_group`` (the call that would open a communicator) and
    torch.distributed answering the world's size and this rank. SGLang then records the
    groups in the rank's context (``override_permanently``), leaves disabled groups unset,
    and the module's group globals are restored afterwards.
    """
    import torch.distributed as dist
    from sglang.srt.distributed import parallel_state as ps

    group = emulated_group_class()
    world = parallel.tp_size * parallel.pp_size
    names = [n for n, v in vars(ps).items() if n.startswith("_") and n.isupper() and (v is None or isinstance(v, ps.GroupCoordinator))]
    saved_globals = {n: getattr(ps, n) for n in names}
    saved_init, saved_dist = ps.init_model_parallel_group, (dist.get_world_size, dist.get_rank)

    def init_model_parallel_group(group_ranks, local_rank, backend, **kwargs):
        mine = next((list(r) for r in group_ranks if world_rank in r), [world_rank])
        return group(kwargs.get("group_name") or "group", mine, world_rank,
                     use_message_queue_broadcaster=bool(kwargs.get("use_message_queue_broadcaster")))

    for n in names:
        setattr(ps, n, None)
    ps.init_model_parallel_group = init_model_parallel_group
    dist.get_world_size = lambda group=None: world
    dist.get_rank = lambda group=None: world_rank
    try:
        ps._WORLD = group("world", list(range(world)), world_rank)
        parallel.override_permanently(world_group=ps._WORLD)
        ps.initialize_model_parallel(backend="nccl")
        yield
    finally:
        ps.init_model_parallel_group = saved_init
        dist.get_world_size, dist.get_rank = saved_dist
        for n, v in saved_globals.items():
            setattr(ps, n, v)


@contextlib.contextmanager
def _engram_hasher_standin() -> Iterator[list[str]]:
    """The Engram hasher built without the model's tokenizer files, which the catalog does not hold.

    layers/engram.py ``EngramHasher.from_config`` loads the tokenizer and
    ``build_compressed_token_map`` normalizes its vocabulary to the config's
    ``engram_compressed_vocab_size`` distinct tokens. The stand-in map sends token i to
    ``i mod engram_compressed_vocab_size`` over the config's ``vocab_size``: the hasher's
    real ``__init__`` runs on it (buffers, multipliers), only the token normalization is
    assumed (listed in the verdict).
    """
    used: list[str] = []
    try:
        from sglang.srt.layers import engram
    except ImportError:
        yield used
        return
    real_from_config = engram.EngramHasher.from_config.__func__
    real_tokenizer, real_map = engram.get_tokenizer, engram.build_compressed_token_map

    def from_config(cls, config, layout, *, image_token_id=None):
        used.append("model: the Engram hasher's token normalization (layers/engram.py build_compressed_token_map; "
                    "the catalog has no tokenizer files)")
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        compressed = int(config.engram_compressed_vocab_size)
        engram.get_tokenizer = lambda *a, **k: None
        engram.build_compressed_token_map = lambda tokenizer: ([i % compressed for i in range(max(vocab, compressed))],
                                                               compressed)
        try:
            return real_from_config(cls, config, layout, image_token_id=image_token_id)
        finally:
            engram.get_tokenizer, engram.build_compressed_token_map = real_tokenizer, real_map

    engram.EngramHasher.from_config = classmethod(from_config)
    try:
        yield used
    finally:
        engram.EngramHasher.from_config = classmethod(real_from_config)


@contextlib.contextmanager
def _engram_shards_recorded() -> Iterator[None]:
    """Each ``EngramEmbedding`` built keeps the table size and hash-column bounds it was given
    (``_oracle_shard``), so :func:`engram_rank_excess` can size every rank's shard."""
    try:
        from sglang.srt.layers import engram
    except ImportError:
        yield
        return
    real_init = engram.EngramEmbedding.__init__

    def init(self, num_embeddings, dim, layer_id, column_bounds):
        real_init(self, num_embeddings, dim, layer_id, column_bounds)
        self._oracle_shard = (int(num_embeddings), tuple(column_bounds))

    engram.EngramEmbedding.__init__ = init
    try:
        yield
    finally:
        engram.EngramEmbedding.__init__ = real_init


@contextlib.contextmanager
def _hip_runtime_emulated() -> Iterator[None]:
    """On the emulated ROCm device, SGLang's handle on the HIP runtime library
    (layers/engram.py:636 ``_hip_runtime``, found among the process's loaded libraries on a
    real pod) is :class:`.emulation.HipRuntime`; elsewhere nothing changes."""
    from .emulation import VENDOR, HipRuntime

    try:
        from sglang.srt.layers import engram
    except ImportError:
        engram = None
    if engram is None or VENDOR.get("name") != "amd" or not hasattr(engram, "_hip_runtime"):
        yield
        return
    real = engram._hip_runtime
    engram._hip_runtime = lambda: HipRuntime()
    try:
        yield
    finally:
        engram._hip_runtime = real


def engram_rank_excess(model: Any) -> int:
    """Bytes the TP rank holding the most Engram rows has on its GPU beyond rank 0's, for the
    device table and peer shards (layers/engram.py ``shard_range`` splits the rows on hash-column
    bounds, unevenly; each row is ``dim`` fp8 bytes and ``dim / FP8_BLOCK_SIZE`` e8m0 scales).
    SGLang plans the KV memory with the least free memory of the group
    (distributed/bootstrap.py:207 ``get_available_gpu_memory(distributed=True)``), which is that
    rank's; the oracle builds rank 0 only and adds this. 0 without Engram or with the host table."""
    try:
        from sglang.srt.layers import engram
    except ImportError:
        return 0
    excess = 0
    for m in model.modules():
        shard = getattr(m, "_oracle_shard", None)
        if not isinstance(m, engram.EngramEmbedding) or shard is None or m.host_table is not None:
            continue
        num_embeddings, bounds = shard
        rows = [end - start for start, end in
                (engram.shard_range(num_embeddings, bounds, r, m.tp_size) for r in range(m.tp_size))]
        excess += (max(rows) - m.rows) * (m.dim + m.dim // engram.FP8_BLOCK_SIZE)
    return excess


@contextlib.contextmanager
def scheduler_rank(server_args: Any, world_rank: int = 0) -> Iterator[Any]:
    """Rank ``world_rank``'s runtime context with its emulated groups, as the scheduler
    process has it after ``init_torch_distributed`` (model_runner.py)."""
    from sglang.srt.runtime_context import SpawnRanks, create_context, get_parallel, use_context

    context = create_context(server_args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, dp_rank=None, gpu_id=0))
    with use_context(context):
        parallel = get_parallel()
        with emulated_collectives(), _model_parallel_groups(parallel, world_rank):
            yield context


#: Storages (``_cdata``) made from device pointers SGLang mapped itself (VMM: cuMemCreate +
#: cuMemMap, e.g. the Engram peer shards, layers/engram.py _PeerShards.views): their bytes are
#: the driver's allocation, counted by cuda_driver.created_bytes, not by resident_bytes. Each
#: storage is held (a meta storage owns no bytes): were it freed, a later model's storage could
#: take its address and go uncounted (CI: builds 2 MB to 0.8 GB under SGLang's own figure).
VMM_STORAGES: dict[int, Any] = {}


def resident_bytes(model: Any) -> int:
    """Bytes of the device tensors ``model`` holds: parameters, buffers and tensors its
    modules keep as attributes (workspaces, tables), each counted once; views of memory
    SGLang mapped through the driver (:data:`VMM_STORAGES`) are not counted here."""
    import torch

    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.is_meta and id(t) not in seen:
            seen.add(id(t))
            if t.untyped_storage()._cdata in VMM_STORAGES:
                return
            total += t.numel() * t.element_size()

    for module in model.modules():
        for t in module._parameters.values():
            add(t)
        for t in module._buffers.values():
            add(t)
        for value in vars(module).values():
            if isinstance(value, torch.Tensor):
                add(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    add(item)
    return total


def build_model(server_args: Any, *, model_config: Any = None, load_format: str | None = None,
                draft: bool = False) -> tuple[Any, dict[str, Any], list[str]]:
    """SGLang's model for rank 0, on the meta device: (model, facts, assumed steps).

    Runs in :func:`scheduler_rank`. The target's model by default; a draft worker's
    (``draft=True``, :mod:`.speculative`) with its own ``model_config`` and
    ``--speculative-draft-load-format`` (``load_format``), without the scheduler's MoE/GEMM
    step (made once, for the target). ``facts``: {"architecture", "quantization",
    "weightBytes" (device bytes live after the build), "maxRankExtraBytes" (what the TP rank
    with the most Engram rows holds beyond rank 0: :func:`engram_rank_excess`), "hostBytes" (pinned host bytes),
    "parameters"}. Raises whatever SGLang raises (its refusal).
    """
    import torch
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.model_executor.model_runner import check_quantized_moe_compatibility
    from sglang.srt.model_executor.model_runner_components.load_model_utils import build_load_config
    from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model, get_model_loader
    from sglang.srt.model_loader.utils import set_default_torch_dtype
    from sglang.srt.runtime_context import get_model, get_parallel

    from sglang.srt.managers.scheduler import Scheduler

    model_config = model_config if model_config is not None else model_config_of(server_args)
    parallel = get_parallel()
    if not draft:
        # The scheduler's own step before its model worker: the MoE and GEMM runtime flags
        # (managers/scheduler.py init_moe_gemm_config), which the layers read as they are built.
        scheduler = Scheduler.__new__(Scheduler)
        scheduler.model_config = model_config
        scheduler.server_args = server_args
        scheduler.init_moe_gemm_config()
    load_config = build_load_config(
        server_args=server_args, tp_rank=parallel.tp_rank, load_format=load_format,
        remote_instance_weight_transporter_engine=None,
        remote_instance_weight_transporter_session_id="", draft_model_idx=None,
        weight_cache_mode=get_model().weight_cache_mode, weight_cache_socket=get_model().weight_cache_socket,
    )
    # The loader of the load format, as load_model_with_memory_saver makes it: its
    # constructor checks the loader options (--model-loader-extra-config); nothing is read.
    get_model_loader(load_config, model_config)
    quant_config = _get_quantization_config(model_config, load_config)
    from . import cuda_driver

    from .emulation import HOST_REGISTERED

    vmm_before = cuda_driver.live_handles()
    pinned_before = len(HOST_REGISTERED)
    meta = MetaAllocations()
    with _engram_hasher_standin() as assumed, _engram_shards_recorded(), _hip_runtime_emulated(), \
            set_default_torch_dtype(model_config.dtype), meta, torch.no_grad():
        model = _initialize_model(model_config, load_config, quant_config)
    pinned = sum(n for _, n in HOST_REGISTERED[pinned_before:])
    if pinned:
        assumed.append(f"model: cudaHostRegister pins {pinned / 2**30:.1f} GiB of host memory (the Engram host table, "
                       "layers/engram.py:729): the node's host memory is not emulated, the call succeeds")
    check_quantized_moe_compatibility(model_config=model_config, tp_size=parallel.tp_size,
                                      moe_ep_size=parallel.moe_ep_size, moe_dp_size=parallel.moe_dp_size)
    facts = {
        "architecture": type(model).__name__,
        "quantization": model_config.quantization,
        "weightBytes": resident_bytes(model) + cuda_driver.created_bytes(since=vmm_before),
        "maxRankExtraBytes": engram_rank_excess(model),
        "hostBytes": meta.host_bytes,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, facts, assumed


def target_runner(server_args: Any, model: Any) -> Any:
    """The target's ``ModelRunner`` as the draft worker reads it (:mod:`.speculative`): its
    model config, model, device, speculative algorithm and ``spec_aux_config``
    (``init_spec_aux_hidden_state``, model_runner.py:596: the draft's layer counts and the
    target layers it captures). The runner's ``__init__`` needs a GPU; these fields are set
    as it sets them."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.runtime_context import get_device, get_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = ModelRunner.__new__(ModelRunner)
    runner.model_config = model_config_of(server_args)
    runner.server_args = server_args
    runner.model = model
    runner.device = get_device().device
    runner.gpu_id = 0
    runner.is_draft_worker = False
    runner.draft_model_idx = None
    runner.spec_algorithm = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
    runner.dtype = runner.model_config.dtype
    runner.capture_tail_hooks = []  # model_runner.py:396; the DSpark verify epilogue adds its hook
    runner.init_spec_aux_hidden_state()
    return runner


def plan_memory(server_args: Any, model: Any) -> tuple[dict[str, Any], Any, Any]:
    """SGLang's KV memory planning for rank 0 after ``model`` is resident: the pool sizes.

    A ModelRunner carrying what ``init_kv_cache_configurator`` reads (the runner's own
    ``__init__`` needs a GPU for what precedes), then the real configurator's
    ``_resolve_memory_pool_config``. ``pre_model_load_memory`` is the emulated free memory
    before the weights, in GiB, as ``bootstrap.measure_pre_model_load_memory`` measures it.
    Returns ({"maxTotalNumTokens", "maxRunningRequests", "memFractionStatic",
    "freeBeforeWeightsBytes"}, the runner, SGLang's MemoryPoolConfig); raises SGLang's refusal.
    """
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.model_executor.model_runner_components.layer_setup import resolve_layer_indices
    from sglang.srt.model_executor.model_runner_components.load_model_utils import resolve_sliding_window_size
    from sglang.srt.runtime_context import get_parallel, get_schedule

    runner = target_runner(server_args, model)
    model_config = runner.model_config
    runner.draft_attention_backend = None
    runner.mem_fraction_static = get_schedule().mem_fraction_static
    runner.memory_pool_config = None
    runner.req_to_token_pool = None
    runner.token_to_kv_pool_allocator = None
    runner.page_size = get_schedule().page_size
    runner.is_hybrid_swa = model_config.is_hybrid_swa
    runner.is_hybrid_swa_compress = model_config.is_hybrid_swa_compress
    runner.use_mla_backend = model_config.attention_arch == AttentionArch.MLA
    runner.pp_group = get_parallel().pp_group
    runner.forward_stream = None
    runner.configure_kv_cache_dtype()
    runner.sliding_window_size = resolve_sliding_window_size(model, model_config)
    runner.layer_info = resolve_layer_indices(model=model, model_config=model_config, is_draft_worker=False,
                                              draft_model_idx=None)
    runner.init_kv_cache_configurator()
    free_before = DEVICE.total - DEVICE.context
    pre_model_load_memory = free_before / (1 << 30)
    # _profile_available_bytes first runs gc.collect() to free weight-loading temporaries
    # held on the GPU; the emulated device has none (its figure is the resident weights),
    # and a full collection of the worker's heap costs about a second.
    import gc

    collect, gc.collect = gc.collect, lambda *a: 0
    try:
        config = runner.kv_cache_configurator._resolve_memory_pool_config(pre_model_load_memory)
    finally:
        gc.collect = collect
    return {
        "maxTotalNumTokens": int(config.max_total_num_tokens),
        "maxRunningRequests": int(config.max_running_requests) if config.max_running_requests is not None else None,
        "memFractionStatic": get_schedule().mem_fraction_static,
        "freeBeforeWeightsBytes": int(free_before),
    }, runner, config
