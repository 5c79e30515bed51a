"""Build the Docker Distribution registry (``registry`` v3) from its pinned Go module, once, into a cache.

``hack/images/registry/go.mod`` pins ``github.com/distribution/distribution/v3`` with a
``tool`` directive for ``cmd/registry``; go.sum pins every dependency. The binary lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/registry/<hash>/registry`` (hack/gotool.py:
a second call builds nothing; an interrupted build leaves no half-filled cache).
``REGISTRY_BIN`` names a prebuilt registry and skips all this.

Use: ``python hack/images/registry/build_registry.py`` prints the binary's path.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gotool import GoTool, main  # noqa: E402

REGISTRY = GoTool(
    name="registry",
    package="github.com/distribution/distribution/v3/cmd/registry",
    module_dir=Path(__file__).resolve().parent,
    env_override="REGISTRY_BIN",
)

if __name__ == "__main__":
    sys.exit(main(REGISTRY))
