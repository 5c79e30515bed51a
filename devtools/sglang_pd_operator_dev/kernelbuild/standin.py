"""A stand-in for SGLang's compile and serve commands, for the ``standin`` build recipe.

Machines without GPUs cannot run ``python -m sglang.compile_deep_gemm`` or a real
server warm-up. The stand-in behaves like them where the builder can tell the
difference, using the same cache variables (``sglang_pd_operator.kernelbuild.builder.cache_env``):

- ``compile <server args>`` writes a DeepGEMM-like kernel derived from the flags into
  ``$SGLANG_CACHE_DIR/deep_gemm``, a lock file into ``deep_gemm/locks`` (as SGLang's
  compile_utils does) and an SGLang-JIT-like module into ``$SGLANG_JIT_CACHE_DIR``;
- ``serve <server args>`` answers ``GET /health_generate`` on ``--host``/``--port``. Like
  a real warm-up it first "captures graphs": it writes a Triton-like kernel for the flags.
  With ``SGLANG_CRASH_ON_JIT_COMPILE=1`` it compiles nothing and refuses to start when a
  kernel it needs is missing, with SGLang's own message.

Knobs for failure tests (environment): ``KERNELBUILD_STANDIN_FAIL=compile|serve|verify``
fails that command; ``KERNELBUILD_STANDIN_PARTIAL=1`` leaves a ``.staging-*`` directory
as an interrupted SGLang JIT compile does; ``KERNELBUILD_STANDIN_LAZY=once`` makes the
first verify start compile one more kernel (a cache SGLang's JIT guard does not cover),
``always`` makes every verify start do so (a cache that never converges).

Standard library only: a test runs it beside a builder copied with ``--install-to``
(``recipe.install``), as the build pod would hold it.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import signal
import sys
import uuid
from pathlib import Path

_IGNORED = {"--host", "--port"}


def _flags_key(args: list[str]) -> str:
    """A key of the flags that decide kernels (host and port excluded)."""
    kept, skip = [], False
    for tok in args:
        if skip:
            skip = False
            continue
        if tok in _IGNORED:
            skip = True
            continue
        kept.append(tok)
    return hashlib.sha256("\0".join(kept).encode()).hexdigest()[:16]


def _value(args: list[str], flag: str, default: str) -> str:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
    return default


def _dirs() -> tuple[Path, Path, Path]:
    cache = Path(os.environ["SGLANG_CACHE_DIR"])
    jit = Path(os.environ.get("SGLANG_JIT_CACHE_DIR") or cache / "jit")
    triton = Path(os.environ.get("TRITON_CACHE_DIR") or cache / "triton")
    return cache, jit, triton


def _fail_if(stage: str) -> None:
    if os.environ.get("KERNELBUILD_STANDIN_FAIL") == stage:
        print(f"standin: failing {stage} on purpose (KERNELBUILD_STANDIN_FAIL={stage})", flush=True)
        sys.exit(3)


def compile_kernels(args: list[str]) -> int:
    """Write the kernels ``sglang.compile_deep_gemm`` would for these flags."""
    _fail_if("compile")
    cache, jit, _ = _dirs()
    key = _flags_key(args)
    tp = _value(args, "--tp-size", "1")
    dg = cache / "deep_gemm"
    (dg / "locks").mkdir(parents=True, exist_ok=True)
    (dg / "locks" / f"GEMM_NT_F8F8BF16_n{tp}.lock").write_text("")
    (dg / f"kernel-{key}.cubin").write_bytes(hashlib.sha512(f"deep_gemm {key}".encode()).digest() * 64)
    module = jit / "sm103" / "standin_moe" / f"bk-{key[:8]}" / f"dk-{key[8:]}"
    module.mkdir(parents=True, exist_ok=True)
    (module / "standin_moe.so").write_bytes(hashlib.sha512(f"jit {key}".encode()).digest() * 32)
    (module / "deps.json").write_text('{"sources": []}\n')
    if os.environ.get("KERNELBUILD_STANDIN_PARTIAL") == "1":
        (jit / "sm103" / "standin_moe" / f".staging-{uuid.uuid4().hex}").mkdir(parents=True)
    print(f"standin: compiled kernels for flags {key} (tp {tp}) into {cache}", flush=True)
    return 0


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        ok = self.path.split("?")[0] in ("/health", "/health_generate")
        body = b"ok" if ok else b"not found"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *a) -> None:  # quiet
        pass


def serve(args: list[str]) -> int:
    """Warm up (or, under SGLANG_CRASH_ON_JIT_COMPILE, check) the kernels, then answer health checks."""
    cache, jit, triton = _dirs()
    key = _flags_key(args)
    crash = os.environ.get("SGLANG_CRASH_ON_JIT_COMPILE") == "1"
    _fail_if("verify" if crash else "serve")
    graph = triton / f"graph-{key}.bin"
    needed = [cache / "deep_gemm" / f"kernel-{key}.cubin", graph]
    if crash:
        missing = [p for p in needed if not p.is_file()]
        if missing:
            scope = missing[0].parent
            print(
                f"RuntimeError: JIT module 'standin' has no usable cached build under {scope}, and "
                "SGLANG_CRASH_ON_JIT_COMPILE forbids compiling at runtime. Seed the cache with prebuilt "
                "artifacts matching this environment, or unset the flag.",
                flush=True,
            )
            return 1
        lazy = os.environ.get("KERNELBUILD_STANDIN_LAZY")
        marker = cache / "deep_gemm" / "lazy-once.cubin"
        if lazy == "always":
            (cache / "deep_gemm" / f"lazy-{uuid.uuid4().hex}.cubin").write_bytes(b"lazy")
        elif lazy == "once" and not marker.exists():
            marker.write_bytes(b"lazy")
    else:
        triton.mkdir(parents=True, exist_ok=True)
        graph.write_bytes(hashlib.sha512(f"graph {key}".encode()).digest() * 16)
    host, port = _value(args, "--host", "127.0.0.1"), int(_value(args, "--port", "30000"))
    server = http.server.ThreadingHTTPServer((host, port), _Health)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"standin: serving {host}:{port} (flags {key}, crash-on-jit {crash})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``compile ARGS...`` or ``serve ARGS...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("compile", "serve"):
        print(
            "usage: python -m sglang_pd_operator_dev.kernelbuild.standin {compile|serve} [SGLang flags ...]",
            file=sys.stderr,
        )
        return 2
    return compile_kernels(argv[1:]) if argv[0] == "compile" else serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
