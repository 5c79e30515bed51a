"""The README's main job, as a newcomer runs it: ``sglang-pd-operator dev demo --once`` (what hack/demo.sh execs).

It starts its own control plane in a private run directory, applies the GB300 example and
must print the resolved plan, Ready, the status and every child object, then stop
everything (exit 0). With an example the operator refuses it must say so as soon as the
refusal is in status (Valid=False, nothing created), not after its 120 s Ready timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import GB300_EXAMPLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
CLI = [sys.executable, "-m", "sglang_pd_operator.cli"]


def _demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    res = subprocess.run([*CLI, "dev", "demo", "--once", "--run-dir", str(tmp_path / "demo"), *args], cwd="/",
                         capture_output=True, text=True, timeout=540, env={**os.environ, "PYTHONSAFEPATH": "1"})
    return res, time.monotonic() - started


def test_the_demo_converges_prints_what_the_readme_promises_and_stops(tmp_path):
    res, took = _demo(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    for promised in ("== the resolved plan", "valid", "== Ready after", "== status", "== child objects",
                     "deployment.apps/", "service/", "configmap/", "decode role's SGLang config file",
                     "== SGLang oracle service ready", "Valid: SGLangAccepted: SGLang 0.5.23"):
        assert promised in out, (promised, out[-3000:])
    assert "cluster: stopped" in out, "the demo must stop its control plane"
    print(f"demo --once: exit 0 after {took:.1f}s")


def test_the_demo_reports_a_refused_example_at_once(tmp_path):
    doc = yaml.safe_load(GB300_EXAMPLE.read_text())
    doc["spec"]["decode"]["parallelism"]["tp"] = 2  # sgl-nvidia-mega is built for TP 4: refused by the operator
    bad = tmp_path / "refused.yaml"
    bad.write_text(yaml.safe_dump(doc))
    res, took = _demo(tmp_path, "--example", str(bad))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "refused" in out and "Valid=False" in out and "spec.decode.parallelism" in out, out[-3000:]
    assert "timed out" not in out, out[-3000:]
    print(f"demo --once with a refused example: exit 1 after {took:.1f}s")


def test_the_demo_keeps_its_cluster_when_its_operator_is_stopped(tmp_path):
    """The README invites a failover test (a second `run` takes over when the leader goes
    away). Stopping the demo's operator (kill -TERM) must leave the demo and its cluster up,
    say so, and the demo must still stop everything on Ctrl-C (exit 0)."""
    import re
    import signal

    out_path = tmp_path / "demo.out"
    with open(out_path, "w") as out:
        demo = subprocess.Popen([*CLI, "dev", "demo", "--run-dir", str(tmp_path / "demo")], cwd="/", stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        def wait_for(what: str, timeout: float) -> str:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                text = out_path.read_text()
                if what in text:
                    return text
                assert demo.poll() is None, f"the demo exited ({demo.returncode}) before {what!r}:\n{text[-3000:]}"
                time.sleep(0.5)
            raise AssertionError(f"no {what!r} in {timeout:.0f}s:\n{out_path.read_text()[-3000:]}")

        text = wait_for("== running until Ctrl-C", 420)
        pid = int(re.search(r"== operator running \(pid (\d+)", text).group(1))
        os.kill(pid, signal.SIGTERM)
        text = wait_for(f"== the demo's operator (pid {pid})", 60)
        assert "error: the operator exited" not in text and "cluster: stopped" not in text, text[-3000:]
        assert "The cluster stays up until Ctrl-C" in text and "Lease default/sglang-pd-operator" in text
        time.sleep(3)
        assert demo.poll() is None, out_path.read_text()[-3000:]
        kubeconfig = tmp_path / "demo" / "kubeconfig"
        kubectl = re.search(r"   kubectl: (\S+/kubectl) ", text).group(1)
        pdd = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "pdd", "-A", "-o", "name"],
                             capture_output=True, text=True, timeout=60)
        assert pdd.returncode == 0 and "pddeployment" in pdd.stdout, pdd.stdout + pdd.stderr  # the cluster answers
        demo.send_signal(signal.SIGINT)  # Ctrl-C
        assert demo.wait(timeout=120) == 0, out_path.read_text()[-3000:]
        assert "cluster: stopped" in out_path.read_text()
    finally:
        if demo.poll() is None:  # a failed assertion: stop the demo the way a person does, so it stops its cluster
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait(timeout=30)
