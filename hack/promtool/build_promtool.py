"""Build ``promtool`` from the pinned Prometheus Go module, once, into a cache.

``hack/promtool/go.mod`` pins ``github.com/prometheus/prometheus`` (module v0.316.0 =
Prometheus 3.16.0) with a ``tool`` directive for ``cmd/promtool``; go.sum pins every
dependency. The binary lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/promtool/<hash>/promtool`` where
``<hash>`` is the sha256 of go.mod and go.sum: a second call finds it and builds nothing.
The build writes into a temporary sibling directory and renames it into place, so an
interrupted build never leaves a half-filled cache; a file lock serialises concurrent
builds of the same hash (the same approach as the dev cluster's binaries,
``sglang_pd_operator.devcluster.build``).

``PROMTOOL`` names a prebuilt promtool and skips all this. A cold build compiles about
600 packages: ~4.5 minutes wall on 2 cores (measured); a warm Go build cache only relinks.

Use: ``python hack/promtool/build_promtool.py`` prints the binary's path;
``ensure_promtool()`` returns it as a Path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent
PACKAGE = "github.com/prometheus/prometheus/cmd/promtool"
ENV_OVERRIDE = "PROMTOOL"


class PromtoolBuildError(RuntimeError):
    """promtool could not be found or built; the message says why."""


def module_hash(module_dir: Path = MODULE_DIR) -> str:
    """sha256 (hex) of go.mod and go.sum: the only inputs of the build."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode() + b"\0" + (module_dir / name).read_bytes() + b"\0")
    return digest.hexdigest()


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/promtool``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sglang-pd-operator" / "promtool"


def prometheus_version(go_mod_text: str) -> str | None:
    """Prometheus release of the pinned module: module v0.MMM.P is release v(MMM//100).(MMM%100).P."""
    m = re.search(r"github\.com/prometheus/prometheus v0\.(\d+)\.(\d+)", go_mod_text)
    if not m:
        return None
    minor = int(m[1])
    return f"{minor // 100}.{minor % 100}.{m[2]}"


def find_promtool() -> Path | None:
    """The binary without building: $PROMTOOL, else a cache hit, else None."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise PromtoolBuildError(f"{ENV_OVERRIDE}={override} is not an executable file")
        return path
    path = cache_root() / module_hash() / "promtool"
    return path if os.access(path, os.X_OK) else None


def ensure_promtool(*, log: Callable[[str], None] = print) -> Path:
    """Return promtool, building it first on a cache miss (see the module docstring).

    Raises PromtoolBuildError when ``go`` is missing or the build fails (with its output tail).
    """
    found = find_promtool()
    if found:
        return found
    go = shutil.which("go")
    if not go:
        raise PromtoolBuildError("`go` is not on PATH: building promtool needs Go >= 1.26 (or set PROMTOOL)")
    key = module_hash()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(final / "promtool", os.X_OK):
            return final / "promtool"
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        started = time.monotonic()
        ldflags = "-s -w"
        version = prometheus_version((MODULE_DIR / "go.mod").read_text())
        if version:
            ldflags += f" -X github.com/prometheus/common/version.Version={version}"
        log(f"promtool: cache miss; building {PACKAGE} (Prometheus {version}) into {final} "
            "(a cold build takes minutes on 2 cores)")
        try:
            proc = subprocess.run([go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp / "promtool"),
                                   PACKAGE], cwd=MODULE_DIR, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise PromtoolBuildError(f"go build {PACKAGE} failed (exit {proc.returncode}):\n{tail}")
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"promtool: built in {time.monotonic() - started:.0f}s -> {final / 'promtool'}")
    return final / "promtool"


if __name__ == "__main__":
    try:
        print(ensure_promtool(log=lambda line: print(line, file=sys.stderr)))
    except PromtoolBuildError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
