"""The SGLang engine simulator's HTTP server (aiohttp).

A stand-in for one SGLang 0.5.23 server (``sglang.launch_server``) where no GPU exists:
it answers the endpoints that smg 1.13 and the operator use, with latencies drawn from
configured lognormal distributions, and exposes ``/metrics`` with SGLang's names,
labels and buckets (``metrics.EngineMetrics``). It is a simulator: it generates no
text worth reading and holds no KV cache.

PD behaviour (how smg 1.13 drives a PD pair over HTTP): the gateway picks one prefill
and one decode worker, adds ``bootstrap_host`` / ``bootstrap_port`` / ``bootstrap_room``
to the JSON body and sends the same request to both at once. The prefill server runs
the prefill, ships the KV cache to the decode server and answers with the first token
only; the decode server waits for that KV cache and then streams the whole answer, which
the gateway returns to the client. Here the prefill role sleeps a prefill time and
answers one token (recording KV transfer latency/speed on its side, as SGLang's prefill
does); the decode role sleeps the TTFT and then emits one token every ITL.

Endpoints: ``/health``, ``/health_generate``, ``/ready``, ``/get_server_info``,
``/server_info``, ``/get_model_info``, ``/model_info``, ``/v1/models``, ``/v1/loads``,
``/get_load``, ``/generate``, ``/v1/completions``, ``/v1/chat/completions`` (streaming as
SSE or not), ``/flush_cache``, ``/metrics`` (served as SGLang serves it, see
:meth:`EngineSimulator.metrics_handler`); control: ``POST /simulator/mode``
(``{"mode": "normal" | "slow" | "fail" | "kv_fail", "slow_factor": 5}``) and
``GET /simulator/state``. Every request path is counted in the state (``requests``).

The metrics live in prometheus_client's multiprocess mode, as SGLang's do: run the
simulator as its own process (``python tools/engine_simulator``, or
``engine_simulator.process.start_process`` from a test), which sets
``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client is imported.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import time
import uuid
from collections import Counter as PathCounter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from prometheus_client.exposition import choose_encoder, gzip_accepted

from .config import MODES, SGLANG_VERSION, LogNormal, SimConfig
from .load import KV_PATH, BootstrapTimeout, DecodeLoad, PrefillLoad
from .metrics import EngineMetrics

__all__ = ["MODES", "SGLANG_VERSION", "EngineSimulator", "LogNormal", "RunningSimulator", "SimConfig", "serve",
           "bootstrap_app"]


class EngineSimulator:
    """One simulated SGLang server; :meth:`app` builds the aiohttp application."""

    def __init__(self, config: SimConfig) -> None:
        if config.role not in ("prefill", "decode", "aggregated"):
            raise ValueError(f"role {config.role!r} is not prefill, decode or aggregated")
        self.config = config
        if config.mode not in MODES:
            raise ValueError(f"mode {config.mode!r} is not one of {', '.join(MODES)}")
        self.mode = config.mode
        self.rng = random.Random(config.seed)
        self.metrics = EngineMetrics(model_name=config.name, role=config.role, dp_size=config.dp_size)
        self.requests: PathCounter[str] = PathCounter()
        self.running = 0
        self.finished = 0
        self.started_at = time.time()
        self.pd_requests: list[dict[str, Any]] = []  # bootstrap fields seen (last 100)
        self._next_dp = 0
        self._session: aiohttp.ClientSession | None = None
        c = config
        self.prefill_load = (PrefillLoad(slots=c.prefill_slots, metrics=self.metrics,
                                         bootstrap_timeout=c.bootstrap_timeout)
                             if c.load_model and c.role == "prefill" else None)
        self.decode_load = (DecodeLoad(max_running=c.max_running, itl_batch_slope=c.itl_batch_slope,
                                       metrics=self.metrics, kv_timeout=c.bootstrap_timeout)
                            if c.load_model and c.role == "decode" else None)

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        """The aiohttp application with every route."""
        app = web.Application(middlewares=[self._count])
        app.on_cleanup.append(self._close)
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        r.add_get("/ready", self.health)
        for path in ("/get_server_info", "/server_info"):
            r.add_get(path, self.server_info)
        for path in ("/get_model_info", "/model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.*}", self.model_card)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/get_load", self.get_load)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/metrics", self.metrics_handler)
        r.add_post("/simulator/mode", self.set_mode)
        r.add_get("/simulator/state", self.state)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler):
        self.requests[f"{request.method} {request.path}"] += 1
        return await handler(request)

    # ------------------------------------------------------------------ info
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.mode == "fail" else 200)

    def _server_info(self) -> dict[str, Any]:
        c = self.config
        mode = {"prefill": "prefill", "decode": "decode"}.get(c.role, "null")
        return {
            "model_path": c.model, "tokenizer_path": c.model, "served_model_name": c.name,
            "host": c.host, "port": c.port, "tp_size": c.tp_size, "dp_size": c.dp_size,
            "enable_dp_attention": c.dp_size > 1, "context_length": c.context_length,
            "disaggregation_mode": mode, "disaggregation_bootstrap_port": c.bootstrap_port,
            "disaggregation_transfer_backend": "mooncake", "page_size": 64, "kv_cache_dtype": "auto",
            "enable_metrics": True, "load_balance_method": "round_robin", "skip_tokenizer_init": False,
            "max_total_num_tokens": 100000, "max_running_requests": 256,
            "internal_states": [{"last_gen_throughput": 0.0, "avg_spec_accept_length": c.spec_accept_length,
                                 "max_total_num_tokens": 100000} for _ in range(c.dp_size)],
            "startup_time": self.started_at, "version": SGLANG_VERSION, "frontend": "python",
            "simulator": True,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        c = self.config
        return web.json_response({
            "model_path": c.model, "served_model_name": c.name, "tokenizer_path": c.model,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": {"prefill": "prefill", "decode": "decode"}.get(c.role, "null"),
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": "simulated", "architectures": ["SimulatedForCausalLM"],
        })

    def _card(self) -> dict[str, Any]:
        return {"id": self.config.name, "object": "model", "created": int(self.started_at),
                "owned_by": "sglang", "root": self.config.name, "max_model_len": self.config.context_length}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model_card(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.config.name:
            return web.json_response({"error": {"message": "model not found", "code": "model_not_found"}},
                                     status=404)
        return web.json_response(self._card())

    async def loads(self, request: web.Request) -> web.Response:
        c = self.config
        loads = []
        for dp in range(c.dp_size):
            loads.append({
                "timestamp": time.time(), "dp_rank": dp, "num_running_reqs": self.running,
                "num_waiting_reqs": 0, "num_used_tokens": 0, "num_total_tokens": 100000,
                "max_total_num_tokens": 100000, "max_running_requests": 256, "token_usage": 0.0,
                "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
                "disaggregation": {"mode": {"prefill": "prefill", "decode": "decode"}.get(c.role, "null")},
            })
        return web.json_response({"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  "version": SGLANG_VERSION, "accelerator": "simulated",
                                  "num_accelerators": c.tp_size, "loads": loads})

    async def get_load(self, request: web.Request) -> web.Response:
        return web.json_response([{"dp_rank": dp, "num_reqs": self.running, "num_waiting_reqs": 0,
                                   "num_tokens": 0} for dp in range(self.config.dp_size)])

    async def flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\n")

    async def metrics_handler(self, request: web.Request) -> web.Response:
        """``/metrics`` as SGLang 0.5.23 serves it: ``add_prometheus_middleware``
        (sglang/srt/utils/common.py) mounts prometheus_client's ``make_asgi_app`` over a
        ``CollectorRegistry`` holding only a ``MultiProcessCollector``; its
        ``_bake_output`` picks the format from ``Accept``, applies ``?name[]=`` through
        ``restricted_registry`` and gzips when ``Accept-Encoding`` allows. The same steps
        run here on the same kind of registry (``EngineMetrics.registry``), so ``name[]``
        gives what it gives on SGLang: a 200 with an empty page, because
        ``restricted_registry`` finds no collector registered under the asked names."""
        params = parse_qs(request.query_string)
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        registry = self.metrics.registry
        if "name[]" in params:
            registry = registry.restricted_registry(params["name[]"])
        body = encoder(registry)
        headers = {"Content-Type": content_type}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    # ------------------------------------------------------------------ control
    async def set_mode(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        mode = body.get("mode")
        if mode not in MODES:
            return web.json_response({"error": f"mode must be one of {', '.join(MODES)}"}, status=400)
        self.mode = mode
        if "slow_factor" in body:
            self.config.slow_factor = float(body["slow_factor"])
        return web.json_response({"mode": self.mode, "slow_factor": self.config.slow_factor})

    async def state(self, request: web.Request) -> web.Response:
        cfg = asdict(self.config)
        return web.json_response({"mode": self.mode, "role": self.config.role, "running": self.running,
                                  "finished": self.finished, "requests": dict(self.requests),
                                  "pd_requests": self.pd_requests[-100:], "config": cfg})

    # ------------------------------------------------------------------ generation
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    @staticmethod
    def _prompt_tokens(kind: str, body: dict[str, Any]) -> int:
        if kind == "chat":
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        elif kind == "completions":
            p = body.get("prompt", "")
            text = " ".join(map(str, p)) if isinstance(p, list) else str(p)
        else:
            if body.get("input_ids") is not None:
                return max(1, len(body["input_ids"]))
            text = str(body.get("text", ""))
        return max(1, len(text.split()))

    def _max_tokens(self, kind: str, body: dict[str, Any]) -> int:
        if kind == "generate":
            n = (body.get("sampling_params") or {}).get("max_new_tokens")
        else:
            n = body.get("max_completion_tokens") or body.get("max_tokens")
        n = self.config.default_max_tokens if n is None else int(n)
        return max(1, min(n, self.config.max_output_tokens))

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body must be JSON"}}, status=400)
        if self.mode == "fail":
            return web.json_response({"error": {"message": "simulator in fail mode", "code": 503}}, status=503)
        if "bootstrap_room" in body or "bootstrap_host" in body:
            self.pd_requests.append({k: body.get(k) for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")})
            del self.pd_requests[:-100]
        stream = bool(body.get("stream", False))
        created = time.time()
        t0 = time.perf_counter()
        factor = self.config.slow_factor if self.mode == "slow" else 1.0
        dp = self._next_dp = (self._next_dp + 1) % self.config.dp_size
        sched = self.metrics.sched(dp)
        prompt_tokens = self._prompt_tokens(kind, body)
        role = self.config.role
        n_out = 1 if role == "prefill" else self._max_tokens(kind, body)
        first_delay = (self.config.prefill if role == "prefill" else self.config.ttft).draw(self.rng, factor)
        gaps = [self.config.itl.draw(self.rng, factor) for _ in range(n_out - 1)]
        rid = body.get("rid") or uuid.uuid4().hex
        loaded = self.config.load_model and role in ("prefill", "decode") and self.mode != "kv_fail"
        self.running += 1
        if not loaded:  # the load model keeps its own gauges (load.py)
            self.metrics.num_running.labels(**sched).set(self.running)
        try:
            if loaded:
                return await self._serve_loaded(request, kind, body, stream=stream, rid=rid, created=created, t0=t0,
                                                factor=factor, sched=sched, prompt_tokens=prompt_tokens,
                                                n_out=n_out)
            if self.mode == "kv_fail" and role in ("prefill", "decode"):
                await asyncio.sleep(first_delay)
                self.metrics.transfer_failed.labels(**sched).inc()
                self.metrics.aborted.labels(**self.metrics.tok_labels).inc()
                return web.json_response({"error": {"message": "KV transfer failed (simulated)", "code": 500}},
                                         status=500)
            if stream:
                return await self._stream(request, kind, body, rid, created, t0, first_delay, gaps,
                                          prompt_tokens, sched)
            await asyncio.sleep(first_delay + sum(gaps))
            self._finish(stream, t0, first_delay, gaps, prompt_tokens, sched)
            return web.json_response(self._full_response(kind, body, rid, created, n_out, prompt_tokens,
                                                         time.perf_counter() - t0))
        finally:
            self.running -= 1
            if not loaded:
                self.metrics.num_running.labels(**sched).set(self.running)

    async def _client(self) -> aiohttp.ClientSession:
        """The session decode uses for the KV handshake with prefill's bootstrap port (closed at cleanup)."""
        if self._session is None:  # no connection limit: every request decode holds KV for waits on its own
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    def _failed(self, sched: dict[str, str], counter: str, message: str) -> web.Response:
        getattr(self.metrics, counter).labels(**sched).inc()
        self.metrics.aborted.labels(**self.metrics.tok_labels).inc()
        return web.json_response({"error": {"message": message, "code": 500}}, status=500)

    async def _serve_loaded(self, request: web.Request, kind: str, body: dict[str, Any], *, stream: bool, rid: str,
                            created: float, t0: float, factor: float, sched: dict[str, str], prompt_tokens: int,
                            n_out: int) -> web.StreamResponse:
        """One request through the load model's queues (``load.py``), then answered as usual."""
        c = self.config
        room = body.get("bootstrap_room")
        room_id = None if room is None else str(room)
        if c.role == "prefill":
            assert self.prefill_load is not None
            kv_ms = c.kv_transfer_ms.draw(self.rng)
            try:
                await self.prefill_load.run(room_id, prefill_s=c.prefill.draw(self.rng, factor), kv_s=kv_ms / 1000)
            except BootstrapTimeout:
                return self._failed(sched, "bootstrap_failed", "no decode pre-allocated the request (simulated)")
            return await self._answer(request, kind, body, stream=stream, rid=rid, created=created, t0=t0,
                                      first_delay=0.0, gaps=[], n_out=1, prompt_tokens=prompt_tokens, sched=sched,
                                      kv_ms=kv_ms)
        load = self.decode_load
        assert load is not None
        await load.admit()
        running = False
        try:
            host = body.get("bootstrap_host")
            if room_id is not None and host:
                port = int(body.get("bootstrap_port") or c.bootstrap_port)
                if not await load.receive_kv(await self._client(), str(host), port, room_id):
                    return self._failed(sched, "transfer_failed", "the KV never came (simulated)")
            else:
                await asyncio.sleep(c.ttft.draw(self.rng, factor))
            load.start_running()
            running = True
            first_step = load.step(c.itl.draw(self.rng, factor))  # the first token takes one decode step
            return await self._answer(request, kind, body, stream=stream, rid=rid, created=created, t0=t0,
                                      first_delay=first_step,
                                      gaps=lambda i: load.step(c.itl.draw(self.rng, factor)), n_out=n_out,
                                      prompt_tokens=prompt_tokens, sched=sched)
        finally:
            if running:
                load.stop_running()
            await load.release()

    async def _answer(self, request: web.Request, kind: str, body: dict[str, Any], *, stream: bool, rid: str,
                      created: float, t0: float, first_delay: float, gaps: Gaps, n_out: int, prompt_tokens: int,
                      sched: dict[str, str], kv_ms: float | None = None) -> web.StreamResponse:
        """Wait ``first_delay``, emit ``n_out`` tokens ``gaps`` apart (SSE or one JSON answer), record the metrics."""
        if stream:
            return await self._stream(request, kind, body, rid, created, t0, first_delay, gaps, prompt_tokens, sched,
                                      n_out=n_out, kv_ms=kv_ms)
        await asyncio.sleep(first_delay)
        ttft = time.perf_counter() - t0
        used = []
        for i in range(n_out - 1):
            gap = _gap(gaps, i)
            await asyncio.sleep(gap)
            used.append(gap)
        self._finish(False, t0, first_delay, used, prompt_tokens, sched, ttft=ttft, kv_ms=kv_ms)
        return web.json_response(self._full_response(kind, body, rid, created, n_out, prompt_tokens,
                                                     time.perf_counter() - t0))

    def _finish(self, stream: bool, t0: float, first_delay: float, gaps: list[float], prompt_tokens: int,
                sched: dict[str, str], *, ttft: float | None = None, e2e: float | None = None,
                ttft_observed: bool = False, kv_ms: float | None = None) -> None:
        """Record one finished request the way SGLang's tokenizer manager does (TTFT too,
        unless the streaming path already observed it at the first token)."""
        m = self.metrics
        sl = m.stream_labels(stream)
        n_out = len(gaps) + 1
        ttft = first_delay if ttft is None else ttft
        e2e = (time.perf_counter() - t0) if e2e is None else e2e
        m.requests.labels(**sl).inc()
        m.prompt_tokens.labels(**sl).inc(prompt_tokens)
        m.generation_tokens.labels(**sl).inc(n_out)
        m.prompt_tokens_hist.labels(**m.tok_labels).observe(prompt_tokens)
        m.generation_tokens_hist.labels(**m.tok_labels).observe(n_out)
        m.e2e.labels(**sl).observe(e2e)
        if self.config.role == "prefill":
            kv_ms = self.config.kv_transfer_ms.draw(self.rng) if kv_ms is None else kv_ms
            m.kv_transfer_latency.labels(**sched).observe(kv_ms)
            m.kv_transfer_speed.labels(**sched).observe(max(0.01, 2.0 * prompt_tokens / 1000.0 / max(kv_ms, 1e-3)))
            m.kv_transfer_bootstrap.labels(**sched).observe(1.0)
        else:
            if not ttft_observed:
                m.ttft.labels(**sl).observe(ttft)
            if not stream:  # streaming requests observe ITL per chunk as they go
                for gap in gaps:
                    m.itl.labels(**m.tok_labels).observe(gap)
            if n_out > 1:
                m.tpot.labels(**sl).observe(max(e2e - ttft, 0.0) / (n_out - 1))
            if self.config.spec_accept_length:
                m.spec_accept_length.labels(**sched).set(self.config.spec_accept_length)
        m.gen_throughput.labels(**sched).set(n_out / max(e2e, 1e-6))
        self.finished += 1

    def _full_response(self, kind: str, body: dict[str, Any], rid: str, created: float, n_out: int,
                       prompt_tokens: int, e2e: float) -> dict[str, Any]:
        text = "".join(_token(i) for i in range(n_out))
        finish = "length"
        if kind == "generate":
            return {"text": text, "output_ids": list(range(n_out)), "meta_info": {
                "id": rid, "finish_reason": {"type": finish, "length": n_out}, "prompt_tokens": prompt_tokens,
                "completion_tokens": n_out, "cached_tokens": 0, "e2e_latency": e2e}}
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_out, "total_tokens": prompt_tokens + n_out}
        model = body.get("model") or self.config.name
        if kind == "completions":
            return {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(created), "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                    "usage": usage}
        return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(created), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": finish}], "usage": usage}

    async def _stream(self, request: web.Request, kind: str, body: dict[str, Any], rid: str, created: float,
                      t0: float, first_delay: float, gaps: Gaps, prompt_tokens: int,
                      sched: dict[str, str], *, n_out: int | None = None,
                      kv_ms: float | None = None) -> web.StreamResponse:
        model = body.get("model") or self.config.name
        n_out = len(gaps) + 1 if n_out is None else n_out
        used: list[float] = []
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        m = self.metrics
        await asyncio.sleep(first_delay)
        # The response head goes out with the first token: smg's HTTP PD router times its
        # smg_pd_ttft_seconds to the decode response head.
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        ttft = time.perf_counter() - t0
        if self.config.role != "prefill":  # SGLang observes TTFT when the first token exists
            m.ttft.labels(**m.stream_labels(True)).observe(ttft)
        last = time.perf_counter()
        text = ""
        for i in range(n_out):
            if i > 0:
                gap = _gap(gaps, i - 1)
                used.append(gap)
                await asyncio.sleep(gap)
                now = time.perf_counter()
                if self.config.role != "prefill":
                    m.itl.labels(**m.tok_labels).observe(now - last)
                last = now
            tok = _token(i)
            text += tok
            done = i == n_out - 1
            if kind == "generate":
                chunk: dict[str, Any] = {"text": text, "output_ids": list(range(i + 1)), "meta_info": {
                    "id": rid, "finish_reason": {"type": "length", "length": n_out} if done else None,
                    "prompt_tokens": prompt_tokens, "completion_tokens": i + 1, "cached_tokens": 0}}
            elif kind == "completions":
                chunk = {"id": f"cmpl-{rid}", "object": "text_completion", "created": int(created), "model": model,
                         "choices": [{"index": 0, "text": tok, "logprobs": None,
                                      "finish_reason": "length" if done else None}]}
            else:
                delta: dict[str, Any] = {"content": tok}
                if i == 0:
                    delta["role"] = "assistant"
                chunk = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": int(created),
                         "model": model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                      "finish_reason": "length" if done else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if include_usage and kind != "generate":
            obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
            usage_chunk = {"id": rid, "object": obj, "created": int(created), "model": model, "choices": [],
                           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n_out,
                                     "total_tokens": prompt_tokens + n_out}}
            await resp.write(f"data: {json.dumps(usage_chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        self._finish(True, t0, first_delay, used, prompt_tokens, sched, ttft=ttft, e2e=time.perf_counter() - t0,
                     kv_ms=kv_ms,
                     ttft_observed=True)
        await resp.write_eof()
        return resp


def _token(i: int) -> str:
    return f" tok{i}"


Gaps = list[float] | Callable[[int], float]


def _gap(gaps: Gaps, i: int) -> float:
    """The gap before token ``i + 1``: from the list, or drawn now (the load model's batch-dependent step)."""
    return gaps[i] if isinstance(gaps, list) else gaps(i)


def bootstrap_app(sim: EngineSimulator | None = None) -> web.Application:
    """The prefill server's bootstrap endpoint (SGLang's CommonKVBootstrapServer routes).

    smg 1.13 opens a TCP connection to a prefill worker's bootstrap port at registration
    and warns when nothing listens; decode servers would use it to rendezvous. The
    simulator answers ``/health`` and accepts ``/route`` without keeping anything. With the
    load model (``sim`` given, ``--load-model``), ``POST /simulator/kv {"room": ...}`` is
    decode's side of the KV handshake (``load.py``): 200 once the room's KV was sent, 504
    when it was not within the bootstrap timeout.
    """
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def kv(request: web.Request) -> web.Response:
        if sim is None or sim.prefill_load is None:
            return web.json_response({"error": "this prefill runs no load model"}, status=404)
        room = str((await request.json()).get("room"))
        done = await sim.prefill_load.handshake(room, sim.config.bootstrap_timeout)
        return web.json_response({"room": room, "sent": done}, status=200 if done else 504)

    app.router.add_get("/health", ok)
    app.router.add_route("*", "/route", ok)
    app.router.add_post(KV_PATH, kv)
    return app


@dataclass
class RunningSimulator:
    """A started simulator: ``simulator`` (its state), ``url`` (``http://host:port``).

    ``bootstrap_runner`` serves the prefill bootstrap port (None for other roles).
    """

    simulator: EngineSimulator
    runner: web.AppRunner
    url: str
    bootstrap_runner: web.AppRunner | None = None
    bootstrap_task: asyncio.Task | None = None

    async def close(self) -> None:
        """Stop serving and release the ports (a bootstrap port still waiting to open never opens)."""
        if self.bootstrap_task is not None:
            self.bootstrap_task.cancel()
        await self.runner.cleanup()
        if self.bootstrap_runner is not None:
            await self.bootstrap_runner.cleanup()


async def serve(config: SimConfig) -> RunningSimulator:
    """Start a simulator on ``config.host:config.port`` inside the running event loop.

    A prefill simulator also listens on ``config.bootstrap_port`` (see
    :func:`bootstrap_app`; a negative port turns that off), ``config.bootstrap_delay``
    seconds after the HTTP port when that is set (it then prints a JSON line
    ``{"simulator": "bootstrap", "port": ...}``). Port 0 picks a free port; the chosen ones
    are written back into ``config`` (a late bootstrap port once it opens).
    """
    sim = EngineSimulator(config)
    runner = web.AppRunner(sim.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    config.port = _bound_port(site, config.port)
    boot = None
    if config.role == "prefill" and config.bootstrap_port >= 0:
        boot = web.AppRunner(bootstrap_app(sim), access_log=None)
        await boot.setup()
        boot_site = web.TCPSite(boot, config.host, config.bootstrap_port)
        if config.bootstrap_delay > 0:
            running = RunningSimulator(simulator=sim, runner=runner, url=f"http://{config.host}:{config.port}",
                                       bootstrap_runner=boot)

            async def open_late() -> None:
                await asyncio.sleep(config.bootstrap_delay)
                await boot_site.start()
                config.bootstrap_port = _bound_port(boot_site, config.bootstrap_port)
                print(json.dumps({"simulator": "bootstrap", "port": config.bootstrap_port}), flush=True)

            running.bootstrap_task = asyncio.get_running_loop().create_task(open_late())
            return running
        try:
            await boot_site.start()
        except BaseException:
            await runner.cleanup()
            await boot.cleanup()
            raise
        config.bootstrap_port = _bound_port(boot_site, config.bootstrap_port)
    return RunningSimulator(simulator=sim, runner=runner, url=f"http://{config.host}:{config.port}",
                            bootstrap_runner=boot)


def _bound_port(site: web.TCPSite, requested: int) -> int:
    sockets = getattr(site._server, "sockets", None) or []  # aiohttp has no public accessor
    return sockets[0].getsockname()[1] if sockets else requested
