"""Build ``kubeconform`` from its pinned Go module, once, into a cache.

``hack/kubeconform/go.mod`` pins ``github.com/yannh/kubeconform`` v0.8.0 with a ``tool``
directive for ``cmd/kubeconform``; go.sum pins every dependency. The binary lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/kubeconform/<hash>/kubeconform`` where
``<hash>`` is the sha256 of go.mod and go.sum: a second call finds it and builds nothing.
The build writes into a temporary sibling directory and renames it into place, so an
interrupted build never leaves a half-filled cache; a file lock serialises concurrent
builds of the same hash (hack/gotool.py, shared with hack/promtool/build_promtool.py; the
dev cluster's binaries, ``sglang_pd_operator_dev.cluster.build``).

kubeconform downloads its Kubernetes JSON schemas from GitHub by default; that is not
possible here, so the schemas come from ``hack/kubeconform/schemas.py`` (generated from a
running API server's ``/openapi/v3`` and from ``crds/``).

``KUBECONFORM`` names a prebuilt kubeconform and skips all this. A cold build compiles
about 60 packages (well under a minute on 2 cores).

Use: ``python hack/kubeconform/build_kubeconform.py`` prints the binary's path;
``ensure_kubeconform()`` returns it as a Path.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gotool import GoTool, GoToolBuildError, main  # noqa: E402

MODULE_DIR = Path(__file__).resolve().parent
KubeconformBuildError = GoToolBuildError


def kubeconform_version(go_sum_text: str) -> str | None:
    """The pinned release, e.g. ``v0.8.0``, read from go.sum."""
    m = re.search(r"^github\.com/yannh/kubeconform (v[0-9][^ /]*) ", go_sum_text, re.M)
    return m[1] if m else None


def _ldflags(module_dir: Path) -> str:
    version = kubeconform_version((module_dir / "go.sum").read_text())
    return f"-X main.version={version}" if version else ""


KUBECONFORM = GoTool(
    name="kubeconform",
    package="github.com/yannh/kubeconform/cmd/kubeconform",
    module_dir=MODULE_DIR,
    env_override="KUBECONFORM",
    ldflags=_ldflags,
)


def find_kubeconform() -> Path | None:
    """The binary without building: $KUBECONFORM, else a cache hit, else None."""
    return KUBECONFORM.find()


def ensure_kubeconform(*, log: Callable[[str], None] = print) -> Path:
    """Return kubeconform, building it first on a cache miss; raises KubeconformBuildError."""
    return KUBECONFORM.ensure(log=log)


if __name__ == "__main__":
    sys.exit(main(KUBECONFORM))
