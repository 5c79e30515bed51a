"""The REAL smg 1.13.0 gateway in PD mode routing through two engine simulators.

Starts a prefill and a decode simulator (tools/engine_simulator) and ``smg launch
--pd-disaggregation`` with static worker URLs on 127.0.0.1, then checks that smg
registers both (it probes /health, /v1/models, /server_info, /model_info, /v1/loads and
the prefill's bootstrap port), that a chat completion goes through, and that smg sent
the same request with the same ``bootstrap_room`` to both workers. Skipped when the
``smg`` command is not installed (``pip install smg==1.13.0``; set SMG_BIN to use another
path). Everything is bounded: each wait has a deadline, every process is stopped.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.contract, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def smg_binary() -> str:
    path = os.environ.get("SMG_BIN") or shutil.which("smg") or str(Path(sys.executable).with_name("smg"))
    if not os.access(path, os.X_OK):
        pytest.skip("smg==1.13.0 is not installed (pip install smg==1.13.0, or set SMG_BIN)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post(url: str, body: dict, timeout: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def wait_for(check, *, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            result = check()
            if result:
                return result
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as err:
            last = err
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


@pytest.fixture
def pd_stack(tmp_path):
    smg = smg_binary()
    ports = {k: free_port() for k in ("prefill", "decode", "bootstrap", "gateway", "prom")}
    procs: list[subprocess.Popen] = []
    logs = {}

    def start(name: str, cmd: list[str], cwd: Path) -> None:
        logs[name] = tmp_path / f"{name}.log"
        procs.append(subprocess.Popen(cmd, cwd=cwd, stdout=logs[name].open("w"), stderr=subprocess.STDOUT))

    sim = [sys.executable, str(ROOT / "tools" / "engine_simulator"), "--host", "127.0.0.1", "--model", "sim/model",
           "--ttft-median", "0.05", "--itl-median", "0.005"]
    start("prefill", sim + ["--role", "prefill", "--port", str(ports["prefill"]),
                            "--bootstrap-port", str(ports["bootstrap"])], ROOT)
    start("decode", sim + ["--role", "decode", "--port", str(ports["decode"])], ROOT)
    for role in ("prefill", "decode"):
        wait_for(lambda r=role: urllib.request.urlopen(f"http://127.0.0.1:{ports[r]}/health", timeout=2).status
                 == 200, deadline_s=20, what=f"{role} simulator")
    start("smg", [smg, "launch", "--pd-disaggregation",
                  "--prefill", f"http://127.0.0.1:{ports['prefill']}", str(ports["bootstrap"]),
                  "--decode", f"http://127.0.0.1:{ports['decode']}",
                  "--host", "127.0.0.1", "--port", str(ports["gateway"]),
                  "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ports["prom"]),
                  "--policy", "round_robin"], tmp_path)
    try:
        yield ports, logs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_smg_registers_and_routes_through_simulators(pd_stack):
    ports, logs = pd_stack
    gw = f"http://127.0.0.1:{ports['gateway']}"

    def both_ready():
        workers = get_json(gw + "/workers")["workers"]
        ready = {w["worker_type"]: w for w in workers if w.get("is_healthy") and w.get("status") == "ready"}
        return ready if {"prefill", "decode"} <= set(ready) else None

    workers = wait_for(both_ready, deadline_s=60, what="smg to register the prefill and decode simulators")
    assert workers["prefill"]["url"] == f"http://127.0.0.1:{ports['prefill']}"
    assert workers["prefill"]["bootstrap_port"] == ports["bootstrap"]
    assert workers["decode"]["labels"]["disaggregation_mode"] == "decode"

    status, body = post(gw + "/v1/chat/completions", {
        "model": "sim/model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == " tok0 tok1 tok2 tok3"
    status, body = post(gw + "/v1/chat/completions", {
        "model": "sim/model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "stream": True})
    events = [e for e in body.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) == 4

    prefill = get_json(f"http://127.0.0.1:{ports['prefill']}/simulator/state")
    decode = get_json(f"http://127.0.0.1:{ports['decode']}/simulator/state")
    # smg sends the same request, with the same bootstrap room, to both legs
    rooms_p = [r["bootstrap_room"] for r in prefill["pd_requests"]]
    rooms_d = [r["bootstrap_room"] for r in decode["pd_requests"]]
    assert len(rooms_d) == 2 and sorted(rooms_p) == sorted(rooms_d)
    assert {r["bootstrap_port"] for r in decode["pd_requests"]} == {ports["bootstrap"]}
    # what smg asked during registration
    for path in ("GET /server_info", "GET /model_info", "GET /v1/loads"):
        assert decode["requests"].get(path, 0) >= 1, (path, decode["requests"])
    assert "Bootstrap port did not accept" not in logs["smg"].read_text()


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def test_smg_readiness_is_200_only_with_a_prefill_and_a_decode_worker(pd_stack):
    """The operator's gateway readinessProbe is smg's /readiness (render/gateway.py): 200 once both
    simulators are registered. /health is 200 from the start, which is why it is not the probe."""
    ports, _ = pd_stack
    gw = f"http://127.0.0.1:{ports['gateway']}"
    wait_for(lambda: status_of(gw + "/readiness") == 200, deadline_s=60, what="smg /readiness to answer 200")
    assert status_of(gw + "/health") == 200


def test_smg_readiness_is_503_with_a_prefill_worker_alone(tmp_path):
    """smg 1.13.0 in PD mode with a prefill registered and its decode worker not up: /health answers
    200 (so a /health probe would send traffic to a gateway that fails every request), /readiness 503."""
    smg = smg_binary()
    ports = {k: free_port() for k in ("prefill", "decode", "bootstrap", "gateway", "prom")}
    procs: list[subprocess.Popen] = []
    try:
        sim = [sys.executable, str(ROOT / "tools" / "engine_simulator"), "--host", "127.0.0.1", "--model", "sim/model"]
        procs.append(subprocess.Popen(sim + ["--role", "prefill", "--port", str(ports["prefill"]),
                                             "--bootstrap-port", str(ports["bootstrap"])], cwd=ROOT,
                                      stdout=(tmp_path / "prefill.log").open("w"), stderr=subprocess.STDOUT))
        wait_for(lambda: status_of(f"http://127.0.0.1:{ports['prefill']}/health") == 200, deadline_s=20,
                 what="prefill simulator")
        procs.append(subprocess.Popen([smg, "launch", "--pd-disaggregation",
                                       "--prefill", f"http://127.0.0.1:{ports['prefill']}", str(ports["bootstrap"]),
                                       "--decode", f"http://127.0.0.1:{ports['decode']}",
                                       "--host", "127.0.0.1", "--port", str(ports["gateway"]),
                                       "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ports["prom"])],
                                      cwd=tmp_path, stdout=(tmp_path / "smg.log").open("w"), stderr=subprocess.STDOUT))
        gw = f"http://127.0.0.1:{ports['gateway']}"

        def prefill_registered():
            workers = get_json(gw + "/workers")["workers"]
            return any(w["worker_type"] == "prefill" and w.get("is_healthy") for w in workers)

        wait_for(prefill_registered, deadline_s=60, what="smg to register the prefill simulator")
        assert status_of(gw + "/health") == 200
        assert status_of(gw + "/readiness") == 503
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
