"""Build one Go command from a pinned Go module, once, into a cache keyed by go.mod + go.sum.

Shared by hack/promtool/build_promtool.py, hack/kubeconform/build_kubeconform.py and
hack/imageref/build_imageref.py.
The binary lands in ``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/<name>/<hash>/<name>``
where ``<hash>`` is the sha256 of go.mod and go.sum: a second call finds it and builds
nothing. The build writes into a temporary sibling directory and renames it into place,
so an interrupted build never leaves a half-filled cache; a file lock serialises
concurrent builds of the same hash (the approach of the dev cluster's binaries,
``sglang_pd_operator_dev.cluster.build``). An environment variable naming a prebuilt
binary skips all of it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class GoToolBuildError(RuntimeError):
    """The tool could not be found or built; the message says why."""


@dataclass(frozen=True)
class GoTool:
    """One command to build: ``name`` (binary and cache folder), the Go ``package``, the
    ``module_dir`` holding go.mod/go.sum, the ``env_override`` naming a prebuilt binary, and
    ``ldflags`` (e.g. ``-X`` version stamps) computed from the module directory, and
    ``sources``: files of the module directory that are inputs too (a command of our own,
    e.g. ``main.go``), hashed with go.mod and go.sum."""

    name: str
    package: str
    module_dir: Path
    env_override: str
    ldflags: Callable[[Path], str] = lambda module_dir: ""
    sources: tuple[str, ...] = ()

    def module_hash(self) -> str:
        """sha256 (hex) of go.mod, go.sum and ``sources``: the only inputs of the build."""
        digest = hashlib.sha256()
        for name in ("go.mod", "go.sum", *self.sources):
            digest.update(name.encode() + b"\0" + (self.module_dir / name).read_bytes() + b"\0")
        return digest.hexdigest()

    def cache_root(self) -> Path:
        """``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/<name>``."""
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "sglang-pd-operator" / self.name

    def find(self) -> Path | None:
        """The binary without building: $<env_override>, else a cache hit, else None."""
        override = os.environ.get(self.env_override)
        if override:
            path = Path(override)
            if not os.access(path, os.X_OK):
                raise GoToolBuildError(f"{self.env_override}={override} is not an executable file")
            return path
        path = self.cache_root() / self.module_hash() / self.name
        return path if os.access(path, os.X_OK) else None

    def ensure(self, *, log: Callable[[str], None] = print) -> Path:
        """Return the binary, building it first on a cache miss.

        Raises GoToolBuildError when ``go`` is missing or the build fails (with its output tail).
        """
        found = self.find()
        if found:
            return found
        go = shutil.which("go")
        if not go:
            raise GoToolBuildError(f"`go` is not on PATH: building {self.name} needs Go >= 1.26 (or set {self.env_override})")
        key = self.module_hash()
        root = self.cache_root()
        root.mkdir(parents=True, exist_ok=True)
        final = root / key
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.access(final / self.name, os.X_OK):
                return final / self.name
            tmp = root / f".{key}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            started = time.monotonic()
            ldflags = ("-s -w " + self.ldflags(self.module_dir)).strip()
            log(f"{self.name}: cache miss; building {self.package} into {final} (a cold build can take minutes)")
            try:
                proc = subprocess.run(
                    [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp / self.name), self.package],
                    cwd=self.module_dir, capture_output=True, text=True,
                )
                if proc.returncode != 0:
                    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                    raise GoToolBuildError(f"go build {self.package} failed (exit {proc.returncode}):\n{tail}")
                if final.exists():
                    shutil.rmtree(final)
                os.rename(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            log(f"{self.name}: built in {time.monotonic() - started:.0f}s -> {final / self.name}")
        return final / self.name


def main(tool: GoTool) -> int:
    """Command-line entry: print the binary's path (building it if needed); 1 on failure."""
    import sys

    try:
        print(tool.ensure(log=lambda line: print(line, file=sys.stderr)))
    except GoToolBuildError as err:
        print(err, file=sys.stderr)
        return 1
    return 0
