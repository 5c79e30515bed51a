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
