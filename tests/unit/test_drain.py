"""Drain, not kill (issue 25, items 3 and 4): what engine and gateway pods are rendered with, and
the rendered preStop program run for real against the engine simulator.

The hook is the exact ``command`` the renderer puts in the pod (``python3 -c <script> port
grace settle gauges...``), run here as the kubelet would run it; the simulator exports
SGLang's gauges under SGLang's names (held to real SGLang by
tests/contract/test_sglang_metrics_contract.py). It must wait while a request is in flight,
return soon after it finished, return at once when nothing serves, and never outlast the grace.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from helpers import EXAMPLES, load_example

from sglang_pd_operator.planning.plan import plan_object
from sglang_pd_operator.render import drain, render_group

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from engine_simulator import LogNormal, SimConfig, start_process  # noqa: E402

EXAMPLE = EXAMPLES / "dsv41-flash-h200-flashmla.yaml"


def _objects(catalog, drain_grace: str | None = None):
    doc = load_example(EXAMPLE)
    if drain_grace:
        doc["spec"].setdefault("rollout", {})["drainGracePeriod"] = drain_grace
    plan, _ = plan_object(doc, catalog)
    return {o["metadata"]["labels"]["pd.sglang-operator.io/role"]: o for o in render_group(plan)
            if o["kind"] == "Deployment"}


@pytest.mark.parametrize("grace,engine_tgps,gateway_tgps", [(None, 120, 70), ("300s", 360, 310)])
def test_engine_and_gateway_pods_drain_within_the_grace_their_termination_grace_matches(
        catalog, grace, engine_tgps, gateway_tgps):
    deps = _objects(catalog, grace)
    seconds = 60 if grace is None else 300
    for role in ("prefill", "decode"):
        pod = deps[role]["spec"]["template"]["spec"]
        cmd = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
        assert cmd[:3] == ["python3", "-c", drain.DRAIN_SCRIPT]
        assert cmd[3:7] == ["127.0.0.1", "30000", str(seconds), str(drain.SETTLE_S)]
        assert tuple(cmd[7:]) == drain.ENGINE_GAUGES
        assert pod["terminationGracePeriodSeconds"] == engine_tgps
    gw = deps["gateway"]["spec"]["template"]["spec"]
    c = gw["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}  # smg registered both roles
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[4] == "29000" and tuple(cmd[7:]) == drain.GATEWAY_GAUGES
    assert gw["terminationGracePeriodSeconds"] == gateway_tgps


def _hook(port: int, grace: int, settle: int = 0, gauges=drain.ENGINE_GAUGES) -> subprocess.Popen:
    cmd = drain.prestop(port=port, drain_grace_s=grace, gauges=gauges)["preStop"]["exec"]["command"]
    cmd = [sys.executable, *cmd[1:6], str(settle), *cmd[7:]]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_hook_waits_for_the_request_in_flight_and_no_longer():
    async def main():
        sim = await start_process(SimConfig(role="aggregated", host="127.0.0.1", port=0, model="sim/m", seed=1,
                                            ttft=LogNormal(0.05, 0.0), itl=LogNormal(0.1, 0.0)))
        try:
            port = int(sim.url.rsplit(":", 1)[1])
            async with aiohttp.ClientSession() as s:
                request = asyncio.ensure_future(s.post(sim.url + "/v1/completions",
                                                       json={"model": "sim/m", "prompt": "x", "max_tokens": 30}))
                await asyncio.sleep(0.5)  # in flight: ~3 s of tokens
                t0 = time.monotonic()
                hook = _hook(port, grace=30)
                while hook.poll() is None:
                    await asyncio.sleep(0.1)
                waited = time.monotonic() - t0
                response = await request
                assert response.status == 200 and request.done()
                out = hook.stdout.read()
            assert hook.returncode == 0 and "idle" in out, out
            assert 1.5 < waited < 8, waited  # waited for the ~2.5 s left, then two quiet polls
            # idle now: the hook returns after two quiet polls
            t0 = time.monotonic()
            hook = _hook(port, grace=30)
            hook.wait(timeout=20)
            assert time.monotonic() - t0 < 3
        finally:
            await sim.close()

    asyncio.run(main())


def test_the_hook_never_outlasts_the_grace_and_returns_at_once_without_a_server():
    async def main():
        sim = await start_process(SimConfig(role="aggregated", host="127.0.0.1", port=0, model="sim/m", seed=1,
                                            ttft=LogNormal(0.05, 0.0), itl=LogNormal(0.5, 0.0)))
        try:
            port = int(sim.url.rsplit(":", 1)[1])
            async with aiohttp.ClientSession() as s:
                request = asyncio.ensure_future(s.post(sim.url + "/v1/completions",
                                                       json={"model": "sim/m", "prompt": "x", "max_tokens": 40}))
                await asyncio.sleep(0.5)
                t0 = time.monotonic()
                hook = _hook(port, grace=2)
                while hook.poll() is None:
                    await asyncio.sleep(0.1)
                assert time.monotonic() - t0 < 4 and "grace period over" in hook.stdout.read()
                request.cancel()
        finally:
            await sim.close()

    asyncio.run(main())
    t0 = time.monotonic()
    hook = _hook(1, grace=30)  # nothing listens on port 1
    hook.wait(timeout=10)
    assert hook.returncode == 0 and time.monotonic() - t0 < 3
