"""Build the Prometheus server from the same pinned Go module as promtool, once, into a cache (hack/gotool.py).

``hack/promtool/go.mod`` pins ``github.com/prometheus/prometheus`` (module v0.316.0 =
Prometheus 3.16.0) with ``tool`` directives for ``cmd/promtool`` and ``cmd/prometheus``:
both binaries come from one module version, so the rules promtool checks are evaluated by
the same engine that serves the e2e's queries. ``PROMETHEUS`` names a prebuilt server and
skips the build. The web UI's assets are not embedded (the ``builtinassets`` build tag is
off): the HTTP API, which is all the operator uses, is complete without them. Measured:
a cold build alone took 7.6 min user + 1.0 min system CPU (15 min wall on a 2-core
machine loaded by other builds; ~4.5 min on two idle cores, like promtool's), and it
shares most packages with promtool's build; with a warm Go build cache it only relinks
(29 s).

Use: ``python hack/promtool/build_prometheus.py`` prints the binary's path;
``ensure_prometheus()`` returns it as a Path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from build_promtool import _ldflags  # noqa: E402
from gotool import GoTool, main  # noqa: E402

PROMETHEUS = GoTool(
    name="prometheus",
    package="github.com/prometheus/prometheus/cmd/prometheus",
    module_dir=Path(__file__).resolve().parent,
    env_override="PROMETHEUS",
    ldflags=_ldflags,
)


def ensure_prometheus(*, log: Callable[[str], None] = print) -> Path:
    """Return the Prometheus server binary, building it first on a cache miss; raises GoToolBuildError."""
    return PROMETHEUS.ensure(log=log)


if __name__ == "__main__":
    sys.exit(main(PROMETHEUS))
