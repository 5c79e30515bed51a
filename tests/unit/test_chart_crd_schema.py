"""The operator's start-up CRD check (reconcilers/crds.py): older schemas refused, newer accepted, apply only when needed.

The chart relies on it for CRD upgrades under GitOps: an operator must not run on a CRD
that lacks fields it writes, because the API server would silently prune them.
"""

from __future__ import annotations

import copy

import pytest

from sglang_pd_operator.api.crd import all_crds
from sglang_pd_operator.reconcilers.crds import CRDSchemaError, ensure_crds, extra_in, missing_in

PDD = "pddeployments.yaml"


def ours() -> dict:
    return copy.deepcopy(all_crds()[PDD])


def spec_schema(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_same_schema_is_neither_older_nor_newer():
    assert missing_in(installed=ours(), expected=ours()) == []
    assert extra_in(installed=ours(), expected=ours()) == []


def test_a_missing_field_is_reported_once_by_its_root():
    older = ours()
    del spec_schema(older)["properties"]["slo"]
    assert missing_in(installed=older, expected=ours()) == ["v1alpha1: spec.slo"]


def test_a_missing_enum_value_is_reported():
    older = ours()
    layout = spec_schema(older)["properties"]["kvLayout"]["properties"]["layout"]
    assert "v41_new" in layout["enum"]
    layout["enum"].remove("v41_new")
    assert missing_in(installed=older, expected=ours()) == ["v1alpha1: spec.kvLayout.layout=v41_new"]


def test_a_newer_crd_is_accepted_and_its_extra_fields_named():
    newer = ours()
    spec_schema(newer)["properties"]["notes"] = {"type": "string", "description": "x"}
    assert missing_in(installed=newer, expected=ours()) == []
    assert extra_in(installed=newer, expected=ours()) == ["v1alpha1: spec.notes"]


def test_a_version_not_served_is_reported():
    other = ours()
    other["spec"]["versions"][0]["served"] = False
    assert missing_in(installed=other, expected=ours()) == ["version v1alpha1 is not served"]


class FakeKube:
    """Holds CRDs by name; records applies (this module's only write)."""

    def __init__(self, crds: dict[str, dict]):
        self.crds = {c["metadata"]["name"]: copy.deepcopy(c) for c in crds.values()}
        self.applied: list[str] = []

    def get(self, api_version, kind, name, namespace=None):
        crd = self.crds.get(name)
        if crd is None:
            return None
        return {**crd, "status": {"conditions": [{"type": "Established", "status": "True"}]}}

    def apply(self, desired, live=None, *, fetch=True):
        self.applied.append(desired["metadata"]["name"])
        self.crds[desired["metadata"]["name"]] = copy.deepcopy(desired)
        return True


def test_check_refuses_missing_and_older_naming_the_fields_and_the_fix():
    expected = all_crds()
    with pytest.raises(CRDSchemaError, match="is not installed.*helm install"):
        ensure_crds(kube=FakeKube({}), policy="check", expected=expected)
    older = {k: copy.deepcopy(v) for k, v in expected.items()}
    del spec_schema(older[PDD])["properties"]["slo"]
    with pytest.raises(CRDSchemaError, match=r"older than this operator: it lacks v1alpha1: spec\.slo.*--crds=apply"):
        ensure_crds(kube=FakeKube(older), policy="check", expected=expected)


def test_apply_writes_only_missing_or_older_crds():
    expected = all_crds()
    kube = FakeKube({})
    ensure_crds(kube=kube, policy="apply", expected=expected)
    assert sorted(kube.applied) == sorted(c["metadata"]["name"] for c in expected.values())
    kube.applied.clear()
    ensure_crds(kube=kube, policy="apply", expected=expected)  # current: zero writes
    assert kube.applied == []
    newer = {k: copy.deepcopy(v) for k, v in expected.items()}
    spec_schema(newer[PDD])["properties"]["notes"] = {"type": "string"}
    kube = FakeKube(newer)
    ensure_crds(kube=kube, policy="apply", expected=expected)  # newer: never downgraded
    assert kube.applied == []


def test_skip_touches_nothing():
    class NoAccess:
        def __getattr__(self, name):
            raise AssertionError(f"--crds=skip must not call kube.{name}")

    ensure_crds(kube=NoAccess(), policy="skip")
    with pytest.raises(ValueError, match="unknown CRD policy"):
        ensure_crds(kube=NoAccess(), policy="always")


@pytest.mark.parametrize(("timing", "ok"), [("15,10,2", True), ("6,4,1", True), ("10,10,2", False), ("15,2,2", False),
                                             ("15,10", False), ("a,b,c", False)])
def test_leader_election_timing_is_validated(timing, ok, tmp_path):
    """``run --leader-elect-timing`` refuses what kubernetes.leaderelection would sys.exit() on later."""
    from click.testing import CliRunner

    from sglang_pd_operator.cli import main

    result = CliRunner().invoke(main, ["run", "--kubeconfig", str(tmp_path / "none"), "--leader-elect",
                                       "--operator-namespace", "ops", "--leader-elect-timing", timing, "--crds", "skip",
                                       "--metrics-port", "0"])
    if ok:  # valid: it gets as far as loading the (missing) kubeconfig
        assert "--leader-elect-timing" not in result.output, result.output
    else:
        assert result.exit_code == 2 and "--leader-elect-timing" in result.output, result.output


def test_leader_election_without_operator_namespace_uses_the_kubeconfig_namespace_else_default(tmp_path, caplog,
                                                                                               monkeypatch):
    """Leader election is on by default; with no --operator-namespace the Lease goes to the
    kubeconfig context's namespace, else ``default``, and the log says which and why."""
    import logging

    import yaml
    from click.testing import CliRunner

    from sglang_pd_operator.runtime import main as operator_main
    from sglang_pd_operator.cli import main

    for ns, expect in ((None, "default"), ("ops", "ops")):
        kubeconfig = tmp_path / f"kubeconfig-{expect}"
        context = {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})}
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": context}]}))
        caplog.clear()
        seen = {}
        monkeypatch.setattr(operator_main, "run_operator", lambda **kw: seen.update(kw))  # no cluster here
        with caplog.at_level(logging.INFO, logger="sglang_pd_operator"):
            result = CliRunner().invoke(main, ["run", "--kubeconfig", str(kubeconfig), "--crds", "skip",
                                               "--metrics-port", "0"], env={"POD_NAMESPACE": ""})
        assert result.exit_code == 0, result.output
        assert f"leader lease in namespace {expect} (" in caplog.text, caplog.text
        assert seen["leader"].namespace == expect and seen["unelected_lease"] is None


def test_an_unreachable_api_server_at_start_is_one_clear_line_and_exit_1(tmp_path, caplog):
    """``run`` whose CRD check gets no answer (here: nothing listens) refuses to run with the
    server's cause in one log line and exit code 1; before, a urllib3 traceback ended it."""
    import logging
    import socket

    import yaml
    from click.testing import CliRunner

    from sglang_pd_operator.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    with caplog.at_level(logging.ERROR, logger="sglang_pd_operator"):
        result = CliRunner().invoke(main, ["run", "--kubeconfig", str(kubeconfig), "--crds", "check",
                                           "--metrics-port", "0", "--no-leader-elect"])
    assert result.exit_code == 1, (result.output, result.exception)
    assert "refusing to run: the API server did not answer the CRD check of" in caplog.text, caplog.text
    assert "kubeconfig" in caplog.text and "Traceback" not in result.output
