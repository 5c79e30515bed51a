"""Build ``promtool`` from the pinned Prometheus Go module, once, into a cache (hack/gotool.py).

``hack/promtool/go.mod`` pins ``github.com/prometheus/prometheus`` (module v0.316.0 =
Prometheus 3.16.0) with ``tool`` directives for ``cmd/promtool`` and ``cmd/prometheus``
(the server, ``build_prometheus.py``); go.sum pins every dependency. ``PROMTOOL`` names a prebuilt promtool and skips the build. A cold build
compiles about 600 packages: ~4.5 minutes wall on 2 cores (measured); a warm Go build
cache only relinks.

Use: ``python hack/promtool/build_promtool.py`` prints the binary's path;
``ensure_promtool()`` returns it as a Path.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gotool import GoTool, GoToolBuildError, main  # noqa: E402

PromtoolBuildError = GoToolBuildError


def prometheus_version(go_mod_text: str) -> str | None:
    """Prometheus release of the pinned module: module v0.MMM.P is release v(MMM//100).(MMM%100).P."""
    m = re.search(r"github\.com/prometheus/prometheus v0\.(\d+)\.(\d+)", go_mod_text)
    if not m:
        return None
    minor = int(m[1])
    return f"{minor // 100}.{minor % 100}.{m[2]}"


def _ldflags(module_dir: Path) -> str:
    version = prometheus_version((module_dir / "go.mod").read_text())
    return f"-X github.com/prometheus/common/version.Version={version}" if version else ""


PROMTOOL = GoTool(
    name="promtool",
    package="github.com/prometheus/prometheus/cmd/promtool",
    module_dir=Path(__file__).resolve().parent,
    env_override="PROMTOOL",
    ldflags=_ldflags,
)


def ensure_promtool(*, log: Callable[[str], None] = print) -> Path:
    """Return promtool, building it first on a cache miss; raises PromtoolBuildError."""
    return PROMTOOL.ensure(log=log)


if __name__ == "__main__":
    sys.exit(main(PROMTOOL))
