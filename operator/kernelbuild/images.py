"""Runtime images with vendor plugins: build arguments from the kernel catalog, and what the Dockerfiles say.

``python -m sglang_pd_operator.kernelbuild.images build-args sglang-nvidia`` prints the
``--build-arg`` flags of ``images/sglang-nvidia/Dockerfile`` from ``kernels/plugins.yaml``
(plugin source, version, ISAs) and ``kernels/builds.yaml`` (base image, tag pattern),
so the catalog stays the one source of versions; ``dockerfile_arg_defaults`` reads the
defaults a Dockerfile declares, which the tests compare with the catalog.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..catalog import builtin_catalog
from .recipes import builtin_build_catalog, image_build_args

_ARG = re.compile(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?$")


def dockerfile_arg_defaults(path: Path) -> dict[str, str]:
    """``ARG NAME=default`` declarations of a Dockerfile (quotes removed; ARGs without a default are left out)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = _ARG.match(line.strip())
        if m and m.group(2) is not None:
            out[m.group(1)] = m.group(2).strip().strip('"').strip("'")
    return out


def main(argv: list[str] | None = None) -> int:
    """``build-args NAME``: print one ``--build-arg K=V`` per line; ``list``: the image names."""
    argv = list(sys.argv[1:] if argv is None else argv)
    builds, catalog = builtin_build_catalog(), builtin_catalog()
    if argv[:1] == ["list"]:
        for name, image in sorted(builds.images.items()):
            print(f"{name}\t{image.dockerfile}")
        return 0
    if len(argv) != 2 or argv[0] != "build-args" or argv[1] not in builds.images:
        print(f"usage: build-args {{{'|'.join(sorted(builds.images))}}} | list", file=sys.stderr)
        return 2
    for key, value in image_build_args(argv[1], builds=builds, catalog=catalog).items():
        print(f"--build-arg {key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
