"""Paged Experts rules: what SGLang's check_paged_experts_compat refuses, and what the operator adds.

Source: sglang 0.5.23 layers/moe/paged_experts/method.py (check_paged_experts_compat):
tp, ep, pp and dp must be 1; no EPLB; no speculative decoding; not --load-format dummy;
--paged-experts-num-resident >= the router's top-k; no
--enable-fused-moe-sum-all-reduce; models with shared experts need
--disable-shared-experts-fusion (the operator renders it). Online weight updates are
refused. Decode CUDA graphs are captured only up to K // top_k requests. Seed 003: the
full expert set lives in pinned host memory.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..features import parse_flags
from ..memory import gib
from ..structs import RolePlan
from ..problems import Problem
from .moe import a2a_backend


def paged_experts_single_gpu(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Paged Experts needs tp, ep, dp (and pp) of 1: one GPU per replica."""
    if role.inputs.paged_experts_k is None:
        return []
    p = role.inputs.parallelism
    flags = parse_flags(role.inputs.spec.extraArgs)
    problems = []
    for name, value in (("tp", p.tp), ("ep", p.ep), ("dp", p.dp)):
        if value != 1:
            problems.append(
                Problem(
                    field=f"spec.{role.role}.parallelism.{name}",
                    message=f"Paged Experts runs on a single GPU; {name} is {value}",
                    fix=f"set {name}: 1 (scale with replicas instead) or remove pagedExperts",
                    rule="paged_experts_single_gpu",
                )
            )
    if int(flags.get("pp_size", 1) or 1) > 1:
        problems.append(
            Problem(
                field=f"spec.{role.role}.extraArgs",
                message="Paged Experts refuses pipeline parallelism (--pp-size > 1)",
                fix="remove --pp-size",
                rule="paged_experts_single_gpu",
            )
        )
    return problems


def paged_experts_flags(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Paged Experts refuses speculative decoding, EPLB, dummy weights, fused MoE sum all-reduce and plugins."""
    k = role.inputs.paged_experts_k
    if k is None:
        return []
    field = role.inputs.paged_experts_field
    flags = parse_flags(role.inputs.spec.extraArgs)
    problems = []

    def add(f: str, msg: str, fix: str) -> None:
        problems.append(Problem(field=f, message=msg, fix=fix, rule="paged_experts_flags"))

    if spec.speculative is not None:
        add("spec.speculative", "Paged Experts refuses speculative decoding", "remove spec.speculative or pagedExperts")
    if spec.kernels.plugin != "none":
        add("spec.kernels.plugin", "Paged Experts cannot run with a vendor kernel plugin", "set kernels.plugin none")
    if flags.get("enable_eplb"):
        add(f"spec.{role.role}.extraArgs", "Paged Experts refuses EPLB (--enable-eplb)", "remove --enable-eplb")
    if flags.get("load_format") == "dummy":
        add(f"spec.{role.role}.extraArgs", "Paged Experts refuses --load-format dummy", "remove --load-format dummy")
    if flags.get("enable_fused_moe_sum_all_reduce"):
        add(
            f"spec.{role.role}.extraArgs",
            "Paged Experts refuses --enable-fused-moe-sum-all-reduce",
            "remove --enable-fused-moe-sum-all-reduce",
        )
    if spec.rlRollout:
        add(
            field,
            "Paged Experts refuses online weight updates (resident experts may keep old weights), and spec.rlRollout "
            "says this deployment receives them",
            "remove pagedExperts for RL rollouts, or set rlRollout false",
        )
    return problems


def paged_experts_resident_count(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """top-k <= K <= routed experts; decode CUDA graphs cover K // top_k requests; unknown model warns."""
    k = role.inputs.paged_experts_k
    if k is None:
        return []
    field = f"{role.inputs.paged_experts_field}.residentExperts"
    model = role.inputs.model
    if model is None:
        return [
            Problem(
                field=field,
                message=f"cannot check K={k} against the router's top-k and expert count of {spec.model.name!r} "
                "(not in the model catalog); SGLang refuses K below top-k at startup",
                fix="add the model to the catalog ConfigMap (models.yaml)",
                rule="paged_experts_resident_count",
                severity="warning",
            )
        ]
    problems = []
    if k < model.topK:
        problems.append(
            Problem(
                field=field,
                message=f"K={k} is below the router's top-k ({model.topK}) of {spec.model.name}; SGLang refuses it",
                fix=f"set residentExperts to at least {model.topK}",
                rule="paged_experts_resident_count",
            )
        )
    if k > model.routedExperts:
        problems.append(
            Problem(
                field=field,
                message=f"K={k} exceeds the {model.routedExperts} routed experts per layer of {spec.model.name}",
                fix=f"set residentExperts to at most {model.routedExperts} (or drop pagedExperts if they all fit)",
                rule="paged_experts_resident_count",
            )
        )
    graph_bs = k // model.topK if model.topK else 0
    cap = parse_flags(role.inputs.spec.extraArgs).get("cuda_graph_max_bs_decode")
    if graph_bs and cap is not None and str(cap).isdigit() and int(cap) > graph_bs:
        problems.append(
            Problem(
                field=f"spec.{role.role}.extraArgs",
                message=f"--cuda-graph-max-bs-decode {cap} exceeds K // top_k = {graph_bs}: Paged Experts captures "
                "full decode CUDA graphs only up to that batch, larger batches run without a full graph",
                fix=f"set --cuda-graph-max-bs-decode {graph_bs} or raise residentExperts",
                rule="paged_experts_resident_count",
                severity="warning",
            )
        )
    return problems


def paged_experts_host_memory(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Every expert is pinned in host memory: the pod's memory request must hold it and fit the node."""
    if role.inputs.paged_experts_k is None or role.memory.pinned_bytes == 0:
        return []
    need = role.memory.host_bytes
    problems = []
    user = role.inputs.spec.resources.memory
    if user is not None:
        from ..memory import quantity_bytes

        if quantity_bytes(user) < need:
            problems.append(
                Problem(
                    field=f"spec.{role.role}.resources.memory",
                    message=f"memory {user} cannot hold the pinned expert store ({gib(role.memory.pinned_bytes)}) "
                    f"plus the engine; the operator sizes this pod at {gib(need)}",
                    fix=f"set resources.memory to at least {gib(need)} or omit it",
                    rule="paged_experts_host_memory",
                )
            )
    return problems


#: ISAs of SGLang's ``get_platform().is_sm100`` (SM100 and SM103: B200, GB200, B300, GB300)
_SM100 = ("sm_100", "sm_103")
#: ISA of SGLang's ``get_platform().is_sm90`` (H100, H200)
_SM90 = "sm_90a"
#: All-to-all backends under which Fp8MoEMethod's ``auto`` runner is DeepGEMM on a GPU with
#: JIT DeepGEMM (fp8.py ``Fp8MoEMethod.is_deepgemm_moe_runner_backend_enabled``).
_DEEPGEMM_AUTO_A2A = ("deepep", "mooncake", "nixl")
#: All-to-all backends whose argument resolution turns ``--moe-runner-backend auto`` into
#: ``deep_gemm`` for every method (moe_hook.py ``_handle_a2a_moe``; deepep_v2 does too, but
#: refuses a paged layer before its runner is built).
_DEEPGEMM_RESOLVING_A2A = ("pplx",)


def _env_flag(role: RolePlan, name: str, default: bool) -> bool:
    """An ``EnvBool`` of sglang/srt/environ.py as the role's env sets it (last one wins)."""
    value = None
    for var in role.inputs.spec.env:
        if var.name == name:
            value = str(var.value).lower()
    if value in ("true", "1", "yes", "y"):
        return True
    if value in ("false", "0", "no", "n"):
        return False
    return default


def _dsv4_fp4_expert_method(runner: str, isa: str, a2a: str, dequant: bool) -> str:
    """The MoE method SGLang 0.5.23 builds for DeepSeek-V4's FP4 experts (Fp8Config with FP4 experts).

    model_overrides/deepseek_v4.py:67-88 turns ``--moe-runner-backend auto`` into
    ``flashinfer_mxfp4`` on CUDA SM90/SM100/SM120 with ``--moe-a2a-backend none`` and no
    SGLANG_DSV4_FP4_DEQUANT; layers/quantization/fp8.py ``Fp8Config.get_quant_method``
    (:445-474) then builds Mxfp4MarlinMoEMethod under marlin, Mxfp4FlashinferCutlassMoEMethod
    under flashinfer_mxfp4 on SM90/SM120, Mxfp4FlashinferTrtllmMoEMethod on SM100, and
    Fp8MoEMethod (with FP4 experts) otherwise.
    """
    if runner == "marlin":
        return "Mxfp4MarlinMoEMethod"
    if runner == "auto" and a2a == "none" and not dequant:
        if isa == _SM90:
            return "Mxfp4FlashinferCutlassMoEMethod"
        if isa in _SM100:
            return "Mxfp4FlashinferTrtllmMoEMethod"
    return "Fp8MoEMethod"


def _jit_deepgemm(role: RolePlan) -> bool:
    """deep_gemm_wrapper/configurer.py ``_compute_enable_deep_gemm``: CUDA at SM90 or above and
    SGLANG_ENABLE_JIT_DEEPGEMM (default on). SM120 also needs DeepGEMM's SM120 APIs, which the
    catalog cannot tell: only the Hopper and Blackwell ISAs count here."""
    acc = role.inputs.accelerator
    return (acc is not None and acc.vendor == "nvidia" and (acc.isa == _SM90 or acc.isa in _SM100)
            and _env_flag(role, "SGLANG_ENABLE_JIT_DEEPGEMM", True))


def paged_experts_moe_method(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Paged Experts pages only experts built by a triton or Marlin runner, in a format it knows.

    Source: sglang 0.5.23 layers/moe/paged_experts/runners.py:166 ``contract_for`` ("requires the
    triton or Marlin MoE runner, the layer's method uses ...") and method.py:355
    ``check_paged_experts_compat`` ("<method> experts are not supported"), both at model
    construction (fused_moe_triton/layer.py ``make_for_layer``). Which runner and method SGLang
    builds:

    - arg_groups/model_overrides/qwen3_moe.py turns ``--moe-runner-backend auto`` into
      ``flashinfer_trtllm`` on SM100/SM103 for an unquantized or FP8 Qwen3-MoE with no
      all-to-all backend;
    - DeepSeek-V4's FP4 experts (catalog ``bytesPerExpertParam`` 0.5) are never a format
      paged experts knows (formats.py: Fp8BlockFormat excludes ``is_fp4_expert``, and the
      MXFP4 FlashInfer / Marlin methods are not in FORMATS), whatever method
      :func:`_dsv4_fp4_expert_method` names;
    - an FP8 checkpoint (``quant_method: fp8``, Fp8MoEMethod) under ``auto`` runs DeepGEMM
      with ``--moe-a2a-backend`` deepep, mooncake or nixl where JIT DeepGEMM is on
      (fp8.py ``create_moe_runner`` / ``is_deepgemm_moe_runner_backend_enabled``), and
      pplx resolves ``auto`` to ``deep_gemm`` for every method (moe_hook.py
      ``_handle_a2a_moe``);
    - ``--moe-a2a-backend deepep_v2`` takes only unquantized or blockwise FP8 methods, never
      the PagedExpertsMoEMethod wrapper (fused_moe_triton/layer.py
      ``_validate_deepep_v2_quant_method``, :300).

    Found by the oracle's model stage (issue 23) and the differential run; the differential
    holds these cases to SGLang.
    """
    if role.inputs.paged_experts_k is None or role.inputs.model is None or role.inputs.accelerator is None:
        return []
    flags = parse_flags(list(role.command.args))
    runner = str(flags.get("moe_runner_backend") or "auto")
    isa = role.inputs.accelerator.isa
    model = role.inputs.model
    a2a = a2a_backend(flags)
    field = f"spec.{role.role}.extraArgs"
    where = f"{role.role} on {role.inputs.accelerator_name} ({isa})"
    if runner not in ("auto", "triton", "marlin"):
        return [Problem(field=field, message=f"Paged Experts needs the triton or Marlin MoE runner; the {where} is "
                        f"given --moe-runner-backend {runner}, which SGLang 0.5.23 refuses at model construction",
                        fix="use --moe-runner-backend triton (or marlin), or remove pagedExperts",
                        rule="paged_experts_moe_method")]
    if flags.get("quantization") not in (None, False):
        return []
    if role.inputs.is_deepseek_v4 and model.bytesPerExpertParam == 0.5:
        dequant = _env_flag(role, "SGLANG_DSV4_FP4_DEQUANT", False)
        method = _dsv4_fp4_expert_method(runner, isa, a2a, dequant)
        return [Problem(field=role.inputs.paged_experts_field,
                        message=f"Paged Experts cannot page {spec.model.name}'s FP4 experts on the {where}: SGLang 0.5.23 "
                        f"builds them with {method}, a format it does not page, and refuses at model construction "
                        "(paged_experts/method.py check_paged_experts_compat)",
                        fix="remove pagedExperts for this model (it pages unquantized, FP8 and INT8 experts)",
                        rule="paged_experts_moe_method")]
    if runner != "auto":
        return []
    if (model.modelType == "qwen3_moe" and isa in _SM100 and a2a == "none"):
        return [Problem(field=field, message=f"Paged Experts needs the triton or Marlin MoE runner, and SGLang 0.5.23 "
                        f"picks flashinfer_trtllm for {model.architecture} on the {where} (model_overrides/qwen3_moe.py): "
                        "it refuses at model construction",
                        fix=f"add --moe-runner-backend triton to spec.{role.role}.extraArgs",
                        rule="paged_experts_moe_method")]
    config = catalog.hf_config(spec.model.name) or {}
    fp8 = (config.get("quantization_config") or {}).get("quant_method") == "fp8"
    if a2a == "deepep_v2":
        return [Problem(field=field, message=f"Paged Experts cannot run under --moe-a2a-backend deepep_v2 (the {where}): "
                        "SGLang 0.5.23 feeds DeepEP v2 only unquantized or 128x128 blockwise FP8 expert methods, and "
                        "Paged Experts wraps the layer's method in PagedExpertsMoEMethod; it refuses at model "
                        "construction (fused_moe_triton/layer.py _validate_deepep_v2_quant_method)",
                        fix=f"remove --moe-a2a-backend deepep_v2 from spec.{role.role}.extraArgs (Paged Experts runs on "
                        "one GPU, with nothing to dispatch)",
                        rule="paged_experts_moe_method")]
    if a2a in _DEEPGEMM_RESOLVING_A2A or (fp8 and a2a in _DEEPGEMM_AUTO_A2A and _jit_deepgemm(role)):
        how = ("resolves --moe-runner-backend auto to deep_gemm under it (moe_hook.py _handle_a2a_moe)"
               if a2a in _DEEPGEMM_RESOLVING_A2A else
               "runs the FP8 experts (Fp8MoEMethod) on DeepGEMM under --moe-runner-backend auto with it "
               "(fp8.py Fp8MoEMethod.create_moe_runner)")
        return [Problem(field=field, message=f"Paged Experts needs the triton or Marlin MoE runner; the {where} runs "
                        f"--moe-a2a-backend {a2a}, and SGLang 0.5.23 {how}: it refuses at model construction "
                        "(paged_experts/runners.py contract_for)",
                        fix=f"remove --moe-a2a-backend {a2a} from spec.{role.role}.extraArgs (Paged Experts runs on one "
                        "GPU, with nothing to dispatch)" + ("" if a2a in _DEEPGEMM_RESOLVING_A2A else
                                                           ", or add --moe-runner-backend triton"),
                        rule="paged_experts_moe_method")]
    return []
