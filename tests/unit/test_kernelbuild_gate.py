"""The PDDeployment side of kernel builds: the gate per role, the compat-key input, mounting the cache."""

from __future__ import annotations

import pytest
from helpers import load_example, with_fields

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild.gate import (
    KernelGateState,
    apply_kernel_gate,
    gate_objects,
    kernel_compat_input,
    kernel_gate,
    kernels_condition,
    missing_builds,
    mount_kernel_cache,
    required_builds,
    with_kernel_compat,
)
from sglang_pd_operator.kernelbuild.inputs import kernel_build_inputs
from sglang_pd_operator.planning import compat
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.render import render_group

DIGEST = "sha256:" + "a" * 64


def _plan(cache="auto", **changes):
    doc = load_example()
    doc["spec"]["kernels"] = {**doc["spec"].get("kernels", {}), "cache": cache}
    with_fields(doc, changes)
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    assert plan.valid, [p.line() for p in plan.problems]
    return plan


def _build(plan, role, *, phase="Succeeded", digest=DIGEST, complete=True, **status):
    kb = kernel_build_inputs(plan, role)
    st = {"phase": phase, "inputHash": kb.input_hash, "inputs": kb.inputs, "pvcName": f"{kb.name}-cache"}
    if phase == "Succeeded":
        st |= {
            "digest": digest,
            "path": "sha256-" + digest[7:],
            "complete": complete,
            "writablePaths": ["deep_gemm/locks"],
        }
    st |= status
    return kb.name, {"metadata": {"name": kb.name}, "spec": kb.spec.model_dump(mode="json"), "status": st}


def _builds(plan, **per_role):
    out = {}
    for role in ("prefill", "decode"):
        kwargs = per_role.get(role)
        if kwargs is None:
            continue
        name, body = _build(plan, role, **kwargs)
        out[name] = body
    return out


def test_cache_none_requires_nothing_and_leaves_the_compat_key_alone():
    plan = _plan("none")
    gates = kernel_gate(plan, {})
    assert {g.state for g in gates.values()} == {"NotRequired"}
    assert kernel_compat_input(gates) == {} and kernels_condition(gates) is None and required_builds(plan) == set()
    assert compat.compat_key({**plan.prefill.compat_inputs, **kernel_compat_input(gates)}) == plan.compat_key


def test_auto_missing_builds_are_created_one_per_distinct_role_input():
    plan = _plan()
    gates = kernel_gate(plan, {})
    assert {r: g.state for r, g in gates.items()} == {"prefill": "Missing", "decode": "Missing"}
    assert all(g.blocks and g.reason == "WaitingForKernels" for g in gates.values())
    made = missing_builds(plan, gates)
    names = {m["metadata"]["name"] for m in made}
    assert names == {gates["prefill"].build_name, gates["decode"].build_name} == required_builds(plan)
    assert len(names) == 2, "prefill and decode compile different flags"
    decode = next(m for m in made if m["spec"]["role"] == "decode")
    assert decode["spec"]["plugin"]["name"] == "sgl-nvidia-mega" and decode["metadata"]["namespace"] == "inference"
    cond = kernels_condition(gates)
    assert cond["status"] == "False" and cond["reason"] == "WaitingForKernels" and "zero replicas" in cond["message"]


def test_gate_states_follow_the_builds():
    plan = _plan()
    gates = kernel_gate(plan, _builds(plan, prefill={"phase": "Building"}, decode={"phase": None}))
    assert (gates["prefill"].state, gates["decode"].state) == ("Building", "Pending")
    failed = {"phase": "Failed", "message": "attempt 1 failed", "nextRetryAt": "2027-01-01T00:00:00Z"}
    gates = kernel_gate(plan, _builds(plan, prefill={}, decode=failed))
    assert gates["prefill"].ready and gates["prefill"].digest == DIGEST and gates["prefill"].crash_on_jit
    g = gates["decode"]
    assert g.state == "Failed" and g.blocks and g.reason == "KernelBuildFailed" and g.next_retry_at
    cond = kernels_condition(gates)
    assert cond["reason"] == "KernelBuildFailed" and "next attempt at 2027-01-01T00:00:00Z" in cond["message"]
    ready = kernel_gate(plan, _builds(plan, prefill={}, decode={}))
    assert all(g.ready for g in ready.values()) and kernels_condition(ready)["status"] == "True"


def test_a_build_of_other_inputs_is_mismatched_and_names_what_differs():
    plan = _plan()
    name, body = _build(plan, "decode")
    body["status"]["inputHash"] = "0" * 32
    body["status"]["inputs"] = {**body["status"]["inputs"], "revision": "old"}
    g = kernel_gate(plan, {name: body})["decode"]
    assert g.state == "Mismatched" and g.blocks and "revision" in g.message


def test_named_build_serves_the_role_it_was_built_for():
    plan = _plan()
    name, body = _build(plan, "decode")
    named = _plan(name)
    gates = kernel_gate(named, {name: body})
    assert gates["decode"].ready and gates["decode"].mode == "named"
    assert gates["prefill"].state == "NotRequired" and "decode build" in gates["prefill"].message
    assert required_builds(named) == {name} and missing_builds(named, gates) == []
    assert set(kernel_compat_input(gates)["kernelCache"]) == {"decode"}
    missing = kernel_gate(_plan("no-such-build"), {})
    assert {g.state for g in missing.values()} == {"Missing"} and "create it" in missing["decode"].message


def _key(plan, gates):
    extra = kernel_compat_input(gates)
    keys = {compat.compat_key({**plan.role(r).compat_inputs, **extra}) for r in ("prefill", "decode")}
    assert len(keys) == 1, "the extra input keeps both roles' keys equal"
    return keys.pop()


def test_compat_key_changes_when_a_digest_changes_and_only_then():
    plan = _plan()
    ready = kernel_gate(plan, _builds(plan, prefill={}, decode={}))
    base = _key(plan, ready)
    assert base != plan.compat_key, "a mounted cache enters the key"
    # a new digest on either role: a new key (a paired rollout)
    for role in ("prefill", "decode"):
        other = dict(_builds(plan, prefill={}, decode={}))
        name, body = _build(plan, role, digest="sha256:" + "b" * 64)
        other[name] = body
        assert _key(plan, kernel_gate(plan, other)) != base
    # anything else about the build: same key
    same = _builds(
        plan,
        prefill={"message": "other words", "durationSeconds": 9, "sizeBytes": 1},
        decode={"files": 99, "writablePaths": []},
    )
    assert _key(plan, kernel_gate(plan, same)) == base
    # while blocked, only the digest counts: Building, Pending, Failed and Missing give one key
    waiting = {_key(plan, kernel_gate(plan, b)) for b in (
        {}, _builds(plan, prefill={"phase": "Building"}, decode={"phase": "Building"}),
        _builds(plan, prefill={"phase": "Failed"}, decode={"phase": None}),
    )}  # fmt: skip
    assert len(waiting) == 1 and waiting != {base}


def test_kernel_compat_input_depends_on_digests_only():
    a = {
        "decode": KernelGateState(
            role="decode", mode="auto", state="Ready", build_name="x", digest="d1", message="m", complete=True
        )
    }
    b = {
        "decode": KernelGateState(
            role="decode", mode="auto", state="Ready", build_name="y", digest="d1", message="n", complete=True
        )
    }
    c = {
        "decode": KernelGateState(role="decode", mode="auto", state="Ready", build_name="x", digest="d2", complete=True)
    }
    assert kernel_compat_input(a) == kernel_compat_input(b) != kernel_compat_input(c)


def _decode_deployment(plan):
    return next(
        o for o in render_group(plan) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-decode")
    )


def test_mount_kernel_cache_read_only_with_jit_dir_and_crash_flag():
    plan = _plan()
    gate = kernel_gate(plan, _builds(plan, prefill={}, decode={}))["decode"]
    dep = _decode_deployment(plan)
    out = mount_kernel_cache(dep, gate)
    pod = out["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "kernel-cache")
    assert vol == {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": gate.pvc_name, "readOnly": True}}
    c = next(c for c in pod["containers"] if c["name"] == "sglang")
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/var/cache/sglang"] == {
        "name": "kernel-cache", "mountPath": "/var/cache/sglang", "subPath": gate.path, "readOnly": True,
    }  # fmt: skip
    assert mounts["/var/cache/sglang/deep_gemm/locks"]["name"] == "kernel-cache-rw-0"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["SGLANG_CACHE_DIR"] == "/var/cache/sglang" and env["SGLANG_JIT_CACHE_DIR"] == "/var/cache/sglang/jit"
    assert env["TRITON_CACHE_DIR"] == "/var/cache/sglang/triton" and env["SGLANG_CRASH_ON_JIT_COMPILE"] == "1"
    assert [e["name"] for e in c["env"]].count("SGLANG_CACHE_DIR") == 1
    assert out["spec"]["template"]["metadata"]["annotations"]["pd.sglang-operator.io/kernel-cache-digest"] == DIGEST
    assert dep["spec"]["template"]["spec"]["volumes"] != pod["volumes"], "the input is not mutated"
    assert not any(v["name"] == "kernel-cache" and "emptyDir" in v for v in pod["volumes"])


def test_a_cache_not_proven_complete_is_not_mounted():
    """Read-only and incomplete, a runtime compile could not write: such a role runs as with cache none."""
    plan = _plan()
    gates = kernel_gate(plan, _builds(plan, prefill={}, decode={"complete": False}))
    gate = gates["decode"]
    assert gate.ready and not gate.blocks and not gate.mountable and not gate.crash_on_jit
    dep = _decode_deployment(plan)
    assert apply_kernel_gate(dep, gate) is dep
    with pytest.raises(ValueError):
        mount_kernel_cache(dep, gate)
    assert kernel_compat_input(gates)["kernelCache"]["decode"] is None
    assert "not proven complete" in kernels_condition(gates)["message"]


def test_apply_kernel_gate_holds_blocked_roles_at_zero_and_leaves_uncached_roles():
    plan = _plan()
    dep = _decode_deployment(plan)
    blocked = kernel_gate(plan, {})["decode"]
    held = apply_kernel_gate(dep, blocked)
    assert held["spec"]["replicas"] == 0 and dep["spec"]["replicas"] == 2
    assert held["spec"]["template"] == dep["spec"]["template"], "no cache mounted while waiting"
    free = KernelGateState(role="decode", mode="none", state="NotRequired")
    assert apply_kernel_gate(dep, free) is dep
    with pytest.raises(ValueError):
        mount_kernel_cache(dep, blocked)


def test_wiring_helpers_rename_the_group_and_gate_its_engine_deployments():
    plan = _plan()
    ready = kernel_gate(plan, _builds(plan, prefill={}, decode={}))
    keyed = with_kernel_compat(plan, ready)
    assert keyed.compat_key == _key(plan, ready) != plan.compat_key
    assert keyed.prefill.compat_key == keyed.decode.compat_key
    assert with_kernel_compat(_plan("none"), kernel_gate(_plan("none"), {})).compat_key == _plan("none").compat_key
    objs = gate_objects(render_group(keyed), ready)
    engines = [
        o
        for o in objs
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["pd.sglang-operator.io/role"] != "gateway"
    ]
    assert len(engines) == 2 and all(keyed.compat_key[:6] in o["metadata"]["name"] for o in engines)
    for o in engines:
        vol = next(v for v in o["spec"]["template"]["spec"]["volumes"] if v["name"] == "kernel-cache")
        assert vol["persistentVolumeClaim"]["readOnly"] is True
    waiting = gate_objects(render_group(with_kernel_compat(plan, kernel_gate(plan, {}))), kernel_gate(plan, {}))
    assert [
        o["spec"]["replicas"] for o in waiting if o["kind"] == "Deployment" and "gateway" not in o["metadata"]["name"]
    ] == [0, 0]
