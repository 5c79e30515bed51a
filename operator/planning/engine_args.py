"""Build one role's SGLang launch arguments and environment (pure).

The argument list is the single description of a role's engine: the ConfigMap's SGLang
config file is written from it, ``check`` prints it, the compat key hashes the parts
that must be equal on both roles, and the contract tests parse it with the real
``sglang.srt.server_args.prepare_server_args`` of sglang==0.5.23. Flag names are those of
sglang 0.5.23 (``sglang/srt/arg_groups/fields/*.py``).

Resolved values are written explicitly (the attention backend after ``auto``, the KV
layout variables even where SGLang has a default) so that what a pod runs never depends
on a default that could differ between the two roles or between SGLang releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api import lws
from ..api.v1alpha1 import PDDeploymentSpec
from .buckets import BUCKET_FLAGS, bucket_args
from .hicache import LOCAL_HOSTNAME_ENV, hicache_args
from .kvlayout import LayoutPrediction
from .roles import RoleInputs
from .transfer import TransferPlan

ENGINE_PORT = 30000
#: Port of node 0's torch.distributed store for a replica spanning nodes (``--dist-init-addr
#: <leader>:DIST_INIT_PORT``); SGLang derives node 0's ZMQ ports from the next ones
#: (server_args.py PortArgs.init_new: dist_init_port + 1 ...), clear of ENGINE_PORT and the
#: bootstrap port.
DIST_INIT_PORT = 20000
#: SGLANG_HOST_IP: the address a rank gives its peers (utils/network.py get_local_ip_auto
#: reads it before probing interfaces); the pod IP on every rank of a multi-node replica.
HOST_IP_ENV = "SGLANG_HOST_IP"
MODEL_MOUNT = "/models"
HF_CACHE = "/root/.cache/huggingface"
SGLANG_CACHE_DIR = "/var/cache/sglang"

# Flags the operator renders from typed fields: refused in extraArgs, with the field to
# set instead (a knob has one place; a role cannot silently diverge through extraArgs).
MANAGED_FLAGS: dict[str, str] = {
    "--model-path": "spec.model",
    "--model": "spec.model",
    "--revision": "spec.model.revision",
    "--served-model-name": "spec.model.servedModelName",
    "--trust-remote-code": "spec.model.trustRemoteCode",
    "--host": "(set by the operator)",
    "--port": "(set by the operator)",
    "--tp-size": "spec.<role>.parallelism.tp",
    "--tensor-parallel-size": "spec.<role>.parallelism.tp",
    "--tp": "spec.<role>.parallelism.tp",
    "--dp-size": "spec.<role>.parallelism.dp",
    "--data-parallel-size": "spec.<role>.parallelism.dp",
    "--dp": "spec.<role>.parallelism.dp",
    "--ep-size": "spec.<role>.parallelism.ep",
    "--expert-parallel-size": "spec.<role>.parallelism.ep",
    "--ep": "spec.<role>.parallelism.ep",
    "--enable-dp-attention": "spec.<role>.parallelism.dpAttention",
    "--attn-dp-size": "spec.<role>.parallelism.dpAttention",
    "--attention-data-parallel-size": "spec.<role>.parallelism.dpAttention",
    "--nnodes": "spec.<role>.parallelism.nodes",
    "--node-rank": "spec.<role>.parallelism.nodes",
    "--dist-init-addr": "spec.<role>.parallelism.nodes",
    "--nccl-init-addr": "spec.<role>.parallelism.nodes",
    "--page-size": "spec.kvLayout.pageSize",
    "--kv-cache-dtype": "spec.kvLayout.dtype",
    "--dsv4-attn-backend": "spec.kvLayout.attentionBackend",
    "--enable-metrics": "(always on)",
    "--disaggregation-mode": "(set by the operator per role)",
    "--disaggregation-transfer-backend": "spec.transfer.backend",
    "--disaggregation-bootstrap-port": "spec.disaggregation.bootstrapPort",
    "--disaggregation-ib-device": "spec.transfer.ibDevices",
    "--disaggregation-decode-allocation-policy": "spec.disaggregation.decodeAllocationPolicy",
    "--sampling-mask-max-tokens": "spec.disaggregation.samplingMaskMaxTokens",
    "--disaggregation-enable-kv-checksum": "spec.disaggregation.kvChecksum",
    "--speculative-algorithm": "spec.speculative.algorithm",
    "--speculative-dspark-block-size": "spec.speculative.blockSize",
    "--speculative-num-draft-tokens": "spec.speculative.numDraftTokens",
    "--speculative-num-steps": "spec.speculative.numSteps",
    "--speculative-draft-model-path": "spec.speculative.draftModelPath",
    "--speculative-draft-model": "spec.speculative.draftModelPath",
    "--enable-nvidia-megakernel": "spec.kernels.plugin",
    "--enable-amd-monokernel": "spec.kernels.plugin",
    "--monokernel-backend": "spec.kernels.plugin",
    "--enable-paged-experts": "spec.pagedExperts",
    "--paged-experts-num-resident": "spec.pagedExperts.residentExperts",
    "--enable-decoder-swa-bounded-replay": "spec.rlRollout",
    "--no-enable-decoder-swa-bounded-replay": "spec.rlRollout",
    "--config": "(the operator's config file)",
    "--enable-hierarchical-cache": "spec.kvCache.hicache",
    "--enable-hicache": "spec.kvCache.hicache",
    "--hicache-ratio": "spec.kvCache.hicache.hostRatio",
    "--hicache-write-policy": "spec.kvCache.hicache.writePolicy",
    "--hicache-storage-backend": "spec.kvCache.hicache.storage.backend",
    "--hicache-storage-backend-extra-config": "spec.kvCache.hicache.storage",
    "--disaggregation-decode-enable-offload-kvcache": "spec.kvCache.hicache.decodeOffload",
    # SGLang's latency histogram buckets: rendered from the SLO targets (planning/buckets.py)
    **{flag: "spec.slo" for flag in BUCKET_FLAGS},
}

# Environment variables the operator sets from typed fields.
MANAGED_ENV: dict[str, str] = {
    "SGLANG_DSV4_KV_LAYOUT": "spec.kvLayout.layout",
    "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "spec.kvLayout.compressed",
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "spec.engram.placement",
    "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS": "spec.engram.placement",
    "SGLANG_CACHE_DIR": "spec.kernels.cache",
    "SGLANG_JIT_CACHE_DIR": "spec.kernels.cache",
    "MC_FORCE_TCP": "spec.transfer.forceTCP",
    LOCAL_HOSTNAME_ENV: "spec.kvCache.hicache.storage (the pod IP)",
    # the address a rank binds and gives its peers (utils/network.py get_local_ip_auto): only
    # the pod's own IP works, which the operator sets on multi-node ranks and SGLang finds itself
    # otherwise; a fixed value fails to bind (ZMQError: Cannot assign requested address)
    HOST_IP_ENV: "the pod IP (SGLang detects it on one node; the operator sets it on every rank of a multi-node replica)",
    "HOST_IP": "the pod IP (SGLANG_HOST_IP's fallback in SGLang's utils/network.py)",
}


EAGLE_TOPK_FLAG = "--speculative-eagle-topk"
DP_LM_HEAD_FLAG = "--enable-dp-lm-head"


def _has_flag(args: list[str], flag: str) -> bool:
    """``flag`` appears in ``args`` as ``--f`` or ``--f=value``."""
    return any(tok == flag or tok.startswith(flag + "=") for tok in args)


@dataclass(frozen=True)
class EngineCommand:
    """A role's SGLang arguments (flags only, no program) and environment (name, value) pairs."""

    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def env_dict(self) -> dict[str, str]:
        """The environment as a dict."""
        return dict(self.env)


def model_path(spec: PDDeploymentSpec) -> str:
    """--model-path: the PVC mount path plus ``source.pvc.path``, or the hub model id."""
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.name
    sub = pvc.path.strip("/")
    return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT


def ib_devices_flag(transfer: TransferPlan | None) -> str | None:
    """--disaggregation-ib-device value: the per-GPU NIC mapping of planning/transfer.py, or None."""
    return transfer.flag if transfer is not None else None


#: Main KV layouts whose compressed caches follow SGLANG_DSV4_COMPRESSED_KV_LAYOUT.
COMPRESSED_OPTION_LAYOUTS = ("v41", "v41_new")


def effective_compressed_option(requested: str, layout: LayoutPrediction | None) -> str:
    """The SGLANG_DSV4_COMPRESSED_KV_LAYOUT value a role's pods get: ``requested``, or ``auto``
    where SGLang ignores the option.

    SGLang reads the option only next to a V4.1 main layout: ``select_dsv4_kv_layout``
    (sglang 0.5.23 mem_cache/deepseek_v4_memory_pool.py) drops it when ``auto`` resolves
    to v4 (H200, MI300), trtllm builds uniform FP8 pools, and ``resolve_compressed_kv_layout``
    pairs a v4 main cache only with v4 caches. Rendering the ignored value would change
    the pod template (and restart every engine) for a change SGLang never sees, so the
    pods get SGLang's default instead (the ``kv-layout-not-built`` warning names the
    field). With no prediction (``layout`` None: the plan is refused) the requested value
    is kept, for the SGLang oracle to judge.
    """
    if layout is None or layout.main_layout in COMPRESSED_OPTION_LAYOUTS:
        return requested
    return "auto"


def node_args(role: RoleInputs) -> list[str]:
    """The placement flags of a replica spanning nodes (none for one node).

    ``--nnodes N --node-rank $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):DIST_INIT_PORT``:
    every pod of the LeaderWorkerSet group runs the same arguments, and the kubelet expands
    ``$(VAR)`` from the variables the LWS pod webhook injects (the pod's worker index, the
    leader pod's DNS name). Source: sglang 0.5.23 arg_groups/fields/parallel.py (--nnodes,
    --node-rank, --dist-init-addr); entrypoints/engine.py runs node 0's tokenizer and HTTP
    server and the schedulers of TP ranks [k*tp/N, (k+1)*tp/N) on node k.
    """
    if not role.multi_node:
        return []
    return [
        "--nnodes", str(role.nodes),
        "--node-rank", lws.env_ref(lws.ENV_WORKER_INDEX),
        "--dist-init-addr", f"{lws.env_ref(lws.ENV_LEADER_ADDRESS)}:{DIST_INIT_PORT}",
    ]  # fmt: skip


def build_engine_command(
    *,
    spec: PDDeploymentSpec,
    role: RoleInputs,
    layout: LayoutPrediction | None,
    kv_cache_dtype: str,
    transfer: TransferPlan | None = None,
    compat_key: str | None = None,
    name: str = "",
    namespace: str = "default",
) -> EngineCommand:
    """The SGLang flags and env of ``role``.

    ``layout`` is the role's predicted layout (None when the model is not a DeepSeek-V4
    family model or the prediction was refused; then no DeepSeek-V4 flags are written).
    ``kv_cache_dtype`` is the resolved --kv-cache-dtype. ``transfer`` is the role's NIC
    mapping (planning/transfer.py); ``compat_key``, ``name`` and ``namespace`` place the
    HiCache storage tier (the group's key namespace, the Mooncake master's Service).
    """
    p = role.parallelism
    args: list[str] = ["--model-path", model_path(spec), "--revision", spec.model.revision]
    if spec.model.servedModelName:
        args += ["--served-model-name", spec.model.servedModelName]
    if spec.model.trustRemoteCode:
        args.append("--trust-remote-code")
    args += ["--host", "0.0.0.0", "--port", str(ENGINE_PORT), "--enable-metrics"]
    args += ["--tp-size", str(p.tp)]
    args += node_args(role)
    if p.dpAttention:
        # --dp-size N --enable-dp-attention is deprecated in 0.5.23 and resolves to
        # attn_dp_size N, dp_size 1 (arg_groups/parallel_hook.py): render the resolved form.
        args += ["--attn-dp-size", str(p.dp)]
    elif p.dp > 1:
        args += ["--dp-size", str(p.dp)]
    if p.ep > 1:
        args += ["--ep-size", str(p.ep)]
    args += ["--page-size", str(role.page_size), "--kv-cache-dtype", kv_cache_dtype]
    if layout is not None:
        args += ["--dsv4-attn-backend", layout.attention_backend]
    elif role.is_deepseek_v4 and role.kv_layout.attentionBackend != "auto":
        # The prediction was refused: the plan is invalid and never deployed, but the
        # SGLang oracle must judge the backend the user asked for, not SGLang's default.
        args += ["--dsv4-attn-backend", role.kv_layout.attentionBackend]

    d = spec.disaggregation
    args += [
        "--disaggregation-mode", role.role,
        "--disaggregation-transfer-backend", spec.transfer.backend,
        "--disaggregation-bootstrap-port", str(d.bootstrapPort),
        "--disaggregation-decode-allocation-policy", d.decodeAllocationPolicy,
    ]  # fmt: skip
    ib = ib_devices_flag(transfer)
    if ib:
        args += ["--disaggregation-ib-device", ib]
    if d.samplingMaskMaxTokens is not None:
        args += ["--sampling-mask-max-tokens", str(d.samplingMaskMaxTokens)]
    if d.kvChecksum:
        args.append("--disaggregation-enable-kv-checksum")

    sp = spec.speculative
    if sp is not None:
        args += ["--speculative-algorithm", sp.algorithm]
        if sp.blockSize is not None:
            args += ["--speculative-dspark-block-size", str(sp.blockSize)]
        if sp.numDraftTokens is not None:
            args += ["--speculative-num-draft-tokens", str(sp.numDraftTokens)]
        if sp.numSteps is not None:
            args += ["--speculative-num-steps", str(sp.numSteps)]
        if sp.draftModelPath:
            args += ["--speculative-draft-model-path", sp.draftModelPath]
        if sp.algorithm == "DSPARK" and role.attention_dp > 1 and not _has_flag(role.spec.extraArgs, DP_LM_HEAD_FLAG):
            # DSpark with attention DP runs only with the LM head data-parallel too:
            # speculative_hook._handle_dspark raises "DSpark with dp attention requires
            # --enable-dp-lm-head" otherwise. It is the one value SGLang accepts there, so
            # the operator renders it, as it does --speculative-eagle-topk 1.
            args.append(DP_LM_HEAD_FLAG)
        if sp.algorithm == "EAGLE" and role.is_deepseek_v4 and not _has_flag(role.spec.extraArgs, EAGLE_TOPK_FLAG):
            # apply_deepseek_v4_defaults asserts speculative_eagle_topk == 1 for EAGLE, and it
            # runs before the speculative hook would default it (deepseek_v4_hook.py).
            args += [EAGLE_TOPK_FLAG, "1"]

    if role.plugin is not None:
        args.append(role.plugin.flag)
    if role.paged_experts_k is not None:
        args += ["--enable-paged-experts", "--paged-experts-num-resident", str(role.paged_experts_k)]
        if role.model is not None and role.model.sharedExperts > 0:
            args.append("--disable-shared-experts-fusion")
    if spec.rlRollout:
        args.append("--no-enable-decoder-swa-bounded-replay")
    args += hicache_args(
        spec=spec, role=role.role, name=name, namespace=namespace, compat_key=compat_key,
        rdma=transfer.rdma if transfer is not None else False,
        devices=transfer.devices if transfer is not None else (),
    )  # fmt: skip
    args += bucket_args(spec.slo, role.role)  # every SLO target a bucket boundary (decode only)
    args += list(role.spec.extraArgs)

    env: list[tuple[str, str]] = []
    if role.is_deepseek_v4:
        env += [
            ("SGLANG_DSV4_KV_LAYOUT", role.kv_layout.layout),
            ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", effective_compressed_option(role.kv_layout.compressed, layout)),
        ]
    if spec.engram is not None:
        if spec.engram.placement == "host":
            env.append(("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "1"))
        elif spec.engram.placement == "peerShards":
            env.append(("SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS", "1"))
    # One cache volume: SGLANG_JIT_CACHE_DIR does not follow SGLANG_CACHE_DIR (environ.py).
    env += [("SGLANG_CACHE_DIR", SGLANG_CACHE_DIR), ("SGLANG_JIT_CACHE_DIR", f"{SGLANG_CACHE_DIR}/jit")]
    if spec.transfer.forceTCP:
        env.append(("MC_FORCE_TCP", "1"))
    if spec.model.source.hub is not None:
        env.append(("HF_HOME", HF_CACHE))
    env += [(e.name, e.value) for e in role.spec.env]
    return EngineCommand(args=tuple(args), env=tuple(env))
