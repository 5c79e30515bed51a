"""Render the Mooncake Store master of a PDDeployment, and the store config each role gets (pure).

With ``kvCache.hicache.storage.backend: mooncake`` the operator runs one Mooncake Store
master per PDDeployment: ``mooncake_master`` from mooncake-transfer-engine (shipped in
SGLang runtime images), as a one-replica Deployment and a Service with two ports:
``rpc`` (engines' store clients, ``--rpc_port``) and ``metrics`` (HTTP ``/health`` and
Prometheus ``/metrics``, ``--metrics_port``). The master holds only metadata (which pod's
segment holds which key); the KV pages live in the host memory every engine pod lends
(``globalSegmentSize``). It is shared by every compat group of the PDDeployment: groups
are kept apart by their key namespace (``extra_backend_tag``, planning/hicache.py), so it
carries no compat-key label and the group pruning never deletes it.

Probes use the metrics port's ``/health`` (``{"status":"ok",...,"service_ready":true}`` on
mooncake-transfer-engine 0.3.13.post1). The operator's own ``KVStoreReady`` condition
reads the same endpoint (reconcilers/kvstore.py).

``render_shared`` (render/__init__.py) includes :func:`render_mooncake_master` (it returns [] when
the spec has no Mooncake storage, so it can be called unconditionally).
"""

from __future__ import annotations

import json
from typing import Any

from ..api.v1alpha1 import MooncakeStorageSpec
from ..planning import hicache as H
from ..planning.structs import Plan, RolePlan
from . import labels as L

MASTER_BINARY = "mooncake_master"
#: Seconds a store client stays alive after its last heartbeat (mooncake_master default 10).
CLIENT_TTL_S = 10


def mooncake_spec(plan: Plan) -> MooncakeStorageSpec | None:
    """The Mooncake storage settings when HiCache stores KV in a Mooncake Store, else None."""
    if H.storage_backend(plan.spec) != "mooncake":
        return None
    hc = H.hicache_spec(plan.spec)
    assert hc is not None
    return hc.storage.mooncake or MooncakeStorageSpec()


def master_labels(name: str) -> dict[str, str]:
    """Labels of the master's objects (no compat key: shared by every group)."""
    return {**L.common_labels(name), "app.kubernetes.io/component": H.MASTER_COMPONENT, **master_selector(name)}


def master_selector(name: str) -> dict[str, str]:
    """The master pod's selector labels."""
    return {L.LABEL_DEPLOYMENT: name, L.LABEL_ROLE: H.MASTER_COMPONENT}


def master_args(mc: MooncakeStorageSpec) -> list[str]:
    """mooncake_master flags (gflags ``--name=value``; names from ``mooncake_master --help`` of 0.3.13.post1)."""
    m = mc.master
    args = [
        f"--rpc_port={m.rpcPort}",
        "--rpc_address=0.0.0.0",
        f"--metrics_port={m.metricsPort}",
        "--metrics_host=0.0.0.0",
        "--enable_metric_reporting=true",
        f"--client_ttl={CLIENT_TTL_S}",
    ]
    if m.evictionHighWatermarkRatio is not None:
        args.append(f"--eviction_high_watermark_ratio={m.evictionHighWatermarkRatio}")
    return args


def render_mooncake_master(plan: Plan, *, owner: dict | None = None) -> list[dict[str, Any]]:
    """The master's Deployment and Service (Service first), or [] without Mooncake storage."""
    mc = mooncake_spec(plan)
    if mc is None:
        return []
    name, ns, m = plan.name, plan.namespace, mc.master
    obj_name = H.master_service_name(name)
    labels = master_labels(name)
    probe = {"httpGet": {"path": "/health", "port": "metrics"}, "timeoutSeconds": 3}
    container = {
        "name": "mooncake-master",
        "image": m.image or plan.spec.runtime.image,
        "imagePullPolicy": plan.spec.runtime.imagePullPolicy,
        "command": [MASTER_BINARY],
        "args": master_args(mc),
        "ports": [
            {"name": "rpc", "containerPort": m.rpcPort, "protocol": "TCP"},
            {"name": "metrics", "containerPort": m.metricsPort, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": m.cpu, "memory": m.memory},
            "limits": {"memory": m.memory},
        },
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": L.metadata(name=obj_name, namespace=ns, labels=labels, owner=owner),
        "spec": {
            "replicas": 1,
            # One master at a time: two would each believe they own the store's metadata.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": master_selector(name)},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 10},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": L.metadata(name=obj_name, namespace=ns, labels=labels, owner=owner),
        "spec": {
            "selector": master_selector(name),
            "ports": [
                {"name": "rpc", "port": m.rpcPort, "targetPort": "rpc", "protocol": "TCP"},
                {"name": "metrics", "port": m.metricsPort, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }
    return [service, deployment]


def store_config(plan: Plan, role: RolePlan) -> dict[str, Any] | None:
    """The Mooncake store config ``role`` renders into --hicache-storage-backend-extra-config, or None.

    Read back from the role's command, so it is exactly what the pod gets.
    """
    args = list(role.command.args)
    if "--hicache-storage-backend" not in args or "--hicache-storage-backend-extra-config" not in args:
        return None
    if args[args.index("--hicache-storage-backend") + 1] != "mooncake":
        return None
    return json.loads(args[args.index("--hicache-storage-backend-extra-config") + 1])


def master_metrics_url(plan: Plan) -> str | None:
    """In-cluster URL of the master's HTTP port (``/health``, ``/metrics``), or None without one."""
    mc = mooncake_spec(plan)
    if mc is None:
        return None
    return f"http://{H.master_host(plan.name, plan.namespace)}:{mc.master.metricsPort}"
