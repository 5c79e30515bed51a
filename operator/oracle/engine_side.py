"""SGLang 0.5.23's own startup checks and PD handshake, run on one rendered role (worker side).

Imported only inside an oracle worker process, after ``emulation.install`` made the
process look like the role's GPU node; it imports SGLang. Every verdict here is SGLang's:

1. :func:`resolve_role` does what ``python -m sglang.launch_server`` does before it loads
   a weight: ``prepare_server_args`` on the role's command (the ``--config`` file the
   ConfigMap carries plus the command-line flags), ``ServerArgs.resolve_once()`` (the
   resolution pipeline of arg_groups/pipeline.py, which loads the model's HF config
   from the emulated model directory) and ``ServerArgs.check_server_args()``
   (arg_groups/validation_hook.py), then the model-building divisibility checks of
   :mod:`.model_checks` (SGLang's ``divide``), and resolves the facts a PD peer is
   compared on: SGLang's ``configure_kv_cache_dtype`` (the KV dtype string),
   ``select_dsv4_kv_layout`` and ``DeepSeekV4TokenToKVPool.pd_kv_layout`` (the PD KV
   layout string), ``get_dsv41_spec_layout`` (the DSpark transfer layout).
2. :func:`serve_bootstrap` starts SGLang's real ``CommonKVBootstrapServer`` on loopback
   and registers every prefill rank (dp x cp x tp x pp) through the real
   ``CommonKVManager.__init__`` -> ``register_to_bootstrap`` (an HTTP PUT), each rank in
   its own SGLang runtime context (``create_context`` with that rank's ``SpawnRanks``).
3. :func:`handshake` builds the decode side's real ``CommonKVManager`` and calls its
   ``try_ensure_parallel_info`` against that server (an HTTP GET of ``/route``): the
   page size, KV dtype, KV layout, DSpark layout, attention-TP and DCP checks of
   disaggregation/common/conn.py, and the decode-allocation-policy comparison of
   ``CommonKVReceiver.init``.

What is emulated, and why: the GPU (``emulation``), the model directory (config.json
only, from the catalog), the pool byte lengths of the DSpark transfer layout (a pool
needs GPU memory; see :func:`_dsv41_kv_args`), loopback addresses for the pod network,
and the bootstrap port: SGLang judges the rendered port, then the rank contexts get a
free loopback port in its place (``RuntimeContext.override``) for the live handshake.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from . import graphs, scheduler_pd, speculative, startup
from .kernel_standins import take_answered, take_calls
from .model_checks import model_build_problems
from . import stages
from .stages import PHASES, STAGES, OracleLimit, sglang_frame
from .stages import Refusal, describe  # noqa: F401  (the worker's and the PD queues' names for them)

log = logging.getLogger(__name__)

#: The stages of one role's startup, in order; a refusal names the stage it came from
#: (then ``bootstrap`` and ``handshake`` for the pair).
POD_IP = "127.0.0.1"
#: The variable a rank's address comes from (utils/network.py get_local_ip_auto reads it first).
HOST_IP_ENV = "SGLANG_HOST_IP"


@contextlib.contextmanager
def role_environment(env: dict[str, str]) -> Iterator[None]:
    """Run with exactly the pod's variables on top of the worker's base environment.

    Resolution writes ``os.environ`` (serving_hook.handle_environment_variables), so the
    whole mapping is restored afterwards.
    """
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        os.environ.setdefault("SGLANG_HOST_IP", POD_IP)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Keep SGLang's logging and argparse output off the worker's protocol stream."""
    err = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err):
        try:
            yield err
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind((POD_IP, 0))
        return s.getsockname()[1]


def _argparse_error(text: str) -> str | None:
    lines = [ln for ln in text.splitlines() if "error:" in ln]
    return lines[-1].split("error:", 1)[1].strip() if lines else None


def _write_config(config_yaml: str, model_dir: str, directory: Path) -> Path:
    """The role's --config file with the model path pointed at the emulated model directory."""
    config = yaml.safe_load(config_yaml) or {}
    config["model-path"] = model_dir
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _cli_args(args: list[str]) -> list[str]:
    """The command-line flags after ``--config FILE`` (the file is rewritten by :func:`_write_config`)."""
    out = list(args)
    return out[2:] if out[:1] == ["--config"] else out


@dataclass
class RoleState:
    """One resolved role (one node of a multi-node replica) kept in the worker for the handshake:
    SGLang's ServerArgs and facts, and the address its ranks give peers (``host_ip``)."""

    role: str
    server_args: Any
    facts: dict[str, Any]
    host_ip: str = POD_IP
    bootstrap: Any = None
    bootstrap_port: int | None = None
    managers: list[Any] = field(default_factory=list)
    board: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- resolution


def resolve_role(request: dict[str, Any]) -> tuple[dict[str, Any], RoleState | None]:
    """Run one role's startup the way ``sglang.launch_server`` does, up to loading weights.

    ``request``: {"role": prefill|decode, "configYaml": the ConfigMap's config.yaml,
    "args": the container args of one pod (``--config FILE`` first; a multi-node replica's
    ``$(LWS_...)`` references already expanded for that pod's node rank), "env": {name:
    value} as that pod sees it, "modelDir": the emulated model directory}.
    Returns ({"role", "starts", "refusal", "facts"}, state or None). ``refusal`` is
    SGLang's own exception: {"stage", "type", "message", "where"}.
    """
    role = request["role"]
    env = dict(request.get("env") or {})
    from . import emulation

    with emulation.pod_gpus(request.get("gpus"), env), tempfile.TemporaryDirectory(prefix="sglang-oracle-") as tmp, \
            role_environment(env):
        config = _write_config(request["configYaml"], request["modelDir"], Path(tmp))
        argv = ["--config", str(config), *_cli_args(request["args"])]
        try:
            server_args, facts = _startup(argv, cache_key=_cache_key(request),
                                          depth=request.get("depth") or "startup")
        except Refusal as r:
            take_answered()
            used = take_calls()
            r.info.setdefault("phase", PHASES.get(r.info.get("stage", ""), r.info.get("stage")))
            if r.info.get("indeterminate"):
                return {"role": role, "starts": None, "refusal": None, "facts": None,
                        "indeterminate": r.info["indeterminate"], "steps": _steps_until(r.info.get("stage"))}, None
            if used or r.info.get("type") == "KernelUsed":
                return {"role": role, "starts": None, "refusal": None, "facts": None,
                        "indeterminate": f"SGLang called GPU kernels the oracle cannot run: {', '.join(used)}"}, None
            return {"role": role, "starts": False, "refusal": r.info, "facts": None,
                    "steps": _steps_until(r.info.get("stage"))}, None
        used = take_calls()
        if used:
            return {"role": role, "starts": None, "refusal": None, "facts": None,
                    "indeterminate": f"SGLang called GPU kernels the oracle cannot run: {', '.join(used)}"}, None
    state = RoleState(role, server_args, facts, host_ip=env.get(HOST_IP_ENV, POD_IP))
    depth = request.get("depth") or "startup"
    steps = list(ALL_STEPS) if depth == "startup" else [s for s in ALL_STEPS if s.split(":")[0] in ("args", "kv")
                                                        or s.startswith("model: the model's divisions")]
    not_run = [f"{s} (not run: depth {depth})" for s in ALL_STEPS if s not in steps]
    # each assumption once, in order: the target and its draft ask the same probes, and a
    # warm worker that reuses a built model must list what a fresh process lists
    assumes = list(dict.fromkeys([*facts.pop("assumedSteps", []), *take_answered(), *not_run,
                                  *startup.ASSUMED_STEPS]))
    return {"role": role, "starts": True, "refusal": None, "facts": facts, "steps": steps,
            "assumes": assumes}, state


def _stage(stage: str, fn, *args):
    with _quiet() as out:
        try:
            return fn(*args)
        except SystemExit as e:
            info = describe(e, stage)
            info["message"] = _argparse_error(out.getvalue()) or info["message"]
            raise Refusal(info) from None
        except Refusal:
            raise
        except Exception as e:  # SGLang's own refusal: ValueError, AssertionError, RuntimeError ...
            raise Refusal(describe(e, stage)) from None


#: The startup steps each stage runs, in SGLang's order (sglang/srt/... file:line).
STAGE_STEPS: dict[str, tuple[str, ...]] = {
    "parse": ("args: prepare_server_args (server_args.py)",),
    "resolve": ("args: ServerArgs.resolve_once (arg_groups/pipeline.py)",),
    "validate": ("args: ServerArgs.check_server_args (arg_groups/validation_hook.py)",),
    "model": ("model: the model's divisions and GPU placement (oracle/model_checks.py, SGLang's ensure_divisibility)",
              *startup.MODEL_STEPS),
    "kv": ("kv: configure_kv_cache_dtype, select_dsv4_kv_layout, pd_kv_layout (mem_cache/)",),
    "speculative": speculative.SPEC_STEPS,
    "memory": startup.MEMORY_STEPS,
    "pools": scheduler_pd.POOL_STEPS,
    "graphs": graphs.GRAPH_STEPS,
    "pd-queues": scheduler_pd.QUEUE_STEPS,
    "transfer": scheduler_pd.TRANSFER_STEPS,
}
ALL_STEPS = tuple(step for stage in STAGES for step in STAGE_STEPS[stage])


def _steps_until(stage: str | None) -> list[str]:
    """The steps run up to and including ``stage`` (the one that refused)."""
    out: list[str] = []
    for name in STAGES:
        out.extend(STAGE_STEPS[name])
        if name == stage:
            break
    return out


#: Flags that only size memory, schedule requests or name addresses: the model SGLang
#: builds does not read them (the memory stage, which does, runs for every role anew), so
#: two commands that differ only in them share one meta-device model.
NOT_MODEL_SHAPE = frozenset({
    "mem-fraction-static", "max-running-requests", "max-total-tokens", "chunked-prefill-size",
    "max-prefill-tokens", "schedule-policy", "schedule-conservativeness", "port", "host",
    "disaggregation-bootstrap-port", "dist-init-addr", "node-rank", "nccl-port", "log-level",
    "served-model-name", "api-key", "watchdog-timeout", "disaggregation-ib-device", "enable-metrics",
})


def _cache_key(request: dict[str, Any]) -> str:
    """What decides a role's model: its config file and flags (less :data:`NOT_MODEL_SHAPE`),
    its environment and the model directory."""
    import json

    config = {k: v for k, v in (yaml.safe_load(request.get("configYaml") or "") or {}).items()
              if str(k).replace("_", "-") not in NOT_MODEL_SHAPE}
    args, skip = [], False
    for arg in _cli_args(list(request.get("args") or [])):
        if skip:
            skip = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in NOT_MODEL_SHAPE:
            skip = "=" not in arg
            continue
        args.append(arg)
    return json.dumps([config, args, sorted((request.get("env") or {}).items()), request.get("modelDir")],
                      sort_keys=True, default=str)


#: Models built on the meta device, by :func:`_cache_key` (the last few; they hold no data).
_MODELS: "dict[str, tuple[tuple[Any, dict[str, Any], list[str]], tuple[int, ...]]]" = {}
_MODELS_KEPT = 8


def _built_model(server_args: Any, key: str) -> tuple[Any, dict[str, Any], list[str]]:
    """The role's model built on the meta device (rank 0), reused for the same command.

    Building the model may change the decode CUDA-graph sizes this command resolved (Paged
    Experts caps them at K // top-k in each MoE layer's ``make_for_layer``,
    layers/moe/paged_experts/method.py:283). Those sizes also depend on flags outside the
    model's key (``--max-running-requests``, :data:`NOT_MODEL_SHAPE`), so a reuse does not
    copy the sizes of the command that built the model: it replays SGLang's own cap, with
    the argument the build gave it, on the sizes this command resolved.
    """
    if key in _MODELS:
        built, caps = _MODELS[key]
        with startup.scheduler_rank(server_args):
            _replay_decode_graph_caps(caps)
        return built
    with startup.scheduler_rank(server_args), _recorded_decode_graph_caps() as caps:
        built = startup.build_model(server_args)
    built[2].extend(take_answered())  # kept with the model: a reuse lists them too
    while len(_MODELS) >= _MODELS_KEPT:
        _MODELS.pop(next(iter(_MODELS)))
    _MODELS[key] = (built, tuple(dict.fromkeys(caps)))  # every MoE layer calls it; once per value
    return built


@contextlib.contextmanager
def _recorded_decode_graph_caps() -> Iterator[list[int]]:
    """Record each ``max_bs`` the model build passes to Paged Experts' decode-graph cap
    (``_cap_decode_capture_batch_sizes``, paged_experts/method.py:282), which still runs."""
    from sglang.srt.layers.moe.paged_experts import method

    caps: list[int] = []
    real = method._cap_decode_capture_batch_sizes

    def recording(max_bs: int) -> None:
        caps.append(max_bs)
        real(max_bs)

    method._cap_decode_capture_batch_sizes = recording
    try:
        yield caps
    finally:
        method._cap_decode_capture_batch_sizes = real


def _replay_decode_graph_caps(caps: tuple[int, ...]) -> None:
    """Apply SGLang's decode-graph cap with each recorded ``max_bs`` to this command's sizes."""
    from sglang.srt.layers.moe.paged_experts import method

    for max_bs in caps:
        method._cap_decode_capture_batch_sizes(max_bs)


#: The speculative stage's outcome per :func:`_cache_key`: the draft worker's checks and its
#: model depend only on what the target's model does (facts, bytes, assumed) or the refusal.
_DRAFTS: "dict[str, tuple[dict[str, Any] | None, int, list[str]] | dict[str, Any]]" = {}


def _draft_worker(server_args: Any, model: Any, key: str) -> tuple[dict[str, Any] | None, int, list[str]]:
    """The speculative stage (:mod:`.speculative`) in rank 0's context with the target's model
    built; reused for the same command (a refusal too). Returns (facts, draft bytes, assumed)."""
    if key in _DRAFTS:
        kept = _DRAFTS[key]
        if isinstance(kept, dict):
            raise Refusal(dict(kept))
        return kept
    try:
        with startup.scheduler_rank(server_args):
            runner = startup.target_runner(server_args, model)
            facts, draft_bytes, assumed = _stage("speculative", speculative.build_draft_worker, server_args, runner)
    except Refusal as r:
        if not r.info.get("indeterminate"):
            _remember(_DRAFTS, key, dict(r.info))
        raise
    # the probes the draft's own model asked are kept with it, as the target's are with the
    # model (_built_model): a reuse lists them too
    out = (facts, draft_bytes, [*assumed, *take_answered()])
    _remember(_DRAFTS, key, out)
    return out


def _remember(cache: dict, key: str, value: Any) -> None:
    while len(cache) >= _MODELS_KEPT:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _scheduler_after_model(server_args: Any, model: Any, weight_bytes: int) -> tuple[dict[str, Any], list[str]]:
    """The scheduler's steps after its model, in rank 0's context with the weights resident:
    memory planning (``memory``), the KV pools (``pools``), the PD queues (``pd-queues``)
    and the transfer backend's manager (``transfer``), each refusal tagged with its stage.
    Returns ({"memory", "pools", "queue", "transfer"}, assumed steps)."""
    from sglang.srt.runtime_context import get_spec

    assumed: list[str] = []
    with startup.scheduler_rank(server_args), startup.DEVICE.resident(weight_bytes):
        memory, runner, config = _stage("memory", startup.plan_memory, server_args, model)
        runner.req_to_token_pool = runner.token_to_kv_pool_allocator = None
        pools = _stage("pools", scheduler_pd.assemble_pools, runner, config)
        assumed.extend(pools.pop("assumes", []))
        decode_graphs = _stage("graphs", graphs.check_decode_graphs, runner)
        assumed.extend(graphs.ASSUMED)
        _, manager_request, queue = _stage("pd-queues", scheduler_pd.build_queues, server_args, runner)
        transfer = None
        algorithm = str(get_spec().speculative_algorithm or "").upper()
        if algorithm not in ("", "NONE"):
            assumed.append(f"transfer: not run for a speculative role ({algorithm}): the draft worker and its KV pool, "
                           "which the transfer manager carries too, are not built (speculative/)")
        else:
            try:
                transfer = _stage("transfer", scheduler_pd.build_manager, server_args, manager_request)
            except Refusal as r:
                if not r.info.get("indeterminate"):
                    raise
                assumed.append(f"transfer: not run: {r.info['indeterminate']}")
            else:
                assumed.extend(scheduler_pd.ASSUMED)
                if (transfer or {}).get("engineStoodIn") == "mori.io.IOEngine":
                    assumed.append(scheduler_pd.MORI_ASSUMED)
                elif (transfer or {}).get("engineStoodIn"):
                    assumed.append(f"transfer: the native engine {transfer['engineStoodIn']} answered as the library "
                                   "does on success (no NIC opened, nothing registered with a device)")
    return {"memory": memory, "pools": pools, "graphs": decode_graphs, "queue": queue, "transfer": transfer}, assumed


#: How far a role's startup runs: ``startup`` (every stage; the default) or ``args`` (the
#: argument checks, the model's divisions and the PD peer facts, without building the model
#: or planning memory: what the CI differential judges, see docs/sglang-oracle.md).
DEPTHS = ("startup", "args")


#: Variables SGLang reads once, when its modules are imported (stages.IMPORT_TIME_ENV): the pool
#: starts a worker per accelerator and value of them, so a role gets one that imported SGLang
#: with its own; the check below still guards a request sent to another worker.
IMPORT_TIME_ENV = stages.IMPORT_TIME_ENV


def _bool_env(value: str | None) -> bool | None:
    if value is None:
        return None
    return value.strip().lower() in ("true", "1", "yes", "y")


def _check_import_time_env(env: dict[str, str], imported: dict[str, str | None]) -> None:
    """An indeterminate verdict (:class:`OracleLimit`) when the role sets a variable of
    :data:`IMPORT_TIME_ENV` to another value than the worker imported SGLang with."""
    for name, where in IMPORT_TIME_ENV.items():
        if name in env and _bool_env(env[name]) != _bool_env(imported.get(name)):
            raise OracleLimit(f"the role sets {name}={env[name]}, which SGLang reads when it is imported ({where}); "
                              f"the oracle's SGLang was imported with {name}={imported.get(name)!r}")


#: The import-time variables as the worker had them when it imported SGLang.
IMPORTED_ENV = {name: os.environ.get(name) for name in IMPORT_TIME_ENV}


def _refuse_to_prefault_host_tables() -> None:
    """The Engram host table's ``per_rank`` layout writes one byte on every page of the rank's
    shard while it is built (layers/engram.py:724 ``_HostTable.__init__``), about 95 GiB per
    layer at tp 1: the worker would take the memory a pod's host has, so the model step is
    not run here (an indeterminate verdict, never a crash of the oracle or its host). The
    ``shared`` default maps a file it never touches and is built."""
    enabled = os.environ.get("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "").lower() in ("true", "1", "yes", "y")
    if enabled and os.environ.get("SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT", "shared") != "shared":
        raise OracleLimit("model: the Engram host table's per_rank layout prefaults its whole shard in host memory "
                          "(layers/engram.py:724); the oracle does not build it")


def _startup(argv: list[str], cache_key: str = "", depth: str = "startup") -> tuple[Any, dict[str, Any]]:
    from sglang.srt.server_args import prepare_server_args

    _stage("parse", _check_import_time_env, dict(os.environ), IMPORTED_ENV)
    server_args = _stage("parse", prepare_server_args, argv)
    _stage("resolve", server_args.resolve_once)
    _stage("validate", server_args.check_server_args)
    problems = _stage("model", model_build_problems, server_args)
    if problems:
        first = problems[0]
        raise Refusal({"stage": "model", "type": first.type, "message": "; ".join(p.message for p in problems),
                       "where": first.where})
    if depth == "args":
        return server_args, _stage("kv", _peer_facts, server_args)
    _stage("model", _refuse_to_prefault_host_tables)
    model, model_facts, assumed = _stage("model", _built_model, server_args, cache_key)
    facts = _stage("kv", _peer_facts, server_args)
    draft, draft_bytes, draft_assumed = _draft_worker(server_args, model, cache_key)
    # The group's least free memory: the rank with the most Engram rows (startup.engram_rank_excess).
    resident = model_facts["weightBytes"] + model_facts.get("maxRankExtraBytes", 0) + draft_bytes
    after, more = _scheduler_after_model(server_args, model, resident)
    more = [*draft_assumed, *more]
    facts["speculative"] = draft
    import torch

    facts["podGpus"] = torch.cuda.device_count()  # what SGLang saw: the pod's GPUs (emulation.pod_gpus)
    facts["model"] = dict(model_facts)
    facts.update(after)
    facts["assumedSteps"] = [*assumed, *more]
    return server_args, facts


def _rank_context(server_args: Any, world_rank: int, dp_rank: int | None = None):
    from sglang.srt.runtime_context import SpawnRanks, create_context

    return create_context(server_args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, dp_rank=dp_rank, gpu_id=0))


def _peer_facts(server_args: Any) -> dict[str, Any]:
    """What a PD peer is compared on, resolved by SGLang's own functions in rank 0's context."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.mem_cache import kv_cache_dtype as kvd
    from sglang.srt.runtime_context import get_disagg, get_model, get_parallel, get_spec, use_context

    cfg = resolving_view(server_args)
    model_config = model_config_of(server_args)
    with use_context(_rank_context(server_args, 0)):
        parallel = get_parallel()
        resolved_dtype, torch_dtype = kvd.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=get_model().kv_cache_dtype,
            model=None,
            model_dtype=model_config.dtype,
            is_draft_worker=False,
            is_dflash=False,
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=get_spec().speculative_draft_kv_cache_dtype,
        )
        kv_dtype_str = resolved_dtype if resolved_dtype is not None else get_model().kv_cache_dtype
        facts: dict[str, Any] = {
            "pageSize": int(cfg.page_size) if cfg.page_size is not None else None,
            "kvCacheDtype": kv_dtype_str,
            "kvCacheTorchDtype": str(torch_dtype).replace("torch.", ""),
            "attnTpSize": parallel.attn_tp_size,
            "attnCpSize": parallel.attn_cp_size,
            "attnDpSize": parallel.attn_dp_size,
            "dcpSize": parallel.attn_dcp_size,
            "tpSize": cfg.tp_size,
            "ppSize": cfg.pp_size,
            "dpSize": cfg.dp_size,
            "epSize": cfg.ep_size,
            "nnodes": cfg.nnodes,
            "nodeRank": cfg.node_rank,
            "chunkedPrefillSize": cfg.chunked_prefill_size,
            "disaggregationMode": cfg.disaggregation_mode,
            "transferBackend": cfg.disaggregation_transfer_backend,
            "decodeAllocationPolicy": get_disagg().disaggregation_decode_allocation_policy,
            "speculativeAlgorithm": str(cfg.speculative_algorithm) if cfg.speculative_algorithm else None,
            "speculativeNumDraftTokens": cfg.speculative_num_draft_tokens,
            "architectures": list(getattr(model_config.hf_config, "architectures", None) or []),
            "modelType": getattr(model_config.hf_config, "model_type", None),
            "dsv4AttnBackend": getattr(cfg, "dsv4_attn_backend", None),
            "kvLayout": None,
            "compressionRatios": None,
            "dsv41SpecLayout": None,
            "stateTypes": [],
        }
        facts["isMla"] = _is_mla_pool(model_config)
        if _is_dsv4(model_config):
            facts.update(_dsv4_layout(model_config, kv_dtype_str))
    return facts


def _is_dsv4(model_config: Any) -> bool:
    return "DeepseekV4ForCausalLM" in (getattr(model_config.hf_config, "architectures", None) or [])


def _is_mla_pool(model_config: Any) -> bool:
    """The KV pool is MLA-shaped (disaggregation/utils.py is_mla_backend: MLATokenToKVPool or
    DeepSeekV4TokenToKVPool), which the KV configurator picks from ``attention_arch``."""
    from sglang.srt.configs.model_config import AttentionArch

    return _is_dsv4(model_config) or getattr(model_config, "attention_arch", None) == AttentionArch.MLA


def _dsv4_layout(model_config: Any, kv_dtype_str: str) -> dict[str, Any]:
    """The PD KV layout string and DSpark transfer layout SGLang would send (DeepSeek-V4 family).

    ``select_dsv4_kv_layout`` and ``DeepSeekV4TokenToKVPool.pd_kv_layout`` (mem_cache/
    deepseek_v4_memory_pool.py) run for real; the pool is a shell carrying the inputs
    ``pd_kv_layout`` reads (a real pool allocates GPU memory), exactly as its own
    ``__init__`` sets them from the KV configurator (kv_cache_configurator.py: the
    model's per-layer ``compress_ratios``; ``uniform_fp8`` for trtllm).
    """
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.disaggregation.utils import get_dsv41_spec_layout
    from sglang.srt.layers.attention.dsv4.unified_kv_gate import is_unified_kv_triton
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool, select_dsv4_kv_layout
    from sglang.srt.runtime_context import get_exec, get_spec

    layout, option = select_dsv4_kv_layout()
    pool = DeepSeekV4TokenToKVPool.__new__(DeepSeekV4TokenToKVPool)
    pool.kv_layout = KVLayout.parse(layout)
    assert pool.kv_layout in (KVLayout.V4, KVLayout.V41, KVLayout.V41_NEW), (
        f"{pool.kv_layout} is only valid for a compressed (extra) cache"
    )
    pool.compressed_kv_layout_option = option
    ratios = list(model_config.compress_ratios)
    pool.compression_ratios = ratios
    pool.uniform_fp8 = (not is_unified_kv_triton()) and get_exec().kernel.dsv4_attn_backend == "trtllm"
    if pool.uniform_fp8:
        assert pool.kv_layout is KVLayout.V4, (
            "--dsv4-attn-backend trtllm keeps its own uniform 512-byte pages; "
            f"it cannot be combined with SGLANG_DSV4_KV_LAYOUT={pool.kv_layout.value}"
        )
    pd_layout = pool.pd_kv_layout()
    kv_args = _dsv41_kv_args(ratios=ratios, pd_layout=pd_layout, kv_dtype_str=kv_dtype_str)
    spec_layout = get_dsv41_spec_layout(kv_args)
    # A DeepSeek-V4 pool is a BaseSWAKVPool: setup_state_kv_args (disaggregation/utils.py)
    # registers its SWA state, and a DSpark draft pool its own.
    draft = str(get_spec().speculative_algorithm or "").upper() == "DSPARK"
    state_types = ["swa", "swa"] if draft else ["swa"]
    return {"kvLayout": pd_layout, "compressionRatios": sorted(set(ratios) - {0}), "dsv41SpecLayout": spec_layout,
            "stateTypes": state_types}


def _dsv41_kv_args(*, ratios: list[int], pd_layout: str, kv_dtype_str: str):
    """A KVArgs carrying what ``get_dsv41_spec_layout`` reads.

    The real function runs; its byte-length inputs (kv_item_lens, state_item_lens) come
    from a GPU pool the oracle cannot build. They are taken as one entry per layer of a
    length named by the PD layout string and KV dtype, so two roles compare equal on
    them exactly when their layouts and dtypes are equal (which the handshake checks
    on its own); the state types are the target and draft SWA states a DSpark pool
    registers (two SWA entries, which get_dsv41_spec_layout requires).
    """
    from sglang.srt.disaggregation.base.conn import KVArgs, StateType

    kv_args = KVArgs()
    kv_args.mla_compression_ratios = list(ratios)
    kv_args.kv_layer_ids = list(range(len(ratios)))
    digest = hashlib.blake2b(f"{pd_layout}|{kv_dtype_str}".encode(), digest_size=4).digest()
    length = int.from_bytes(digest, "big") % (1 << 20) + 1
    kv_args.kv_item_lens = [length] * len(ratios)
    kv_args.state_types = [StateType.SWA, StateType.SWA]
    kv_args.state_item_lens = [[length], [length]]
    return kv_args


# --------------------------------------------------------------------------- handshake


def _kv_args_for(state: RoleState, *, tp_rank: int, pp_rank: int, system_dp_rank: int):
    from sglang.srt.disaggregation.base.conn import KVArgs

    facts = state.facts
    kv_args = KVArgs()
    kv_args.engine_rank = tp_rank
    kv_args.pp_rank = pp_rank
    kv_args.system_dp_rank = system_dp_rank
    kv_args.rust_http_port = None
    kv_args.kv_cache_dtype_str = facts["kvCacheDtype"]
    kv_args.kv_layout = facts["kvLayout"]
    kv_args.page_size = facts["pageSize"]
    kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = [], [], [0]
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = [], [], []
    kv_args.state_types, kv_args.state_data_ptrs, kv_args.state_data_lens = [], [], []
    kv_args.state_item_lens, kv_args.state_layer_ids, kv_args.state_dim_per_tensor = [], [], []
    kv_args.state_slice_outer_counts, kv_args.state_conv_shard_groups = [], []
    kv_args.is_hybrid_mla_backend = False
    kv_args.swa_kv_cache_layout = None
    kv_args.mla_compression_ratios = None
    kv_args.ib_device = None
    kv_args.gpu_id = 0
    from sglang.srt.disaggregation.base.conn import StateType

    kv_args.state_types = [StateType(v) for v in facts.get("stateTypes") or []]
    kv_args.state_item_lens = [[0] for _ in kv_args.state_types]
    if facts.get("dsv41SpecLayout") is not None:
        spec = facts["dsv41SpecLayout"]
        kv_args.mla_compression_ratios = list(spec["compression_ratios"])
        kv_args.kv_layer_ids = list(spec["kv_layer_ids"])
        kv_args.kv_item_lens = list(spec["kv_item_lens"])
        kv_args.state_types = [StateType(v) for v in spec["state_types"]]
        kv_args.state_item_lens = [list(x) for x in spec["state_item_lens"]]
    return kv_args


@contextlib.contextmanager
def _process_group_exists() -> Iterator[None]:
    """While a multi-node prefill's ranks register: torch.distributed reports an initialized group.

    ``CommonKVManager`` syncs node 0's bootstrap port to every rank over the world group
    before it registers (conn.py ``_sync_bootstrap_port_across_nodes``) and first checks
    ``torch.distributed.is_initialized()``. The oracle's ranks share one process and pass
    that broadcast through a :class:`GroupStandIn` (see :func:`_manager`); only this check
    is answered, inside the block, for conn.py's module alias alone.
    """
    from sglang.srt.disaggregation.common import conn

    real = conn.dist
    conn.dist = _DistStandIn(real)
    try:
        yield
    finally:
        conn.dist = real


class _DistStandIn:
    """torch.distributed as conn.py sees it during :func:`_process_group_exists`: initialized."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def is_available(self) -> bool:
        """True: the stand-in world group carries the collectives the managers use."""
        return True

    def is_initialized(self) -> bool:
        """True: see :func:`_process_group_exists`."""
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _manager(state: RoleState, *, world_rank: int, dp_rank: int | None, mode: str):
    """SGLang's CommonKVManager for one rank of ``state``, built by its real ``__init__``."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_parallel, use_context

    context = _rank_context(state.server_args, world_rank, dp_rank)
    if state.bootstrap_port is not None:
        # The pod's bootstrap port, mapped to the loopback port the oracle's bootstrap
        # server listens on: a resolved-config override (RuntimeContext.override), the
        # command SGLang judged is unchanged.
        context.override("sglang-pd-operator oracle: loopback bootstrap port",
                          disaggregation_bootstrap_port=state.bootstrap_port)
    with use_context(context):
        parallel = get_parallel()
        kv_args = _kv_args_for(
            state, tp_rank=parallel.tp_rank, pp_rank=parallel.pp_rank, system_dp_rank=dp_rank or 0
        )
        is_mla = bool(state.facts.get("isMla"))
        # The manager keeps a handle of its pipeline group (PP consensus when pp > 1);
        # no process group exists in the oracle, so a stand-in of the same shape is given.
        pp_group = GroupStandIn(world_size=parallel.pp_size, rank_in_group=parallel.pp_rank,
                                group=(dp_rank, parallel.tp_rank), board=state.board)
        groups: dict[str, Any] = {"pp_group": pp_group}
        if parallel.nnodes > 1:
            # A multi-node prefill broadcasts node 0's bootstrap port over the world group
            # before it registers (conn.py _sync_bootstrap_port_across_nodes).
            groups["world_group"] = GroupStandIn(world_size=parallel.tp_size * parallel.pp_size,
                                                 rank_in_group=world_rank, group=("world", dp_rank),
                                                 board=state.board)
        with parallel.override(**groups):
            manager = CommonKVManager(kv_args, DisaggregationMode(mode), state.server_args, is_mla_backend=is_mla)
    return manager, context


@dataclass(frozen=True)
class GroupStandIn:
    """A process group's shape (size and this rank) for ranks that all live in this process.

    ``broadcast_object`` passes the source rank's object through ``board`` (ranks are built
    in rank order, so the source posts before the others read, as the PP consensus store
    of disaggregation/pp_consensus_store.py needs); any other collective raises
    :class:`OracleLimit`.
    """

    world_size: int
    rank_in_group: int
    group: tuple = ()
    board: dict = field(default_factory=dict, compare=False)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """The object of rank ``src`` of this group (posted by it, read by the others in order)."""
        counter = ("seq", self.group, self.rank_in_group)
        seq = self.board.get(counter, 0)
        self.board[counter] = seq + 1
        slot = ("broadcast", self.group, src, seq)
        if self.rank_in_group == src:
            self.board[slot] = obj
            return obj
        if slot not in self.board:
            raise OracleLimit("a rank read a broadcast before its source rank posted it")
        return self.board[slot]

    def __getattr__(self, name: str) -> Any:
        raise OracleLimit(f"the oracle has no process group to run {name} on")


def _prefill_ranks(facts: dict[str, Any]) -> Iterator[tuple[int, int | None]]:
    """(world_rank, system dp_rank) of every prefill scheduler that registers with the bootstrap server."""
    dp = facts["dpSize"] or 1
    world = (facts["tpSize"] or 1) * (facts["ppSize"] or 1)
    for replica in range(dp):
        for rank in range(world):
            yield rank, (replica if dp > 1 else None)


def _node_ranks(state: RoleState) -> set[int]:
    """World ranks (pp_rank x tp_size + tp_rank) whose schedulers run on ``state``'s node.

    SGLang's own placement: entrypoints/engine.py ``_calculate_rank_ranges(node_rank)`` in
    the node's runtime context (one node: every rank).
    """
    from sglang.srt.entrypoints.engine import _calculate_rank_ranges
    from sglang.srt.runtime_context import get_parallel, use_context

    with use_context(_rank_context(state.server_args, 0)):
        parallel = get_parallel()
        pp_range, tp_range, _, _ = _calculate_rank_ranges(parallel.node_rank)
        return {pp * parallel.tp_size + tp for pp in pp_range for tp in tp_range}


def serve_bootstrap(states: "RoleState | list[RoleState]") -> dict[str, Any]:
    """Start SGLang's bootstrap server for a resolved prefill and register every rank, from its node.

    ``states``: the prefill replica's nodes, node 0 first (one state for one node). Node
    0's state runs the bootstrap server, as SGLang runs it in node 0's process only
    (managers/disagg_service.py); every rank registers from its own node's resolved
    arguments (``--node-rank`` k, ``--dist-init-addr``: a multi-node rank registers at the
    dist-init host) with that node's address (SGLANG_HOST_IP). The server answers the
    decode only once dp x cp x tp x pp ranks registered. Returns {"address":
    "127.0.0.1:PORT"} or {"refusal": {...}} when a registration is refused (the server
    answers 400 to inconsistent ranks) or a rank is on no node.
    """
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    nodes = states if isinstance(states, list) else [states]
    leader = nodes[0]
    port = free_port()
    for node in nodes:
        node.bootstrap_port = port
        node.board = leader.board  # one replica: its ranks' collectives share one board across nodes
    with _quiet():
        leader.bootstrap = CommonKVBootstrapServer(POD_IP, port)
    watch = TransportWatch()
    try:
        _wait_listening(port)
        placed = {rank: node for node in nodes for rank in _node_ranks(node)}
        with _process_group_exists() if len(nodes) > 1 else contextlib.nullcontext(), watch.watching():
            for world_rank, dp_rank in _prefill_ranks(leader.facts):
                node = placed.get(world_rank)
                if node is None:
                    raise OracleLimit(f"prefill rank {world_rank} runs on none of the {len(nodes)} nodes judged")
                with role_environment({HOST_IP_ENV: node.host_ip}), _quiet():
                    manager, _ = _manager(node, world_rank=world_rank, dp_rank=dp_rank, mode="prefill")
                leader.managers.append(manager)
    except Exception as e:
        refusal = describe(e, "bootstrap")
        if watch.failed and not refusal.get("indeterminate"):
            refusal["indeterminate"] = watch.indeterminate("bootstrap")
        return {"refusal": refusal}
    # A registration that never got an answer leaves the server short of a rank: the decode's
    # later "Could not fetch bootstrap info" would be the emulation's, not SGLang's verdict.
    why = watch.indeterminate("bootstrap")
    if why:
        return {"refusal": {"stage": "bootstrap", "type": "Timeout", "message": why, "where": None,
                            "indeterminate": why}}
    return {"address": f"{POD_IP}:{port}"}


class TransportWatch:
    """The HTTP requests SGLang's PD code sent while watched, and which of them never got an answer.

    SGLang's bootstrap client (disaggregation/common/conn.py: ``try_ensure_parallel_info``,
    ``CommonKVReceiver._get_bootstrap_info_from_server``, ``_register_topology_row``) sends
    through ``requests`` with its own 5 s deadline and turns a timeout or a refused
    connection into ``False`` / ``None`` / a logged warning, which then surfaces as a refusal
    ("Could not fetch bootstrap info ..."). In the oracle the bootstrap server is a loopback
    thread of a worker on a loaded machine: such a failure is the emulation's, not SGLang's
    logic judging the spec. ``failed`` lists ``METHOD url: error`` of each request whose last
    attempt (SGLang retries the registration) raised a transport error
    (``requests.RequestException``); an answer with any status code is SGLang's and is not
    listed.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], str | None] = {}  # (method, url) -> error of its last attempt

    @property
    def failed(self) -> list[str]:
        """``METHOD url: error`` of every request whose last attempt got no answer."""
        return [f"{method} {url}: {error}" for (method, url), error in self._last.items() if error]

    def indeterminate(self, stage: str) -> str | None:
        """Why ``stage``'s outcome is no verdict (a request got no answer), or None."""
        failed = self.failed
        if not failed:
            return None
        return (f"{stage}: SGLang's request to the bootstrap server got no answer in the emulation "
                f"(the oracle's loopback server or the machine's load, not SGLang's checks): {failed[0]}"
                + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""))

    @contextlib.contextmanager
    def watching(self) -> Iterator["TransportWatch"]:
        """Record every ``requests`` call made in the block (all of them go through ``Session.send``)."""
        import requests

        original = requests.Session.send
        watch = self

        def send(session: Any, request: Any, **kwargs: Any) -> Any:
            key = (request.method, request.url)
            try:
                response = original(session, request, **kwargs)
            except requests.RequestException as e:
                watch._last[key] = f"{type(e).__name__}: {str(e)[:200]}"
                raise
            watch._last[key] = None
            return response

        requests.Session.send = send
        try:
            yield self
        finally:
            requests.Session.send = original


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((POD_IP, port)) == 0:
                return
        time.sleep(0.02)
    raise OracleLimit(f"SGLang's bootstrap server did not listen on {POD_IP}:{port} within {timeout:.0f} s")


def handshake(state: RoleState, address: str) -> dict[str, Any]:
    """The decode side's handshake with a prefill bootstrap server: SGLang's checks, for real.

    In decode rank 0's context: the real ``CommonKVManager`` (decode mode), its
    ``try_ensure_parallel_info(address)`` (page size, KV dtype, KV layout, DSpark layout,
    attention TP, MXFP8 and DCP checks; disaggregation/common/conn.py), then a real
    ``CommonKVReceiver`` for one request per prefill DP rank and its ``init`` (the
    decode-allocation-policy and prefill_complete checks, the rank mapping, a GET of every
    target rank's bootstrap info). ``init`` ends in the transfer backend's registration message, which the
    common manager leaves to Mooncake / NIXL (``NotImplementedError``): reaching it means
    every common check passed. Returns {"pairs": True, "prefillRanks": the ``ip:port`` of every
    prefill rank the requests reached (on a multi-node prefill, addresses of several nodes)}
    or {"pairs": False, "refusal"}. A refusal that follows a request SGLang sent and never got
    an answer to (:class:`TransportWatch`) carries ``indeterminate``: no verdict.
    """
    reached: set[str] = set()
    watch = TransportWatch()
    try:
        result = _handshake(state, address, reached, watch)
    except Exception as e:
        result = {"pairs": False, "refusal": describe(e, "handshake")}
    refusal = result.get("refusal")
    why = watch.indeterminate("handshake")
    if refusal is not None and why and not refusal.get("indeterminate"):
        # SGLang turned a request that got no answer into False / None and refused on it:
        # the step never judged the spec (issue 23: a timeout is indeterminate, never a refusal).
        refusal["indeterminate"] = f"{why}; SGLang then said: {refusal.get('message', '')}"
    return result


def _handshake(state: RoleState, address: str, reached: set[str], watch: TransportWatch) -> dict[str, Any]:
    """:func:`handshake`'s steps, its requests watched by ``watch``; adds the prefill ranks reached to ``reached``."""
    from sglang.srt.disaggregation.common.conn import CommonKVReceiver
    from sglang.srt.runtime_context import use_context

    with role_environment({HOST_IP_ENV: state.host_ip}), _quiet(), watch.watching():
        manager, context = _manager(state, world_rank=0, dp_rank=None, mode="decode")
        state.managers.append(manager)
        with use_context(context):
            if not manager.try_ensure_parallel_info(address):
                return {"pairs": False, "refusal": {
                    "stage": "handshake", "type": "RuntimeError",
                    "message": "decode could not read the prefill's parallel info from the bootstrap server",
                    "where": "sglang/srt/disaggregation/common/conn.py:try_ensure_parallel_info"}}
            # one request per prefill DP rank: each reaches the ranks of that DP rank, so
            # together they reach every prefill rank, on whichever node it runs
            for dp_rank in range(max(1, manager.prefill_info_table[address].dp_size)):
                room = dp_rank + 1
                receiver = CommonKVReceiver(manager, address, room)
                try:
                    receiver.init(prefill_dp_rank=dp_rank)
                except NotImplementedError:
                    pass  # the backend's registration message: the common handshake is complete
                failure = manager.failure_records.get(room)
                if failure:
                    return {"pairs": False, "refusal": {
                        "stage": "handshake", "type": "KVTransferError", "message": failure,
                        "where": "sglang/srt/disaggregation/common/conn.py:CommonKVReceiver.init"}}
                reached |= {f"{i['rank_ip']}:{i['rank_port']}" for i in receiver.bootstrap_infos or []
                            if not i.get("is_dummy")}
    return {"pairs": True, "prefillRanks": sorted(reached)}


def close_bootstrap(state: RoleState) -> None:
    """Stop the bootstrap server and close the rank managers' sockets."""
    for manager in state.managers:
        with contextlib.suppress(Exception):
            manager.server_socket.close(linger=0)
        with contextlib.suppress(Exception):
            manager._zmq_ctx.term()
    state.managers.clear()
    if state.bootstrap is not None:
        with _quiet(), contextlib.suppress(Exception):
            state.bootstrap.close()
        state.bootstrap = None

