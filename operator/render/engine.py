"""Render one role (prefill or decode) of one compat group: ConfigMap, workload, headless Service.

One renderer, parameterized by role (no near-identical prefill/decode copies), and one pod
template function (:func:`pod_template`) for every engine pod: a single-node role's
Deployment pod, and a multi-node role's LeaderWorkerSet leader and workers (the workload
object itself: render/multinode.py). The
role's SGLang flags go into a ``--config`` YAML file in the ConfigMap where SGLang's
config parser accepts them (switches and one-value options,
sglang/srt/utils/server_args_config_parser.py); the rest stay on the command line. A
hash of the config, command and env is a pod-template annotation, so any change rolls
the pods.

The ConfigMap is named after its content (:func:`config_map_name`) and immutable: a change
of config makes a new ConfigMap beside the old one, never rewrites the one running pods
mount. An in-place update's old pods (and any pod their ReplicaSet makes again) keep
reading the config they started with until the last of them is gone; only then does the
reconciler prune it (``reconcilers/configs.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any, Literal

import yaml

from ..api import lws
from ..api.v1alpha1 import parse_duration
from ..planning import transfer as T
from ..planning.engine_args import ENGINE_PORT, HF_CACHE, HOST_IP_ENV, MODEL_MOUNT, SGLANG_CACHE_DIR
from ..planning.hicache import FILE_STORAGE_MOUNT, LOCAL_HOSTNAME_ENV, hicache_spec, storage_backend
from ..planning.memory import gib, quantity_bytes
from ..planning.structs import Plan, RolePlan
from ..planning.sglang_flags import flag_table
from ..planning.rollout import InPlaceStrategy, progress_deadline_seconds, role_strategies
from . import labels as L
from .drain import ENGINE_GAUGES, prestop, termination_grace_seconds
from .multinode import (compute_domains, group_service_settings, imex_claims, imex_pod_labels, kueue_annotations,
                        leader_worker_set, pod_affinity, wait_for_leader_container)
from .probes import http_probe, readiness_probe, worker_readiness_probe

CONFIG_DIR = "/etc/sglang"
CONFIG_FILE = "config.yaml"
STARTUP_PROBE_PERIOD_S = 10
STARTUP_PROBE_FAILURES = 360  # 60 minutes: weight loading of a large MoE from a PVC
RDMA_BACKENDS = T.RDMA_BACKENDS


def split_config(args: tuple[str, ...] | list[str]) -> tuple[dict[str, Any], list[str]]:
    """Split SGLang flags into a ``--config`` YAML mapping and the flags that must stay on the command line.

    Keys are the flags without their leading dashes (SGLang's config parser turns a key
    back into ``--key`` and the value back into a string); switches map to ``true``;
    whole numbers are written as YAML integers, every other value as a string. Flags the
    config parser refuses (BooleanOptionalAction, nargs +/*) are returned in order, and so
    are flags whose value holds a ``$(VAR)`` reference: the kubelet expands those in a
    container's args only (``--node-rank $(LWS_WORKER_INDEX)`` of a multi-node replica).
    """
    table = flag_table()
    config: dict[str, Any] = {}
    cli: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        info = table.get(tok)
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        expanded = has_value and "$(" in args[i + 1]
        if info is None or not info.config_file or expanded:
            cli.append(tok)
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                cli.append(args[i])
                i += 1
            continue
        if info.takes_value and has_value:
            value = args[i + 1]
            config[tok[2:]] = int(value) if value.isdigit() else value
            i += 2
        else:
            config[tok[2:]] = True
            i += 1
    return config, cli


def config_yaml(role: RolePlan) -> str:
    """The role's SGLang config file text."""
    return _config_text(tuple(role.command.args))


@functools.lru_cache(maxsize=1024)
def _config_text(args: tuple[str, ...]) -> str:
    """:func:`config_yaml` of a command line, remembered: every reconcile renders each role's
    config file twice (the ConfigMap and the pod template's hash), and PyYAML's emitter was
    a fifth of a reconcile's CPU at scale (benchmarks/bench_scale.py, docs/scale.md)."""
    config, _ = split_config(args)
    return yaml.safe_dump(config, sort_keys=False)


def engine_command(role: RolePlan) -> list[str]:
    """The container's args after ``python3 -m sglang.launch_server``."""
    _, cli = split_config(role.command.args)
    return ["--config", f"{CONFIG_DIR}/{CONFIG_FILE}", *cli]


#: Hex digits of the config file's sha256 in its ConfigMap's name.
CONFIG_NAME_HASH_LENGTH = 10


def config_map_name(plan: Plan, role: RolePlan) -> str:
    """``<deployment>-<group id>-<component>-config-<sha256 of the config file, 10 hex>``.

    Content-addressed: two renderings with the same config file share one ConfigMap, a
    changed file gets a new one (an in-place update never rewrites the file its old pods
    read; a shared, rewritten ConfigMap reached old pods through the kubelet's volume
    refresh and any restart of their container).
    """
    digest = hashlib.sha256(config_yaml(role).encode()).hexdigest()[:CONFIG_NAME_HASH_LENGTH]
    return f"{L.group_object_name(plan.name, plan.compat_key, role.role)}-config-{digest}"


def config_hash(role: RolePlan, image: str) -> str:
    """sha256 prefix over config file, command, env and image: the pod-template annotation that rolls pods."""
    blob = json.dumps([config_yaml(role), engine_command(role), list(role.command.env), image], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def uses_rdma(plan: Plan) -> bool:
    """KV moves over RDMA: a real transfer backend and no TCP fallback (then, and only then, the
    pods request the accelerator's RDMA resource and the IPC_LOCK capability)."""
    return T.uses_rdma(plan.spec)


def _resources(plan: Plan, role: RolePlan) -> dict[str, Any]:
    inputs = role.inputs
    acc = inputs.accelerator
    assert acc is not None, "render needs a valid plan"
    gpus = inputs.gpus_per_pod  # a multi-node replica's pods each take their node's share
    # half of the node's CPUs per GPU: room for the gateway, daemons and the node's system share
    cpu = inputs.spec.resources.cpu or str(max(4, acc.cpus * gpus // (2 * acc.gpusPerNode)))
    memory = inputs.spec.resources.memory or gib(role.memory.host_bytes)
    requests: dict[str, str] = {"cpu": cpu, "memory": memory, acc.gpuResource: str(gpus)}
    limits: dict[str, str] = {"memory": memory, acc.gpuResource: str(gpus)}
    if uses_rdma(plan):
        requests[acc.rdmaResource] = "1"
        limits[acc.rdmaResource] = "1"
    return {"requests": requests, "limits": limits}


def _volumes(plan: Plan, role: RolePlan, config_map: str) -> tuple[list[dict], list[dict]]:
    spec = plan.spec
    shm = role.memory.shm
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "kernel-cache", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "kernel-cache", "mountPath": SGLANG_CACHE_DIR},
    ]
    if _stores_files(plan, role):
        fs = hicache_spec(spec).storage.file
        if fs is not None and fs.claimName:
            volumes.append({"name": "hicache", "persistentVolumeClaim": {"claimName": fs.claimName}})
        else:
            volumes.append({"name": "hicache", "emptyDir": {"sizeLimit": fs.size if fs is not None else "200Gi"}})
        mounts.append({"name": "hicache", "mountPath": FILE_STORAGE_MOUNT})
    source = spec.model.source
    if source.pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": source.pvc.claimName, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    else:
        volumes.append({"name": "model", "emptyDir": {"sizeLimit": source.hub.cacheSize}})
        mounts.append({"name": "model", "mountPath": HF_CACHE})
    return volumes, mounts


def _renders_storage(plan: Plan, role: RolePlan) -> bool:
    """The role's pods talk to the HiCache storage tier (prefill always, decode with offload)."""
    hc = hicache_spec(plan.spec)
    return storage_backend(plan.spec) is not None and (role.role == "prefill" or bool(hc and hc.decodeOffload))


def _stores_files(plan: Plan, role: RolePlan) -> bool:
    return _renders_storage(plan, role) and storage_backend(plan.spec) == "file"


def _env(plan: Plan, role: RolePlan) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in role.command.env]
    if _renders_storage(plan, role) and storage_backend(plan.spec) == "mooncake":
        # The address Mooncake Store peers reach this pod on; SGLang prefers the variable over
        # the extra config's local_hostname (MooncakeStoreConfig._resolve_local_hostname).
        env.append({"name": LOCAL_HOSTNAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    if role.inputs.multi_node:
        # every rank's address (bootstrap registration, KV transfer, torch.distributed):
        # SGLang reads SGLANG_HOST_IP before probing interfaces (utils/network.py)
        env.append({"name": HOST_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    hub = plan.spec.model.source.hub
    if hub is not None and hub.tokenSecret is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": hub.tokenSecret.name, "key": hub.tokenSecret.key}},
            }
        )
    return env


def _tolerations(role: RolePlan) -> list[dict[str, Any]]:
    acc = role.inputs.accelerator
    assert acc is not None
    out = [{"key": acc.gpuResource, "operator": "Exists", "effect": "NoSchedule"}]
    for t in role.inputs.spec.tolerations:
        out.append(t.model_dump(exclude_none=True))
    return out


def role_launch(plan: Plan, role: RolePlan) -> dict[str, Any]:
    """What the role's engine container starts with: {"configYaml", "args", "env"}.

    ``configYaml`` is the ConfigMap's config file, ``args`` the container args after
    ``python3 -m sglang.launch_server`` (``--config <mounted file>`` first), ``env`` the
    container's variables with each ``valueFrom`` as its source (``{"fieldRef": ...}``).
    Works for plans with errors too: the SGLang oracle judges what would be rendered.
    """
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in _env(plan, role)}
    return {"configYaml": config_yaml(role), "args": engine_command(role), "env": env}


#: Which pod of a replica a template is for: the only pod of a single-node replica, or the
#: leader (node 0) / a worker (nodes 1..N-1) of a LeaderWorkerSet group.
PodKind = Literal["replica", "leader", "worker"]


def pod_template(plan: Plan, role: RolePlan, *, pod: PodKind = "replica") -> dict[str, Any]:
    """The pod template of ``role``: the one template function of every engine pod.

    ``pod``: ``replica`` (a Deployment's pod), ``leader`` or ``worker`` (a LeaderWorkerSet
    group's node 0 and nodes 1..N-1). Every pod of a role gets the same image, SGLang
    arguments and config file (a multi-node replica's ``--node-rank $(LWS_WORKER_INDEX)``
    and ``--dist-init-addr $(LWS_LEADER_ADDRESS):port`` are expanded per pod by the
    kubelet), the same bootstrap port, NIC mapping, volumes and resources; they differ in
    the readiness probe only (:func:`~.probes.worker_readiness_probe`: a worker has no HTTP
    server). A multi-node pod also gets SGLANG_HOST_IP from its pod IP and the
    ``wait-for-leader`` init container (render/multinode.py).
    """
    name, key = plan.name, plan.compat_key
    component = role.role
    image = role.inputs.runtime.image
    acc = role.inputs.accelerator
    assert acc is not None
    cm_name = config_map_name(plan, role)
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    pod_annotations = {L.ANNOTATION_CONFIG_HASH: config_hash(role, image)}
    if component == "prefill":
        port = plan.spec.disaggregation.bootstrapPort
        ports.append({"name": "bootstrap", "containerPort": port, "protocol": "TCP"})
        pod_annotations[L.ANNOTATION_BOOTSTRAP_PORT] = str(port)
    volumes, mounts = _volumes(plan, role, cm_name)
    drain_grace = parse_duration(plan.spec.rollout.drainGracePeriod)
    readiness = (worker_readiness_probe() if pod == "worker"
                 else readiness_probe(component, bootstrap_port=plan.spec.disaggregation.bootstrapPort))
    container: dict[str, Any] = {
        "name": "sglang",
        "image": image,
        "imagePullPolicy": role.inputs.runtime.imagePullPolicy,
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": engine_command(role),
        "env": _env(plan, role),
        "ports": ports,
        "resources": _resources(plan, role),
        "startupProbe": http_probe("/health", period=STARTUP_PROBE_PERIOD_S, failures=STARTUP_PROBE_FAILURES),
        "readinessProbe": readiness,
        "livenessProbe": http_probe("/health", period=15, failures=4),
        "lifecycle": prestop(port=ENGINE_PORT, drain_grace_s=drain_grace, gauges=ENGINE_GAUGES),
        "volumeMounts": mounts,
    }
    if uses_rdma(plan):
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    spec: dict[str, Any] = {
        "nodeSelector": {**acc.nodeLabels, **role.inputs.spec.nodeSelector},
        "tolerations": _tolerations(role),
        "terminationGracePeriodSeconds": termination_grace_seconds(drain_grace),
        "containers": [container],
        "volumes": volumes,
    }
    affinity = pod_affinity(plan, role)
    if affinity is not None:
        spec["affinity"] = affinity
    claims = imex_claims(plan, role)
    if claims:  # the IMEX channel of the role's ComputeDomain (render/multinode.py)
        spec["resourceClaims"] = claims
        container["resources"]["claims"] = [{"name": c["name"]} for c in claims]
    if role.inputs.multi_node:
        spec = {"initContainers": [wait_for_leader_container(role)], **spec}
        pod_annotations.update(kueue_annotations(plan, role))
    pod_labels = {**L.component_labels(name, component, key), **imex_pod_labels(plan, role)}
    return {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": spec}


def render_role(plan: Plan, role: RolePlan, *, owner: dict | None = None,
                replicas: int | None = None) -> list[dict[str, Any]]:
    """ConfigMap, headless Service and workload of ``role`` in the plan's compat group.

    The workload is a Deployment for a single-node replica, a LeaderWorkerSet for a replica
    spanning nodes (render/multinode.py). ``owner`` is the PDDeployment's {apiVersion,
    kind, name, uid}; without a uid (the ``render`` command) no ownerReferences are
    written. ``replicas``: the role's count when ``spec.<role>.replicas`` is omitted (its
    PDRoleScale's, ``planning/scaling.py``); ignored when the spec sets it; None (a caller
    that knows no count) leaves the field out. Raises AssertionError on a plan with errors
    (render only valid plans).
    """
    assert plan.valid, "render needs a valid plan"
    name, ns, key = plan.name, plan.namespace, plan.compat_key
    component = role.role
    obj_name = L.group_object_name(name, key, component)
    labels = L.component_labels(name, component, key)

    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": L.metadata(name=config_map_name(plan, role), namespace=ns, labels=labels, owner=owner),
        # its name is its content's hash: the data never changes (and the kubelet need not watch it)
        "immutable": True,
        "data": {CONFIG_FILE: config_yaml(role)},
    }
    strategy = role_strategies(spec=plan.spec, prefill=plan.prefill, decode=plan.decode)[component]
    if role.inputs.multi_node:
        workload = leader_worker_set(
            plan, role, owner=owner, strategy=strategy, replicas=replicas,
            leader=pod_template(plan, role, pod="leader"), worker=pod_template(plan, role, pod="worker"),
        )  # fmt: skip
    else:
        workload = _deployment(plan, role, owner=owner, strategy=strategy, template=pod_template(plan, role),
                               replicas=replicas)
    svc_ports = [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}]
    if component == "prefill":
        svc_ports.append(
            {"name": "bootstrap", "port": plan.spec.disaggregation.bootstrapPort, "targetPort": "bootstrap", "protocol": "TCP"}
        )
    service_spec: dict[str, Any] = {
        "clusterIP": "None",
        "selector": L.selector_labels(name, component, key),
        "ports": svc_ports,
    }
    if role.inputs.multi_node:
        service_spec.update(group_service_settings())
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        # a multi-node role's Service is also its LeaderWorkerSet's subdomain, which LWS creates
        # (as its controller) if it finds none: the PDDeployment owns it without claiming control
        "metadata": L.metadata(name=obj_name, namespace=ns, labels=labels, owner=owner,
                               controller=not role.inputs.multi_node),
        "spec": service_spec,
    }
    # the Service before the workload: LWS then finds it and adopts it as the pods' subdomain;
    # the ComputeDomain too: its pods' claim template exists only once the driver made it
    domains = compute_domains(plan, role, owner=owner, replicas=replicas) if role.inputs.multi_node else []
    return [config_map, service, *domains, workload]


def _deployment(plan: Plan, role: RolePlan, *, owner: dict | None, strategy: InPlaceStrategy,
                template: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    """The apps/v1 Deployment of a single-node role (``replicas``: as :func:`render_role`)."""
    name, ns, key, component = plan.name, plan.namespace, plan.compat_key, role.role
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": L.selector_labels(name, component, key)},
        # in place (same key): surge one pod within rollout.maxSurgeGPUs, so the last ready pod
        # of a role stops only once its replacement is Ready; the Deployment's own progress
        # deadline reports a replacement that never gets there (observe.py reads it)
        "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy.rolling_update()},
        "progressDeadlineSeconds": progress_deadline_seconds(plan.spec),
        "template": template,
    }
    count = role.inputs.spec.replicas if role.inputs.spec.replicas is not None else replicas
    if count is not None:  # None only from a caller that knows no count: server-side apply leaves it alone
        deployment_spec = {"replicas": count, **deployment_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": L.metadata(name=L.group_object_name(name, key, component), namespace=ns,
                               labels=L.component_labels(name, component, key), owner=owner),
        "spec": deployment_spec,
    }


def memory_request_bytes(deployment: dict[str, Any]) -> int:
    """The memory request of a rendered engine workload's container (Deployment or LeaderWorkerSet), in bytes."""
    container = lws.pod_templates(deployment)[0]["spec"]["containers"][0]
    return quantity_bytes(container["resources"]["requests"]["memory"])
