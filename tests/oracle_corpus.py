"""Generated PDDeployments for the oracle differential (tests/contract/test_oracle_differential.py).

One generator, :func:`generate_spec`, driven by a :class:`random.Random`, draws a
PDDeployment dict the way users write them: mostly schema-valid, weighted towards the
shapes of ``examples/`` (DeepSeek-V4.1-Flash on GB300 / B300 / H200 / MI355X, TP or DEP
roles, DSpark, a vendor plugin on decode), with the less common corners drawn less often:
cross-hardware PD (a per-role accelerator), per-role KV layout overrides, Paged Experts,
every Engram placement and transfer backend, the ``disaggregation`` knobs, RL rollouts,
``extraArgs`` from the PD-relevant flags of SGLang 0.5.23's parser (values included:
a chunked prefill size of 1000 is not a multiple of DeepSeek-V4's page), environment
variables SGLang's startup reads, and now and then a flag or variable the operator
manages or a value the schema refuses.

Two ways to use it:

- :func:`corpus` ``(n, seed)``: a deterministic list of ``n`` distinct specs (equal seeds,
  equal lists, on every machine and Python run: only ``random.Random`` decides), the CI
  differential uses ``corpus(2000, seed=13)``; :func:`multi_node_corpus` draws specs
  whose roles span nodes (``parallelism.nodes``) from its own stream, the CI differential
  adds ``multi_node_corpus(200, seed=31)``;
- :func:`pddeployments`: a hypothesis strategy over the same generator, for
  property-style tests (hypothesis drives the ``Random`` and shrinks through it).

The choice tables are plain data at module level so a reader sees the weights.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Mapping, Sequence

API_VERSION = "pd.sglang-operator.io/v1alpha1"
NAMESPACE = "inference"

# --------------------------------------------------------------------------- tables
# value -> weight. Names from kernels/models.yaml, kernels/accelerators.yaml,
# kernels/plugins.yaml and operator/api/v1alpha1.py.
MODELS = {
    "deepseek-ai/DeepSeek-V4.1-Flash": 70,
    "deepseek-ai/DeepSeek-V4-Flash": 12,
    "Qwen/Qwen3-30B-A3B": 10,
    "Qwen/Qwen3-30B-A3B-FP8": 8,
}
DSV4_MODELS = {"deepseek-ai/DeepSeek-V4.1-Flash", "deepseek-ai/DeepSeek-V4-Flash"}
ACCELERATORS = {
    "gb300": 24, "b300": 14, "b200": 10, "gb200": 8, "h200": 14,
    "h100": 6, "mi355x": 12, "mi350x": 6, "l40s": 6,
}  # fmt: skip
GPUS_PER_NODE = {"gb300": 4, "b300": 8, "b200": 8, "gb200": 4, "h200": 8, "h100": 8, "mi355x": 8, "mi350x": 8, "l40s": 8}
SM100 = {"gb300", "b300", "b200", "gb200"}
AMD = {"mi355x", "mi350x"}
IMAGES = {
    "nvidia-blackwell": "lmsysorg/sglang:v0.5.23-cu130",
    "nvidia": "lmsysorg/sglang:v0.5.23-cu129",
    "amd": "lmsysorg/sglang:v0.5.23-rocm700-mi35x",
}
ATTENTION_BACKENDS = {"auto": 50, "flashmla": 24, "flashmla_mega": 20, "trtllm": 6}
LAYOUTS = {"auto": 60, "v4": 14, "v41": 16, "v41_new": 10}
COMPRESSED = {"auto": 70, "fp8": 15, "fp4": 15}
PAGE_SIZES = {256: 45, 64: 30, 1: 5, 16: 5, 32: 4, 128: 6, 512: 3, 1024: 2}
DTYPES = {"fp8_e4m3": 62, "auto": 26, "bfloat16": 3, "bf16": 3, "fp8_e5m2": 2, "nvfp4": 2, "mxfp8": 1, "fp4_mx_block16": 1}
QWEN_PAGE_SIZES = {16: 30, 1: 20, 64: 25, 32: 10, 256: 15}
QWEN_DTYPES = {"auto": 60, "fp8_e4m3": 15, "bfloat16": 15, "fp8_e5m2": 10}
SPECULATIVE_V41 = {None: 40, "DSPARK": 54, "EAGLE": 4, "NEXTN": 2}
SPECULATIVE_V4 = {None: 50, "EAGLE": 30, "DSPARK": 12, "NEXTN": 8}
SPECULATIVE_QWEN = {None: 85, "EAGLE": 8, "NGRAM": 4, "DSPARK": 3}
DSPARK_BLOCK_SIZES = {3: 30, 5: 35, 1: 5, 2: 8, 4: 10, 7: 7, 8: 5}
ENGRAM = {None: 20, "host": 20, "device": 25, "peerShards": 35}
ENGRAM_AMD = {None: 20, "host": 25, "device": 45, "peerShards": 10}  # peerShards is CUDA-only in SGLang
TRANSFER_NVIDIA = {"mooncake": 78, "nixl": 14, "fake": 5, "mori": 3}
TRANSFER_AMD = {"mooncake": 62, "mori": 18, "nixl": 15, "fake": 5}
RESIDENT_EXPERTS = {26: 25, 8: 15, 16: 15, 32: 15, 64: 10, 4: 8, 6: 6, 128: 6}
TP_SIZES = {1: 12, 2: 18, 3: 4, 4: 40, 8: 26}
GATEWAY_POLICIES = {"cache_aware": 60, "round_robin": 20, "power_of_two": 10, "random": 5, "least_load": 5}

#: extraArgs: flag -> (weight, values); values None for a switch. Flags and choices from
#: SGLang 0.5.23's parser (operator/planning/data/sglang-0.5.23-flags.json).
EXTRA_ARGS: dict[str, tuple[int, Sequence[Any] | None]] = {
    "--chunked-prefill-size": (14, [8192, 4096, 16384, 2048, 1000, 512, 6000, 3000, -1]),
    "--enable-dp-lm-head": (8, None),
    "--moe-a2a-backend": (9, ["none", "deepep", "megamoe", "mori", "flashinfer", "nixl", "mooncake", "deepep_v2", "pplx"]),
    "--attn-cp-size": (3, [2, 4]),
    "--enable-prefill-cp": (2, None),
    "--cp-strategy": (2, ["interleave", "zigzag"]),
    "--dcp-size": (2, [2, 4, 8]),
    "--pp-size": (2, [2, 4]),
    "--enable-two-batch-overlap": (3, None),
    "--enable-single-batch-overlap": (2, None),
    "--disaggregation-decode-enable-radix-cache": (3, None),
    "--max-running-requests": (8, [8, 64, 256, 1024]),
    "--mem-fraction-static": (8, [0.7, 0.8, 0.85, 0.9]),
    "--cuda-graph-max-bs-decode": (5, [8, 32, 128, 256]),
    "--enable-eplb": (3, None),
    "--ep-num-redundant-experts": (2, [8, 32]),
    "--moe-dense-tp-size": (2, [1, 2]),
    "--moe-runner-backend": (3, ["auto", "deep_gemm", "triton", "flashinfer_trtllm", "megamoe", "cutlass", "aiter"]),
    "--deepep-mode": (2, ["auto", "low_latency", "normal"]),
    "--disable-radix-cache": (3, None),
    "--disable-cuda-graph": (2, None),
    "--context-length": (3, [32768, 131072]),
    "--schedule-policy": (2, ["fcfs", "lpm", "priority"]),
    "--enable-priority-scheduling": (2, None),
    "--enable-mixed-chunk": (2, None),
    "--disable-overlap-schedule": (2, None),
    "--speculative-eagle-topk": (2, [1, 4]),
    "--disaggregation-decode-polling-interval": (1, [1, 4]),
    "--num-reserved-decode-tokens": (1, [512, 1024]),
    "--load-balance-method": (2, ["round_robin", "follow_bootstrap_room", "total_tokens"]),
    "--max-prefill-tokens": (2, [8192, 16384]),
    "--cuda-graph-max-bs": (1, [64]),  # not a 0.5.23 flag (it is --cuda-graph-max-bs-decode): a typo users make
}
#: Flags the operator sets from typed fields (planning/engine_args.py MANAGED_FLAGS): drawn rarely.
MANAGED_EXTRA_ARGS: dict[str, Sequence[Any] | None] = {
    "--page-size": [256, 64],
    "--tp-size": [4],
    "--kv-cache-dtype": ["fp8_e4m3"],
    "--enable-hierarchical-cache": None,
    "--disaggregation-transfer-backend": ["nixl"],
    "--speculative-dspark-block-size": [3],
}
#: env entries: variable -> (weight, values). Variables SGLang 0.5.23's startup reads.
ENV_VARS: dict[str, tuple[int, Sequence[str]]] = {
    "SGLANG_RAGGED_VERIFY_MODE": (10, ["static", "static", "cap-accept", "compact", "ragged"]),
    "SGLANG_DISAGG_STAGING_BUFFER": (4, ["1", "0", "true"]),
    "SGLANG_RUST_SERVER": (3, ["1", "0"]),
    "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION": (3, ["1", "0"]),
    "SGLANG_ENABLE_PP_SPEC": (2, ["1"]),
    "SGLANG_DSV4_DECODER_TAIL_GRAPH_MAX_ROWS": (4, ["0", "2048"]),
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": (2, ["600"]),
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": (1, ["600"]),
    "SGLANG_MORI_EP_V2": (1, ["0"]),
    "SGLANG_DSV4_FP4_EXPERTS": (1, ["0", "1"]),
}
#: Variables the operator manages (planning/engine_args.py MANAGED_ENV): drawn rarely.
MANAGED_ENV_VARS: dict[str, Sequence[str]] = {
    "SGLANG_DSV4_KV_LAYOUT": ["v4", "v41"],
    "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS": ["1"],
    "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": ["fp8"],
}


# --------------------------------------------------------------------------- drawing helpers
def pick(rng: random.Random, table: Mapping[Any, float]) -> Any:
    """One key of ``table`` drawn with its weight."""
    keys = list(table)
    return rng.choices(keys, weights=[table[k] for k in keys], k=1)[0]


def chance(rng: random.Random, p: float) -> bool:
    """True with probability ``p``."""
    return rng.random() < p


def _image(accelerator: str) -> str:
    if accelerator in AMD:
        return IMAGES["amd"]
    return IMAGES["nvidia-blackwell" if accelerator in SM100 else "nvidia"]


# --------------------------------------------------------------------------- parts
def _kv_layout(rng: random.Random, model: str, accelerator: str) -> dict[str, Any]:
    if model not in DSV4_MODELS:
        out: dict[str, Any] = {"pageSize": pick(rng, QWEN_PAGE_SIZES), "dtype": pick(rng, QWEN_DTYPES)}
        if chance(rng, 0.1):
            out["attentionBackend"] = pick(rng, ATTENTION_BACKENDS)
        return out
    backends = dict(ATTENTION_BACKENDS)
    if accelerator in SM100:
        backends["flashmla_mega"] = 35
    out = {
        "attentionBackend": pick(rng, backends),
        "layout": pick(rng, LAYOUTS),
        "compressed": pick(rng, COMPRESSED),
        "pageSize": pick(rng, PAGE_SIZES),
        "dtype": pick(rng, DTYPES),
    }
    # users often write only some fields: drop a few to their defaults
    for key in ("layout", "compressed", "attentionBackend", "dtype", "pageSize"):
        if chance(rng, 0.1):
            out.pop(key)
    return out


def _kv_override(rng: random.Random, base: dict[str, Any], model: str, accelerator: str) -> dict[str, Any]:
    """A per-role kvLayout: equal to the spec-wide one, one field changed, or a fresh draw."""
    kind = pick(rng, {"same": 30, "one-field": 50, "fresh": 20})
    if kind == "same":
        return dict(base)
    if kind == "fresh":
        return _kv_layout(rng, model, accelerator)
    out = dict(base)
    key = pick(rng, {"attentionBackend": 30, "layout": 25, "compressed": 20, "pageSize": 15, "dtype": 10})
    table = {"attentionBackend": ATTENTION_BACKENDS, "layout": LAYOUTS, "compressed": COMPRESSED,
             "pageSize": PAGE_SIZES, "dtype": DTYPES}[key]  # fmt: skip
    out[key] = pick(rng, table)
    return out


def _parallelism(rng: random.Random, accelerator: str, *, single_gpu: bool = False) -> dict[str, Any]:
    """One role's parallelism: TP, DEP (dp = tp with DP attention), partial DP attention, plain DP."""
    if single_gpu:
        return {"tp": 1} if chance(rng, 0.7) else {}
    gpus = GPUS_PER_NODE[accelerator]
    tps = {tp: w for tp, w in TP_SIZES.items() if tp <= gpus or chance(rng, 0.05)}
    shape = pick(rng, {"tp": 52, "tp-ep": 18, "dep": 20, "dp-attn-partial": 5, "dp": 4, "bad": 1})
    tp = pick(rng, tps)
    if shape == "tp":
        return {"tp": tp}
    if shape == "tp-ep":
        return {"tp": tp, "ep": tp if chance(rng, 0.85) else max(1, tp // 2)}
    if shape == "dep":
        tp = max(tp, 2)
        out = {"tp": tp, "dp": tp, "ep": tp, "dpAttention": True}
        if chance(rng, 0.15):
            out.pop("ep")
        return out
    if shape == "dp-attn-partial":
        tp = max(tp, 4)
        return {"tp": tp, "dp": 2, "ep": tp, "dpAttention": True}
    if shape == "dp":
        return {"tp": tp, "dp": 2}
    # what the CRD's CEL rules refuse: DP attention without dp, or dp not dividing tp
    return {"tp": 4, "dp": 3, "dpAttention": True} if chance(rng, 0.5) else {"tp": 4, "dpAttention": True}


def _speculative(rng: random.Random, model: str) -> dict[str, Any] | None:
    if model in DSV4_MODELS:
        algo = pick(rng, SPECULATIVE_V41 if model.endswith("V4.1-Flash") else SPECULATIVE_V4)
    else:
        algo = pick(rng, SPECULATIVE_QWEN)
    if algo is None:
        return None
    if algo == "DSPARK":
        out: dict[str, Any] = {"algorithm": "DSPARK", "blockSize": pick(rng, DSPARK_BLOCK_SIZES)}
        r = rng.random()
        if r < 0.12:
            out["numDraftTokens"] = out["blockSize"] + 1
        elif r < 0.14:
            out["numDraftTokens"] = out["blockSize"] + 2  # CEL refuses
        elif r < 0.2:
            out.pop("blockSize")
        return out
    if algo in ("EAGLE", "NEXTN"):
        out = {"algorithm": algo, "numSteps": pick(rng, {1: 30, 2: 30, 3: 40}), "numDraftTokens": pick(rng, {2: 30, 4: 50, 8: 20})}
        if chance(rng, 0.2):
            out.pop("numSteps")
        return out
    return {"algorithm": algo}


def _extra_args(rng: random.Random, *, role: str, dp_attention: bool, dspark: bool) -> list[str]:
    out: list[str] = []
    used: set[str] = set()

    def add(flag: str, values: Sequence[Any] | None) -> None:
        if flag in used:
            return
        used.add(flag)
        if values is None:
            out.append(flag)
            return
        value = str(rng.choice(list(values)))
        if chance(rng, 0.1):
            out.append(f"{flag}={value}")
        else:
            out.extend([flag, value])

    # the DSpark-with-DP-attention corner SGLang's speculative hook guards
    if dspark and dp_attention:
        if chance(rng, 0.55):
            add("--enable-dp-lm-head", None)
        if chance(rng, 0.3):
            add("--moe-a2a-backend", EXTRA_ARGS["--moe-a2a-backend"][1])
    if role == "prefill" and chance(rng, 0.12):
        add("--chunked-prefill-size", EXTRA_ARGS["--chunked-prefill-size"][1])
    n = pick(rng, {0: 55, 1: 25, 2: 12, 3: 6, 4: 2})
    weights = {flag: w for flag, (w, _) in EXTRA_ARGS.items()}
    for _ in range(n):
        flag = pick(rng, weights)
        add(flag, EXTRA_ARGS[flag][1])
    if chance(rng, 0.03):
        flag = rng.choice(sorted(MANAGED_EXTRA_ARGS))
        add(flag, MANAGED_EXTRA_ARGS[flag])
    return out


def _env(rng: random.Random, *, dspark: bool) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    names: set[str] = set()
    n = pick(rng, {0: 78, 1: 16, 2: 6})
    if dspark and chance(rng, 0.12):
        names.add("SGLANG_RAGGED_VERIFY_MODE")
        out.append({"name": "SGLANG_RAGGED_VERIFY_MODE", "value": rng.choice(ENV_VARS["SGLANG_RAGGED_VERIFY_MODE"][1])})
    weights = {name: w for name, (w, _) in ENV_VARS.items()}
    for _ in range(n):
        name = pick(rng, weights)
        if name not in names:
            names.add(name)
            out.append({"name": name, "value": rng.choice(list(ENV_VARS[name][1]))})
    if chance(rng, 0.02):
        name = rng.choice(sorted(MANAGED_ENV_VARS))
        if name not in names:
            out.append({"name": name, "value": rng.choice(list(MANAGED_ENV_VARS[name]))})
    return out


def _schema_break(rng: random.Random, spec: dict[str, Any]) -> None:
    """One edit the CRD schema refuses (a few percent of the corpus: SGLang never sees these)."""
    kind = pick(rng, {"page0": 2, "tp0": 2, "unknown-field": 2, "page-string": 1, "backend": 1, "replicas": 1})
    if kind == "page0":
        spec.setdefault("kvLayout", {})["pageSize"] = 0
    elif kind == "tp0":
        spec["decode"].setdefault("parallelism", {})["tp"] = 0
    elif kind == "unknown-field":
        spec.setdefault("kvLayout", {})["pagesize"] = 256
    elif kind == "page-string":
        spec.setdefault("kvLayout", {})["pageSize"] = "256"
    elif kind == "backend":
        spec["transfer"] = {"backend": "rdma"}
    else:
        spec["prefill"]["replicas"] = -1


# --------------------------------------------------------------------------- the generator
def generate_spec(rng: random.Random, name: str = "gen") -> dict[str, Any]:
    """One PDDeployment dict drawn with ``rng`` (only ``rng`` decides: equal states, equal specs)."""
    model = pick(rng, MODELS)
    dsv4 = model in DSV4_MODELS
    accelerator = pick(rng, ACCELERATORS)
    spec: dict[str, Any] = {
        "model": {
            "name": model,
            "revision": "3f2c1e9" if dsv4 else "main",
            "source": {"pvc": {"claimName": "model-store", "path": "/" + model.split("/")[-1]}},
        },
        "runtime": {"image": _image(accelerator), "sglangVersion": "0.5.23"},
        "accelerator": accelerator,
    }
    if chance(rng, 0.6):
        spec["model"]["servedModelName"] = model.split("/")[-1].lower()
    if dsv4 and chance(rng, 0.7):
        spec["model"]["trustRemoteCode"] = True
    spec["kvLayout"] = _kv_layout(rng, model, accelerator)

    # cross-hardware PD: one role on another accelerator
    role_acc = {"prefill": accelerator, "decode": accelerator}
    if chance(rng, 0.1):
        other = pick(rng, {k: w for k, w in ACCELERATORS.items() if k != accelerator})
        role_acc[rng.choice(["prefill", "decode"])] = other

    # Paged Experts (Qwen mostly): single GPU roles
    paged: dict[str, Any] | None = None
    paged_roles: dict[str, dict[str, Any]] = {}
    if chance(rng, 0.4 if not dsv4 else 0.04):
        k = {"residentExperts": pick(rng, RESIDENT_EXPERTS)}
        where = pick(rng, {"spec": 70, "decode": 15, "prefill": 10, "both-roles": 5})
        if where == "spec":
            paged = k
        elif where == "both-roles":
            paged_roles = {"prefill": k, "decode": {"residentExperts": pick(rng, RESIDENT_EXPERTS)}}
        else:
            paged_roles = {where: k}
    single_gpu_all = paged is not None and chance(rng, 0.9)

    speculative = _speculative(rng, model) if (paged is None and not paged_roles) or chance(rng, 0.05) else None
    dspark = speculative is not None and speculative["algorithm"] == "DSPARK"

    # vendor plugin (rendered on decode): mostly DeepSeek-V4.1 on a GPU it is built for
    plugin = "none"
    decode_acc = role_acc["decode"]
    v41 = model.endswith("V4.1-Flash")
    if decode_acc in SM100 and chance(rng, 0.3 if v41 else 0.04):
        plugin = "sgl-nvidia-mega"
    elif decode_acc in AMD and chance(rng, 0.35 if v41 else 0.04):
        plugin = "sgl-amd-mono"
    elif chance(rng, 0.03):
        plugin = rng.choice(["sgl-nvidia-mega", "sgl-amd-mono"])
    if plugin != "none" or chance(rng, 0.2):
        kernels: dict[str, Any] = {"plugin": plugin}
        if plugin == "sgl-nvidia-mega" and chance(rng, 0.1):
            kernels["slots"] = rng.choice([8, 16, 32])
        spec["kernels"] = kernels

    roles: dict[str, dict[str, Any]] = {}
    same_shape = chance(rng, 0.6 if dspark else 0.45)
    for role in ("prefill", "decode"):
        single = single_gpu_all or (role in paged_roles and chance(rng, 0.9))
        if role == "decode" and plugin != "none" and not single and GPUS_PER_NODE[decode_acc] >= 4 \
                and chance(rng, 0.75):
            par = {"tp": 4} if chance(rng, 0.8) else {"tp": 4, "ep": 4}  # the TP size the plugins are built for
        elif role == "decode" and same_shape and not single and "parallelism" in roles["prefill"] \
                and GPUS_PER_NODE[role_acc["decode"]] >= roles["prefill"]["parallelism"].get("tp", 1):
            par = copy.deepcopy(roles["prefill"]["parallelism"])
        else:
            par = _parallelism(rng, role_acc[role], single_gpu=single)
        r: dict[str, Any] = {}
        if chance(rng, 0.9):
            r["replicas"] = pick(rng, {1: 70, 2: 25, 0: 5})
        if par:
            r["parallelism"] = par
        if role_acc[role] != accelerator:
            r["accelerator"] = role_acc[role]
        if role in paged_roles:
            r["pagedExperts"] = paged_roles[role]
        if chance(rng, 0.08):
            r["kvLayout"] = _kv_override(rng, spec["kvLayout"], model, role_acc[role])
        args = _extra_args(rng, role=role, dp_attention=bool(par.get("dpAttention")), dspark=dspark)
        if args:
            r["extraArgs"] = args
        env = _env(rng, dspark=dspark)
        if env:
            r["env"] = env
        roles[role] = r

    if dsv4 and model.endswith("V4.1-Flash"):
        placement = pick(rng, ENGRAM_AMD if accelerator in AMD else ENGRAM)
    else:
        placement = pick(rng, {None: 90, "host": 4, "device": 3, "peerShards": 3})
    if placement is not None:
        spec["engram"] = {"placement": placement}
    if paged is not None:
        spec["pagedExperts"] = paged
    if speculative is not None:
        spec["speculative"] = speculative

    transfer = {"backend": pick(rng, TRANSFER_AMD if accelerator in AMD else TRANSFER_NVIDIA)}
    if transfer["backend"] == "mooncake" and chance(rng, 0.03):
        transfer["forceTCP"] = True
    if transfer["backend"] != "mooncake" or chance(rng, 0.85):
        spec["transfer"] = transfer

    disagg: dict[str, Any] = {}
    if chance(rng, 0.15):
        disagg["decodeAllocationPolicy"] = pick(rng, {"early": 60, "prefill_complete": 40})
    if chance(rng, 0.1):
        disagg["samplingMaskMaxTokens"] = rng.choice([1, 8, 64, 1024])
    if chance(rng, 0.1):
        disagg["kvChecksum"] = True
    if chance(rng, 0.03):
        disagg["bootstrapPort"] = 9000
    if disagg:
        spec["disaggregation"] = disagg
    if chance(rng, 0.08):
        spec["rlRollout"] = True
    if chance(rng, 0.04):
        backend = pick(rng, {"none": 60, "file": 40})
        hicache: dict[str, Any] = {"storage": {"backend": backend}}
        if chance(rng, 0.3):
            hicache["hostRatio"] = rng.choice([1.0, 2.0])
        spec["kvCache"] = {"hicache": hicache}

    spec["prefill"] = roles["prefill"]
    spec["decode"] = roles["decode"]
    spec["gateway"] = {"replicas": pick(rng, {1: 70, 2: 30}), "policy": pick(rng, GATEWAY_POLICIES)}
    if chance(rng, 0.5):
        spec["slo"] = {"ttft": {"p90": rng.choice(["800ms", "2s"])}, "itl": {"p90": rng.choice(["15ms", "40ms"])}}
    if chance(rng, 0.03):
        _schema_break(rng, spec)
    return {"apiVersion": API_VERSION, "kind": "PDDeployment", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}  # fmt: skip


def spec_key(doc: Mapping[str, Any]) -> str:
    """What makes two generated documents the same spec (the name does not)."""
    return json.dumps(doc.get("spec"), sort_keys=True, default=str)


def _distinct(n: int, rng: random.Random, draw: Any, prefix: str) -> list[dict[str, Any]]:
    """``n`` distinct documents from ``draw(rng, name)``, named ``<prefix>-<index>`` in draw order."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    draws = 0
    while len(out) < n:
        draws += 1
        if draws > 50 * n + 1000:
            raise RuntimeError(f"the generator keeps drawing duplicates: {len(out)} distinct of {draws} draws")
        doc = draw(rng, f"{prefix}-{len(out):05d}")
        key = spec_key(doc)
        if key in seen:
            continue
        seen.add(key)
        out.append(doc)
    return out


def corpus(n: int, seed: int = 13, *, prefix: str | None = None) -> list[dict[str, Any]]:
    """``n`` distinct generated PDDeployments, the same list for the same ``(n, seed)``.

    Names are ``<prefix>-<index>`` (default prefix ``gen<seed>``), numbered in draw order
    among the distinct specs; a redrawn duplicate is skipped.
    """
    return _distinct(n, random.Random(seed), lambda rng, name: generate_spec(rng, name=name), prefix or f"gen{seed}")


#: Nodes per replica of a role made to span nodes (3 rarely: it splits few shapes evenly).
NODES = {2: 50, 4: 28, 3: 6, 8: 10, 16: 6}
#: How a multi-node role's parallelism is drawn: DEP (attention DP across nodes), TP across
#: nodes, pipeline stages across nodes, and the shapes the rules refuse (system DP across
#: nodes, fewer or more GPUs per node than the node has).
MULTI_NODE_SHAPES = {"dep": 45, "tp": 22, "pp": 8, "dp-system": 8, "fewer": 8, "more": 5, "dep-cp": 4}


def make_multi_node(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with one role (or both) spanning nodes: ``parallelism.nodes`` and a parallelism that
    uses them (mostly a whole node per pod), sometimes a refused shape. Changes ``doc`` and returns it."""
    spec = doc["spec"]
    spec.pop("pagedExperts", None)  # Paged Experts runs on one GPU
    roles = pick(rng, {("decode",): 45, ("prefill",): 25, ("prefill", "decode"): 30})
    if chance(rng, 0.5):
        # a plain base, so more multi-node specs are ones SGLang serves (where a false accept
        # would show): no plugin, the layout SGLang picks, no extra flags, DEP on the other
        # role too (DSpark pairs equal attention TP only)
        spec.pop("kernels", None)
        spec["kvLayout"] = {k: v for k, v in spec["kvLayout"].items() if k in ("pageSize", "dtype")}
        for role in ("prefill", "decode"):
            spec[role].pop("extraArgs", None)
            spec[role].pop("kvLayout", None)
            if role not in roles:
                acc = spec[role].get("accelerator") or spec["accelerator"]
                tp = min(4, GPUS_PER_NODE[acc])
                spec[role]["parallelism"] = {"tp": tp, "dp": tp, "ep": tp, "dpAttention": True}
    for role in roles:
        r = spec[role]
        r.pop("pagedExperts", None)
        acc = r.get("accelerator") or spec["accelerator"]
        gpus = GPUS_PER_NODE[acc]
        nodes = pick(rng, NODES)
        shape = pick(rng, MULTI_NODE_SHAPES)
        while gpus * nodes > 64 and nodes > 2:  # tp is at most 64
            nodes //= 2
        total = gpus * nodes
        if shape == "fewer":
            total = max(nodes, total // 2)
        elif shape == "more":
            total = min(64, total * 2)
        if shape in ("dep", "dep-cp", "fewer", "more"):
            par: dict[str, Any] = {"tp": total, "dp": total, "ep": total, "dpAttention": True}
        elif shape == "tp":
            par = {"tp": total, "ep": total} if chance(rng, 0.5) else {"tp": total}
        elif shape == "pp":
            par = {"tp": max(1, total // nodes)}
            r["extraArgs"] = [*r.get("extraArgs", []), "--pp-size", str(nodes)]
        else:  # system DP across nodes: SGLang refuses it
            par = {"tp": total, "dp": 2}
        par["nodes"] = nodes
        r["parallelism"] = par
        if shape == "dep-cp":
            r["extraArgs"] = [*r.get("extraArgs", []), "--enable-prefill-cp", "--cp-strategy", "interleave"]
        if chance(rng, 0.3) and par.get("dpAttention"):
            r["extraArgs"] = [*r.get("extraArgs", []), "--moe-a2a-backend", pick(rng, {"megamoe": 60, "deepep": 25,
                                                                                      "deepep_v2": 15})]
            if spec.get("speculative", {}).get("algorithm") == "DSPARK":
                r["env"] = [e for e in r.get("env", []) if e["name"] != "SGLANG_RAGGED_VERIFY_MODE"] + [
                    {"name": "SGLANG_RAGGED_VERIFY_MODE", "value": "static"}]
    return doc


def multi_node_corpus(n: int, seed: int = 31, *, prefix: str | None = None) -> list[dict[str, Any]]:
    """``n`` distinct generated PDDeployments with a role spanning nodes (:func:`make_multi_node`),
    the same list for the same ``(n, seed)``; drawn from their own stream, so :func:`corpus` is unchanged."""
    return _distinct(n, random.Random(seed), lambda rng, name: make_multi_node(rng, generate_spec(rng, name=name)),
                     prefix or f"mn{seed}")


def pddeployments(name: str = "hyp") -> Any:
    """A hypothesis strategy of PDDeployment dicts drawn by :func:`generate_spec`.

    Hypothesis supplies the ``Random`` (``st.randoms(use_true_random=False)``), so it
    replays and shrinks failures; with ``derandomize=True`` or ``@seed`` it is fixed.
    """
    from hypothesis import strategies as st

    def build(rng: random.Random) -> dict[str, Any]:
        return generate_spec(rng, name=name)

    return st.randoms(use_true_random=False).map(build)


__all__ = ["chance", "corpus", "generate_spec", "make_multi_node", "multi_node_corpus", "pddeployments", "pick",
           "spec_key"]
