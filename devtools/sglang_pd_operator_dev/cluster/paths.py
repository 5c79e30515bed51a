"""Where the dev cluster's inputs and outputs live on disk.

Inputs come from the source tree (``hack/cluster/``: the Go module, kwok stages, node
pools); binaries go to a per-user cache keyed by the Go module's hash (see ``build``);
each running cluster owns one run directory (certificates, logs, etcd data, state file).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming a directory of prebuilt binaries (skips the Go build).
BIN_DIR_ENV = "SGLANG_PD_CLUSTER_BIN_DIR"
#: Environment variable overriding the location of hack/cluster (tests, odd layouts).
SOURCE_DIR_ENV = "SGLANG_PD_CLUSTER_SOURCE_DIR"


def repo_root() -> Path:
    """The checkout root: the folder holding ``devtools/`` (this package's source), ``operator/`` and ``hack/``."""
    return Path(__file__).resolve().parents[3]


def source_dir() -> Path:
    """``hack/cluster/``: go.mod, kwok stages and node-pools.yaml.

    Raises FileNotFoundError when it is missing (e.g. a wheel install without the
    source tree); set SGLANG_PD_CLUSTER_SOURCE_DIR to point at a checkout's copy.
    """
    override = os.environ.get(SOURCE_DIR_ENV)
    path = Path(override) if override else repo_root() / "hack" / "cluster"
    if not (path / "go.mod").is_file():
        raise FileNotFoundError(
            f"{path}/go.mod not found: the dev cluster needs the source checkout's hack/cluster "
            f"(set {SOURCE_DIR_ENV} to its path)"
        )
    return path


def lws_source_dir() -> Path:
    """``hack/cluster/lws/``: the Go module pinning the LeaderWorkerSet controller.

    A module of its own beside ``hack/cluster/go.mod`` (its tools.go says why); ``build``
    compiles it into the same binary cache directory as the control plane.
    """
    return source_dir() / "lws"


def kwok_stage_dir() -> Path:
    """``hack/cluster/kwok/``: the kwok Stage YAML files passed to kwok with --config."""
    return source_dir() / "kwok"


def node_pools_file() -> Path:
    """``hack/cluster/node-pools.yaml``: the fake GPU node pools."""
    return source_dir() / "node-pools.yaml"


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/sglang-pd-operator``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sglang-pd-operator"


def binary_cache_dir() -> Path:
    """Parent of the per-hash binary directories (``cluster-bin/<sha256>/``)."""
    return cache_root() / "cluster-bin"


def kueue_cache_dir() -> Path:
    """Parent of the per-hash Kueue directories (``kueue-bin/<sha256>/``), apart from ``cluster-bin``:
    Kueue is optional and its module hash moves on its own."""
    return cache_root() / "kueue-bin"


def default_run_dir() -> Path:
    """The command line's run directory: ``<checkout>/.run/cluster`` (gitignored)."""
    return repo_root() / ".run" / "cluster"
