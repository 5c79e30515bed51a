"""Build ``imageref`` (hack/imageref/main.go, github.com/distribution/reference v0.6.0) once, into a cache.

The judge of tests/contract/test_image_reference_grammar.py: the real image reference
grammar kubelet parses images with (``reference.ParseNormalizedNamed``), for holding our
parser (docker-image-py, ``api/text.py``) and the CRD's pattern to it. ``go.mod`` pins the
module, ``go.sum`` every dependency; the binary lands in
``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator/imageref/<hash>/imageref`` where ``<hash>``
covers go.mod, go.sum and main.go (hack/gotool.py, shared with promtool and kubeconform):
a second call builds nothing.

``IMAGEREF`` names a prebuilt binary and skips all this. A cold build compiles two small
modules (12.6 s of CPU; the figures are in docs/validation.md).

Use: ``python hack/imageref/build_imageref.py`` prints the binary's path;
``ensure_imageref()`` returns it as a Path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gotool import GoTool, main  # noqa: E402

MODULE_DIR = Path(__file__).resolve().parent

IMAGEREF = GoTool(
    name="imageref",
    package=".",
    module_dir=MODULE_DIR,
    env_override="IMAGEREF",
    sources=("main.go",),
)


def ensure_imageref(*, log: Callable[[str], None] = print) -> Path:
    """Return imageref, building it first on a cache miss; raises gotool.GoToolBuildError."""
    return IMAGEREF.ensure(log=log)


if __name__ == "__main__":
    sys.exit(main(IMAGEREF))
