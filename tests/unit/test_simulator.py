"""The SGLang engine simulator over real HTTP on loopback (tools/engine_simulator).

Each simulator runs as its own process (``engine_simulator.start_process``): its metrics
live in prometheus_client's multiprocess mode, as SGLang's do, which a process chooses
when it first imports prometheus_client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import aiohttp
import pytest

from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import bucket_width_at

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:  # not an installed package (and the repo root must not be on sys.path)
    sys.path.insert(0, str(TOOLS))

from engine_simulator import LogNormal, SimConfig, config_to_argv, parse_args, start_process  # noqa: E402
from engine_simulator.config import MODES  # noqa: E402
from loadgen import percentile, run_load, summarize  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def run(coro):
    return asyncio.run(coro)


def config(role: str, **kw) -> SimConfig:
    kw.setdefault("ttft", LogNormal(0.03, 0.2))
    kw.setdefault("prefill", LogNormal(0.02, 0.2))
    kw.setdefault("itl", LogNormal(0.004, 0.1))
    return SimConfig(role=role, host="127.0.0.1", port=0, bootstrap_port=0, model="sim/m", seed=1, **kw)


async def sse_events(resp: aiohttp.ClientResponse) -> list:
    body = (await resp.read()).decode()
    events = [e[len("data: "):] for e in body.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_info_endpoints_answer_like_sglang():
    async def main():
        sim = await start_process(config("prefill", dp_size=2))
        try:
            async with aiohttp.ClientSession() as s:
                for path in ("/health", "/health_generate", "/ready"):
                    assert (await s.get(sim.url + path)).status == 200
                info = await (await s.get(sim.url + "/get_server_info")).json()
                assert info["disaggregation_mode"] == "prefill" and info["version"] == "0.5.23"
                assert info["disaggregation_bootstrap_port"] == sim.config.bootstrap_port
                assert await (await s.get(sim.url + "/server_info")).json() == info | {
                    "internal_states": info["internal_states"]}
                model = await (await s.get(sim.url + "/get_model_info")).json()
                assert model["model_path"] == "sim/m" and model["is_generation"] is True
                models = await (await s.get(sim.url + "/v1/models")).json()
                assert models["data"][0]["id"] == "sim/m"
                loads = await (await s.get(sim.url + "/v1/loads")).json()
                assert [entry["dp_rank"] for entry in loads["loads"]] == [0, 1]
                boot = f"http://127.0.0.1:{sim.config.bootstrap_port}/health"
                assert (await s.get(boot)).status == 200      # the prefill bootstrap listener
        finally:
            await sim.close()
    run(main())


def test_decode_streams_tokens_and_records_sglang_metrics():
    async def main():
        sim = await start_process(config("decode", dp_size=4))
        try:
            async with aiohttp.ClientSession() as s:
                body = {"model": "sim/m", "messages": [{"role": "user", "content": "a b c"}], "stream": True,
                        "max_tokens": 5, "stream_options": {"include_usage": True},
                        "bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 42}
                resp = await s.post(sim.url + "/v1/chat/completions", json=body)
                chunks = await sse_events(resp)
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
                assert text == " tok0 tok1 tok2 tok3 tok4"
                assert chunks[-1]["usage"]["completion_tokens"] == 5
                full = await (await s.post(sim.url + "/v1/completions",
                                           json={"model": "sim/m", "prompt": "x", "max_tokens": 3})).json()
                assert full["choices"][0]["text"] == " tok0 tok1 tok2" and full["usage"]["completion_tokens"] == 3
                gen = await (await s.post(sim.url + "/generate",
                                          json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})).json()
                assert gen["meta_info"]["completion_tokens"] == 2
                gen_stream = await sse_events(await s.post(sim.url + "/generate", json={
                    "text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 3}}))
                assert gen_stream[-1]["text"] == " tok0 tok1 tok2"
                text = await (await s.get(sim.url + "/metrics")).text()
                state = await (await s.get(sim.url + "/simulator/state")).json()
        finally:
            await sim.close()
        assert state["pd_requests"] == [{"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998,
                                         "bootstrap_room": 42}]
        scrape = ex.parse_exposition(text)
        assert scrape.histograms[ex.TTFT].total == 4
        assert scrape.histograms[ex.ITL].total == 4 + 2 + 1 + 2     # n-1 gaps per request
        assert scrape.histograms[ex.TPOT].total == 4
        assert scrape.counters[ex.REQUESTS] == 4
        assert scrape.gauges[ex.QUEUE_REQS].series == 4                  # one per dp_rank
        assert ex.KV_TRANSFER_LATENCY_MS not in scrape.histograms       # prefill-side metric
        assert 'engine_type="decode"' in text and 'dp_rank="3"' in text
        assert "_created" not in text                                    # as SGLang's multiprocess mode
    run(main())


def test_name_filter_gives_an_empty_page_as_on_sglang():
    """SGLang serves /metrics from a registry holding only a MultiProcessCollector, so
    ``?name[]=`` (restricted_registry) answers 200 with nothing; the simulator too."""
    async def main():
        sim = await start_process(config("decode", dp_size=2))
        try:
            async with aiohttp.ClientSession() as s:
                await (await s.post(sim.url + "/generate", json={"text": "x"})).read()
                full = await (await s.get(sim.url + "/metrics")).text()
                resp = await s.get(sim.url + "/metrics", params=[("name[]", f"{ex.TTFT}_bucket"),
                                                                  ("name[]", ex.QUEUE_REQS)])
                part = await resp.read()
                status = resp.status
        finally:
            await sim.close()
        return full, part, status
    full, part, status = run(main())
    assert status == 200 and part == b""
    assert f"{ex.TTFT}_bucket{{" in full and f"{ex.QUEUE_REQS}{{" in full


def test_engine_metrics_refuse_a_process_outside_multiprocess_mode():
    from engine_simulator.metrics import EngineMetrics

    with pytest.raises(RuntimeError, match="multiprocess"):
        EngineMetrics(model_name="m", role="decode")


def test_command_line_round_trips_the_config():
    cfg = SimConfig(role="prefill", host="127.0.0.9", port=0, model="a/b", served_model_name="b",
                    bootstrap_port=0, ttft=LogNormal(0.25, 0.4), prefill=LogNormal(0.07, 0.0),
                    itl=LogNormal(0.013, 0.21), kv_transfer_ms=LogNormal(9.5, 0.1), default_max_tokens=7,
                    max_output_tokens=99, slow_factor=3.5, seed=11, dp_size=4, tp_size=2,
                    spec_accept_length=2.5, mode=MODES[-1], bootstrap_delay=1.5)
    assert parse_args(config_to_argv(cfg)) == cfg
    assert parse_args(config_to_argv(SimConfig())) == SimConfig()


def test_prefill_answers_one_token_and_records_no_ttft():
    async def main():
        sim = await start_process(config("prefill"))
        try:
            async with aiohttp.ClientSession() as s:
                req = {"text": "hi", "sampling_params": {"max_new_tokens": 50}, "bootstrap_room": 1}
                r = await (await s.post(sim.url + "/generate", json=req)).json()
                await s.post(sim.url + "/simulator/mode", json={"mode": "kv_fail"})
                assert (await s.post(sim.url + "/generate", json=req)).status == 500
                text = await (await s.get(sim.url + "/metrics")).text()
        finally:
            await sim.close()
        assert r["meta_info"]["completion_tokens"] == 1
        scrape = ex.parse_exposition(text)
        assert scrape.counters[ex.TRANSFER_FAILED] == 1
        assert ex.TTFT not in scrape.histograms and ex.ITL not in scrape.histograms
        assert scrape.histograms[ex.KV_TRANSFER_LATENCY_MS].total == 1
        assert scrape.histograms[ex.E2E].total == 1
    run(main())


def test_prefill_can_open_its_bootstrap_port_late():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def main():
        sim = await start_process(dataclasses.replace(config("prefill", bootstrap_delay=1.5), bootstrap_port=port))
        try:
            async with aiohttp.ClientSession() as s:
                assert (await s.get(sim.url + "/health")).status == 200  # the engine answers at once
                with pytest.raises(aiohttp.ClientConnectorError):
                    await s.get(f"http://127.0.0.1:{port}/health")
                await asyncio.sleep(2.5)
                assert (await s.get(f"http://127.0.0.1:{port}/health")).status == 200
        finally:
            await sim.close()
    run(main())


def test_modes_switch_at_run_time():
    async def main():
        sim = await start_process(config("aggregated", ttft=LogNormal(0.02, 0.0), slow_factor=10.0))
        try:
            async with aiohttp.ClientSession() as s:
                req = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
                fast = await (await s.post(sim.url + "/generate", json=req)).json()
                r = await s.post(sim.url + "/simulator/mode", json={"mode": "slow"})
                assert (await r.json())["mode"] == "slow"
                slow = await (await s.post(sim.url + "/generate", json=req)).json()
                await s.post(sim.url + "/simulator/mode", json={"mode": "fail"})
                assert (await s.post(sim.url + "/generate", json=req)).status == 503
                assert (await s.get(sim.url + "/health")).status == 503
                assert (await s.post(sim.url + "/simulator/mode", json={"mode": "nope"})).status == 400
                await s.post(sim.url + "/simulator/mode", json={"mode": "kv_fail"})
                # an aggregated server transfers no KV cache: kv_fail changes nothing
                assert (await s.post(sim.url + "/generate", json=req)).status == 200
                text = await (await s.get(sim.url + "/metrics")).text()
        finally:
            await sim.close()
        # TTFT is exactly 20 ms (sigma 0) in normal mode and 200 ms in slow mode
        assert fast["meta_info"]["e2e_latency"] < slow["meta_info"]["e2e_latency"]
        assert slow["meta_info"]["e2e_latency"] >= 0.2
        ttft = ex.parse_exposition(text).histograms[ex.TTFT]
        assert ttft.counts[ttft.bounds.index(0.1)] == 2 and ttft.total == 3    # 20 ms twice, 200 ms once
        assert ttft.counts[ttft.bounds.index(0.2)] == 3
        assert ex.parse_exposition(text).counters[ex.TRANSFER_FAILED] == 0
    run(main())


def test_loadgen_percentiles_agree_with_the_simulator_histograms():
    """Client-side percentiles vs the percentile the operator computes from /metrics.

    Bound: one histogram bucket (where the server-side estimate interpolates) plus the
    client's extra time (HTTP + event loop, a few ms on loopback)."""
    async def main():
        sim = await start_process(config("aggregated", ttft=LogNormal(0.25, 0.4), itl=LogNormal(0.01, 0.2)))
        try:
            results = await run_load(url=sim.url, model="sim/m", requests=60, concurrency=12, max_tokens=6)
            async with aiohttp.ClientSession() as s:
                text = await (await s.get(sim.url + "/metrics")).text()
        finally:
            await sim.close()
        return results, text
    results, text = run(main())
    summary = summarize(results)
    assert summary["succeeded"] == 60 and summary["itl_seconds"]["count"] == 60 * 5
    server = ex.parse_exposition(text).histograms[ex.TTFT]
    client_p90 = summary["ttft_seconds"]["p90"]
    server_p90 = server.quantile(0.9)
    assert abs(client_p90 - server_p90) <= bucket_width_at(client_p90, server.bounds) + 0.05


def test_percentile_helper():
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([5.0], 0.99) == 5.0


# --------------------------------------------------------------------------- the load model (--load-model)
def _gauges(text: str) -> dict[str, float]:
    return {name: g.sum for name, g in ex.parse_exposition(text).gauges.items()}


async def _pd_request(s: aiohttp.ClientSession, prefill, decode, room: int, max_tokens: int) -> tuple[float, list]:
    """What smg does: the same body with bootstrap fields to both roles at once; decode's stream is the
    answer. Returns (client TTFT, decode's SSE chunks)."""
    body = {"model": "sim/m", "prompt": "x", "max_tokens": max_tokens, "stream": True,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.config.bootstrap_port, "bootstrap_room": room}
    t0 = asyncio.get_running_loop().time()
    pre = asyncio.create_task(s.post(prefill.url + "/v1/completions", json=body))
    resp = await s.post(decode.url + "/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    first = None
    raw = b""
    async for chunk in resp.content.iter_any():
        first = first if first is not None else asyncio.get_running_loop().time() - t0
        raw += chunk
    p = await pre
    assert p.status == 200
    await p.read()
    return first, [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]


def test_load_model_queues_at_prefill_and_decode_ttft_grows_with_it():
    """One prefill slot of 100 ms and 8 PD requests at once: they queue at prefill (waiting, and in
    bootstrap until decode pre-allocates), decode waits in its transfer queue, and decode's TTFT
    (what the operator reads) grows by about one prefill time per place in the queue."""
    async def main():
        prefill = await start_process(config("prefill", prefill=LogNormal(0.1, 0.0), load_model=True,
                                             prefill_slots=1, kv_transfer_ms=LogNormal(2.0, 0.0)))
        decode = await start_process(config("decode", itl=LogNormal(0.002, 0.0), load_model=True, max_running=64))
        try:
            async with aiohttp.ClientSession() as s:
                tasks = [asyncio.create_task(_pd_request(s, prefill, decode, i, 4)) for i in range(8)]
                await asyncio.sleep(0.25)
                busy = (_gauges(await (await s.get(prefill.url + "/metrics")).text()),
                        _gauges(await (await s.get(decode.url + "/metrics")).text()))
                done = await asyncio.gather(*tasks)
                idle = (_gauges(await (await s.get(prefill.url + "/metrics")).text()),
                        _gauges(await (await s.get(decode.url + "/metrics")).text()))
                ttft = ex.parse_exposition(await (await s.get(decode.url + "/metrics")).text()).histograms[ex.TTFT]
        finally:
            await prefill.close()
            await decode.close()
        return busy, idle, done, ttft
    (p_busy, d_busy), (p_idle, d_idle), done, ttft = run(main())
    assert p_busy[ex.RUNNING_REQS] == 1 and p_busy[ex.QUEUE_REQS] >= 4, p_busy   # one slot, the rest wait
    assert d_busy[ex.DECODE_TRANSFER_QUEUE] >= 5 and d_busy[ex.DECODE_PREALLOC_QUEUE] == 0, d_busy
    assert all(p_idle[g] == 0 for g in (ex.RUNNING_REQS, ex.QUEUE_REQS, ex.PREFILL_BOOTSTRAP_QUEUE,
                                        ex.PREFILL_INFLIGHT_QUEUE)), p_idle
    assert d_idle[ex.DECODE_TRANSFER_QUEUE] == 0 and d_idle[ex.RUNNING_REQS] == 0
    firsts = sorted(t for t, _ in done)
    assert firsts[0] < 0.3 and firsts[-1] >= 8 * 0.1, firsts   # the eighth waits seven prefills
    assert [len([c for c in chunks if c["choices"] and c["choices"][0]["text"]]) for _, chunks in done] == [4] * 8, done[0]
    assert ttft.total == 8 and ttft.quantile(0.9) >= 0.6


def test_load_model_itl_grows_with_the_decode_batch_and_full_kv_waits_in_prealloc():
    """A decode step takes ITL x (1 + slope x (running - 1)): 8 requests at once stream slower than
    one alone; with KV for 3 requests, the others wait in the prealloc queue (token_usage 1)."""
    async def main():
        decode = await start_process(config("decode", ttft=LogNormal(0.01, 0.0), itl=LogNormal(0.01, 0.0),
                                            load_model=True, max_running=3, itl_batch_slope=0.5))
        try:
            async with aiohttp.ClientSession() as s:
                req = {"model": "sim/m", "prompt": "x", "max_tokens": 6}
                alone = await (await s.post(decode.url + "/v1/completions", json=req)).json()
                tasks = [asyncio.create_task(s.post(decode.url + "/v1/completions", json=req)) for _ in range(8)]
                await asyncio.sleep(0.05)
                busy = _gauges(await (await s.get(decode.url + "/metrics")).text())
                for t in tasks:
                    assert (await t).status == 200
                text = await (await s.get(decode.url + "/metrics")).text()
        finally:
            await decode.close()
        return alone, busy, text
    alone, busy, text = run(main())
    assert busy[ex.DECODE_PREALLOC_QUEUE] == 5 and busy[ex.RUNNING_REQS] == 3 and busy[ex.TOKEN_USAGE] == 1.0
    itl = ex.parse_exposition(text).histograms[ex.ITL]
    # alone: 5 gaps of 10 ms; three at once: 10 ms x (1 + 0.5 x 2) = 20 ms
    assert itl.total == 9 * 5
    slow = itl.total - itl.counts[itl.bounds.index(0.015)]   # cumulative: gaps above 15 ms
    assert itl.counts[itl.bounds.index(0.01)] >= 5 and slow >= 20, (itl.counts, slow)


def test_loadgen_trace_arrivals_follow_the_rate():
    from loadgen import arrivals, parse_trace, rate_at

    points = parse_trace("0:2,60:2,60:8,120:8")
    assert rate_at(points, 30) == 2 and rate_at(points, 60) == 8 and rate_at(points, 200) == 0
    times = arrivals(points, seed=3)
    before, after = sum(t < 60 for t in times), sum(t >= 60 for t in times)
    assert 90 <= before <= 150 and 400 <= after <= 560      # 120 and 480 expected, Poisson
    assert times == sorted(times) and arrivals(points, seed=3) == times
    with pytest.raises(ValueError, match="t:rate"):
        parse_trace("0:2,x")
    with pytest.raises(ValueError, match="non-decreasing"):
        parse_trace("10:2,5:3")


def test_load_model_handshakes_are_not_capped_by_a_connection_pool():
    """120 PD requests at once, KV memory for all: every decode handshake reaches prefill at once, so
    prefill's bootstrap queue (decode short of KV memory) is empty while its waiting queue is long.
    (An HTTP pool of 100 connections on decode's side once showed as a bootstrap queue: 20 requests
    stuck there until 80 had finished, i.e. never empty while 30 or more wait.)

    No fixed sleep: prefill's gauges are polled until a moment with 30 or more requests waiting
    and none in the bootstrap queue is seen, or every request is done; a loaded machine only makes
    the moment come later (prefill works one 250 ms forward at a time: the queue builds whenever
    handshakes come faster than 4 a second, and the test ends as soon as the moment is seen)."""
    async def main():
        prefill = await start_process(config("prefill", prefill=LogNormal(0.25, 0.0), load_model=True,
                                             kv_transfer_ms=LogNormal(1.0, 0.0)))
        decode = await start_process(config("decode", itl=LogNormal(0.001, 0.0), load_model=True, max_running=256))
        seen = []
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                tasks = [asyncio.create_task(_pd_request(s, prefill, decode, i, 2)) for i in range(120)]
                done = asyncio.ensure_future(asyncio.gather(*tasks))
                while not done.done():
                    g = _gauges(await (await s.get(prefill.url + "/metrics")).text())
                    seen.append(g)
                    if g[ex.QUEUE_REQS] >= 30 and g[ex.PREFILL_BOOTSTRAP_QUEUE] == 0:
                        done.cancel()  # seen: the rest of the requests prove nothing more
                        break
                    await asyncio.sleep(0.02)  # a polling pace, not a proof
                await asyncio.gather(done, return_exceptions=True)
        finally:
            await prefill.close()
            await decode.close()
        return seen
    seen = run(main())
    assert any(g[ex.QUEUE_REQS] >= 30 and g[ex.PREFILL_BOOTSTRAP_QUEUE] == 0 for g in seen), \
        [(g[ex.QUEUE_REQS], g[ex.PREFILL_BOOTSTRAP_QUEUE]) for g in seen]
