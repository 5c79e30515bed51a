"""``sglang-pd-operator oracle serve`` on the real SGLang 0.5.23: the served verdict is ``check --sglang``'s.

The service process runs as in the cluster (warm gb300 worker, /readyz), and every answer
is compared field for field with ``check --sglang -o json`` on the same file: one spec SGLang
accepts, and one the operator's rules accept but SGLang refuses (LoRA on decode without a
rank: SGLang's lora_hook refuses it at startup). A worker killed mid-service gives 503
(no verdict), then the next request is judged by a fresh worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.contract, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).with_name("sglang-pd-operator"))
ENV = {**os.environ, "PYTHONSAFEPATH": "1"}

#: Accepted by the operator's rules (``check`` exit 0), refused by SGLang at startup.
REFUSED_BY_SGLANG_ONLY = ("decode", ["--enable-lora"], "you need to specify both --max-lora-rank and --lora-target-modules")


def refused_by_sglang_only(doc: dict) -> dict:
    """``doc`` with the flag the rules accept and SGLang refuses (:data:`REFUSED_BY_SGLANG_ONLY`)."""
    role, flags, _ = REFUSED_BY_SGLANG_ONLY
    doc["spec"][role]["extraArgs"] = [*doc["spec"][role].get("extraArgs", []), *flags]
    return doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service():
    port = _free_port()
    proc = subprocess.Popen([EXE, "oracle", "serve", "--host", "127.0.0.1", "--port", str(port), "--warm", "gb300"],
                            env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("oracle serve was not ready in 300 s")
    yield port, proc
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("oracle serve did not stop on SIGTERM")


def ask(port: int, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/verdict", data=json.dumps({"object": doc}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def check_sglang(doc: dict, tmp_path: Path) -> tuple[int, dict]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run([EXE, "check", "--sglang", "-o", "json", str(path)], capture_output=True, text=True,
                         env=ENV, cwd=ROOT, timeout=900)
    return out.returncode, json.loads(out.stdout)


def _without_seconds(verdict: dict) -> dict:
    """The verdict without its timing and the bootstrap servers' ephemeral ports (hosts stay)."""
    out = {k: v for k, v in verdict.items() if k != "seconds"}
    out["pair"] = {**out["pair"], "prefillRanks": [r.rsplit(":", 1)[0] for r in out["pair"]["prefillRanks"]]}
    return out


@pytest.mark.parametrize("refused", [False, True], ids=["accepted", "refused-by-sglang-only"])
def test_the_served_verdict_is_check_sglangs(service, tmp_path, refused):
    port, _ = service
    doc = yaml.safe_load((ROOT / "examples" / "dsv41-flash-gb300-low-latency.yaml").read_text())
    if refused:
        doc = refused_by_sglang_only(doc)
    code, served = ask(port, doc)
    assert code == 200, served
    exit_code, checked = check_sglang(doc, tmp_path)
    assert _without_seconds(served["sglang"]) == _without_seconds(checked["sglang"])
    for role in ("prefill", "decode"):  # each assumption once (a target and its draft ask the same probes)
        assumes = checked["sglang"][role].get("assumes") or []
        assert len(assumes) == len(set(assumes)), assumes
    assert served["valid"] is checked["valid"] is True  # the operator's rules accept both
    if refused:
        assert exit_code == 1 and served["sglang"]["accepted"] is False
        assert REFUSED_BY_SGLANG_ONLY[2] in served["sglang"]["decode"]["refusal"]["message"]
        assert served["sglang"]["decode"]["refusal"]["stage"]
    else:
        assert exit_code == 0 and served["sglang"]["accepted"] is True
    again_code, again = ask(port, doc)
    assert again_code == 200 and again["oracle"]["cached"] is True and again["sglang"] == served["sglang"]


def test_a_worker_killed_mid_service_gives_no_verdict_then_a_fresh_worker(service):
    port, proc = service
    workers = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "sglang_pd_operator.oracle.worker"],
                             capture_output=True, text=True).stdout.split()
    assert workers, "the warm worker runs as a child of the service"
    for pid in workers:
        os.kill(int(pid), signal.SIGKILL)
    doc = yaml.safe_load((ROOT / "examples" / "dsv41-flash-gb300-low-latency.yaml").read_text())
    doc["spec"]["decode"]["extraArgs"] = ["--chunked-prefill-size", "8192"]  # not in the cache
    code, body = ask(port, doc)
    if code == 503:  # the dead worker answered first: no verdict, never a verdict made up
        assert "no verdict" in body["error"]
        code, body = ask(port, doc)
    assert code == 200 and body["sglang"]["accepted"] is True
