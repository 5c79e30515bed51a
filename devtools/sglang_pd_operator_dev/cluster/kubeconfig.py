"""Kubeconfig files of a dev cluster: one for the user and tests (admin), one per component.

Certificates are embedded (``*-data`` fields), so a kubeconfig keeps working when copied
elsewhere, as long as the cluster runs.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

#: Name of the cluster, user and context inside every kubeconfig this harness writes.
CONTEXT = "sglang-pd-dev"


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def render_kubeconfig(*, server: str, ca_cert: Path, client_cert: Path, client_key: Path,
                      user: str = CONTEXT) -> dict:
    """A kubeconfig (as a dict) for ``server`` (e.g. "https://127.0.0.1:6443")."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {
            "server": server, "certificate-authority-data": _b64(ca_cert)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": _b64(client_cert), "client-key-data": _b64(client_key)}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": user}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: Path, **kwargs) -> Path:
    """Write :func:`render_kubeconfig` (same keyword arguments) to ``path`` (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(render_kubeconfig(**kwargs), sort_keys=False))
    path.chmod(0o600)
    return path
