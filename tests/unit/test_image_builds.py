"""The two builds of the operator image install the same packages at the same versions.

images/operator/Dockerfile is the build for machines with Docker; ``hack/images.sh build``
(hack/images/images.py: mmdebstrap + umoci) is the build here. Both take the Debian
packages from images/base/debian.yaml (the Dockerfile's final stage pins every one of
them; mmdebstrap installs exactly that list and the build fails if dpkg reports anything
else), the Python packages from requirements/lock.txt (the build fails when the image
holds a distribution the lock does not pin at that version), the same pip to install them,
the same sources, and the user, entrypoint, command and environment the Dockerfile declares.
"""

from __future__ import annotations

import re

import pytest
import yaml
from helpers import ROOT, images_build


images = images_build()
VALUES = ROOT / "charts" / "sglang-pd-operator" / "values.yaml"


def test_dockerfile_pins_every_debian_package_of_the_mmdebstrap_build():
    base = images.Base.load()
    assert len(base.packages) > 50, "debian.yaml holds the whole resolved set, not only the roots"
    for root in base.roots:
        assert root in base.packages, f"the root {root} is not in the resolved set"
    assert images.dockerfile_apt_pins() == base.packages, "run `hack/images.sh lock-base`"
    text = images.OPERATOR_DOCKERFILE.read_text()
    assert images.dockerfile_with_pins(text, base) == text, "the Dockerfile's pin block is stale: run `hack/images.sh lock-base`"
    # the Docker build starts from the same suite
    (arg,) = [a for op, a in images.dockerfile_instructions() if op == "ARG" and a.startswith("DEBIAN_IMAGE=")]
    assert arg.endswith(f":{base.suite}-slim"), arg


def test_a_changed_pin_is_seen():
    base = images.Base.load()
    name = sorted(base.packages)[0]
    changed = images.Base(**{**base.__dict__, "packages": {**base.packages, name: "0:0-changed"}})
    text = images.OPERATOR_DOCKERFILE.read_text()
    assert images.dockerfile_with_pins(text, changed) != text
    assert f"{name}=0:0-changed \\" in images.render_pin_block(changed)


def test_same_pip_same_sources_same_lock():
    base = images.Base.load()
    ins = images.dockerfile_instructions()
    runs = [arg for op, arg in ins if op == "RUN"]
    assert [r for r in runs if f"pip=={base.pip}" in r], "the Dockerfile downloads another pip than debian.yaml's"
    assert [r for r in runs if f"pip-{base.pip}-py3-none-any.whl/pip install" in r]
    wheel = [r for r in runs if "pip wheel" in r]
    assert wheel and "-c requirements/lock.txt" in wheel[0]
    # the build stage's COPY sources are the ones hack/images.sh copies
    first = next(i for i, (op, _) in enumerate(ins) if op == "FROM")
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    copied = [p.rstrip("/") for op, arg in ins[first:last] if op == "COPY" for p in arg.split()[:-1]]
    assert sorted(copied) == sorted(images.SOURCE_PATHS)
    commands = images.wheel_commands("python", "operator", ROOT / "w", ROOT / "s")
    assert len(commands) == 1 and commands[0][commands[0].index("-c") + 1].endswith("requirements/lock.txt")


def test_image_config_is_the_dockerfiles_and_the_charts():
    config = images.dockerfile_config()
    values = yaml.safe_load(VALUES.read_text())["podSecurityContext"]
    assert config.user == f"{values['runAsUser']}:{values['runAsGroup']}" == "65532:65532"
    assert config.entrypoint == ["sglang-pd-operator"] and config.cmd == ["run"]
    assert config.env["PYTHONDONTWRITEBYTECODE"] == "1" and config.env["PYTHONSAFEPATH"] == "1"


def test_python_packages_outside_the_lock_are_named():
    lock = images.locked_versions(images.LOCK.read_text())
    assert lock["pydantic"] and lock["kopf"]
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    installed = {"kopf": lock["kopf"], "pydantic": lock["pydantic"], "sglang-pd-operator": project}
    assert images.unlocked_python_packages(installed, image="operator") == []
    assert images.unlocked_python_packages({**installed, "kopf": "0.0.1"}, image="operator") == ["kopf==0.0.1"]
    assert images.unlocked_python_packages({"left-pad": "1.0"}, image="operator") == ["left-pad==1.0"]
    nodeps = images.locked_versions((images.ORACLE_REQUIREMENTS / "sglang-nodeps.txt").read_text())
    assert images.unlocked_python_packages({"torch": nodeps["torch"]}, image="oracle") == []


def test_the_pin_block_must_exist():
    with pytest.raises(images.ImageError, match="pin"):
        images.dockerfile_with_pins("FROM x\n", images.Base.load())


def _fake_rootfs(tmp_path, *, script=True, interpreter=True, module=True):
    root = tmp_path / "rootfs"
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    site = root / "usr/local/lib/python3.11/dist-packages/sglang_pd_operator"
    site.mkdir(parents=True)
    if script:
        (root / "usr/local/bin/sglang-pd-operator").write_text(
            "#!/usr/bin/python3\nimport sys\nfrom sglang_pd_operator.cli import main\nsys.exit(main())\n")
    if interpreter:
        (root / "usr/bin/python3").write_text("")
    if module:
        (site / "cli.py").write_text("")
    return root


def test_smoke_names_what_the_entrypoint_lacks(tmp_path):
    """A missing entrypoint, interpreter or module fails the smoke run before runc, by name."""
    env = ["PATH=/usr/local/bin:/usr/bin"]
    assert images.entrypoint_problems(_fake_rootfs(tmp_path / "ok"), ["sglang-pd-operator", "run"], env) == []
    (problem,) = images.entrypoint_problems(_fake_rootfs(tmp_path / "a", script=False), ["sglang-pd-operator"], env)
    assert "sglang-pd-operator (the entrypoint) is not on the image's PATH" in problem
    (problem,) = images.entrypoint_problems(_fake_rootfs(tmp_path / "b", interpreter=False), ["sglang-pd-operator"], env)
    assert "interpreter /usr/bin/python3 is missing" in problem
    (problem,) = images.entrypoint_problems(_fake_rootfs(tmp_path / "c", module=False), ["sglang-pd-operator"], env)
    assert "imports sglang_pd_operator.cli, which is not installed" in problem


def test_runtime_spec_is_the_charts_pod():
    """umoci's spec made read-only, uid 65532, /tmp a tmpfs, host network, binds read-only."""
    spec = {"process": {"args": ["x"], "terminal": True, "user": {"uid": 0, "gid": 0}, "env": ["PATH=/usr/bin"]},
            "root": {"path": "rootfs", "readonly": False},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "mount"}]}}
    out = images.runtime_spec(spec, args=["sglang-pd-operator", "run"], env={"POD_NAME": "p"},
                              binds=[(ROOT, images.SA_DIR)])
    assert out["root"]["readonly"] is True and out["process"]["user"] == {"uid": 65532, "gid": 65532}
    assert out["process"]["terminal"] is False and out["process"]["args"] == ["sglang-pd-operator", "run"]
    assert "POD_NAME=p" in out["process"]["env"] and "PATH=/usr/bin" in out["process"]["env"]
    assert {n["type"] for n in out["linux"]["namespaces"]} == {"pid", "mount"}
    mounts = {m["destination"]: m for m in out["mounts"]}
    assert mounts["/tmp"]["type"] == "tmpfs" and "ro" in mounts[images.SA_DIR]["options"]
    assert spec["root"]["readonly"] is False  # the input is not changed


def test_oracle_smoke_asks_the_service_the_image_runs():
    """The oracle smoke starts the Dockerfile's own command (``oracle serve``) with the port,
    host and warm accelerator appended, and POSTs to the service's own verdict path: both
    checked against the CLI's options and operator/oracle/service.py, so a renamed option or
    path fails here, not in a 15-minute smoke."""
    import json

    from sglang_pd_operator.catalog import builtin_catalog
    from sglang_pd_operator.cli import oracle_serve
    from sglang_pd_operator.oracle.service import API_PATH
    from sglang_pd_operator.planning.plan import plan_object
    from sglang_pd_operator.planning.problems import errors

    assert images.ORACLE_VERDICT_PATH == API_PATH
    cmd = images.dockerfile_config(images.ORACLE_DOCKERFILE).cmd
    args = images.oracle_serve_args(cmd, port=18090, accelerator="l40s")
    assert args[:len(cmd)] == cmd and args[:2] == ["oracle", "serve"]
    ctx = oracle_serve.make_context("serve", args[2:])       # click keeps the last value of an option
    assert (ctx.params["host"], ctx.params["port"], ctx.params["warm"]) == ("127.0.0.1", 18090, "l40s")
    with pytest.raises(images.ImageError, match="oracle serve"):
        images.oracle_serve_args(["check", "--sglang", "x.yaml"], port=1, accelerator="l40s")
    # the body is the service's shape, and the example plans without errors (the service's first step)
    doc, body = images.oracle_request(images.SMOKE_EXAMPLE)
    request = json.loads(body)
    assert set(request) == {"object", "catalogOverrides"} and request["object"] == doc
    plan, problems = plan_object(request["object"], builtin_catalog())
    assert plan is not None and not errors(problems), problems
    assert builtin_catalog().accelerator(doc["spec"]["accelerator"]) is not None


def test_oracle_smoke_fails_on_a_refused_or_unknown_verdict():
    good = {"valid": True, "problems": [], "sglang": {"accepted": True, "prefill": {}, "decode": {}, "pair": {}}}
    assert images.verdict_problems(200, good) == []
    (problem,) = images.verdict_problems(503, {"error": "the oracle failed"})
    assert "answered 503" in problem
    (problem,) = images.verdict_problems(200, {**good, "sglang": {**good["sglang"], "accepted": None}})
    assert "accepted=None" in problem
    (problem,) = images.verdict_problems(200, {**good, "sglang": {**good["sglang"], "accepted": False}})
    assert "accepted=False" in problem
    (problem,) = images.verdict_problems(200, {"valid": True, "problems": []})
    assert "no SGLang verdict" in problem
    (problem,) = images.verdict_problems(200, {**good, "valid": False, "problems": ["x"]})
    assert "valid is False" in problem
