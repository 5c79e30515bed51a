"""KernelBuild inputs from a PDDeployment plan: what is hashed, what is not, names, the CRD and the rendered Job."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import load_example, with_fields

from sglang_pd_operator.api.crd import all_crds
from sglang_pd_operator.api.kernelbuild import parse_kernelbuild
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild.inputs import (
    KernelBuildError,
    kernel_args,
    kernel_build_inputs,
    kernel_env,
    spec_inputs,
)
from sglang_pd_operator.kernelbuild.recipes import builtin_build_catalog, load_build_catalog
from sglang_pd_operator.kernelbuild.render import (
    build_request,
    job_name,
    render_job,
    render_pvc,
    render_request,
)
from sglang_pd_operator.planning.plan import build_plan


def _plan(**changes):
    doc = load_example()
    with_fields(doc, changes)
    return build_plan(parse_pddeployment(doc), builtin_catalog())


def _hashes(**changes):
    plan = _plan(**changes)
    return {r: kernel_build_inputs(plan, r).input_hash for r in ("prefill", "decode")}


BASE = None


def _base():
    global BASE
    BASE = BASE or _hashes()
    return BASE


def test_hash_is_stable_and_roles_differ():
    assert _hashes() == _base()
    assert _base()["prefill"] != _base()["decode"]


@pytest.mark.parametrize(
    "change",
    [
        {"model.revision": "a1b2c3d"},
        {"runtime.image": "lmsysorg/sglang:v0.5.23-cu130-custom"},
        {"speculative.blockSize": 3},
        {"kvLayout.attentionBackend": "flashmla"},
        {"kernels.version": "0.1.1"},
    ],
)
def test_inputs_that_change_kernels_change_the_hash(change):
    h = _hashes(**change)
    assert h["decode"] != _base()["decode"], change


def test_plugin_version_changes_only_the_decode_build():
    h = _hashes(**{"kernels.version": "0.1.1"})
    assert h["prefill"] == _base()["prefill"] and h["decode"] != _base()["decode"]


@pytest.mark.parametrize(
    "change",
    [
        {"decode.replicas": 7},
        {"gateway.replicas": 5},
        {"disaggregation.bootstrapPort": 9000},
        {"transfer.ibDevices": ["mlx5_0"]},
        {"model.servedModelName": "dsv41"},
        {"model.source": {"pvc": {"claimName": "other-store", "path": "/DeepSeek-V4.1-Flash"}}},
        {"kernels.cache": "auto"},
    ],
)
def test_inputs_that_do_not_change_kernels_keep_the_hash(change):
    assert _hashes(**change) == _base(), change


def test_kernel_args_and_env_drop_server_addressing_and_cache_location():
    args = ["--model-path", "/models/x", "--host", "0.0.0.0", "--port", "30000", "--enable-metrics", "--tp-size", "4",
            "--disaggregation-ib-device", "mlx5_0,mlx5_1", "--revision=abc", "--served-model-name", "m", "--page-size", "256"]  # fmt: skip
    assert kernel_args(args) == ["--tp-size", "4", "--page-size", "256"]
    env = [
        ("SGLANG_CACHE_DIR", "/c"),
        ("SGLANG_DSV4_KV_LAYOUT", "v4"),
        ("MC_FORCE_TCP", "1"),
        ("SGLANG_DSV4_KV_LAYOUT", "auto"),
    ]
    assert kernel_env(env) == [{"name": "SGLANG_DSV4_KV_LAYOUT", "value": "auto"}]


def test_planner_and_reconciler_compute_the_same_hash():
    """kernel_build_inputs (PDDeployment side) == spec_inputs (KernelBuild reconciler side, with the catalog)."""
    plan = _plan()
    for role in ("prefill", "decode"):
        kb = kernel_build_inputs(plan, role)
        obj = kb.manifest("inference")
        parsed = parse_kernelbuild(json.loads(json.dumps(obj)))  # as it comes back from the API
        _, inputs, h = spec_inputs(parsed.spec, catalog=builtin_catalog())
        assert (inputs, h) == (kb.inputs, kb.input_hash)
        # a user's spec that leaves recipe and plugin version to the defaults resolves to the same hash
        bare = parsed.spec.model_copy(
            update={"recipe": None, "plugin": parsed.spec.plugin.model_copy(update={"version": None})}
        )
        assert spec_inputs(bare, catalog=builtin_catalog())[2] == kb.input_hash


def test_names_fit_and_encode_accelerator_role_and_inputs():
    plan = _plan()
    for role in ("prefill", "decode"):
        kb = kernel_build_inputs(plan, role)
        assert kb.name == f"gb300-{role}-{kb.input_hash[:10]}" and len(kb.name) <= 40
        assert len(job_name(kb.name, kb.input_hash, 20)) <= 63


def test_unknown_recipe_accelerator_and_wrong_isa_are_refused():
    plan = _plan()
    spec = kernel_build_inputs(plan, "decode").spec
    with pytest.raises(KernelBuildError, match="spec.recipe"):
        spec_inputs(spec.model_copy(update={"recipe": "nope"}), catalog=builtin_catalog())
    with pytest.raises(KernelBuildError, match="spec.accelerator"):
        spec_inputs(spec.model_copy(update={"accelerator": "tpu"}), catalog=builtin_catalog())
    with pytest.raises(KernelBuildError, match="supports sm_100, sm_103, not sm_90a"):
        spec_inputs(spec.model_copy(update={"accelerator": "h200"}), catalog=builtin_catalog())


def test_recipe_fingerprint_enters_the_hash():
    plan = _plan()
    text = builtin_build_catalog().model_dump_json()
    data = json.loads(text)
    data["recipes"]["sglang-cuda"]["steps"][0]["argv"].append("--extra")
    changed = load_build_catalog(text=yaml.safe_dump(data))
    assert kernel_build_inputs(plan, "decode", builds=changed).input_hash != _base()["decode"]
    data["recipes"]["sglang-cuda"]["description"] = "only words"
    data["recipes"]["sglang-cuda"]["steps"][0]["argv"].pop()
    assert (
        kernel_build_inputs(plan, "decode", builds=load_build_catalog(text=yaml.safe_dump(data))).input_hash
        == _base()["decode"]
    )


# --------------------------------------------------------------------------- render
def _rendered(role="decode"):
    plan = _plan()
    kb = kernel_build_inputs(plan, role)
    resolved, _, h = spec_inputs(kb.spec)
    acc = builtin_catalog().accelerator("gb300")
    owner = {"apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "KernelBuild", "name": kb.name, "uid": "u-1"}
    request = build_request(name=kb.name, spec=kb.spec, resolved=resolved, input_hash=h)
    job = render_job(name=kb.name, namespace="inference", spec=kb.spec, accelerator=acc, input_hash=h, attempt=1,
                     owner=owner, builder_image="op:1")  # fmt: skip
    return kb, request, job, owner


def test_request_runs_the_recipe_with_the_roles_flags():
    kb, request, _, _ = _rendered()
    steps = {s["name"]: s for s in request["steps"]}
    assert list(steps) == ["deep-gemm", "warm-up", "verify"] and steps["verify"]["verify"]
    argv = steps["deep-gemm"]["argv"]
    assert argv[:3] == ["{python}", "-m", "sglang.compile_deep_gemm"] and argv[-2:] == ["--timeout", "7200"]
    assert argv[3:7] == ["--model-path", "/models/DeepSeek-V4.1-Flash", "--revision", kb.spec.model.revision]
    for flag in kb.spec.args:
        assert flag in argv
    assert "--enable-nvidia-megakernel" in argv and "--port" in argv and "30000" in argv
    assert "--disaggregation-ib-device" not in argv, "the build pod has no RDMA NIC"
    assert request["env"]["MC_FORCE_TCP"] == "1" and request["env"]["SGLANG_DSV4_KV_LAYOUT"] == "auto"
    assert request["writable"] == ["deep_gemm/locks", ".cache/flashinfer/*/*/cached_ops/tmp"]


def test_job_runs_on_the_accelerator_with_the_roles_gpus_and_reports_by_termination_message():
    kb, request, job, owner = _rendered()
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 7200
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB300"} and pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    assert c["image"] == "lmsysorg/sglang:v0.5.23-cu130"
    assert c["command"] == ["python3", "-m", "sglang_pd_operator.kernelbuild.builder"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["terminationMessagePath"] == "/dev/termination-log" and c["terminationMessagePolicy"] == "File"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/var/cache/sglang"] == "work" and mounts["/kernel-cache-volume"] == "cache-volume"
    assert mounts["/models"] == "model"
    init = pod["initContainers"][0]
    assert init["image"] == "op:1" and "--install-to" in init["command"]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["cache-volume"]["persistentVolumeClaim"]["claimName"] == f"{kb.name}-cache"
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert job["metadata"]["ownerReferences"][0]["kind"] == "KernelBuild"
    assert spec["template"]["metadata"]["labels"]["pd.sglang-operator.io/kernelbuild"] == kb.name
    cm = render_request(name=kb.name, namespace="inference", request=request, owner=owner)
    assert vols["request"]["configMap"]["name"] == cm["metadata"]["name"]
    assert json.loads(cm["data"]["request.json"]) == request


def test_pvc_is_read_write_many_by_default():
    kb, _, _, owner = _rendered()
    pvc = render_pvc(name=kb.name, namespace="inference", spec=kb.spec, owner=owner)
    assert (
        pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"]["resources"]["requests"]["storage"] == "100Gi"
    )
    assert "storageClassName" not in pvc["spec"]


# --------------------------------------------------------------------------- CRD
def _walk(schema, path="spec"):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_kernelbuild_crd_is_structural_documented_and_short_named_kb():
    crd = all_crds()["kernelbuilds.yaml"]
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["kb"] and crd["spec"]["names"]["kind"] == "KernelBuild"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][:3] == ["Phase", "Role", "Accelerator"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(spec):
        for banned in ("$ref", "anyOf", "allOf", "oneOf", "default", "title", "const"):
            assert banned not in node, f"{path} has {banned}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"
        if path != "spec" and not (path.endswith(("[]", "{}")) and node.get("type") != "object"):
            assert node.get("description"), f"{path} has no description (kubectl explain)"
    assert "KernelBuild" in yaml.safe_dump(crd)


def test_every_build_object_and_its_pods_carry_the_label_the_operator_watches_by():
    """The operator watches its children with the server-side selector
    app.kubernetes.io/managed-by=sglang-pd-operator (docs/control-loop.md): a build object or
    pod without it would never reach the operator's view."""
    from sglang_pd_operator.kernelbuild.render import render_pvc, render_request

    kb, request, job, owner = _rendered()
    managed = {"app.kubernetes.io/managed-by": "sglang-pd-operator"}
    objects = [job, render_pvc(name=kb.name, namespace="inference", spec=kb.spec, owner=owner),
               render_request(name=kb.name, namespace="inference", request=request, owner=owner)]
    for obj in objects:
        assert managed.items() <= obj["metadata"]["labels"].items(), obj["kind"]
    assert managed.items() <= job["spec"]["template"]["metadata"]["labels"].items()
