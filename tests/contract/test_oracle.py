"""The SGLang oracle's stand-ins, each held to the real code path it stands for.

The oracle (sglang_pd_operator.oracle) runs SGLang 0.5.23's startup validation and PD
handshake with four stand-ins: the emulated GPU, the vendor plugin specs built from the
catalog, import stand-ins for the GPU kernel packages, and the model-build divisions.
Each test here would fail if a stand-in drifted from what it stands for: SGLang's own
probes must see the emulated GPU, SGLang's plugin binding must refuse what the catalog
says the plugin refuses, no kernel stand-in may be called while judging, and each
division must be refused with SGLang's ``divide`` message. The ``check --sglang`` CLI
is run on every example, as CI does.
"""

from __future__ import annotations

import copy

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.contract, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _judge(oracle, catalog, doc, *, depth: str | None = None):
    """Plan ``doc`` and judge it; ``depth`` ("args" | "startup") for this call only (default: the oracle's).

    Tests of the argument checks and the handshake judge at ``args``: a deeper stage's refusal
    (the model build, memory) would stop the role before what they test."""
    from sglang_pd_operator.planning.plan import plan_object

    plan, _ = plan_object(doc, catalog)
    assert plan is not None, "the spec must pass the schema"
    saved = oracle.depth
    oracle.depth = depth or saved
    try:
        return plan, oracle.judge_plan(plan)
    finally:
        oracle.depth = saved


def _example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


# --------------------------------------------------------------------------- the emulated GPU


def test_every_accelerator_emulates_what_sglangs_probes_see(oracle, catalog):
    """A worker checks at start (emulation.verify) that SGLang's platform probes report the
    catalog GPU; a drift makes the worker refuse to start, so starting is the assertion."""
    for name in catalog.accelerators:
        worker = oracle.pool.worker(name)
        assert worker.info["ready"] and worker.info["sglang"] == "0.5.23"


def test_a_drifted_emulation_is_caught(catalog, tmp_path):
    """Facts SGLang's probes cannot reproduce (an AMD part without a HIP torch) stop the worker."""
    pytest.importorskip("sglang")
    from sglang_pd_operator.oracle.device import device_facts
    from sglang_pd_operator.oracle.pool import OracleError, WorkerProcess
    from sglang_pd_operator.oracle.worker import DEVICE_ENV

    facts = device_facts(catalog.accelerator("mi355x")).to_json()
    facts["hip_version"] = None  # torch would then be a CUDA build: SGLang sees no HIP
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONSAFEPATH": "1", DEVICE_ENV: json.dumps(facts)}
    with pytest.raises(OracleError, match="EmulationDrift"):
        WorkerProcess(key="drifted", env=env, python=sys.executable, timeout=300)


def test_node_nics_are_the_catalogs(oracle, catalog):
    """SGLang validates --disaggregation-ib-device against /sys/class/infiniband: the oracle's
    node has exactly the catalog's NICs, so a NIC of another node type is refused by SGLang."""
    doc = _example("dsv41-flash-h200-flashmla.yaml")
    plan, verdict = _judge(oracle, catalog, doc)
    assert verdict.accepted, verdict.refusals
    assert "mlx5_0" in " ".join(plan.prefill.command.args)
    from sglang_pd_operator.oracle.device import device_facts

    assert device_facts(catalog.accelerator("h200")).rdma_devices == tuple(r.device for r in catalog.accelerator("h200").rails)


# --------------------------------------------------------------------------- plugin stand-ins


def test_plugin_standin_is_judged_by_sglangs_binding(oracle, catalog):
    """sgl-nvidia-mega is built for TP 4 only (kernels/plugins.yaml): SGLang's own
    handle_nvidia_megakernel refuses the decode role at tp 2 with its own message."""
    doc = _example("dsv41-flash-gb300-low-latency.yaml")
    doc["spec"]["decode"]["parallelism"] = {"tp": 2}
    doc["spec"]["prefill"]["parallelism"] = {"tp": 2}
    _, verdict = _judge(oracle, catalog, doc, depth="args")  # at startup, TP2 prefill's weights leave no KV memory
    assert verdict.decode.starts is False
    assert "--enable-nvidia-megakernel cannot run this setup" in verdict.decode.refusal.message
    assert "tp_size 2 is not one of ['4']" in verdict.decode.refusal.message
    assert verdict.decode.refusal.where.startswith("sglang/srt/kernel_plugins/nvidia/binding.py:handle_nvidia_megakernel")
    assert verdict.prefill.starts  # plugins render on decode only


def test_plugin_standin_refuses_what_the_catalog_refuses(oracle, catalog, tmp_path):
    """A feature the catalog marks refused is refused by SGLang's binding through the stand-in."""
    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator.oracle import Oracle

    overrides = {"plugins.yaml": yaml.safe_dump({"plugins": {
        "sgl-nvidia-mega": {**catalog.plugin("sgl-nvidia-mega").model_dump(mode="json"),
                            "features": {**catalog.plugin("sgl-nvidia-mega").features,
                                         "speculative_decoding": "refused"}}}})}
    refusing = load_catalog(overrides=overrides)
    with Oracle(catalog=refusing, max_workers=1) as o:
        _, verdict = _judge(o, refusing, _example("dsv41-flash-gb300-low-latency.yaml"))
    assert verdict.decode.starts is False
    assert "speculative decoding is in use and sgl-nvidia-mega (catalog stand-in) does not accept it" in (
        verdict.decode.refusal.message
    )


# --------------------------------------------------------------------------- kernel stand-ins


def test_no_kernel_standin_is_used_judging_the_examples(oracle, catalog):
    """Every example is judged without SGLang calling a GPU kernel package (kernel_standins)."""
    for path in EXAMPLES:
        _, verdict = _judge(oracle, catalog, yaml.safe_load(path.read_text()))
        assert verdict.accepted is True, (path.name, verdict.refusals, verdict.prefill.indeterminate)
        for role in (verdict.prefill, verdict.decode):
            assert role.indeterminate is None, (path.name, role.indeterminate)


# --------------------------------------------------------------------------- model-build divisions


@pytest.mark.parametrize(
    "example, parallelism, message",
    [
        ("dsv41-flash-gb300-low-latency.yaml", {"tp": 3}, "64 is not divisible by 3: attention heads"),
        ("qwen3-30b-a3b-paged-experts.yaml", {"tp": 3, "ep": 3}, "128 is not divisible by 3: routed experts"),
    ],
)
def test_model_build_divisions_are_sglangs(oracle, catalog, example, parallelism, message):
    doc = _example(example)
    doc["spec"].pop("pagedExperts", None)
    for role in ("prefill", "decode"):
        doc["spec"][role].pop("pagedExperts", None)
        doc["spec"][role]["parallelism"] = dict(parallelism)
    if doc["spec"].get("kernels"):
        doc["spec"]["kernels"] = {"plugin": "none"}
    doc["spec"]["accelerator"] = "h200"
    if "DeepSeek" in doc["spec"]["model"]["name"]:
        doc["spec"]["kvLayout"].update({"attentionBackend": "flashmla", "layout": "v4"})
    doc["spec"].pop("engram", None)
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is False, verdict.prefill
    assert verdict.prefill.refusal.stage == "model"
    assert message in verdict.prefill.refusal.message


def test_paged_experts_check_is_sglangs(oracle, catalog):
    """K below the router's top-k: SGLang's check_paged_experts_compat refuses, in its words."""
    doc = _example("qwen3-30b-a3b-paged-experts.yaml")
    doc["spec"]["pagedExperts"] = {"residentExperts": 4}
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is False
    assert "Paged experts: --paged-experts-num-resident must be at least the router's top-k (8)" in (
        verdict.prefill.refusal.message
    )


# --------------------------------------------------------------------------- handshake


def test_handshake_refusals_come_from_conn_py(oracle, catalog):
    """Both roles start, SGLang's own try_ensure_parallel_info refuses the pair."""
    doc = _example("dsv41-flash-gb300-throughput-dep.yaml")
    doc["spec"]["decode"]["parallelism"] = {"tp": 4}  # DEP prefill, TP decode: attention TP 1 vs 4
    _, verdict = _judge(oracle, catalog, doc, depth="args")
    assert verdict.prefill.starts and verdict.decode.starts
    assert verdict.pair.pairs is False
    assert verdict.pair.refusal.message == (
        "DeepSeek-V4.1 DSpark PD requires the same TP size on both servers (including prefill CP ranks for MLA)"
    )
    assert verdict.pair.refusal.where.startswith("sglang/srt/disaggregation/common/conn.py:try_ensure_parallel_info")

    doc = _example("dsv41-flash-gb300-low-latency.yaml")
    doc["spec"]["prefill"]["accelerator"] = "h200"  # auto layout: v4 on Hopper, v41 on Blackwell
    doc["spec"]["prefill"]["parallelism"] = {"tp": 4}
    doc["spec"]["kvLayout"]["attentionBackend"] = "auto"
    # at startup, H200's TP4 prefill is refused first: FP4 experts at 576 per rank (quantized_moe_block_width)
    _, verdict = _judge(oracle, catalog, doc, depth="args")
    assert verdict.pair.pairs is False
    assert verdict.pair.refusal.message.startswith(
        "KV layout mismatch: prefill server has kv_layout=v4,c1:v4,c2:v4, but decode server has "
        "kv_layout=v41,c1:v41_fp4,c2:v41_fp4"
    )


def test_every_prefill_rank_registers(oracle, catalog):
    """The bootstrap server answers only once dp x cp x tp x pp ranks registered: DEP4 prefill
    registers 4 ranks (attention DP groups) and the decode reads them."""
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-throughput-dep.yaml"))
    assert verdict.pair.pairs is True
    assert verdict.prefill.facts["attnDpSize"] == 4 and verdict.prefill.facts["attnTpSize"] == 1


class _StallingBootstrap:
    """A loopback HTTP server in front of the prefill's real bootstrap server: it forwards the
    decode's parallel-info query (``/route?prefill_dp_rank=-1...``) and answers no other
    request, so SGLang's own 5 s deadline on the per-rank GET
    (``CommonKVReceiver._get_bootstrap_info_from_server``) runs out, as on a loaded machine."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading
        import urllib.request

        release = self.release = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if "prefill_dp_rank=-1" not in self.path:
                    release.wait(30)  # never answered within SGLang's deadline
                    return
                with urllib.request.urlopen(f"http://{upstream}{self.path}", timeout=30) as r:
                    body, status = r.read(), r.status
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_handshake_request_that_times_out_is_indeterminate_not_a_refusal(oracle, catalog, monkeypatch):
    """Issue 23: a timeout is no verdict. SGLang's receiver turns a bootstrap GET that got no
    answer in its 5 s into "Could not fetch bootstrap info" (a KVTransferError): the oracle
    names the step and the request and gives no verdict, never a refusal or an accept."""
    worker = oracle.pool.worker("gb300")
    real_call = worker.call
    proxies = []

    def call(op, **kwargs):
        if op == "handshake":  # the decode talks to the stalling server in front of the real one
            proxies.append(_StallingBootstrap(kwargs["address"]))
            with proxies[-1] as address:
                return real_call(op, **{**kwargs, "address": address})
        return real_call(op, **kwargs)

    monkeypatch.setattr(worker, "call", call)
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-low-latency.yaml"), depth="args")
    assert proxies, "the handshake ran"
    assert verdict.prefill.starts and verdict.decode.starts, verdict.to_dict()
    assert verdict.pair.pairs is None and verdict.pair.refusal is None, verdict.pair
    assert verdict.accepted is None
    why = verdict.pair.indeterminate
    assert why.startswith("handshake: SGLang's request to the bootstrap server got no answer"), why
    assert "Timeout" in why, why
    # the per-rank GET ran out (the case built here); on a machine loaded enough that the
    # forwarded parallel-info query itself took over 5 s, that step is the one named
    assert ("prefill_dp_rank=0" in why and "Could not fetch bootstrap info" in why) or (
        "prefill_dp_rank=-1" in why and "parallel info" in why), why


# --------------------------------------------------------------------------- multi-node replicas


def test_each_node_rank_runs_its_own_command_through_sglang(oracle, catalog):
    """Every pod of a LeaderWorkerSet group is judged: SGLang parses node k's expanded command
    (``--node-rank k``, ``--dist-init-addr <node 0>:20000``) and resolves it on its own node."""
    from sglang_pd_operator.oracle.judge import pod_launches

    plan, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-multi-node.yaml"))
    assert verdict.accepted is True, verdict.to_dict()
    assert verdict.decode.facts["nnodes"] == 4 and verdict.decode.facts["tpSize"] == 16
    worker = oracle.pool.worker("gb300")
    model_dir = oracle.pool.model_dir(plan.spec.model.name, catalog.hf_config(plan.spec.model.name))
    for k, launch in enumerate(pod_launches(plan, plan.decode)):
        result = worker.call("resolve", request={"role": "decode", **launch, "modelDir": model_dir})
        worker.call("release", handle=result["handle"])
        assert result["starts"] is True
        assert (result["facts"]["nodeRank"], result["facts"]["nnodes"]) == (k, 4)


def test_prefill_ranks_register_from_every_node_and_decode_reaches_them(oracle, catalog):
    """A prefill replica on 2 nodes (DEP8): each node's 4 ranks register with the bootstrap server
    at the dist-init host with their own node's address (SGLANG_HOST_IP), through SGLang's real
    CommonKVManager; the decode's requests (one per prefill DP rank) reach all 8, on both nodes."""
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-multi-node.yaml"))
    assert verdict.pair.pairs is True, verdict.pair
    hosts = [r.rsplit(":", 1)[0] for r in verdict.pair.prefill_ranks]
    assert len(hosts) == 8 and sorted(set(hosts)) == ["127.0.0.1", "127.0.0.2"]
    assert hosts.count("127.0.0.1") == hosts.count("127.0.0.2") == 4


def test_a_multi_node_handshake_refusal_comes_from_conn_py(oracle, catalog):
    """DEP prefill on 2 nodes with a TP8 decode on 2 nodes: both start, the handshake refuses
    DSpark's attention TP mismatch in SGLang's words."""
    doc = _example("dsv41-flash-gb300-multi-node.yaml")
    doc["spec"]["decode"]["parallelism"] = {"tp": 8, "nodes": 2}
    doc["spec"]["decode"]["extraArgs"] = []
    _, verdict = _judge(oracle, catalog, doc, depth="args")
    assert verdict.prefill.starts and verdict.decode.starts, verdict.to_dict()
    assert verdict.pair.pairs is False
    assert "requires the same TP size" in verdict.pair.refusal.message


def test_a_role_that_cannot_be_judged_is_named_and_the_other_is_not_blamed(oracle, catalog):
    doc = _example("dsv41-flash-gb300-low-latency.yaml")
    doc["spec"]["decode"]["accelerator"] = "b999"  # not in the catalog
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.accepted is None
    assert verdict.decode.indeterminate == "decode accelerator 'b999' is not in the catalog"
    assert "b999" not in verdict.prefill.indeterminate and "other role" in verdict.prefill.indeterminate
    assert verdict.prefill.accelerator == "gb300" and "b999" in verdict.pair.indeterminate


# --------------------------------------------------------------------------- the CLI


def _check(*args: str) -> subprocess.CompletedProcess:
    """``sglang-pd-operator check ARGS`` from this venv, as a user runs it."""
    exe = str(Path(sys.executable).with_name("sglang-pd-operator"))
    return subprocess.run([exe, "check", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONSAFEPATH": "1"}, cwd=ROOT, timeout=900)


def _edited_example(tmp_path: Path, example: str, decode_extra_args: list[str]) -> str:
    """The path of a copy of ``example`` whose decode role has ``decode_extra_args``."""
    doc = _example(example)
    doc["spec"]["decode"]["extraArgs"] = decode_extra_args
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_check_sglang_on_every_example_prints_sglangs_verdict():
    out = _check("--sglang", *map(str, EXAMPLES))
    assert out.returncode == 0, out.stdout + out.stderr
    print(out.stdout)
    for path in EXAMPLES:
        block = out.stdout.split(str(path), 1)[1].split("\nexamples/", 1)[0]
        assert "SGLang 0.5.23: starts and pairs" in block, block
        assert "    prefill on " in block and "    decode on " in block
        assert "    pair: the PD handshake passes" in block
    data = json.loads(_check("--sglang", "-o", "json", str(EXAMPLES[0])).stdout)
    assert data["sglang"]["accepted"] is True
    assert data["sglang"]["prefill"]["starts"] is True and data["sglang"]["pair"]["pairs"] is True


def test_check_sglang_exits_1_with_sglangs_text(tmp_path):
    path = _edited_example(tmp_path, "dsv41-flash-gb300-throughput-dep.yaml", ["--moe-a2a-backend", "deepep"])
    out = _check("--sglang", path)
    assert out.returncode == 1
    assert "SGLang 0.5.23: refused" in out.stdout
    assert "DSpark with dp attention supports moe_a2a_backend 'none'" in out.stdout


def test_check_sglang_first_line_says_sglang_refuses_what_our_rules_accept(tmp_path):
    """A spec only SGLang refuses (--enable-lora without a rank or target modules; --mem-fraction-static
    0.05 was one until rules/weights.py caught it): the first line must not read "valid" alone while
    the exit code is 1; -o json keeps ``valid`` as our verdict."""
    path = _edited_example(tmp_path, "dsv41-flash-gb300-low-latency.yaml", ["--enable-lora"])
    plain = _check(path)
    assert plain.returncode == 0 and ": valid, compat key " in plain.stdout.splitlines()[0], plain.stdout
    out = _check("--sglang", path)
    assert out.returncode == 1, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert ": valid by the operator's rules but SGLang refuses it, compat key " in first, first
    assert "SGLang 0.5.23: refused" in out.stdout and "--max-lora-rank" in out.stdout, out.stdout
    js = _check("--sglang", "-o", "json", path)
    data = json.loads(js.stdout)
    assert js.returncode == 1 and data["valid"] is True and data["sglang"]["accepted"] is False


# --------------------------------------------------------------------------- the scheduler's startup stages


def _role_doc(example: str, role: str, *, extra_args=(), env=None, parallelism=None) -> dict:
    doc = _example(example)
    spec = doc["spec"][role]
    spec["extraArgs"] = [*(spec.get("extraArgs") or []), *extra_args]
    if env:
        spec["env"] = [*(spec.get("env") or []), *({"name": k, "value": v} for k, v in env.items())]
    if parallelism is not None:
        spec["parallelism"] = parallelism
    return doc


def _operator_accepts_role(catalog, doc, role: str) -> bool:
    from sglang_pd_operator.planning.plan import plan_object

    _, problems = plan_object(doc, catalog)
    return not [p for p in problems if p.severity == "error" and p.field.startswith(f"spec.{role}")]


def _operator_rules(catalog, doc, role: str) -> set[str]:
    """The rules of the operator's errors on ``role``."""
    from sglang_pd_operator.planning.plan import plan_object

    _, problems = plan_object(doc, catalog)
    return {p.rule for p in problems if p.severity == "error" and p.field.startswith(f"spec.{role}")}


def _qwen_tp4_on_b300() -> dict:
    """Qwen3-30B-A3B without Paged Experts, TP4 on both roles, on an 8-GPU B300 node: a pod of 4 of its GPUs."""
    doc = _example("qwen3-30b-a3b-paged-experts.yaml")
    doc["spec"]["accelerator"] = "b300"
    doc["spec"].pop("pagedExperts", None)
    for role in ("prefill", "decode"):
        doc["spec"][role].pop("pagedExperts", None)
        doc["spec"][role]["parallelism"] = {"tp": 4}
    return doc


@pytest.mark.parametrize("visible, hides", [("0,1", True), ("3,2,1,0", False), ("0,1,2,3,7", False), ("", True)])
def test_cuda_visible_devices_in_env_is_judged_like_the_driver(oracle, catalog, visible, hides):
    """A fresh user's finding: ``CUDA_VISIBLE_DEVICES=0`` in a TP4 role's env passed ``check`` and the
    oracle, which emulated the GPUs the pod requests and not what the variable narrows them to.
    Now the emulation narrows them as CUDA does (planning/devices.py), SGLang's own placement
    refuses a rank past them, and the rule ``visible_devices_cover_pod`` says the same."""
    doc = _qwen_tp4_on_b300()
    doc["spec"]["prefill"]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": visible}]
    _, verdict = _judge(oracle, catalog, doc)
    assert ("visible_devices_cover_pod" in _operator_rules(catalog, doc, "prefill")) is hides
    if hides:
        assert verdict.prefill.starts is False, verdict.prefill
        assert "invalid device ordinal" in verdict.prefill.refusal.message, verdict.prefill.refusal
    else:
        assert verdict.prefill.starts is True, (verdict.prefill.refusal, verdict.prefill.indeterminate)
        assert verdict.prefill.facts["podGpus"] == 4
    assert verdict.decode.starts is True  # the variable was the prefill pod's only


def test_every_example_runs_the_whole_startup(oracle, catalog):
    """Every example is judged through the model build and memory planning (no stage skipped),
    with the steps run and assumed named, and the weights' bytes from the meta tensors."""
    from sglang_pd_operator.oracle.stages import STAGES

    for path in EXAMPLES:
        _, verdict = _judge(oracle, catalog, yaml.safe_load(path.read_text()))
        for role in (verdict.prefill, verdict.decode):
            assert role.starts is True, (path.name, role.refusal, role.indeterminate)
            assert any(step.startswith("memory: KVCacheConfigurator") for step in role.steps), role.steps
            assert any("weight loading" in a for a in role.assumes), role.assumes
            assert role.facts["model"]["weightBytes"] > 1 << 30, role.facts["model"]
            assert role.facts["memory"]["maxTotalNumTokens"] > 0
    assert STAGES[-1] == "transfer"


def test_memory_fraction_too_small_for_the_weights(oracle, catalog):
    """Refusal class 1 (memory): DeepSeek-V4.1-Flash's decode shard on GB300 holds ~190 GiB of
    weights; --mem-fraction-static 0.5 leaves nothing for the KV cache. The argument checks
    accept it; SGLang's _profile_available_bytes refuses it. Found by the memory stage; the
    operator now refuses it too (weights_fit_gpu, with the replicated bytes of the catalog)."""
    doc = _role_doc("dsv41-flash-gb300-low-latency.yaml", "decode", extra_args=["--mem-fraction-static", "0.5"])
    assert not _operator_accepts_role(catalog, doc, "decode")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.decode.starts is False, verdict.decode
    refusal = verdict.decode.refusal
    assert (refusal.stage, refusal.phase) == ("memory", "memory")
    assert "Loaded weights leave no GPU memory for the KV cache" in refusal.message
    assert refusal.where.startswith("sglang/srt/mem_cache/kv_cache_configurator.py:_profile_available_bytes")
    assert verdict.prefill.starts is True


def test_quantized_moe_width_breaks_its_block(oracle, catalog):
    """Refusal class 2 (model): FP4 experts on H200 at TP8 without EP give each rank 288 of the
    2304-wide MoE intermediate; FlashInfer's CUTLASS MXFP4 MoE (create_weights) needs multiples
    of 128. Found by the model stage; the operator now refuses it too (quantized_moe_block_width)."""
    doc = _role_doc("dsv41-flash-h200-flashmla.yaml", "decode", parallelism={"tp": 8})
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.decode.starts is False, verdict.decode
    refusal = verdict.decode.refusal
    assert refusal.phase == "model"
    assert "intermediate=288" in refusal.message
    assert refusal.where.startswith("sglang/srt/layers/quantization/mxfp4_flashinfer_cutlass_moe.py:create_weights")
    assert not _operator_accepts_role(catalog, doc, "decode")  # the rule the model stage led to


def test_an_environment_setting_the_kv_configurator_refuses(oracle, catalog):
    """Refusal class 3 (memory): SGLANG_DSV4_COMPRESS_STATE_DTYPE=fp16 passes every argument
    check (nothing reads it there); the KV cache configurator refuses it while it sizes the
    DeepSeek-V4 compressed-state pools."""
    doc = _role_doc("dsv41-flash-gb300-throughput-dep.yaml", "decode", env={"SGLANG_DSV4_COMPRESS_STATE_DTYPE": "fp16"})
    assert _operator_accepts_role(catalog, doc, "decode")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.decode.starts is False, verdict.decode
    assert verdict.decode.refusal.phase in ("memory", "model"), verdict.decode.refusal
    assert "Unsupported SGLANG_DSV4_COMPRESS_STATE_DTYPE='fp16'" in verdict.decode.refusal.message


def test_a_flag_the_model_loader_refuses(oracle, catalog):
    """Refusal class 4 (model): --model-loader-extra-config with a key the default loader does
    not take; resolution and validation accept it, the loader's constructor refuses it."""
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", "prefill",
                    extra_args=["--model-loader-extra-config", '{"enable_gds": true}'])
    assert _operator_accepts_role(catalog, doc, "prefill")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is False, verdict.prefill
    refusal = verdict.prefill.refusal
    assert refusal.phase == "model"
    assert "Unexpected extra config keys" in refusal.message and "enable_gds" in refusal.message
    assert refusal.where.startswith("sglang/srt/model_loader/loader.py:_validate_default_loader_extra_config")


def test_a_model_build_the_emulation_cannot_run_is_indeterminate(oracle, catalog):
    """A step that needs what the emulation does not give (here: a kernel called while the
    model is built) is no verdict, with the step named, never an accept."""
    from sglang_pd_operator.oracle import stages

    assert stages.emulation_limit(RuntimeError("Cannot copy out of meta tensor; no data!")) is not None
    assert stages.emulation_limit(ValueError("64 is not divisible by 3")) is None


def test_the_pod_sees_the_gpus_it_requests(oracle, catalog):
    """A TP4 replica on an 8-GPU B300 node: the pod requests 4 GPUs, and SGLang
    (torch.cuda.device_count, nvidia-smi) sees 4, not the node's 8."""
    from sglang_pd_operator.oracle.judge import pod_gpus

    doc = _qwen_tp4_on_b300()
    plan, verdict = _judge(oracle, catalog, doc)
    assert catalog.accelerator("b300").gpusPerNode == 8
    assert pod_gpus(plan, plan.prefill) == 4
    assert verdict.prefill.starts is True, (verdict.prefill.refusal, verdict.prefill.indeterminate)
    assert verdict.prefill.facts["podGpus"] == 4


# --------------------------------------------------------------------------- pools, PD queues, transfer manager


def test_pools_pd_queues_and_the_transfer_manager_run(oracle, catalog):
    """After the memory plan, each role's KV pools are built by SGLang's own classes on the
    meta device, the scheduler's init_disaggregation builds the role's PD queue, and the
    real MooncakeKVManager is built on the queue's KVArgs with the native engine replaced."""
    _, verdict = _judge(oracle, catalog, _example("qwen3-30b-a3b-paged-experts.yaml"))
    assert verdict.accepted is True, verdict.to_dict()
    for role, queue in ((verdict.prefill, "PrefillBootstrapQueue"), (verdict.decode, "DecodePreallocQueue")):
        facts = role.facts
        assert facts["pools"]["tokenToKVPool"] == "MHATokenToKVPool" and facts["pools"]["poolBytes"] > 1 << 30
        assert facts["queue"]["queue"] == queue
        assert facts["queue"]["kvArgs"]["kvBuffers"] == 2 * 48  # K and V of 48 layers
        assert facts["transfer"]["manager"] == "MooncakeKVManager"
        assert facts["transfer"]["engineCalls"][:2] == ["TransferEngine", "initialize"]
        assert "batch_register_memory" in facts["transfer"]["engineCalls"]
        for stage in ("pools:", "pd-queues:", "transfer:"):
            assert any(s.startswith(stage) for s in role.steps), (stage, role.steps)
        assert any("background threads" in a for a in role.assumes)


def test_a_speculative_role_builds_its_draft_worker(oracle, catalog):
    """The speculative stage runs SGLang's maybe_init_draft_worker: DSparkWorkerV2's own
    checks and its draft TpModelWorker, whose draft model (DeepSeek-V4.1's bundled DSpark
    head) is built on the meta device and its bytes count against the KV memory; where the
    worker's __init__ meets the emulation's edge is named under assumes."""
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-low-latency.yaml"))
    decode = verdict.decode
    assert decode.starts is True, (decode.refusal, decode.indeterminate)
    draft = decode.facts["speculative"]
    assert draft["algorithm"] == "DSPARK" and draft["draftArchitecture"] == "DeepseekV4ForCausalLMDSpark", draft
    assert draft["draftWeightBytes"] > 1 << 30 and draft["draftParameters"] > 0
    assert any(s.startswith("speculative: the draft TpModelWorker.__init__") for s in decode.steps), decode.steps
    assert any(a.startswith("speculative: the draft's weights") for a in decode.assumes), decode.assumes
    # the draft's bytes are resident when the memory is planned (Scheduler.init_model_worker order)
    plain = _example("qwen3-30b-a3b-paged-experts.yaml")
    _, qwen = _judge(oracle, catalog, plain)
    assert qwen.decode.facts["speculative"] is None


def test_the_draft_is_built_under_the_scheduler_moe_flags(oracle, catalog):
    """The scheduler sets its MoE flags once (init_moe_gemm_config, managers/scheduler.py:558)
    and builds the draft under them: on the wide-EP example's decode (TP 64, megamoe) the
    DSpark draft's shared experts are replicated (models/deepseek_v2.py:874), so their FP8
    blocks of 32 are whole; the draft built with the default a2a backend would split 2304
    over 64 ranks (36 per rank) and fp8.py:606 would refuse a deployment SGLang starts."""
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-wide-ep.yaml"))
    decode = verdict.decode
    assert decode.starts is True, (decode.refusal, decode.indeterminate)
    draft = decode.facts["speculative"]
    assert draft["draftArchitecture"] == "DeepseekV4ForCausalLMDSpark" and draft["draftWeightBytes"] > 0, draft
    assert any("init_moe_gemm_config, managers/scheduler.py:558" in s for s in decode.steps), decode.steps


def test_dspark_attention_dp_with_a_moe_draft_is_refused_by_the_draft_worker(oracle, catalog):
    """Refusal class (speculative): DSpark with DP attention whose attention TP is above 1 on
    DeepSeek-V4.1 (a MoE draft): the argument checks accept it, DSparkWorkerV2.__init__
    refuses it (dspark_worker_v2.py:212); the operator's rule dspark_moe_draft_attention_tp
    (named after it) refuses it too."""
    doc = _example("dsv41-flash-gb300-throughput-dep.yaml")
    for role in ("prefill", "decode"):
        doc["spec"][role]["parallelism"] = {"tp": 4, "dp": 2, "ep": 4, "dpAttention": True}
    assert _operator_rules(catalog, doc, "decode") == {"dspark_moe_draft_attention_tp"}
    _, args_verdict = _judge(oracle, catalog, doc, depth="args")
    assert args_verdict.decode.starts is True
    _, verdict = _judge(oracle, catalog, doc)
    refusal = verdict.decode.refusal
    assert verdict.decode.starts is False and (refusal.stage, refusal.phase) == ("speculative", "speculative"), refusal
    assert "requires attn_tp == 1" in refusal.message
    assert refusal.where.startswith("sglang/srt/speculative/dspark_components/dspark_worker_v2.py:__init__")


def test_a_speculative_role_names_the_transfer_stage_it_did_not_run(oracle, catalog):
    """DSpark's transfer manager carries the draft worker's KV pool, which the oracle does not
    build: the PD queue runs, the transfer stage is listed under assumes, not skipped silently."""
    _, verdict = _judge(oracle, catalog, _example("dsv41-flash-gb300-low-latency.yaml"))
    decode = verdict.decode
    assert decode.starts is True and decode.facts["queue"]["queue"] == "DecodePreallocQueue"
    assert decode.facts["transfer"] is None
    assert any(a.startswith("transfer: not run for a speculative role (DSPARK)") for a in decode.assumes)


def test_every_kernel_probe_answers_a_call_sglang_makes():
    """Each capability probe the kernel stand-ins answer (kernel_standins.PROBES) is a name SGLang
    imports from that library and calls: a probe SGLang stopped making (or a renamed one) fails here.
    The AITER lookup is held to the quantization types MoRI's dispatcher asks for (moriep.py:967)."""
    import importlib.util
    import re

    from sglang_pd_operator.oracle.kernel_standins import PROBES

    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"
    sources = {p: p.read_text(errors="replace") for p in root.rglob("*.py")}
    for name in PROBES:
        library, func = name.split(".")[0], name.rsplit(".", 1)[-1]
        users = [p for p, text in sources.items() if re.search(rf"\b(from|import) {library}\b", text)
                 and re.search(rf"\b{func}\(", text)]
        assert users, f"no SGLang module imports {library} and calls {func}"
    moriep = sources[root / "layers/moe/token_dispatcher/moriep.py"]
    asked = set(re.findall(r"get_hip_quant\(QuantType\.(\w+)\)", moriep))
    assert asked == {"per_1x128", "per_1x32"}, asked  # the types PROBES' assumption names


def test_transfer_engine_standin_matches_the_native_library():
    """Every method of the Mooncake engine stand-in is a method the installed native library
    (mooncake/engine.so) exports, and every engine method SGLang's wrapper calls while it
    starts is one the stand-in has."""
    import importlib.util
    import re

    from sglang_pd_operator.oracle.scheduler_pd import STANDIN_METHODS, TransferEngineStandIn

    spec = importlib.util.find_spec("mooncake")
    library = (Path(list(spec.submodule_search_locations)[0]) / "engine.so").read_bytes()
    for name in STANDIN_METHODS:
        assert callable(getattr(TransferEngineStandIn, name))
        # the linker merges string suffixes: "register_memory" is stored as the tail of
        # "batch_register_memory", so a name may follow "_" but not a letter
        assert re.search(rb"(?<![A-Za-z])" + name.encode() + rb"(?![A-Za-z_])", library), name
    wrapper = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / (
        "srt/distributed/device_communicators/mooncake_transfer_engine.py")
    text = wrapper.read_text()
    startup_part = text[text.index("class MooncakeTransferEngine"):text.index("def transfer_sync")]
    called = set(re.findall(r"self\.engine\.(\w+)\(", startup_part))
    assert called and called <= set(STANDIN_METHODS), called - set(STANDIN_METHODS)


def test_mori_engine_standin_covers_what_sglang_calls():
    """MoRI (ROCm/mori) has no wheel to install here, so its engine stand-in is held to SGLang's
    own module instead: every name disaggregation/mori/conn.py imports from ``mori.io`` and
    ``mori.cpp`` is one the stand-in supplies, every engine method ``MoriKVManager`` calls while
    it starts (``__init__``, ``_init_engine``, ``_register_local_buffers``) is one the stand-in
    has, and every enum member it names exists. A new call or name in SGLang fails here."""
    import ast
    import importlib.util

    from sglang_pd_operator.oracle import scheduler_pd

    path = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt/disaggregation/mori/conn.py"
    tree = ast.parse(path.read_text())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module in ("mori.io", "mori.cpp") for a in node.names}
    assert imported and imported <= set(scheduler_pd.MORI_NAMES), imported - set(scheduler_pd.MORI_NAMES)
    values = scheduler_pd._mori_values()
    manager = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MoriKVManager")
    startup = [f for f in manager.body if isinstance(f, ast.FunctionDef)
               and f.name in ("__init__", "_init_engine", "_register_local_buffers")]
    assert len(startup) == 3
    called, members = set(), set()
    for fn in startup:
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
                if (isinstance(target, ast.Name) and target.id == "engine") or (
                        isinstance(target, ast.Attribute) and target.attr == "engine"):
                    called.add(node.func.attr)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in values:
                members.add((node.value.id, node.attr))
    assert {"create_backend", "get_engine_desc", "register_memory"} <= called
    standin = scheduler_pd.MoriIOEngineStandIn
    assert all(callable(getattr(standin, m, None)) for m in called), [m for m in called if not hasattr(standin, m)]
    assert members and all(hasattr(values[cls], attr) for cls, attr in members), members


def test_a_mori_role_starts_and_pairs_with_the_engine_stood_in(oracle, catalog):
    """The MoRI transfer manager runs (``MoriKVManager.__init__`` with only ``mori.io``'s engine stood
    in: disaggregation/mori/conn.py:384) and the pair's common bootstrap handshake is tried: before
    the stand-in every MoRI spec was indeterminate (a kernel stand-in's IOEngineConfig), and a
    dropped manager's first zmq context blocked the bootstrap server (scheduler_pd._close). What the
    stand-in cannot check is named in the verdict (scheduler_pd.MORI_ASSUMED)."""
    from sglang_pd_operator.oracle import scheduler_pd

    doc = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
           "metadata": {"name": "qwen3-mori", "namespace": "inference"},
           "spec": {"model": {"name": "Qwen/Qwen3-30B-A3B", "revision": "main",
                              "source": {"pvc": {"claimName": "model-store", "path": "/Qwen3-30B-A3B"}}},
                    "runtime": {"image": "lmsysorg/sglang:v0.5.23-rocm700-mi35x", "sglangVersion": "0.5.23"},
                    "accelerator": "mi355x", "transfer": {"backend": "mori"},
                    "prefill": {"replicas": 1, "parallelism": {"tp": 1}},
                    "decode": {"replicas": 1, "parallelism": {"tp": 1}}}}
    assert not _operator_rules(catalog, doc, "prefill") and not _operator_rules(catalog, doc, "decode")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is True and verdict.decode.starts is True, (verdict.prefill, verdict.decode)
    for role in (verdict.prefill, verdict.decode):
        assert role.facts["transfer"]["manager"] == "MoriKVManager", role.facts["transfer"]
        calls = role.facts["transfer"]["engineCalls"]
        assert calls[:3] == ["IOEngine", "create_backend", "get_engine_desc"] and "register_memory" in calls, calls
        assert scheduler_pd.MORI_ASSUMED in role.assumes
    assert verdict.pair.pairs is True, verdict.pair


@pytest.mark.parametrize("accelerator,image", [("mi355x", "lmsysorg/sglang:v0.5.23-rocm700-mi35x"),
                                               ("h200", "lmsysorg/sglang:v0.5.23-cu130")])
def test_a_cuda_only_all_to_all_library_is_a_refusal_on_rocm_only(oracle, catalog, accelerator, image):
    """Refusal class (model): ``--moe-a2a-backend nixl`` imports nixl_ep while each MoE layer's dispatcher
    is built (token_dispatcher/nixl.py _load_nixl_ep). nixl_ep has CUDA builds only, so on an emulated
    ROCm pod the ImportError is SGLang's refusal (the operator's a2a_backend_cuda_only refuses it too);
    on CUDA the image may hold it, so the verdict stays indeterminate and names the missing module."""
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", "decode", extra_args=("--moe-a2a-backend", "nixl"))
    doc["spec"]["accelerator"] = accelerator
    doc["spec"]["runtime"]["image"] = image
    doc["spec"].pop("pagedExperts")
    rules = _operator_rules(catalog, doc, "decode")
    _, verdict = _judge(oracle, catalog, doc)
    decode = verdict.decode
    if accelerator == "mi355x":
        assert rules == {"a2a_backend_cuda_only"}
        assert decode.starts is False and (decode.refusal.stage, decode.refusal.phase) == ("model", "model")
        assert "NixlEP is not installed" in decode.refusal.message and "no build for amd GPUs" in decode.refusal.message
    else:
        assert "a2a_backend_cuda_only" not in rules
        assert decode.starts is None and "lacks a module SGLang imports: NixlEP" in decode.indeterminate, decode


def test_a_staging_buffer_on_an_mla_model_is_refused_by_the_pd_queue(oracle, catalog):
    """Refusal class (pd-queues): SGLANG_DISAGG_STAGING_BUFFER=1 on DeepSeek-V4 (an MLA pool):
    no argument check reads it; PrefillBootstrapQueue.__init__ refuses it. The operator's
    rule staging_buffer_non_mla (named after it) refuses it too."""
    doc = _role_doc("dsv41-flash-gb300-throughput-dep.yaml", "prefill", env={"SGLANG_DISAGG_STAGING_BUFFER": "1"})
    assert _operator_rules(catalog, doc, "prefill") == {"staging_buffer_non_mla"}
    _, args_verdict = _judge(oracle, catalog, doc, depth="args")
    assert args_verdict.prefill.starts is True  # the argument checks accept it
    _, verdict = _judge(oracle, catalog, doc)
    refusal = verdict.prefill.refusal
    assert verdict.prefill.starts is False and (refusal.stage, refusal.phase) == ("pd-queues", "pd-queues"), refusal
    assert "SGLANG_DISAGG_STAGING_BUFFER is designed for non-MLA models" in refusal.message
    assert refusal.where.startswith("sglang/srt/disaggregation/prefill.py:__init__")


@pytest.mark.parametrize("role,env,message", [
    ("prefill", {"SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": "2", "SGLANG_DISAGGREGATION_QUEUE_SIZE": "4"},
     "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE=2 must be greater than or equal to SGLANG_DISAGGREGATION_QUEUE_SIZE=4"),
    ("decode", {"SGLANG_ENABLE_FAILED_SESSION_PROBE": "1", "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": "30",
                "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S": "10"},
     "Need 0 < SGLANG_FAILED_SESSION_PROBE_INTERVAL_S <= SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S"),
])
def test_an_environment_the_mooncake_manager_refuses(oracle, catalog, role, env, message):
    """Refusal classes (transfer): settings MooncakeKVManager.__init__ checks, which the
    argument checks never read: a thread pool smaller than the transfer queues, a failed-session
    probe interval above its maximum. The operator's rules named after them refuse them too."""
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", role, env=env)
    rule = "mooncake_thread_pool_queue_size" if role == "prefill" else "mooncake_failed_session_probe"
    assert _operator_rules(catalog, doc, role) == {rule}
    _, args_verdict = _judge(oracle, catalog, doc, depth="args")
    assert getattr(args_verdict, role).starts is True
    _, verdict = _judge(oracle, catalog, doc)
    refusal = getattr(verdict, role).refusal
    assert getattr(verdict, role).starts is False and (refusal.stage, refusal.phase) == ("transfer", "transfer"), refusal
    assert message in refusal.message
    assert refusal.where.startswith("sglang/srt/disaggregation/mooncake/conn.py:__init__")


@pytest.mark.parametrize("queues,starts", [(8, True), (9, False)])
def test_the_default_thread_pool_is_sized_by_the_node_cpus(oracle, catalog, queues, starts):
    """os.cpu_count() in the pod is the node's (L40S: 128 CPUs), so a Mooncake prefill's default
    transfer thread pool is min(max(4, 64 // 8), 12) = 8 there (mooncake/conn.py:327), not
    this machine's: 8 transfer queues start, 9 are refused; the operator's rule agrees."""
    from sglang_pd_operator.planning.rules.transfer import mooncake_default_thread_pool

    assert catalog.accelerator("l40s").cpus == 128 and mooncake_default_thread_pool(128) == 8
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", "prefill",
                    env={"SGLANG_DISAGGREGATION_QUEUE_SIZE": str(queues)})
    assert _operator_rules(catalog, doc, "prefill") == (set() if starts else {"mooncake_thread_pool_queue_size"})
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is starts, verdict.prefill.refusal
    if starts:
        assert verdict.prefill.facts["transfer"]["manager"] == "MooncakeKVManager"
    else:
        assert "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE=8 must be greater than or equal to " \
               "SGLANG_DISAGGREGATION_QUEUE_SIZE=9" in verdict.prefill.refusal.message


def _qwen_h200_tp2() -> dict:
    """Qwen3-30B-A3B without Paged Experts, TP2 on H200 for both roles (the rules table's base ``qwen``)."""
    doc = _example("qwen3-30b-a3b-paged-experts.yaml")
    doc["spec"]["accelerator"] = "h200"
    doc["spec"].pop("pagedExperts", None)
    for role in ("prefill", "decode"):
        doc["spec"][role].pop("pagedExperts", None)
        doc["spec"][role]["parallelism"] = {"tp": 2}
    return doc


def test_a_staging_buffer_role_builds_its_transfer_manager_in_the_pd_queue(oracle, catalog):
    """False-accept group 4 of the differential (gen13-00964): SGLANG_DISAGG_STAGING_BUFFER on a
    GQA model. The PD queue uses its manager right after building it (set_kv_buffer_tensors,
    decode.py:790 / prefill.py:374; DecodeStagingHandler.create reads _staging_ctx,
    staging_handler.py:152). The oracle used to hand the queue its recorder of the manager's
    arguments, and SGLang's code failed on it ("'_ManagerRequest' object has no attribute
    '_staging_ctx'"), which was scored as SGLang's refusal. Now the queue gets the real
    MooncakeKVManager (with its staging ring buffer registered), as on a GPU, and both roles start."""
    doc = _qwen_h200_tp2()
    for role in ("prefill", "decode"):
        doc["spec"][role]["env"] = [{"name": "SGLANG_DISAGG_STAGING_BUFFER", "value": "true"}]
    assert _operator_accepts_role(catalog, doc, "decode") and _operator_accepts_role(catalog, doc, "prefill")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.accepted is True, verdict.to_dict()
    decode, prefill = verdict.decode, verdict.prefill
    assert decode.facts["queue"]["managerBuiltByQueue"] is True and prefill.facts["queue"]["managerBuiltByQueue"] is True
    assert decode.facts["queue"]["stagingHandler"] == "DecodeStagingHandler", decode.facts["queue"]
    assert prefill.facts["queue"]["stagingHandler"] is None
    for role in (decode, prefill):
        assert role.facts["transfer"]["manager"] == "MooncakeKVManager", role.facts["transfer"]
        # the KV buffers, then the staging memory (decode: its ring buffer; prefill: a buffer per transfer queue)
        assert role.facts["transfer"]["engineCalls"].count("batch_register_memory") >= 2, role.facts["transfer"]
    # without the variable the manager is built by the transfer stage, as before
    _, plain = _judge(oracle, catalog, _qwen_h200_tp2())
    assert plain.decode.facts["queue"]["managerBuiltByQueue"] is False and plain.decode.facts["queue"]["stagingHandler"] is None


def test_a_manager_the_pd_queue_builds_keeps_its_refusal_tagged_transfer(oracle, catalog):
    """A refusal of MooncakeKVManager.__init__ while the queue builds it (staging on) is the
    transfer stage's, as when the transfer stage builds it."""
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", "decode", env={
        "SGLANG_DISAGG_STAGING_BUFFER": "true", "SGLANG_ENABLE_FAILED_SESSION_PROBE": "1",
        "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S": "30", "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S": "10"})
    _, verdict = _judge(oracle, catalog, doc)
    refusal = verdict.decode.refusal
    assert verdict.decode.starts is False and (refusal.stage, refusal.phase) == ("transfer", "transfer"), refusal
    assert "Need 0 < SGLANG_FAILED_SESSION_PROBE_INTERVAL_S <= SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S" in refusal.message
    assert refusal.where.startswith("sglang/srt/disaggregation/mooncake/conn.py:__init__")


def test_a_speculative_role_on_page_size_1_reads_its_pool_strides(oracle, catalog):
    """Indeterminate class of the differential (rules:speculative:ngram-page-size-1-is-served):
    a speculative role's MHA pool is built with enable_kv_cache_copy, whose warmup reads
    ``data_strides[0].item()`` (memory_pool.py:2397) from a device tensor SGLang made from host
    data: the meta device used to lose the values ("Tensor.item() cannot be called on meta
    tensors"). The values are kept; the Triton warmup launch itself is named under assumes."""
    doc = _qwen_h200_tp2()
    doc["spec"]["kvLayout"]["pageSize"] = 1
    doc["spec"]["speculative"] = {"algorithm": "NGRAM"}
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.accepted is True, verdict.to_dict()
    for role in (verdict.prefill, verdict.decode):
        assert any(a.startswith("pools: the KV-copy kernel's warmup launch") for a in role.assumes), role.assumes


def test_device_tensors_made_from_host_data_keep_their_values():
    """MetaAllocations: torch.tensor(values, device="cuda") and cpu.to("cuda") are meta tensors that
    answer item()/tolist() with the host values; an allocation without data still has none to read."""
    import torch

    from sglang_pd_operator.oracle.startup import MetaAllocations

    with MetaAllocations():
        strides = torch.tensor([4096, 8192], device="cuda")
        moved = torch.tensor([1.5, 2.5]).to("cuda")
        empty = torch.empty(2, device="cuda")
        assert strides.is_meta and moved.is_meta
        assert strides[0].item() == 4096 and strides.tolist() == [4096, 8192] and int(strides[1]) == 8192
        assert moved.tolist() == [1.5, 2.5]
        with pytest.raises(RuntimeError, match="meta tensors"):
            empty[0].item()


# --------------------------------------------------------------------------- the CUDA-graph runner's checks


def test_a_warm_worker_judges_each_spec_as_a_fresh_one_whatever_came_before(oracle, catalog):
    """A model reused from a warm worker must not carry what the command that built it resolved.
    ``--max-running-requests`` is not part of the model's key (it only sizes the request pool),
    but the decode CUDA-graph sizes resolve from it: a fresh-user report saw
    ``--max-running-requests 0`` judged after the example accepted (the earlier command's sizes
    restored on reuse), and the example judged after it refused with ``capture_bs=[0]``. Both
    orders must give each spec its own verdict, and the Paged Experts cap still holds on reuse."""
    good = _example("dsv41-flash-gb300-low-latency.yaml")
    bad = copy.deepcopy(good)
    bad["spec"]["decode"]["extraArgs"] = [*(bad["spec"]["decode"].get("extraArgs") or []),
                                          "--max-running-requests", "0"]
    for order in ((bad, good), (good, bad), (bad, good)):
        verdicts = [_judge(oracle, catalog, doc)[1] for doc in order]
        by_spec = {id(doc): v for doc, v in zip(order, verdicts)}
        assert by_spec[id(good)].accepted is True, by_spec[id(good)].to_dict()
        refused = by_spec[id(bad)]
        assert refused.accepted is False and refused.decode.starts is False, refused.to_dict()
        assert refused.decode.refusal.stage == "graphs" and "capture_bs" in refused.decode.refusal.message, refused.decode.refusal
    # Paged Experts: the cap the build made is applied again to a reuse with a smaller request pool
    pe = _example("qwen3-30b-a3b-paged-experts.yaml")
    _judge(oracle, catalog, pe)
    small = copy.deepcopy(pe)
    small["spec"]["decode"]["extraArgs"] = [*(small["spec"]["decode"].get("extraArgs") or []),
                                            "--max-running-requests", "2"]
    graphs = _judge(oracle, catalog, small)[1].decode.facts["graphs"]
    assert max(graphs["captureBs"]) <= 3 and graphs["maxBs"] <= 3, graphs


def test_the_decode_graph_runner_checks_run_on_the_planned_request_pool(oracle, catalog):
    """The graphs stage runs SGLang's capture_decode_graph and the decode graph runner's
    __init__ up to the attention kernels: the capture sizes come from SGLang's own
    get_batch_sizes_to_capture on the pool the memory stage sized. Paged Experts caps the
    decode graphs at K // top_k = 26 // 8 = 3 requests (seed 003); a PD prefill captures no
    decode graph; the capture itself is named under assumes. The cap is written by the model
    build (paged_experts/method.py:283), so a model reused from a warm worker must carry it."""
    _, verdict = _judge(oracle, catalog, _example("qwen3-30b-a3b-paged-experts.yaml"))
    decode, prefill = verdict.decode, verdict.prefill
    assert decode.starts is True and prefill.starts is True, verdict.to_dict()
    graphs = decode.facts["graphs"]
    assert graphs["runner"] == "DecodeCudaGraphRunner", graphs
    assert graphs["captureBs"] == [1, 2, 3] and graphs["maxBs"] == 3 and graphs["capturedReqWidth"] == 1, graphs
    assert graphs["requestPool"] == decode.facts["memory"]["maxRunningRequests"], graphs
    assert prefill.facts["graphs"]["runner"] is None
    # a warm worker reuses the built model; the sizes its build capped are carried with it
    _, again = _judge(oracle, catalog, _example("qwen3-30b-a3b-paged-experts.yaml"))
    assert again.decode.facts["graphs"]["captureBs"] == [1, 2, 3], again.decode.facts["graphs"]
    for role in (decode, prefill):
        assert any(s.startswith("graphs: capture_decode_graph") for s in role.steps), role.steps
        assert any(a.startswith("graphs: the attention backend's graph buffers") for a in role.assumes), role.assumes
        assert not any("CUDA-graph runner's own checks" in a for a in role.assumes)
    # a speculative decode captures its verify width: DSpark on DeepSeek-V4.1
    _, dspark = _judge(oracle, catalog, _example("dsv41-flash-gb300-low-latency.yaml"))
    verify = dspark.decode.facts["graphs"]
    assert verify["capturedReqWidth"] > 1 and verify["maxNumTokens"] == verify["maxBs"] * verify["capturedReqWidth"], verify


# --------------------------------------------------------------------------- the Engram host table


@pytest.mark.parametrize("accelerator", ["h200", "gb200", "mi350x"])
def test_a_host_engram_table_is_built_through_the_tp_broadcast_and_cuda_host_register(oracle, catalog, accelerator):
    """Indeterminate classes of the differential (gen13-00682, gen13-01413): with
    engram.placement host (SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE) each Engram layer maps a
    shared host table: rank 0 broadcasts its memfd over the TP group's message queue
    (layers/engram.py:740; "the oracle's emulated oracle:tp group has no mq_broadcaster"), then
    pins it with torch.cuda.cudart().cudaHostRegister (:729; "No CUDA GPUs are available") and
    asks the driver whether the GPU reads host memory through the CPU's page tables. Rank 0 is
    the queue's writer and gets back what it sends; the registration succeeds, its bytes are
    listed under assumes. The model builds and both roles start (H200: an x86 host; GB200: Grace).
    On ROCm the table's device address comes from hipHostGetDevicePointer through ctypes
    (:672; gen13-00872: "libamdhip64 is not loaded in the current process"), which the
    emulated HIP runtime answers for the registered range (emulation.HipRuntime)."""
    doc = _example("dsv41-flash-h200-flashmla.yaml")
    doc["spec"]["engram"] = {"placement": "host"}
    if accelerator in ("gb200", "mi350x"):
        doc["spec"]["accelerator"] = accelerator
        doc["spec"]["runtime"]["image"] = ("lmsysorg/sglang:v0.5.23-cu130" if accelerator == "gb200"
                                           else "lmsysorg/sglang:v0.5.23-rocm700-mi35x")
        tp = 4 if accelerator == "gb200" else 8
        for role in ("prefill", "decode"):
            doc["spec"][role]["parallelism"] = {"tp": tp, "ep": tp}
        if accelerator == "mi350x":
            doc["spec"].pop("kernels", None)
            doc["spec"]["kvLayout"] = {"attentionBackend": "flashmla", "compressed": "auto"}
    assert _operator_accepts_role(catalog, doc, "prefill") and _operator_accepts_role(catalog, doc, "decode")
    plan, verdict = _judge(oracle, catalog, doc)
    assert ("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "1") in plan.prefill.command.env
    for role in (verdict.prefill, verdict.decode):
        assert role.starts is True, (role.refusal, role.indeterminate)
        assert any(a.startswith("model: cudaHostRegister pins ") and "Engram host table" in a for a in role.assumes), role.assumes


def test_memory_is_planned_with_the_most_loaded_ranks_engram_shard(oracle, catalog):
    """SGLang plans the KV memory with the least free memory of the TP group
    (distributed/bootstrap.py:207, get_available_gpu_memory(distributed=True)); the Engram
    table splits on hash-column bounds, unevenly (layers/engram.py shard_range), so the most
    loaded rank holds more than rank 0, which the oracle builds. The verdict's facts carry the
    difference, computed with SGLang's own shard_range, and the operator's even share is never
    above the most loaded rank's bytes."""
    from sglang.srt.layers import engram

    from sglang_pd_operator.planning.rules.weights import weights_per_gpu_lower_bound

    doc = _example("dsv41-flash-gb300-low-latency.yaml")
    plan, verdict = _judge(oracle, catalog, doc)
    facts = verdict.decode.facts["model"]
    config = catalog.hf_config(doc["spec"]["model"]["name"])
    assert facts["maxRankExtraBytes"] > 0, facts
    assert facts["maxRankExtraBytes"] < 0.02 * facts["weightBytes"]
    dim = int(config["text_config"]["engram_head_dim"])
    row = dim + dim // engram.FP8_BLOCK_SIZE
    assert facts["maxRankExtraBytes"] % row == 0  # whole rows
    bound = weights_per_gpu_lower_bound(spec=plan.spec, role=plan.decode)
    most = facts["weightBytes"] + facts["maxRankExtraBytes"]
    assert bound <= most < 1.02 * bound, (bound, most)
    # the peer shards' views of the memory SGLang mapped through the driver are not counted
    # twice (startup.VMM_STORAGES): once counted, the example held a second Engram shard (50 GB)
    assert doc["spec"]["engram"]["placement"] == "peerShards"


def test_a_variable_sglang_reads_at_import_gets_a_worker_that_imported_with_it(oracle, catalog):
    """SGLANG_USE_AITER is read when moriep.py is imported (moriep.py:55) and a worker imports SGLang
    once, so the pool starts a worker for the role's value (key ``mi355x SGLANG_USE_AITER=true``) and the
    role gets SGLang's verdict. The guard stays: the same request sent to the worker that imported
    SGLang without it is no verdict, with the reason (engine_side._check_import_time_env)."""
    doc = _role_doc("qwen3-30b-a3b-paged-experts.yaml", "prefill", env={"SGLANG_USE_AITER": "1"},
                    extra_args=("--moe-a2a-backend", "mori", "--chunked-prefill-size", "4096"))
    doc["spec"].pop("pagedExperts")
    doc["spec"].update(accelerator="mi355x", runtime={**doc["spec"]["runtime"],
                                                      "image": "lmsysorg/sglang:v0.5.23-rocm700-mi35x"})
    plan, verdict = _judge(oracle, catalog, doc)
    # MoRI's EPv1 dispatcher quantizes with AITER's get_hip_quant, imported only with the variable (moriep.py:967)
    assert verdict.prefill.starts is True and verdict.decode.starts is True, (verdict.prefill, verdict.decode)
    assert verdict.pair.pairs is True
    assert "mi355x SGLANG_USE_AITER=true" in oracle.pool._workers
    model_dir = oracle.pool.model_dir(plan.spec.model.name, catalog.hf_config(plan.spec.model.name))
    [request] = oracle._requests(plan, plan.prefill, model_dir)
    result = oracle.pool.worker("mi355x").call("resolve", request=request)
    assert result["starts"] is None
    assert "SGLANG_USE_AITER=1, which SGLang reads when it is imported" in result["indeterminate"]


def test_a_per_rank_engram_host_table_is_not_prefaulted(oracle, catalog):
    """The per_rank host layout writes every page of its shard while it is built
    (layers/engram.py:724): the oracle does not build it (no verdict) instead of taking the
    host's memory; the shared default is built."""
    doc = _example("dsv41-flash-h200-flashmla.yaml")
    doc["spec"]["engram"] = {"placement": "host"}
    doc["spec"]["decode"]["env"] = [{"name": "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT", "value": "per_rank"}]
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.decode.starts is None, verdict.decode
    assert "per_rank layout prefaults its whole shard" in verdict.decode.indeterminate
    assert verdict.prefill.starts is not None, verdict.prefill  # the shared table gets a verdict


# --------------------------------------------------------------------------- a TP group across nodes


def test_a_tp_group_across_nodes_knows_which_ranks_share_rank_0s_node(oracle, catalog):
    """Indeterminate class of the differential (mn31-00070): a TP group spanning two nodes builds
    its LM head's all-gather (distributed/device_communicators/triton_symm_mem_ag.py:487), which
    asks SGLang's ``in_the_same_node_as`` (parallel_state.py:3390, a shared-memory collective)
    which ranks share rank 0's node ("Process group <oracle emulated process group> is not
    initialized in the world group map"). The emulated group answers from the pod layout (4
    consecutive ranks per GB300 tray), the all-gather turns multimem off as SGLang does across
    nodes, and every node rank starts."""
    from sglang_pd_operator.oracle.startup import _EmulatedProcessGroup

    group = _EmulatedProcessGroup(list(range(8)))
    assert group.same_node_as(0, 4) == [True] * 4 + [False] * 4
    assert group.same_node_as(5, 4) == [False] * 4 + [True] * 4
    assert _EmulatedProcessGroup([2, 3, 4, 5]).same_node_as(0, 4) == [True, True, False, False]

    doc = _example("qwen3-30b-a3b-paged-experts.yaml")
    doc["spec"].pop("pagedExperts", None)
    doc["spec"]["accelerator"] = "gb300"
    doc["spec"]["runtime"]["image"] = "lmsysorg/sglang:v0.5.23-cu130"
    doc["spec"]["kvLayout"] = {"pageSize": 64}
    doc["spec"]["prefill"] = {"replicas": 1, "parallelism": {"tp": 8, "nodes": 2}}
    doc["spec"]["decode"] = {"replicas": 1, "parallelism": {"tp": 4}}
    assert _operator_accepts_role(catalog, doc, "prefill")
    _, verdict = _judge(oracle, catalog, doc)
    assert verdict.prefill.starts is True, (verdict.prefill.refusal, verdict.prefill.indeterminate)
    assert verdict.prefill.facts["nnodes"] == 2
