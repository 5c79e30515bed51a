"""Bounded load against an OpenAI-compatible endpoint, with client-side latency figures.

Sends exactly ``--requests`` streaming ``/v1/chat/completions`` (or ``/v1/completions``)
requests at ``--concurrency`` in flight, and measures per request, on the client:

- TTFT: from sending the request to the first SSE chunk that carries text (seconds);
- ITL: the gap between consecutive text-carrying chunks, divided by the tokens the later
  chunk carried when the server reports usage (else one token per chunk) (seconds);
- per-user speed: (output tokens - 1) / (last token time - first token time), tokens/s,
  the reciprocal of SGLang's per-request TPOT;
- end-to-end latency (seconds).

It prints p50/p90/p99 of each and writes everything (summary and per-request samples) as
JSON with ``--out``. Usable against a real deployment (the smg gateway Service, port-
forwarded) as well as against the engine simulator. Percentiles are exact order
statistics of the samples (nearest-rank on the sorted list, linear interpolation), not
histogram estimates.

Run: ``python tools/loadgen.py --url http://127.0.0.1:30000 --model M --requests 200
--concurrency 8 --max-tokens 64 --out load.json``. Only the standard library and aiohttp.

Open loop (``--trace``): instead of a fixed number of requests at a fixed concurrency,
requests arrive as a Poisson process whose rate follows a trace, ``t:rate`` points
(seconds from the start : requests per second) joined linearly, e.g. ``0:2,60:2,60:8,180:8``
(a step from 2 to 8 req/s at 60 s, for 180 s). Arrivals do not wait for answers, as users
do not, so queueing in the server shows in the latencies. Each sample carries ``sent_at``
(seconds from the start), for figures per stretch of time (benchmarks/bench_autoscale.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from dataclasses import replace as dataclasses_replace

import aiohttp


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds, ``error`` set on failure."""

    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    speed: float | None = None
    status: int | None = None
    error: str | None = None
    sent_at: float | None = None


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of ``values`` by linear interpolation between order statistics."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _chunk_text(obj: dict) -> str:
    text = ""
    for choice in obj.get("choices") or []:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text += delta.get("content") or delta.get("reasoning_content") or ""
        else:
            text += choice.get("text") or ""
    return text


async def one_request(session: aiohttp.ClientSession, *, url: str, model: str, prompt: str, max_tokens: int,
                      chat: bool, timeout_s: float) -> RequestResult:
    """Send one streaming request and time it (see the module doc)."""
    if chat:
        path = "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    else:
        path = "/v1/completions"
        body = {"model": model, "prompt": prompt}
    body.update({"max_tokens": max_tokens, "stream": True, "temperature": 0.0,
                 "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    token_times: list[float] = []
    usage_tokens = None
    try:
        async with session.post(url.rstrip("/") + path, json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return RequestResult(ok=False, status=resp.status, error=(await resp.text())[:300])
            buffer = b""
            async for raw in resp.content.iter_any():
                now = time.perf_counter()
                buffer += raw
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            continue
                        obj = json.loads(data)
                        if obj.get("usage"):
                            usage_tokens = obj["usage"].get("completion_tokens")
                        if _chunk_text(obj):
                            token_times.append(now)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
        return RequestResult(ok=False, error=f"{type(err).__name__}: {err}")
    end = time.perf_counter()
    if not token_times:
        return RequestResult(ok=False, status=200, error="no token in the stream", e2e=end - t0)
    chunks = len(token_times)
    tokens = usage_tokens if usage_tokens else chunks
    per_chunk = max(1.0, tokens / chunks)
    itls = [(b - a) / per_chunk for a, b in zip(token_times, token_times[1:])]
    decode_time = token_times[-1] - token_times[0]
    speed = (tokens - 1) / decode_time if tokens > 1 and decode_time > 0 else None
    return RequestResult(ok=True, ttft=token_times[0] - t0, e2e=end - t0, itls=itls, output_tokens=tokens,
                         speed=speed, status=200)


async def run_load(*, url: str, model: str, requests: int, concurrency: int, max_tokens: int,
                   prompt: str = "Explain prefill/decode disaggregation in one paragraph.", chat: bool = True,
                   timeout_s: float = 120.0) -> list[RequestResult]:
    """Send ``requests`` requests with at most ``concurrency`` in flight; results in send order."""
    if requests < 1 or concurrency < 1:
        raise ValueError("requests and concurrency must be >= 1")
    results: list[RequestResult | None] = [None] * requests
    next_index = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                i = next_index
                next_index += 1
                results[i] = await one_request(session, url=url, model=model, prompt=f"{prompt} (#{i})",
                                               max_tokens=max_tokens, chat=chat, timeout_s=timeout_s)
        await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    return [r for r in results if r is not None]


def parse_trace(text: str) -> list[tuple[float, float]]:
    """``"t:rate,t:rate,..."`` -> [(seconds, requests/s)], times non-decreasing, rates >= 0.

    Raises ValueError naming the bad point."""
    points = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            t, rate = (float(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"trace point {part!r} is not t:rate (seconds:requests per second)") from None
        if rate < 0 or (points and t < points[-1][0]):
            raise ValueError(f"trace point {part!r}: rates must be >= 0 and times non-decreasing")
        points.append((t, rate))
    if len(points) < 2:
        raise ValueError("a trace needs at least two points (start and end)")
    return points


def rate_at(points: list[tuple[float, float]], t: float) -> float:
    """The trace's rate at ``t`` (linear between points; the last point's rate wins at equal times)."""
    for (t0, r0), (t1, r1) in zip(points, points[1:]):
        if t0 <= t < t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
    return points[-1][1] if t <= points[-1][0] else 0.0


def arrivals(points: list[tuple[float, float]], *, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of a Poisson process following the trace (thinning)."""
    rng = random.Random(seed)
    peak = max(r for _, r in points)
    out: list[float] = []
    if peak <= 0:
        return out
    t, end = points[0][0], points[-1][0]
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return out
        if rng.random() * peak < rate_at(points, t):
            out.append(t)


async def run_trace(*, url: str, model: str, points: list[tuple[float, float]], max_tokens: int,
                    prompt: str = "Explain prefill/decode disaggregation in one paragraph.", chat: bool = True,
                    timeout_s: float = 120.0, seed: int = 0) -> list[RequestResult]:
    """Open-loop load following ``points`` (see the module doc); results in send order, with ``sent_at``."""
    times = arrivals(points, seed=seed)
    results: list[RequestResult | None] = [None] * len(times)
    connector = aiohttp.TCPConnector(limit=0)
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(i: int, at: float) -> None:
            r = await one_request(session, url=url, model=model, prompt=f"{prompt} (#{i})", max_tokens=max_tokens,
                                  chat=chat, timeout_s=timeout_s)
            results[i] = dataclasses_replace(r, sent_at=at)

        tasks = []
        for i, at in enumerate(times):
            delay = at - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, time.perf_counter() - start)))
        await asyncio.gather(*tasks)
    return [r for r in results if r is not None]


def summarize(results: list[RequestResult], wall_s: float | None = None) -> dict:
    """p50/p90/p99 (seconds; speed in tokens/s) of TTFT, ITL, e2e and per-user speed."""
    ok = [r for r in results if r.ok]

    def pcts(values: list[float]) -> dict[str, float | None]:
        return {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9),
                "p99": percentile(values, 0.99), "count": len(values)}

    # speed "p90" = the speed at least 90% of requests reach = the 10th percentile of speeds
    speeds = [r.speed for r in ok if r.speed is not None]
    return {
        "requests": len(results), "succeeded": len(ok), "failed": len(results) - len(ok),
        "wall_seconds": wall_s,
        "ttft_seconds": pcts([r.ttft for r in ok if r.ttft is not None]),
        "itl_seconds": pcts([x for r in ok for x in r.itls]),
        "e2e_seconds": pcts([r.e2e for r in ok if r.e2e is not None]),
        "per_user_speed_tokens_per_second": {
            "p50": percentile(speeds, 0.5), "p90": percentile(speeds, 0.1), "p99": percentile(speeds, 0.01),
            "count": len(speeds),
            "note": "pN = the speed at least N% of requests reach (the (100-N)th percentile of speeds)",
        },
        "errors": sorted({r.error for r in results if r.error})[:10],
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}ms" if unit == "s" else f"{v:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Command line; exit code 1 when every request failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="base URL of the gateway, e.g. http://127.0.0.1:30000")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="Explain prefill/decode disaggregation in one paragraph.")
    p.add_argument("--completions", action="store_true", help="use /v1/completions instead of chat")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, s")
    p.add_argument("--out", help="write the summary and per-request samples to this JSON file")
    p.add_argument("--trace", help="open loop: t:rate points (s:req/s), e.g. 0:2,60:2,60:8,180:8 "
                                   "(--requests and --concurrency are then not used)")
    p.add_argument("--seed", type=int, default=0, help="--trace: seed of the arrival times")
    a = p.parse_args(argv)
    started = time.perf_counter()
    if a.trace:
        try:
            points = parse_trace(a.trace)
        except ValueError as err:
            p.error(str(err))
        results = asyncio.run(run_trace(url=a.url, model=a.model, points=points, max_tokens=a.max_tokens,
                                        prompt=a.prompt, chat=not a.completions, timeout_s=a.timeout, seed=a.seed))
    else:
        results = asyncio.run(run_load(url=a.url, model=a.model, requests=a.requests, concurrency=a.concurrency,
                                       max_tokens=a.max_tokens, prompt=a.prompt, chat=not a.completions,
                                       timeout_s=a.timeout))
    summary = summarize(results, time.perf_counter() - started)
    print(f"{summary['succeeded']}/{summary['requests']} ok in {summary['wall_seconds']:.1f}s")
    for key, unit in (("ttft_seconds", "s"), ("itl_seconds", "s"), ("e2e_seconds", "s"),
                      ("per_user_speed_tokens_per_second", "tok/s")):
        s = summary[key]
        print(f"  {key:34s} p50 {_fmt(s['p50'], unit):>10s}  p90 {_fmt(s['p90'], unit):>10s}  "
              f"p99 {_fmt(s['p99'], unit):>10s}  (n={s['count']})")
    for err in summary["errors"]:
        print(f"  error: {err}", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"summary": summary, "samples": [asdict(r) for r in results]}, fh, indent=1)
    return 0 if summary["succeeded"] else 1


if __name__ == "__main__":
    sys.exit(main())
