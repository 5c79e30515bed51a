"""The builder script runs for real: stand-in compile/serve commands from the catalog, atomic publish, refusals.

Every build here is a subprocess ``python -m sglang_pd_operator.kernelbuild.builder`` with
a request rendered by the operator's own code (``kernelbuild.render.build_request``) from
the GB300 example's decode role and the dev tools' ``standin`` recipe (added to a copy of
kernels/builds.yaml, which never holds it), so the path from a PDDeployment to a published
cache is exercised end to end without a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_example

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.kernelbuild import builder as B
from sglang_pd_operator.kernelbuild.inputs import KernelBuildError, kernel_build_inputs, spec_inputs
from sglang_pd_operator.kernelbuild.render import build_request
from sglang_pd_operator.kernelbuild.recipes import builtin_build_catalog
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator_dev.kernelbuild import recipe as standin


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(role: str = "decode", **changes) -> dict:
    doc = load_example()
    for k, v in changes.items():
        doc["spec"][k] = v
    plan = build_plan(parse_pddeployment(doc), builtin_catalog())
    builds = standin.build_catalog_with_standin()
    kb = kernel_build_inputs(plan, role, builds=builds, recipe=standin.STANDIN)
    resolved, _, h = spec_inputs(kb.spec, builds=builds)
    return build_request(name=kb.name, spec=kb.spec, resolved=resolved, input_hash=h, port=_free_port())


def _run(tmp: Path, request: dict, *, env: dict | None = None, python: list[str] | None = None, name: str = "b"):
    req = tmp / f"{name}-request.json"
    req.write_text(json.dumps(request))
    term = tmp / f"{name}-termination-log"
    cmd = [*(python or [sys.executable]), "-m", "sglang_pd_operator.kernelbuild.builder",
           "--request", str(req), "--work-dir", str(tmp / f"{name}-work"), "--volume", str(tmp / "volume"),
           "--termination-log", str(term)]  # fmt: skip
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
    )
    result = json.loads(term.read_text()) if term.exists() else None
    return proc, result


def _published(tmp: Path) -> list[Path]:
    vol = tmp / "volume"
    return sorted(vol.iterdir()) if vol.exists() else []


def test_build_publishes_a_verified_content_addressed_cache(tmp_path):
    request = _request()
    proc, result = _run(tmp_path, request)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["ok"] and result["complete"] is True and result["inputHash"] == request["inputHash"]
    digest = result["digest"]
    assert digest.startswith("sha256:") and result["path"] == "sha256-" + digest.removeprefix("sha256:")
    [published] = _published(tmp_path)
    assert published.name == result["path"]
    # the published tree has the digest the builder reported, computed over the copy
    assert B.tree_digest(published) == (digest, result["sizeBytes"], result["files"])
    manifest = B.read_manifest(published)
    assert manifest["digest"] == digest and manifest["inputHash"] == request["inputHash"]
    # what the stand-in compiled, warmed up and proved complete is all there; the lock
    # directory exists (a mount point for the pods) but is empty
    assert list((published / "deep_gemm").glob("kernel-*.cubin")) and list((published / "triton").glob("graph-*.bin"))
    assert list((published / "jit").rglob("*.so"))
    assert result["writablePaths"] == ["deep_gemm/locks"] and not any((published / "deep_gemm" / "locks").iterdir())
    # the result line is also in the log, and the termination message fits kubelet's limit
    assert B.RESULT_PREFIX in proc.stdout and len((tmp_path / "b-termination-log").read_bytes()) <= B.TERMINATION_LIMIT


def test_equal_inputs_give_equal_digest_and_publishing_twice_is_idempotent(tmp_path):
    request = _request()
    _, first = _run(tmp_path, request, name="one")
    _, second = _run(tmp_path, request, name="two")
    assert first["digest"] == second["digest"] and len(_published(tmp_path)) == 1
    # other flags compile other kernels: another digest, another directory beside the first
    _, other = _run(tmp_path, _request(role="prefill"), name="three")
    assert other["digest"] != first["digest"] and len(_published(tmp_path)) == 2


@pytest.mark.parametrize(
    "env, step, reason",
    [
        ({"KERNELBUILD_STANDIN_FAIL": "compile"}, "compile", "StepFailed"),
        ({"KERNELBUILD_STANDIN_FAIL": "serve"}, "warm-up", "StepFailed"),
        ({"KERNELBUILD_STANDIN_FAIL": "verify"}, "verify", "StepFailed"),
        ({"KERNELBUILD_STANDIN_PARTIAL": "1"}, "verify", "PartialCache"),
        ({"KERNELBUILD_STANDIN_LAZY": "always"}, "verify", "Incomplete"),
    ],
)
def test_a_partial_or_failed_build_publishes_nothing(tmp_path, env, step, reason):
    proc, result = _run(tmp_path, _request(), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert result["ok"] is False and result["step"] == step and result["reason"] == reason, result
    assert _published(tmp_path) == [] or all(not p.name.startswith("sha256-") for p in _published(tmp_path))
    assert not [p for p in _published(tmp_path) if p.name.startswith(B.STAGING_PREFIX)], "staging left behind"
    assert "refused to publish" in proc.stderr


def test_failure_message_carries_the_failing_commands_output(tmp_path):
    _, result = _run(tmp_path, _request(), env={"KERNELBUILD_STANDIN_FAIL": "compile"})
    assert "exit code 3" in result["message"] and "failing compile on purpose" in result["message"]


def test_a_verify_pass_that_compiles_more_gets_a_second_pass(tmp_path):
    """A cache SGLang's JIT guard does not cover (DeepGEMM, Triton) grew under verify: the second pass must not."""
    proc, result = _run(tmp_path, _request(), env={"KERNELBUILD_STANDIN_LAZY": "once"})
    assert proc.returncode == 0 and result["complete"] is True, proc.stdout
    assert "pass 1 compiled new kernels" in proc.stdout
    assert (tmp_path / "volume" / result["path"] / "deep_gemm" / "lazy-once.cubin").is_file()


def test_the_installed_builder_runs_with_the_standard_library_only(tmp_path):
    """The init container copies the builder into the pod; the runtime image has no pydantic or kopf."""
    target = tmp_path / "opt"
    out = subprocess.run(
        [sys.executable, "-m", "sglang_pd_operator.kernelbuild.builder", "--install-to", str(target)],
        capture_output=True, text=True, check=True, cwd="/", env={**os.environ, "PYTHONSAFEPATH": "1"},
    )  # fmt: skip
    assert "kernelbuild/builder.py" in out.stdout
    standin.install(target)  # the recipe's commands, as a test image would hold them beside the builder
    # -S: no site-packages at all; the copied files are the only non-stdlib code on the path
    proc, result = _run(tmp_path, _request(), python=[sys.executable, "-S"], env={"PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result["ok"]


def test_digest_covers_paths_contents_and_exec_bit_not_mtimes(tmp_path):
    root = tmp_path / "t"
    (root / "a").mkdir(parents=True)
    (root / "a" / "k.bin").write_bytes(b"kernel")
    (root / "b.so").write_bytes(b"so")
    base = B.tree_digest(root)[0]
    os.utime(root / "b.so", (1, 1))
    assert B.tree_digest(root)[0] == base
    (root / "b.so").chmod(0o755)
    assert B.tree_digest(root)[0] != base
    (root / "b.so").chmod(0o644)
    assert B.tree_digest(root)[0] == base
    (root / "b.so").write_bytes(b"sO")
    assert B.tree_digest(root)[0] != base
    (root / "b.so").write_bytes(b"so")
    (root / "a" / "k.bin").rename(root / "a" / "k2.bin")
    assert B.tree_digest(root)[0] != base
    (root / "a" / "k2.bin").rename(root / "a" / "k.bin")
    (root / "c").mkdir()
    assert B.tree_digest(root)[0] != base, "an empty directory (a mount point) is part of the tree"
    (root / "c").rmdir()
    (root / B.MANIFEST).write_text("{}")
    assert B.tree_digest(root)[0] == base, "the manifest is not part of the digest"


def test_publish_refuses_a_copy_whose_digest_differs(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "k").write_bytes(b"x")
    with pytest.raises(B.BuildError) as e:
        B.publish(work, volume=tmp_path / "vol", digest="sha256:" + "0" * 64, manifest={})
    assert e.value.reason == "CopyMismatch"
    assert list((tmp_path / "vol").iterdir()) == []


def test_glob_rules():
    assert B.glob_regex("**/.staging-*").match(".staging-1")
    assert B.glob_regex("**/.staging-*").match("jit/sm103/m/.staging-1")
    assert not B.glob_regex("**/.staging-*").match("jit/.staging-1/file")
    assert B.glob_regex("deep_gemm/*.cubin").match("deep_gemm/k.cubin")
    assert not B.glob_regex("deep_gemm/*.cubin").match("deep_gemm/x/k.cubin")
    assert B.glob_regex("**").match("anything/at/all")


def test_cache_env_keeps_every_cache_under_one_directory():
    env = B.cache_env("/var/cache/sglang")
    assert env["SGLANG_JIT_CACHE_DIR"] == "/var/cache/sglang/jit"  # does not follow SGLANG_CACHE_DIR by itself
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/sglang"
    assert all(v.startswith("/var/cache/sglang") for v in env.values())


def test_result_encoding_fits_the_termination_message():
    long = {"ok": False, "step": "warm-up", "reason": "StepFailed", "message": "x" * 20000}
    text = B.encode_result(long)
    assert len(text.encode()) <= B.TERMINATION_LIMIT and B.decode_result(text)["reason"] == "StepFailed"
    assert B.decode_result(B.RESULT_PREFIX + '{"ok": true}') == {"ok": True}
    assert B.decode_result("not json") is None and B.decode_result(None) is None


def test_a_bad_request_is_refused(tmp_path):
    proc, result = _run(tmp_path, {"version": 99})
    assert proc.returncode == 2 and result["reason"] == "BadRequest"


def test_the_operators_catalog_has_no_standin_recipe():
    """A user's KernelBuild cannot select the stand-in: only the dev tools' copy of the catalog has it."""
    assert builtin_build_catalog().recipe(standin.STANDIN) is None
    with_standin = standin.build_catalog_with_standin()
    assert with_standin.recipe(standin.STANDIN) is not None
    assert set(with_standin.recipes) - set(builtin_build_catalog().recipes) == {standin.STANDIN}
    spec = kernel_build_inputs(build_plan(parse_pddeployment(load_example()), builtin_catalog()), "decode").spec
    with pytest.raises(KernelBuildError, match="spec.recipe"):
        spec_inputs(spec.model_copy(update={"recipe": standin.STANDIN}))
