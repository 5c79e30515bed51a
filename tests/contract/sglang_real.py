"""Thin wrappers around the REAL sglang==0.5.23 and smg==1.13.0 code, for contract tests.

Nothing here re-implements SGLang or smg logic: each wrapper builds the inputs the
real function expects, emulates the GPU it would ask about by patching the device
queries SGLang itself calls (the patch points are listed in
docs/sglang-0.5.23-facts.md, section "Emulating an ISA"), and calls it. Where SGLang
raises, the wrapper lets the real exception through.

Every public function skips the calling test (pytest.importorskip) when sglang or
smg is not installed. Install recipe: requirements/contract.txt.

Run tests with `pytest ...`, not `python -m pytest ...` from the repository root: the
source folder `operator/` there shadows the standard-library module `operator` when
the root is on sys.path, and torch then fails to import (or set PYTHONSAFEPATH=1).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import types
from typing import Any, Iterator, Mapping, Optional, Sequence
from unittest import mock

import pytest

SGLANG_VERSION = "0.5.23"
SMG_VERSION = "1.13.0"

# A model path that is never read: prepare_server_args only parses (it does not
# open the model path, load the HF config, touch a GPU or the network).
DUMMY_MODEL_PATH = "/nonexistent/model"

# ISA -> how SGLang sees that GPU. cap = torch.cuda.get_device_capability().
_ISAS: dict[str, dict[str, Any]] = {
    "sm_103": {"hip": False, "cap": (10, 3), "sm100": True, "gfx95": False},
    "sm_100": {"hip": False, "cap": (10, 0), "sm100": True, "gfx95": False},
    "sm_90a": {"hip": False, "cap": (9, 0), "sm100": False, "gfx95": False},
    "sm_90": {"hip": False, "cap": (9, 0), "sm100": False, "gfx95": False},
    "gfx950": {"hip": True, "cap": (9, 5), "sm100": False, "gfx95": True},
    "gfx942": {"hip": True, "cap": (9, 4), "sm100": False, "gfx95": False},
}
SUPPORTED_ISAS = tuple(_ISAS)


class EngineArgsError(ValueError):
    """argparse refused a launch command (sglang's parser calls sys.exit(2))."""


# --------------------------------------------------------------------------- imports


def _require_sglang():
    mod = pytest.importorskip("sglang", reason="sglang==0.5.23 is not installed")
    version = getattr(mod, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("sglang")
    if version != SGLANG_VERSION:
        pytest.skip(f"sglang {version} installed; contract is pinned to {SGLANG_VERSION}")
    pytest.importorskip("sglang.srt.server_args")
    return mod


def _require_smg():
    pytest.importorskip("smg", reason="smg==1.13.0 is not installed")
    from importlib.metadata import version as _v

    if _v("smg") != SMG_VERSION:
        pytest.skip(f"smg {_v('smg')} installed; contract is pinned to {SMG_VERSION}")
    return pytest.importorskip("smg.router_args")


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _environ(env: Optional[Mapping[str, Optional[str]]]) -> Iterator[None]:
    """Set (value) or unset (None) environment variables for the duration."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _keep_root_logging() -> Iterator[None]:
    # prepare_server_args calls logging.basicConfig(force=True); keep pytest's handlers.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _argparse_call(fn, *args):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args)
    except SystemExit as e:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        raise EngineArgsError(lines[-1] if lines else f"argparse exit {e.code}") from None


# --------------------------------------------------------------------------- engine args


def parse_engine_args(argv: Sequence[str], env: Optional[Mapping[str, Optional[str]]] = None):
    """The real `sglang.srt.server_args.prepare_server_args(argv)` result (a ServerArgs).

    `argv` is the launch command without `python -m sglang.launch_server`. Unknown
    flags and bad choices raise EngineArgsError carrying argparse's message. `env`
    is applied only during the call (parsing reads no SGLANG_* variable; resolution,
    which does, is not run here).
    """
    _require_sglang()
    from sglang.srt.server_args import prepare_server_args

    with _environ(env), _keep_root_logging():
        return _argparse_call(prepare_server_args, list(argv))


@contextlib.contextmanager
def emulate_isa(isa: str, *, dsv4_attn_backend: Optional[str] = None) -> Iterator[None]:
    """Make SGLang's own device queries answer as on `isa`, for the DeepSeek-V4 KV
    layout selection and the DeepSeek-V4 argument hook. No GPU is touched."""
    _require_sglang()
    if isa not in _ISAS:
        raise ValueError(f"unknown ISA {isa!r}; known: {SUPPORTED_ISAS}")
    facts = _ISAS[isa]
    import torch

    from sglang.srt.arg_groups import deepseek_v4_hook
    from sglang.srt.layers.attention import hip_flash_mla
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as dsv4_pool
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.utils import common as common_utils

    gfx95 = lambda: facts["gfx95"]  # noqa: E731
    patches = [
        mock.patch.object(torch.cuda, "is_available", lambda: True),
        mock.patch.object(torch.cuda, "get_device_capability", lambda *a, **k: facts["cap"]),
        mock.patch.object(torch.version, "cuda", None if facts["hip"] else "13.0"),
        mock.patch.object(common_utils, "is_sm100_supported", lambda: facts["sm100"]),
        mock.patch.object(common_utils, "is_gfx95_supported", gfx95),
        mock.patch.object(dsv4_pool, "_is_hip", facts["hip"]),
        mock.patch.object(dsv4_pool, "is_gfx95_supported", gfx95),
        mock.patch.object(hip_flash_mla, "is_gfx95_supported", gfx95),
        mock.patch.object(deepseek_v4_hook, "is_gfx95_supported", gfx95),
    ]
    if dsv4_attn_backend is not None:
        exec_ns = types.SimpleNamespace(
            kernel=types.SimpleNamespace(dsv4_attn_backend=dsv4_attn_backend)
        )
        patches.append(mock.patch.object(dsv4_pool, "get_exec", lambda: exec_ns))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(
            override_platform(
                is_cuda=not facts["hip"], is_hip=facts["hip"], is_sm100=facts["sm100"]
            )
        )
        yield


def _model_config(model_type: str, architectures: Sequence[str]):
    return types.SimpleNamespace(
        hf_config=types.SimpleNamespace(
            model_type=model_type, architectures=list(architectures)
        )
    )


def real_dsv4_attn_backend(
    argv: Sequence[str],
    *,
    isa: str,
    model_type: str = "deepseek_v41",
    env: Optional[Mapping[str, Optional[str]]] = None,
) -> str:
    """The --dsv4-attn-backend a launch command resolves to on `isa`.

    Runs the real `handle_deprecated_dp_attention` and `apply_deepseek_v4_defaults`
    (arg_groups/parallel_hook.py, deepseek_v4_hook.py) on the parsed command, with the model's HF config reduced to its model_type and
    architecture. Raises its real AssertionError for an impossible backend (e.g.
    flashmla_mega off SM100/SM103 or off DeepSeek-V4.1, trtllm under PD).
    """
    _require_sglang()
    from sglang.srt.arg_groups import deepseek_v4_hook
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.parallel_hook import handle_deprecated_dp_attention

    argv = list(argv)
    if "--device" not in argv:
        argv += ["--device", "cuda"]  # what resolution sets on CUDA and ROCm alike
    server_args = parse_engine_args(argv, env)
    arch = "DeepseekV4ForCausalLM"  # V4 and V4.1 (DeepseekV41ForCausalLM is normalized to it)
    mc = _model_config(model_type, [arch])
    with _environ(env), _keep_root_logging(), emulate_isa(isa), mock.patch.object(
        deepseek_v4_hook, "model_config_of", lambda _sa: mc
    ), mock.patch("sglang.srt.arg_groups.overrides.model_config_of", lambda _sa: mc):
        # Pipeline order (arg_groups/pipeline.py): the deprecated
        # `--dp-size N --enable-dp-attention` becomes attn_dp_size first.
        handle_deprecated_dp_attention(server_args)
        deepseek_v4_hook.apply_deepseek_v4_defaults(server_args, arch)
        return resolving_view(server_args).dsv4_attn_backend


def real_select_dsv4_kv_layout(
    *, isa: str, attn_backend: str, kv_layout_env: Optional[str], compressed_env: Optional[str]
):
    """The real `select_dsv4_kv_layout()` -> (KVLayout, compressed option or None), with
    `attn_backend` already resolved (flashmla | flashmla_mega | trtllm)."""
    _require_sglang()
    from sglang.srt.mem_cache import deepseek_v4_memory_pool as dsv4_pool

    env = {
        "SGLANG_DSV4_KV_LAYOUT": kv_layout_env,
        "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": compressed_env,
    }
    with _environ(env), emulate_isa(isa, dsv4_attn_backend=attn_backend):
        return dsv4_pool.select_dsv4_kv_layout()


def real_pd_kv_layout(
    *,
    isa: str,
    attn_backend: str,
    kv_layout_env: Optional[str],
    compressed_env: Optional[str],
    model_type: str = "deepseek_v41",
    compression_ratios: Sequence[int] = (4, 128),
    disaggregation_mode: str = "decode",
    kv_cache_dtype: str = "fp8_e4m3",
    extra_argv: Sequence[str] = (),
) -> str:
    """The PD KV layout string one side sends in the handshake, e.g. "v41,c4:v41,c128:v41".

    1. `attn_backend` (auto | flashmla | flashmla_mega | trtllm) is resolved by the real
       DeepSeek-V4 hook for this side's flags (real_dsv4_attn_backend);
    2. the real `select_dsv4_kv_layout()` picks the main layout and compressed option;
    3. the real `DeepSeekV4TokenToKVPool.pd_kv_layout` formats them, on a pool shell
       carrying only the four attributes that method reads (a real pool needs a GPU).
    `compression_ratios` are the model's non-zero hf_config.compress_ratios (DeepSeek-V4.1:
    4 and 128). Every sglang exception (AssertionError / ValueError) propagates.
    """
    _require_sglang()
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.layers.attention.dsv4.unified_kv_gate import is_unified_kv_triton
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    env = {
        "SGLANG_DSV4_KV_LAYOUT": kv_layout_env,
        "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": compressed_env,
    }
    argv = [
        "--model-path", DUMMY_MODEL_PATH,
        "--disaggregation-mode", disaggregation_mode,
        "--kv-cache-dtype", kv_cache_dtype,
        "--dsv4-attn-backend", attn_backend,
        *extra_argv,
    ]  # fmt: skip
    backend = real_dsv4_attn_backend(argv, isa=isa, model_type=model_type, env=env)
    layout, option = real_select_dsv4_kv_layout(
        isa=isa, attn_backend=backend, kv_layout_env=kv_layout_env, compressed_env=compressed_env
    )
    pool = DeepSeekV4TokenToKVPool.__new__(DeepSeekV4TokenToKVPool)
    pool.kv_layout = KVLayout.parse(layout)
    pool.compressed_kv_layout_option = option
    pool.compression_ratios = list(compression_ratios)
    # DeepSeekV4TokenToKVPool.__init__ (deepseek_v4_memory_pool.py:1031-1038): the trtllm
    # pool is uniform FP8 and must have been given the V4 layout.
    pool.uniform_fp8 = (not is_unified_kv_triton()) and backend == "trtllm"
    if pool.uniform_fp8:
        assert pool.kv_layout is KVLayout.V4, (
            "--dsv4-attn-backend trtllm keeps its own uniform 512-byte pages; "
            f"it cannot be combined with SGLANG_DSV4_KV_LAYOUT={pool.kv_layout.value}"
        )
    return pool.pd_kv_layout()


# --------------------------------------------------------------------------- plugins


def real_features_in_use(server_args, vendor: str = "nvidia") -> set[str]:
    """Names of the plugin Features (e.g. "PD_DISAGGREGATION") this configuration uses,
    from the real FEATURE_PROBES of srt/kernel_plugins/<vendor>/binding.py, evaluated on
    the same resolving view `handle_<vendor>_*` uses. Unresolved fields keep their
    parsed values (e.g. --dp-size 4 --enable-dp-attention counts as DP attention)."""
    _require_sglang()
    from sglang.srt.arg_groups.overrides import resolving_view

    if vendor == "nvidia":
        from sglang.srt.kernel_plugins.nvidia import binding
    elif vendor == "amd":
        from sglang.srt.kernel_plugins.amd import binding
    else:
        raise ValueError(f"vendor must be nvidia or amd, not {vendor!r}")
    return {f.name for f in binding.features_in_use(resolving_view(server_args))}


def real_plugin_features(vendor: str = "nvidia") -> dict[str, str]:
    """The real Feature enum of kernels/plugin_kernels/<vendor>/spec.py: name -> value."""
    _require_sglang()
    if vendor == "nvidia":
        from sglang.kernels.plugin_kernels.nvidia.spec import Feature
    elif vendor == "amd":
        from sglang.kernels.plugin_kernels.amd.spec import Feature
    else:
        raise ValueError(f"vendor must be nvidia or amd, not {vendor!r}")
    return {f.name: f.value for f in Feature}


# --------------------------------------------------------------------------- paged experts


def real_paged_experts_check(
    *,
    num_resident: Optional[int],
    top_k: int,
    tp_size: int = 1,
    ep_size: int = 1,
    pp_size: int = 1,
    dp_size: int = 1,
    enable_eplb: bool = False,
    speculative_algorithm: Optional[str] = None,
    prefill_graph: str = "breakable",
    decode_graph: str = "full",
    load_format: str = "auto",
    quantization_supported: bool = True,
    enable_fused_moe_sum_all_reduce: bool = False,
    num_fused_shared_experts: int = 0,
) -> None:
    """Run the real `check_paged_experts_compat` (layers/moe/paged_experts/method.py)
    against these settings; it raises RuntimeError("Paged experts: ...") listing every
    problem, or returns None. The published runtime config it reads is supplied as
    plain namespaces (prefill/decode graph: full | breakable | disabled)."""
    _require_sglang()
    from sglang.srt.layers.moe.paged_experts import method
    from sglang.srt.model_executor import cuda_graph_config as cgc

    ns = types.SimpleNamespace
    graph = ns(
        cuda_graph_config=ns(prefill=ns(backend=prefill_graph), decode=ns(backend=decode_graph))
    )
    exec_ns = ns(
        moe=ns(
            enable_eplb=enable_eplb,
            paged_experts_num_resident=num_resident,
            enable_fused_moe_sum_all_reduce=enable_fused_moe_sum_all_reduce,
        ),
        graph=graph,
    )
    parallel = ns(tp_size=tp_size, ep_size=ep_size, pp_size=pp_size, dp_size=dp_size)
    layer = ns(
        top_k=top_k,
        quant_method=ns(),
        num_fused_shared_experts=num_fused_shared_experts,
    )
    expert_format = object() if quantization_supported else None
    with mock.patch.object(method, "get_parallel", lambda: parallel), mock.patch.object(
        method, "get_exec", lambda: exec_ns
    ), mock.patch.object(method, "get_spec", lambda: ns(speculative_algorithm=speculative_algorithm)), mock.patch.object(
        method, "get_model", lambda: ns(load_format=load_format)
    ), mock.patch.object(cgc, "get_exec", lambda: exec_ns):
        method.check_paged_experts_compat(layer=layer, expert_format=expert_format)


# --------------------------------------------------------------------------- HiCache / Mooncake


def real_mooncake_store_config(
    extra_config_json: Optional[str], env: Optional[Mapping[str, Optional[str]]] = None
):
    """The MooncakeStoreConfig SGLang builds for --hicache-storage-backend mooncake.

    `extra_config_json` is the --hicache-storage-backend-extra-config string. The real
    `MooncakeBaseStore._load_config` picks the source: the extra config when it names
    master_server_address or client_server_address, else the file in
    SGLANG_HICACHE_MOONCAKE_CONFIG_PATH, else MOONCAKE_* environment variables (and
    raises ValueError when none is given). No Mooncake library or GPU is needed.
    """
    _require_sglang()
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeBaseStore

    extra = json.loads(extra_config_json) if extra_config_json else None
    storage_config = types.SimpleNamespace(extra_config=extra)
    with _environ(env):
        return MooncakeBaseStore()._load_config(storage_config)


# --------------------------------------------------------------------------- smg


def parse_smg_args(argv: Sequence[str]):
    """The real smg `RouterArgs` for a `smg launch ...` command line.

    Uses smg.launch_router.parse_router_args, which is what `smg launch` runs:
    RouterArgs.add_cli_args(parser, use_router_prefix=False), then
    RouterArgs.from_cli_args. A leading "launch" is dropped. argparse errors raise
    EngineArgsError.
    """
    _require_smg()
    from smg.launch_router import parse_router_args

    argv = list(argv)
    if argv[:1] == ["launch"]:
        argv = argv[1:]
    return _argparse_call(parse_router_args, argv)


def smg_binary() -> str:
    """Path of the `smg` console script installed with smg (entry point smg.cli:main)."""
    _require_smg()
    path = os.path.join(os.path.dirname(sys.executable), "smg")
    if not os.path.exists(path):
        pytest.skip("the smg console script is not next to this interpreter")
    return path
