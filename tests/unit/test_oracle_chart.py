"""The chart's SGLang oracle service (``oracle.enabled``) and its image (images/oracle/Dockerfile).

With ``oracle.enabled`` the chart renders a Deployment, a Service and a ServiceAccount of
the oracle's own that can read nothing (no Role or binding names it, no token mounted),
and the operator gets ``--oracle-url`` pointing at that Service with the policy values.
The image installs the operator package plus sglang exactly the way ``sglang install``
does (its steps are this package's, not a copy), runs as the chart's user and passes hadolint.
"""

from __future__ import annotations

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


def test_the_image_installs_sglang_the_way_sglang_install_does_and_runs_as_the_chart_says():
    ins = _instructions()
    last = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    build, final = ins[:last], ins[last:]
    runs = " ".join(arg for op, arg in build if op == "RUN")
    assert "sglang-pd-operator sglang install" in runs and "sglang-pd-operator sglang status" in runs
    assert "requirements/lock.txt" in runs  # the operator's dependencies at the locked versions
    values = yaml.safe_load(VALUES.read_text())
    assert ("USER", f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}") in final
    assert ("ENTRYPOINT", '["sglang-pd-operator"]') in final
    env = " ".join(arg for op, arg in final if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # read-only root filesystem
    assert not [arg for op, arg in final if op == "RUN"]  # no compiler or apt in the final stage
    copies = [arg for op, arg in final if op == "COPY"]
    assert copies == ["--from=build /opt/oracle /opt/oracle"]
    assert f"EXPOSE {values['oracle']['port']}" in DOCKERFILE.read_text()


def test_hadolint_is_clean():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).is_file():
        pytest.fail("hadolint not installed: pip install -r requirements/lint.txt")
    proc = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
