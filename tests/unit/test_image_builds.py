"""The two builds of each image (operator, oracle) install the same packages at the same versions.

images/operator/Dockerfile and images/oracle/Dockerfile are the builds for machines with
Docker; ``hack/images.sh build`` (hack/images/images.py: mmdebstrap + umoci) is the build
here. Both take the Debian packages from images/base/debian.yaml (each Dockerfile's final
stage pins every one of them; mmdebstrap installs exactly that list and the build fails if
dpkg reports anything else), the Python packages from requirements/lock.txt and, for the
oracle, operator/oracle/requirements/ (the same ``pip wheel`` commands; the build fails when
the image holds a distribution they do not pin at that version), the same pip with the same
options to install them, the same sources, and the user, entrypoint, command and
environment the Dockerfile declares.

Also here: a build that fails half-way leaves no image that looks complete, and smoke and
push refuse a record built from other inputs (the build's steps faked: no root needed).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shlex

import pytest
import yaml
from helpers import ROOT, images_build


images = images_build()
VALUES = ROOT / "charts" / "sglang-pd-operator" / "values.yaml"


@pytest.mark.parametrize("image", ["operator", "oracle"])
def test_dockerfile_pins_every_debian_package_of_the_mmdebstrap_build(image):
    base = images.Base.load()
    dockerfile = images.DOCKERFILES[image]
    assert len(base.packages) > 50, "debian.yaml holds the whole resolved set, not only the roots"
    for root in base.roots:
        assert root in base.packages, f"the root {root} is not in the resolved set"
    assert images.dockerfile_apt_pins(dockerfile) == base.packages, "run `hack/images.sh lock-base`"
    text = dockerfile.read_text()
    assert images.dockerfile_with_pins(text, base) == text, "the Dockerfile's pin block is stale: run `hack/images.sh lock-base`"
    # both stages start from the same suite's slim image, and the final stage installs nothing else
    (arg,) = [a for op, a in images.dockerfile_instructions(dockerfile) if op == "ARG" and a.startswith("DEBIAN_IMAGE=")]
    assert arg.endswith(f":{base.suite}-slim"), arg
    froms = [a.split()[0] for op, a in images.dockerfile_instructions(dockerfile) if op == "FROM"]
    assert froms == ["${DEBIAN_IMAGE}", "${DEBIAN_IMAGE}"], froms
    runs = [a for op, a in images.final_stage(dockerfile) if op == "RUN" and "apt-get install" in a]
    assert len(runs) == 1 and [w for w in runs[0].split() if "=" in w and not w.startswith("-")] == base.pins()


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
    assert _wheel_plan(_pip_commands(images.OPERATOR_DOCKERFILE, "wheel"), src="") == \
        _wheel_plan([c[c.index("wheel") + 1:] for c in commands], src=str(ROOT / "s") + "/")
    (install,) = _pip_commands(images.OPERATOR_DOCKERFILE, "install")
    assert set(images.PIP_INSTALL_OPTIONS) <= set(install), install


def _pip_commands(dockerfile, verb: str) -> list[list[str]]:
    """Every ``pip <verb> ...`` (or ``.../pip <verb>``) of the Dockerfile's RUN lines, as argv after the verb."""
    out = []
    for op, arg in images.dockerfile_instructions(dockerfile):
        if op != "RUN":
            continue
        for part in arg.split("&&"):
            words = shlex.split(part)
            if len(words) > 1 and (words[0] == "pip" or words[1].endswith("/pip")) and verb in words[:3]:
                out.append(words[words.index(verb) + 1:])
    return out


def _wheel_plan(argvs, *, src: str) -> list[tuple]:
    """What each ``pip wheel`` builds: (constraints file, --no-deps, wheel directory, what),
    paths relative to the source tree ``src`` and the wheel root, so both builds compare."""
    plan = []
    for argv in argvs:
        argv = [a for a in argv if a not in ("--no-cache-dir", "-q", "--disable-pip-version-check")]
        constraints = argv[argv.index("-c") + 1].removeprefix(src) if "-c" in argv else None
        wheel_dir = argv[argv.index("--wheel-dir") + 1].rstrip("/").rsplit("/", 1)[1]
        what = argv[argv.index("-r") + 1] if "-r" in argv else argv[-1]
        what = "." if what in (".", src.rstrip("/")) else what.removeprefix(src)
        plan.append((constraints, "--no-deps" in argv, wheel_dir, what))
    return plan


def test_the_oracles_two_builds_install_the_same_wheels_with_the_same_pip():
    """images/oracle/Dockerfile builds the wheels with hack/images.sh's pip commands
    (wheel_commands: the package and SGLang's CPU set under the lock, the CUDA set without
    dependencies), from the same sources, installs them with the same pip and options, and
    builds the CUDA stubs with the same script; its final stage copies only what pip installed."""
    base = images.Base.load()
    dockerfile = images.ORACLE_DOCKERFILE
    ins = images.dockerfile_instructions(dockerfile)
    hack = images.wheel_commands("python", "oracle", images.ROOT / "w", images.ROOT / "s")
    docker = _pip_commands(dockerfile, "wheel")
    assert _wheel_plan(docker, src="") == _wheel_plan([c[c.index("wheel") + 1:] for c in hack], src=str(images.ROOT / "s") + "/")
    assert [p for _, _, _, p in _wheel_plan(docker, src="")] == [
        ".", "operator/oracle/requirements/sglang-cpu.txt", "operator/oracle/requirements/sglang-nodeps.txt"]
    # the same sources as the operator's build stage, which are the ones hack/images.sh copies
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    copied = [p.rstrip("/") for op, arg in ins[:last] if op == "COPY" for p in arg.split()[:-1]]
    assert sorted(copied) == sorted(images.SOURCE_PATHS)
    # the same pip, run from its wheel, with the same options; main, then the CUDA set --no-deps
    (download,) = _pip_commands(dockerfile, "download")
    assert f"pip=={base.pip}" in download
    installs = _pip_commands(dockerfile, "install")
    assert len(installs) == 2 and "--no-deps" not in installs[0] and "--no-deps" in installs[1]
    runs = " ".join(arg for op, arg in ins if op == "RUN")
    assert runs.count(f"/wheels/pip/pip-{base.pip}-py3-none-any.whl/pip install") == 2
    for argv in installs:
        assert set(images.PIP_INSTALL_OPTIONS) <= set(argv), argv
        # the Docker-only options: the build stage installs under /image (its own Debian
        # python packages do not count); everything else is the hack build's
        extra = set(a for a in argv if a.startswith("-")) - set(images.PIP_INSTALL_OPTIONS) - {"--no-deps"}
        assert extra == {"--root", "--ignore-installed"}, extra
    assert [a for a in installs[0] if a.endswith(".whl")] == ["/wheels/main/*.whl"]
    assert [a for a in installs[1] if a.endswith(".whl")] == ["/wheels/nodeps/*.whl"]
    # the CUDA stubs: the same script on the installed site-packages, built with the base's libc
    assert "python3 operator/oracle/cuda_stubs.py /image/usr/local/lib/python3.11/dist-packages" in runs
    build_apt = [w for op, a in ins[:last] if op == "RUN" and "apt-get install" in a for w in a.split() if "=" in w]
    assert f"libc6-dev={base.packages['libc6']}" in build_apt, build_apt
    # the final stage: the pins, then only what pip installed (the hack build installs to /usr/local too)
    final = images.final_stage(dockerfile)
    assert [a for op, a in final if op == "COPY"] == ["--from=build /image/usr/local /usr/local"]
    assert len([a for op, a in final if op == "RUN"]) == 1
    assert "PATH" not in images.dockerfile_config(dockerfile).env  # the console scripts are in /usr/local/bin


def test_the_dockerfiles_name_tests_that_exist():
    for dockerfile in images.DOCKERFILES.values():
        for name in re.findall(r"tests/[\w/]+\.py", dockerfile.read_text()):
            assert (ROOT / name).is_file(), f"{dockerfile.relative_to(ROOT)} names {name}, which does not exist"


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


# ---------------------------------------------------------------------------------------
# a build that fails half-way; a stale or incomplete record


def _fake_steps(monkeypatch, tmp_path, *, salt=lambda: b""):
    """build()'s tools faked (no root, mmdebstrap, pip or umoci; tar is real): each build makes a
    one-layer layout by hand whose layer holds ``salt()``. Returns the output directory."""
    out = tmp_path / "images"
    base = images.Base.load()
    monkeypatch.setattr(images, "OUT", out)
    monkeypatch.setattr(images, "require_root", lambda: None)
    monkeypatch.setattr(images, "ensure_tools", lambda *names: None)
    monkeypatch.setattr(images, "host_tools", lambda: {"python": "faked"})

    def build_wheels(base, image, work, *, fresh=False):
        (work / "wheels").mkdir()
        return work / "wheels"

    def base_rootfs(base, target, *, fresh=False):
        (target / "usr" / "bin").mkdir(parents=True)

    def make_oci(base, image, rootfs, layout, config, work):
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)

        def blob(data: bytes, media_type: str) -> dict:
            digest = hashlib.sha256(data).hexdigest()
            (blobs / digest).write_bytes(data)
            return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

        layer = blob(gzip.compress(b"rootfs" + salt(), mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
        cfg = blob(json.dumps({"config": {"User": config.user}}).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = blob(json.dumps({"schemaVersion": 2, "config": cfg, "layers": [layer]}).encode(), images.OCI_MANIFEST)
        (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
            {**manifest, "annotations": {"org.opencontainers.image.ref.name": image}}]}))

    monkeypatch.setattr(images, "build_wheels", build_wheels)
    monkeypatch.setattr(images, "base_rootfs", base_rootfs)
    monkeypatch.setattr(images, "installed_debs", lambda rootfs: dict(base.packages))
    monkeypatch.setattr(images, "install_wheels", lambda *args: None)
    monkeypatch.setattr(images, "package_list", lambda rootfs: {"debian": dict(base.packages), "python": {}})
    monkeypatch.setattr(images, "missing_shared_libraries", lambda rootfs: [])
    monkeypatch.setattr(images, "unlocked_python_packages", lambda installed, image: [])
    monkeypatch.setattr(images, "make_oci", make_oci)
    return out


def _fail(what):
    def step(*args, **kwargs):
        raise images.ImageError(f"{what} failed (injected)")
    return step


@pytest.mark.parametrize("where", ["wheels", "install", "tar", "record"])
def test_a_build_that_fails_half_way_leaves_no_image_that_looks_complete(monkeypatch, tmp_path, where):
    """A good build, then one that fails at the wheels, the install, the archive (after the
    layout was made) or the record's sizes: the previous build's record, archive and layout
    are gone, no work directory stays, and smoke and push (record_of) say there is no image."""
    out = _fake_steps(monkeypatch, tmp_path)
    record = images.build("operator")
    assert images.record_of("operator") == record
    assert {p.name for p in out.iterdir()} == {"operator.json", "operator.oci.tar", "operator.oci"}
    assert record["inputs"]["sha256"] == images.tree_hash(images.BUILD_INPUTS) and record["inputs"]["commit"]
    assert record["archive_bytes"] == (out / "operator.oci.tar").stat().st_size
    if where == "wheels":
        monkeypatch.setattr(images, "build_wheels", _fail("pip wheel"))
    elif where == "install":
        monkeypatch.setattr(images, "install_wheels", _fail("pip install (in the image)"))
    elif where == "tar":
        real_run = images.run
        monkeypatch.setattr(images, "run", lambda command, *, what, **kw:
                            _fail(what)() if what.startswith("tar") else real_run(command, what=what, **kw))
    else:
        monkeypatch.setattr(images, "sha256_file", _fail("sha256 of the archive"))
    with pytest.raises(images.ImageError, match="injected"):
        images.build("operator")
    assert list(out.iterdir()) == [], "a failed build left files behind"
    with pytest.raises(images.ImageError, match="no built operator image .* the last build failed"):
        images.record_of("operator")


def test_smoke_and_push_refuse_a_stale_or_incomplete_image(monkeypatch, tmp_path):
    out = _fake_steps(monkeypatch, tmp_path)
    record = images.build("operator")
    current = images.tree_hash(images.BUILD_INPUTS)
    assert images.record_problems(record, "operator", out, inputs_sha256=current) == []
    # stale: the tree's inputs changed since the build
    monkeypatch.setattr(images, "tree_hash", lambda paths: "0" * 64)
    with pytest.raises(images.ImageError, match="stale: built from other inputs"):
        images.record_of("operator")
    (problem,) = images.record_problems(record, "operator", out, inputs_sha256="0" * 64)
    assert record["inputs"]["commit"][:12] in problem
    # a record that names no inputs (an older build) is not used either
    old = {k: v for k, v in record.items() if k != "inputs"}
    assert images.record_problems(old, "operator", out, inputs_sha256=current) == [
        "its record names no inputs (built before records did)"]
    # incomplete or other files than the record names
    other = {**record, "digest": "sha256:" + "1" * 64}
    assert "not the recorded" in images.record_problems(other, "operator", out, inputs_sha256=current)[0]
    with open(out / "operator.oci.tar", "ab") as f:
        f.write(b"x")
    assert "bytes, not the recorded" in images.record_problems(record, "operator", out, inputs_sha256=current)[0]
    (out / "operator.oci.tar").unlink()
    assert images.record_problems(record, "operator", out, inputs_sha256=current) == ["its archive operator.oci.tar is missing"]
    (out / "operator.oci" / "index.json").unlink()
    assert "layout operator.oci is missing" in images.record_problems(record, "operator", out, inputs_sha256=current)[0]


def test_verify_reproducible_compares_two_builds_from_nothing(monkeypatch, tmp_path):
    """Two builds with ``fresh`` (no cached base, no pip cache) into their own directories, never
    .run/images/<image>.*; equal digests: the result names both; different: the blobs that differ."""
    fresh = []
    out = _fake_steps(monkeypatch, tmp_path)
    real_build = images.build
    monkeypatch.setattr(images, "build", lambda image, **kw: fresh.append(kw["fresh"]) or real_build(image, **kw))
    result = images.verify_reproducible("operator")
    assert fresh == [True, True] and result["reproducible"] is True
    first, second = result["builds"]
    assert first["digest"] == second["digest"] and first["digest"].startswith("sha256:") and len(first["digest"]) == 71
    assert result["inputs"]["commit"] and json.loads((out / "reproducible" / "operator" / "result.json").read_text()) == result
    assert not (out / "operator.json").exists()
    salts = iter([b"1", b"2"])
    _fake_steps(monkeypatch, tmp_path, salt=lambda: next(salts))
    monkeypatch.setattr(images, "build", real_build)
    with pytest.raises(images.ImageError, match="not reproducible: sha256:.* then sha256:.*only in the first: \\['sha256:"):
        images.verify_reproducible("operator")
    assert (out / "reproducible" / "operator" / "2" / "operator.oci").is_dir()  # kept for diffoscope
