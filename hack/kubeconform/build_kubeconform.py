"""Build ``kubeconform`` from its pinned Go module, once, into a cache.

``hack/kubeconform/go.mod`` pins ``github.com/yannh/kubeconform`` v0.8.0 with a ``tool``
directive for ``cmd/kubeconform``; go.sum pins every dependency. The binary lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/kubeconform/<hash>/kubeconform`` where
``<hash>`` is the sha256 of go.mod and go.sum: a second call finds it and builds nothing.
The build writes into a temporary sibling directory and renames it into place, so an
interrupted build never leaves a half-filled cache; a file lock serialises concurrent
builds of the same hash (the same approach as ``hack/promtool/build_promtool.py`` and the
dev cluster's binaries, ``sglang_pd_operator.devcluster.build``).

kubeconform downloads its Kubernetes JSON schemas from GitHub by default; that is not
possible here, so the schemas come from ``hack/kubeconform/schemas.py`` (generated from a
running API server's ``/openapi/v3`` and from ``crds/``).

``KUBECONFORM`` names a prebuilt kubeconform and skips all this. A cold build compiles
about 60 packages (well under a minute on 2 cores).

Use: ``python hack/kubeconform/build_kubeconform.py`` prints the binary's path;
``ensure_kubeconform()`` returns it as a Path.
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
PACKAGE = "github.com/yannh/kubeconform/cmd/kubeconform"
ENV_OVERRIDE = "KUBECONFORM"


class KubeconformBuildError(RuntimeError):
    """kubeconform could not be found or built; the message says why."""


def module_hash(module_dir: Path = MODULE_DIR) -> str:
    """sha256 (hex) of go.mod and go.sum: the only inputs of the build."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode() + b"\0" + (module_dir / name).read_bytes() + b"\0")
    return digest.hexdigest()


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/kubeconform``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sglang-pd-operator" / "kubeconform"


def kubeconform_version(go_sum_text: str) -> str | None:
    """The pinned release, e.g. ``v0.8.0``, read from go.sum."""
    m = re.search(r"^github\.com/yannh/kubeconform (v[0-9][^ /]*) ", go_sum_text, re.M)
    return m[1] if m else None


def find_kubeconform() -> Path | None:
    """The binary without building: $KUBECONFORM, else a cache hit, else None."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise KubeconformBuildError(f"{ENV_OVERRIDE}={override} is not an executable file")
        return path
    path = cache_root() / module_hash() / "kubeconform"
    return path if os.access(path, os.X_OK) else None


def ensure_kubeconform(*, log: Callable[[str], None] = print) -> Path:
    """Return kubeconform, building it first on a cache miss (see the module docstring).

    Raises KubeconformBuildError when ``go`` is missing or the build fails (with its output tail).
    """
    found = find_kubeconform()
    if found:
        return found
    go = shutil.which("go")
    if not go:
        raise KubeconformBuildError("`go` is not on PATH: building kubeconform needs Go >= 1.26 (or set KUBECONFORM)")
    key = module_hash()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(final / "kubeconform", os.X_OK):
            return final / "kubeconform"
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        started = time.monotonic()
        version = kubeconform_version((MODULE_DIR / "go.sum").read_text())
        ldflags = "-s -w" + (f" -X main.version={version}" if version else "")
        log(f"kubeconform: cache miss; building {PACKAGE} {version} into {final}")
        try:
            proc = subprocess.run([go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp / "kubeconform"),
                                   PACKAGE], cwd=MODULE_DIR, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise KubeconformBuildError(f"go build {PACKAGE} failed (exit {proc.returncode}):\n{tail}")
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"kubeconform: built in {time.monotonic() - started:.0f}s -> {final / 'kubeconform'}")
    return final / "kubeconform"


if __name__ == "__main__":
    try:
        print(ensure_kubeconform(log=lambda line: print(line, file=sys.stderr)))
    except KubeconformBuildError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
