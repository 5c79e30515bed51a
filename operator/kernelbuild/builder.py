"""The KernelBuild Job's entrypoint: compile into a private directory, verify, publish atomically.

Run inside the SGLang runtime image as::

    python3 -m sglang_pd_operator.kernelbuild.builder \\
        --request /etc/kernelbuild/request.json \\
        --work-dir /var/cache/sglang --volume /kernel-cache-volume

Standard library only: the runtime image has SGLang, not this operator's dependencies.
The build pod's init container (the operator image) copies this package's few files into
the pod with ``--install-to DIR``, so any runtime image can run it.

What it guarantees (issue: "refuse to publish a partial cache"):

1. Every recipe step runs with ``SGLANG_CACHE_DIR`` (and the JIT / Triton / TileLang /
   FlashInfer / CUDA cache variables, see :func:`cache_env`) pointing at ``--work-dir``,
   which is the same absolute path the engine pods mount the cache at: cached build files
   that record absolute paths (FlashInfer's ninja files) stay valid.
2. A failed step, a serve step that exits before answering, a verify pass that still
   compiles something, a missing ``expect`` file or a leftover ``forbid`` entry (an
   interrupted compile) fails the build: nothing is published.
3. Publishing copies the work directory into ``<volume>/.staging-<random>``, recomputes the
   digest of the copy and refuses when it differs, writes the manifest, and renames the
   staging directory to ``<volume>/sha256-<hex>`` (content-addressed; a rename is atomic on
   one file system). Readers see a complete cache or none.
4. The digest is sha256 over the sorted relative paths, file modes (executable bit),
   sizes and contents (symlink targets for links), never mtimes: equal trees give equal
   digests on any machine.
5. The result (digest, path, size, files, duration, whether a verify pass proved the
   cache complete) is written as JSON to the container's termination message
   (``/dev/termination-log``), which the operator reads from the pod status — no API
   credentials in the build pod. On failure the JSON says which step failed and why.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from collections.abc import Iterable

REQUEST_VERSION = 1
MANIFEST = ".kernelbuild.json"
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096  # bytes kubelet keeps of a termination message
RESULT_PREFIX = "KERNELBUILD_RESULT "
PUBLISHED_PREFIX = "sha256-"
STAGING_PREFIX = ".staging-"
CRASH_ON_JIT = "SGLANG_CRASH_ON_JIT_COMPILE"
_TAIL_LINES = 40


class BuildError(Exception):
    """A build that must not be published: which step, a CamelCase reason, and what happened."""

    def __init__(self, step: str, reason: str, message: str):
        super().__init__(f"{step}: {reason}: {message}")
        self.step, self.reason, self.message = step, reason, message


# --------------------------------------------------------------------------- environment
def cache_env(cache_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Every cache variable SGLang 0.5.23 and its kernel libraries read, under one directory.

    Source: sglang srt/environ.py ``SGLANG_CACHE_DIR`` and ``third_party_cache_defaults``
    (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, CUDA_CACHE_PATH, TILELANG_CACHE_DIR,
    FLASHINFER_WORKSPACE_BASE). SGLang only ``setdefault``s the third-party ones, and not
    at all when FlashInfer was imported first, so they are set explicitly here.
    ``SGLANG_JIT_CACHE_DIR`` does not follow ``SGLANG_CACHE_DIR``
    (kernels/jit/utils/compile/cache.py ``cache_root``) and is set to ``<dir>/jit``.
    """
    d = str(cache_dir).rstrip("/") or "/"
    return {
        "SGLANG_CACHE_DIR": d,
        "SGLANG_JIT_CACHE_DIR": f"{d}/jit",
        "TRITON_CACHE_DIR": f"{d}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{d}/inductor",
        "CUDA_CACHE_PATH": f"{d}/nv",
        "TILELANG_CACHE_DIR": f"{d}/tilelang",
        "FLASHINFER_WORKSPACE_BASE": d,
    }


# --------------------------------------------------------------------------- digest
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a path glob relative to the cache root: ``**`` spans directories, ``*`` and ``?`` do not."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _entries(root: Path) -> Iterable[tuple[str, os.stat_result]]:
    """(relative posix path, lstat) of everything under ``root``, not following symlinks."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        for name in dirnames + filenames:
            full = base / name
            rel = full.relative_to(root).as_posix()
            yield rel, full.lstat()


def tree_digest(root: Path, *, exclude: Iterable[str] = (MANIFEST,)) -> tuple[str, int, int]:
    """(``sha256:<hex>``, total file bytes, file count) of the tree under ``root``.

    One line per entry, sorted by the path's bytes: ``d <path>`` for a directory,
    ``f <path> <x> <size> <sha256>`` for a file (x = 1 when any execute bit is set),
    ``l <path> <target>`` for a symlink. Top-level names in ``exclude`` (the manifest)
    are left out. Raises BuildError for sockets, FIFOs and devices.
    """
    excluded = set(exclude)
    lines: list[tuple[bytes, bytes]] = []
    size = files = 0
    for rel, st in _entries(root):
        if rel.split("/", 1)[0] in excluded:
            continue
        key = os.fsencode(rel)
        if stat.S_ISDIR(st.st_mode):
            lines.append((key, b"d " + key))
        elif stat.S_ISLNK(st.st_mode):
            lines.append((key, b"l " + key + b" " + os.fsencode(os.readlink(root / rel))))
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(root / rel, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            x = b"1" if st.st_mode & 0o111 else b"0"
            lines.append(
                (key, b"f " + key + b" " + x + b" " + str(st.st_size).encode() + b" " + h.hexdigest().encode())
            )
            size += st.st_size
            files += 1
        else:
            raise BuildError("verify", "UnsupportedFile", f"{rel} is not a file, directory or symlink")
    total = hashlib.sha256()
    for _, line in sorted(lines):
        total.update(line + b"\n")
    return "sha256:" + total.hexdigest(), size, files


# --------------------------------------------------------------------------- checks
def prepare_writable(root: Path, patterns: Iterable[str]) -> list[str]:
    """Make the engines' lock directories exist and be empty; return them, sorted.

    A literal pattern is created when missing (the pods mount an emptyDir over it, and a
    mount point must exist in a read-only volume). A wildcard pattern keeps the directories
    the build created. Their contents (lock files) are removed: they are not kernels.
    """
    found: set[str] = set()
    for pattern in patterns:
        if not any(c in pattern for c in "*?["):
            (root / pattern).mkdir(parents=True, exist_ok=True)
            found.add(pattern.strip("/"))
            continue
        rx = glob_regex(pattern.strip("/"))
        found.update(rel for rel, st in _entries(root) if stat.S_ISDIR(st.st_mode) and rx.match(rel))
    for rel in found:
        for child in (root / rel).iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    return sorted(found)


def check_tree(root: Path, *, expect: Iterable[str], forbid: Iterable[str]) -> list[str]:
    """Problems that make the tree a partial cache: unmatched ``expect`` globs, matched ``forbid`` globs."""
    entries = list(_entries(root))
    problems = []
    for pattern in expect:
        rx = glob_regex(pattern)
        if not any(stat.S_ISREG(st.st_mode) and st.st_size > 0 and rx.match(rel) for rel, st in entries):
            problems.append(f"expected a non-empty file matching {pattern!r}, found none")
    for pattern in forbid:
        rx = glob_regex(pattern)
        hits = sorted(rel for rel, _ in entries if rx.match(rel))
        if hits:
            problems.append(f"{pattern!r} matches {', '.join(hits[:3])}: leftovers of an interrupted compile")
    return problems


# --------------------------------------------------------------------------- steps
class _Output:
    """Stream a child's output to our stdout and keep its last lines for error messages."""

    def __init__(self, proc: subprocess.Popen, step: str):
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._thread = threading.Thread(target=self._pump, args=(proc, step), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen, step: str) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            print(f"[{step}] {line}", flush=True)

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "\n".join(self.tail)


def _expand(argv: list[str], python: str) -> list[str]:
    return [a.replace("{python}", python) for a in argv]


def _stop(proc: subprocess.Popen, grace: float = 60.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_step(step: dict[str, Any], *, env: dict[str, str], port: int, deadline: float, python: str) -> None:
    """Run one recipe step; raise BuildError when it fails, times out or (serve) never answers."""
    name, argv = step["name"], _expand(list(step["argv"]), python)
    print(f"kernelbuild: step {name}: {' '.join(argv)}", flush=True)
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        raise BuildError(name, "StepFailed", f"cannot start {argv[0]}: {e}") from e
    out = _Output(proc, name)
    try:
        if step["kind"] == "run":
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BuildError(name, "DeadlineExceeded", "the build deadline passed while the step ran") from None
            if code != 0:
                raise BuildError(name, "StepFailed", f"exit code {code}\n{out.text()}")
            return
        url = f"http://127.0.0.1:{port}{step.get('probe', '/health_generate')}"
        while True:
            code = proc.poll()
            if code is not None:
                raise BuildError(name, "StepFailed", f"exited with code {code} before {url} answered\n{out.text()}")
            if time.monotonic() > deadline:
                raise BuildError(name, "DeadlineExceeded", f"{url} did not answer 200 before the build deadline")
            try:
                with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - loopback only
                    if resp.status == 200:
                        print(f"kernelbuild: step {name}: {url} answered 200", flush=True)
                        return
            except (urllib.error.URLError, OSError, TimeoutError):
                pass
            time.sleep(1.0)
    finally:
        _stop(proc)
        out.text()


# --------------------------------------------------------------------------- build
def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _empty(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def load_request(path: Path) -> dict[str, Any]:
    """Read and check the request JSON the operator wrote (kernelbuild.render.build_request)."""
    req = json.loads(path.read_text())
    if req.get("version") != REQUEST_VERSION:
        raise BuildError("request", "BadRequest", f"request version {req.get('version')!r}, expected {REQUEST_VERSION}")
    for key in ("steps", "port", "inputHash"):
        if key not in req:
            raise BuildError("request", "BadRequest", f"request has no {key!r}")
    return req


def build(request: dict[str, Any], *, work_dir: Path, volume: Path, python: str = sys.executable) -> dict[str, Any]:
    """Run the recipe, verify, publish; return the result dict. Raises BuildError (nothing published)."""
    start = time.monotonic()
    deadline = start + float(request.get("timeoutSeconds") or 7200)
    _empty(work_dir)  # the cache must hold exactly what these flags compile
    env = {**os.environ, **{k: str(v) for k, v in (request.get("env") or {}).items()}, **cache_env(work_dir)}
    env.pop(CRASH_ON_JIT, None)
    port = int(request["port"])

    complete = False
    for step in request["steps"]:
        if not step.get("verify"):
            run_step(step, env=env, port=port, deadline=deadline, python=python)
            continue
        # Verify: start with runtime JIT forbidden; SGLang's JIT raises on a miss, and for
        # caches it does not guard (DeepGEMM, Triton) the tree must not change either.
        for attempt in (1, 2):
            before = tree_digest(work_dir)[0]
            run_step(step, env={**env, CRASH_ON_JIT: "1"}, port=port, deadline=deadline, python=python)
            after = tree_digest(work_dir)[0]
            if before == after:
                complete = True
                break
            print(f"kernelbuild: step {step['name']}: pass {attempt} compiled new kernels", flush=True)
        else:
            raise BuildError(step["name"], "Incomplete", "the cache still changed on a second verify pass")

    writable = prepare_writable(work_dir, request.get("writable") or [])
    problems = check_tree(work_dir, expect=request.get("expect") or ["**"], forbid=request.get("forbid") or [])
    if problems:
        raise BuildError("verify", "PartialCache", "; ".join(problems))
    digest, size, files = tree_digest(work_dir)
    published = publish(work_dir, volume=volume, digest=digest, manifest={
        "digest": digest,
        "sizeBytes": size,
        "files": files,
        "inputHash": request["inputHash"],
        "name": request.get("name"),
        "recipe": request.get("recipe"),
        "complete": complete,
        "writablePaths": writable,
    })  # fmt: skip
    return {
        "ok": True,
        "digest": digest,
        "path": published.name,
        "sizeBytes": size,
        "files": files,
        "durationSeconds": round(time.monotonic() - start, 3),
        "inputHash": request["inputHash"],
        "complete": complete,
        "writablePaths": writable,
    }


def publish(work_dir: Path, *, volume: Path, digest: str, manifest: dict[str, Any]) -> Path:
    """Copy into a staging directory of ``volume``, re-verify the digest, rename to ``sha256-<hex>``.

    Idempotent: when the content-addressed directory already exists with the same digest
    in its manifest, the copy is discarded and the existing directory returned. Raises
    BuildError (removing the staging copy) when the copy's digest differs.
    """
    volume.mkdir(parents=True, exist_ok=True)
    final = volume / (PUBLISHED_PREFIX + digest.removeprefix("sha256:"))
    staging = volume / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
    try:
        shutil.copytree(work_dir, staging, symlinks=True)
        copied = tree_digest(staging)[0]
        if copied != digest:
            raise BuildError(
                "publish", "CopyMismatch", f"the copy in the volume has digest {copied}, expected {digest}"
            )
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync_tree(staging)
        if final.exists():
            existing = json.loads((final / MANIFEST).read_text()) if (final / MANIFEST).is_file() else {}
            if existing.get("digest") != digest:
                raise BuildError("publish", "Conflict", f"{final} exists with another digest {existing.get('digest')}")
            shutil.rmtree(staging)
            return final
        os.rename(staging, final)
        fd = os.open(volume, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return final
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def read_manifest(published: Path) -> dict[str, Any]:
    """The manifest of a published cache directory (for tools and tests)."""
    return json.loads((published / MANIFEST).read_text())


# --------------------------------------------------------------------------- result
def encode_result(result: dict[str, Any], limit: int = TERMINATION_LIMIT) -> str:
    """JSON of ``result`` within ``limit`` bytes: long messages and path lists are shortened."""
    text = json.dumps(result, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) <= limit:
        return text
    trimmed = dict(result)
    if "message" in trimmed:
        trimmed["message"] = "..." + str(trimmed["message"])[-(limit // 2) :]
    if trimmed.get("writablePaths"):
        trimmed["writablePaths"] = trimmed["writablePaths"][:8]
        trimmed["writablePathsTruncated"] = True
    text = json.dumps(trimmed, sort_keys=True, separators=(",", ":"))
    while len(text.encode()) > limit and trimmed.get("message"):
        trimmed["message"] = trimmed["message"][len(trimmed["message"]) // 2 :]
        text = json.dumps(trimmed, sort_keys=True, separators=(",", ":"))
    return text


def decode_result(message: str | None) -> dict[str, Any] | None:
    """The result dict from a termination message (or a log line), None when there is none."""
    if not message:
        return None
    text = message.strip()
    if text.startswith(RESULT_PREFIX):
        text = text[len(RESULT_PREFIX) :]
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and "ok" in value else None


def _report(result: dict[str, Any], termination_log: str | None) -> None:
    text = encode_result(result)
    print(RESULT_PREFIX + text, flush=True)
    if termination_log:
        try:
            Path(termination_log).write_text(text)
        except OSError as e:
            print(f"kernelbuild: cannot write {termination_log}: {e}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- install
_INSTALL_FILES = ("__init__.py", "kernelbuild/__init__.py", "kernelbuild/builder.py")


def install(target: Path) -> list[Path]:
    """Copy this builder into ``target``/sglang_pd_operator (the init container's job)."""
    package_root = Path(__file__).resolve().parent.parent
    written = []
    for rel in _INSTALL_FILES:
        dst = target / "sglang_pd_operator" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package_root / rel, dst)
        written.append(dst)
    return written


def main(argv: list[str] | None = None) -> int:
    """CLI entrypoint; returns the exit code (0 published, 1 build refused, 2 bad request)."""
    p = argparse.ArgumentParser(
        prog="python -m sglang_pd_operator.kernelbuild.builder", description=__doc__.split("\n")[0]
    )
    p.add_argument("--request", type=Path, help="request JSON written by the operator")
    p.add_argument("--work-dir", type=Path, default=Path("/var/cache/sglang"), help="SGLANG_CACHE_DIR while building")
    p.add_argument("--volume", type=Path, help="root of the cache volume to publish into")
    p.add_argument("--termination-log", default=TERMINATION_LOG, help="where the result JSON goes ('' for none)")
    p.add_argument("--install-to", type=Path, help="copy the builder into this directory and exit")
    args = p.parse_args(argv)
    if args.install_to:
        for path in install(args.install_to):
            print(path)
        return 0
    if not args.request or not args.volume:
        p.error("--request and --volume are required")
    try:
        request = load_request(args.request)
        result = build(request, work_dir=args.work_dir, volume=args.volume)
    except BuildError as e:
        print(f"kernelbuild: refused to publish: {e}", file=sys.stderr, flush=True)
        _report({"ok": False, "step": e.step, "reason": e.reason, "message": e.message}, args.termination_log)
        return 2 if e.reason == "BadRequest" else 1
    except (OSError, ValueError) as e:
        print(f"kernelbuild: refused to publish: {e}", file=sys.stderr, flush=True)
        _report({"ok": False, "step": "builder", "reason": "BuilderError", "message": str(e)}, args.termination_log)
        return 1
    _report(result, args.termination_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
