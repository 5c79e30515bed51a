"""Render a KernelBuild's children (pure): the cache PVC, the request ConfigMap, one Job per attempt.

The Job runs on a node of the build's accelerator (the catalog's node labels), with as
many GPUs as one engine replica of the role, the same runtime image and the same model
source at the same path as the engine pods. Its init container (the operator image)
copies the builder into the pod, so any runtime image can run it; the build container
then runs ``python3 -m sglang_pd_operator.kernelbuild.builder`` with the request
rendered here: the recipe's commands with the role's flags substituted.

Paths are chosen so the cache is built at the path the engines mount it at
(``SGLANG_CACHE_DIR`` = /var/cache/sglang, a pod-local emptyDir while building), and
published into the PVC mounted at :data:`VOLUME_MOUNT`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .. import __version__
from ..api.kernelbuild import KernelBuildSpec
from ..api.v1alpha1 import API_VERSION, ModelSource, parse_duration
from ..catalog import Accelerator
from ..planning.engine_args import HF_CACHE, MODEL_MOUNT, SGLANG_CACHE_DIR
from ..render import labels as L
from .builder import REQUEST_VERSION, TERMINATION_LOG
from .inputs import LABEL_INPUT_HASH, LABEL_KERNELBUILD, ResolvedBuild
from .recipes import SERVER_ARGS

BUILD_PORT = 30000
VOLUME_MOUNT = "/kernel-cache-volume"
REQUEST_DIR = "/etc/kernelbuild"
REQUEST_FILE = "request.json"
BUILDER_DIR = "/opt/kernelbuild"
CONTAINER = "builder"
LABEL_ATTEMPT = f"{L.DOMAIN}/attempt"
BUILDER_IMAGE_ENV = "SGLANG_PD_OPERATOR_IMAGE"
DEFAULT_BUILDER_IMAGE = f"sglang-pd-operator:{__version__}"
DEFAULT_MEMORY = "64Gi"


def default_builder_image() -> str:
    """The operator image (``$SGLANG_PD_OPERATOR_IMAGE``, set by the chart), else ``sglang-pd-operator:<version>``."""
    return os.environ.get(BUILDER_IMAGE_ENV) or DEFAULT_BUILDER_IMAGE


def pvc_name(kb: str) -> str:
    """``<kernelbuild>-cache``."""
    return f"{kb}-cache"


def request_name(kb: str, input_hash: str) -> str:
    """``<kernelbuild>-<inputs6>-request``: per inputs, so a running attempt never reads a newer request."""
    return f"{kb}-{input_hash[:6]}-request"


def job_name(kb: str, input_hash: str, attempt: int) -> str:
    """``<kernelbuild>-<inputs6>-<attempt>``: one Job per attempt, never reused across inputs."""
    return f"{kb}-{input_hash[:6]}-{attempt}"


def model_path(source: ModelSource, model_name: str) -> str:
    """--model-path as the engine pods see it (same mount): the PVC path under /models, else the hub id."""
    if source.pvc is None:
        return model_name
    sub = source.pvc.path.strip("/")
    return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT


def server_args(spec: KernelBuildSpec, *, port: int = BUILD_PORT) -> list[str]:
    """The SGLang flags the recipe's commands get: model, revision, the role's kernel flags, loopback host and port."""
    return [
        "--model-path", model_path(spec.model.source, spec.model.name),
        "--revision", spec.model.revision,
        *spec.args,
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def build_request(
    *, name: str, spec: KernelBuildSpec, resolved: ResolvedBuild, input_hash: str, port: int = BUILD_PORT
) -> dict[str, Any]:
    """The builder's request: the recipe's steps with ``{server_args}``, ``{port}`` and ``{timeout_seconds}`` filled in.

    ``{python}`` stays: the builder replaces it with the image's interpreter. The env is
    the role's kernel environment plus ``MC_FORCE_TCP=1`` (the build pod has no RDMA NIC;
    Mooncake stays the transfer backend because DeepSeek-V4.1 DSpark under PD refuses any
    other at startup, sglang arg_groups/deepseek_v4_hook.py:377).
    """
    timeout = int(parse_duration(spec.timeout))
    sargs = server_args(spec, port=port)
    steps = []
    for step in resolved.recipe.steps:
        argv: list[str] = []
        for a in step.argv:
            if a == SERVER_ARGS:
                argv += sargs
            else:
                argv.append(a.replace("{port}", str(port)).replace("{timeout_seconds}", str(timeout)))
        steps.append({"name": step.name, "kind": step.kind, "argv": argv, "probe": step.probe, "verify": step.verify})
    env = {e.name: e.value for e in spec.env}
    env["MC_FORCE_TCP"] = "1"
    if spec.model.source.hub is not None:
        env["HF_HOME"] = HF_CACHE
    return {
        "version": REQUEST_VERSION,
        "name": name,
        "inputHash": input_hash,
        "recipe": resolved.recipe_name,
        "port": port,
        "timeoutSeconds": timeout,
        "steps": steps,
        "env": env,
        "expect": list(resolved.recipe.expect),
        "forbid": list(resolved.recipe.forbid),
        "writable": list(resolved.recipe.writable),
    }


def owner_of(body: dict[str, Any]) -> dict[str, Any]:
    """The owner reference target of a KernelBuild body."""
    meta = body["metadata"]
    return {"apiVersion": API_VERSION, "kind": "KernelBuild", "name": meta["name"], "uid": meta.get("uid")}


def labels_of(kb: str, input_hash: str | None = None) -> dict[str, str]:
    """Labels on every child of a KernelBuild."""
    out = {
        "app.kubernetes.io/name": "sglang-kernelbuild",
        "app.kubernetes.io/managed-by": L.MANAGED_BY,
        LABEL_KERNELBUILD: kb,
    }
    if input_hash:
        out[LABEL_INPUT_HASH] = input_hash
    return out


def render_pvc(*, name: str, namespace: str, spec: KernelBuildSpec, owner: dict | None) -> dict[str, Any]:
    """The cache PVC (ReadWriteMany by default), owned by the KernelBuild."""
    pvc_spec: dict[str, Any] = {
        "accessModes": list(spec.storage.accessModes),
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storageClassName is not None:
        pvc_spec["storageClassName"] = spec.storage.storageClassName
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": L.metadata(name=pvc_name(name), namespace=namespace, labels=labels_of(name), owner=owner),
        "spec": pvc_spec,
    }


def render_request(*, name: str, namespace: str, request: dict[str, Any], owner: dict | None) -> dict[str, Any]:
    """The ConfigMap holding ``request.json`` for the builder."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": L.metadata(
            name=request_name(name, request["inputHash"]),
            namespace=namespace,
            labels=labels_of(name, request["inputHash"]),
            owner=owner,
        ),
        "data": {REQUEST_FILE: json.dumps(request, indent=2, sort_keys=True) + "\n"},
    }


def _resources(spec: KernelBuildSpec, acc: Accelerator) -> dict[str, Any]:
    cpu = spec.resources.cpu or str(max(4, (acc.cpus // acc.gpusPerNode) * spec.gpus - 2))
    memory = spec.resources.memory or DEFAULT_MEMORY
    gpus = str(spec.gpus)
    return {
        "requests": {"cpu": cpu, "memory": memory, acc.gpuResource: gpus},
        "limits": {"memory": memory, acc.gpuResource: gpus},
    }


def render_job(
    *,
    name: str,
    namespace: str,
    spec: KernelBuildSpec,
    accelerator: Accelerator,
    input_hash: str,
    attempt: int,
    owner: dict | None,
    builder_image: str | None = None,
) -> dict[str, Any]:
    """The build Job of one attempt. ``backoffLimit: 0``: retries are the KernelBuild's (with backoff, counted in status)."""
    labels = {**labels_of(name, input_hash), LABEL_ATTEMPT: str(attempt)}
    shm = spec.resources.sharedMemory or accelerator.sharedMemory
    volumes: list[dict[str, Any]] = [
        {"name": "request", "configMap": {"name": request_name(name, input_hash)}},
        {"name": "builder", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "work", "emptyDir": {"sizeLimit": spec.storage.size}},
        {"name": "cache-volume", "persistentVolumeClaim": {"claimName": pvc_name(name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "request", "mountPath": REQUEST_DIR, "readOnly": True},
        {"name": "builder", "mountPath": BUILDER_DIR, "readOnly": True},
        {"name": "work", "mountPath": SGLANG_CACHE_DIR},
        {"name": "cache-volume", "mountPath": VOLUME_MOUNT},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    env: list[dict[str, Any]] = [
        {"name": "PYTHONPATH", "value": BUILDER_DIR},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    source = spec.model.source
    if source.pvc is not None:
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claimName, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    else:
        volumes.append({"name": "model", "emptyDir": {"sizeLimit": source.hub.cacheSize}})
        mounts.append({"name": "model", "mountPath": HF_CACHE})
        if source.hub.tokenSecret is not None:
            env.append(
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {
                        "secretKeyRef": {"name": source.hub.tokenSecret.name, "key": source.hub.tokenSecret.key}
                    },
                }
            )
    image = builder_image or spec.builderImage or default_builder_image()
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": dict(accelerator.nodeLabels),
        "tolerations": [{"key": accelerator.gpuResource, "operator": "Exists", "effect": "NoSchedule"}],
        "initContainers": [
            {
                "name": "install-builder",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-m", "sglang_pd_operator.kernelbuild.builder", "--install-to", BUILDER_DIR],
                "volumeMounts": [{"name": "builder", "mountPath": BUILDER_DIR}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            }
        ],
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.runtime.image,
                "imagePullPolicy": spec.runtime.imagePullPolicy,
                "command": ["python3", "-m", "sglang_pd_operator.kernelbuild.builder"],
                "args": [
                    "--request",
                    f"{REQUEST_DIR}/{REQUEST_FILE}",
                    "--work-dir",
                    SGLANG_CACHE_DIR,
                    "--volume",
                    VOLUME_MOUNT,
                    "--termination-log",
                    TERMINATION_LOG,
                ],  # fmt: skip
                "env": env,
                "resources": _resources(spec, accelerator),
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    template_meta: dict[str, Any] = {"labels": labels}
    if spec.podAnnotations:
        template_meta["annotations"] = dict(spec.podAnnotations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": L.metadata(
            name=job_name(name, input_hash, attempt), namespace=namespace, labels=labels, owner=owner
        ),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(parse_duration(spec.timeout)),
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
