"""Render the smg model gateway: one Deployment per compat group, shared RBAC, the user-facing Service.

smg 1.13 discovers workers through the Kubernetes API (``--discovery-provider
kubernetes``) by label selectors; the selectors include the compat key, so a gateway
only ever pairs a prefill and a decode of one key. For a role whose replicas span nodes
they select the LeaderWorkerSet leaders only (``leaderworkerset.sigs.k8s.io/worker-index=0``,
node 0, the one pod with an HTTP server). It reads the prefill bootstrap port
from the pod annotation ``sglang.ai/bootstrap-port`` and needs get/list/watch on pods of
its namespace. The user-facing Service selects the gateway pods of the *serving* group,
which the reconciler moves only when a new group is Ready (paired rollouts).
"""

from __future__ import annotations

from typing import Any

from ..api import lws
from ..api.v1alpha1 import parse_duration
from ..planning.engine_args import ENGINE_PORT
from ..planning.rollout import progress_deadline_seconds
from ..planning.structs import Plan
from . import labels as L
from .drain import GATEWAY_GAUGES, prestop, termination_grace_seconds

GATEWAY_METRICS_PORT = 29000
DEFAULT_CPU = "2"  # per gateway pod, when spec.gateway.resources.cpu is unset
DEFAULT_MEMORY = "4Gi"


def gateway_args(plan: Plan, compat_key: str | None = None) -> list[str]:
    """The arguments after ``smg launch`` for the gateway of ``compat_key`` (default: the plan's)."""
    key = compat_key or plan.compat_key
    gw = plan.spec.gateway

    def selector(role: str) -> list[str]:
        labels = L.selector_labels(plan.name, role, key)
        if plan.role(role).inputs.multi_node:
            # node 0 of a multi-node replica serves HTTP; the other ranks' stand-in /health
            # answers 200 but they serve no request (OME does the same; llm-d #2296, #2598)
            labels = {**labels, lws.LABEL_WORKER_INDEX: lws.LEADER_INDEX}
        return [f"{k}={v}" for k, v in labels.items()]

    return [
        "--host", "0.0.0.0",
        "--port", str(gw.port),
        "--pd-disaggregation",
        # smg 1.13: --service-discovery is the legacy spelling of --discovery-provider
        # kubernetes and the two are mutually exclusive (router_args.py).
        "--discovery-provider", "kubernetes",
        "--service-discovery-namespace", plan.namespace,
        "--service-discovery-port", str(ENGINE_PORT),
        "--prefill-selector", *selector("prefill"),
        "--decode-selector", *selector("decode"),
        "--policy", gw.policy,
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(GATEWAY_METRICS_PORT),
        *gw.extraArgs,
    ]  # fmt: skip


def service_account_name(name: str) -> str:
    """The gateway's ServiceAccount / Role / RoleBinding name."""
    return f"{name}-gateway"


def render_gateway_group(plan: Plan, *, owner: dict | None = None) -> list[dict[str, Any]]:
    """The gateway Deployment of the plan's compat group."""
    name, ns, key = plan.name, plan.namespace, plan.compat_key
    gw = plan.spec.gateway
    labels = L.component_labels(name, L.ROLE_GATEWAY, key)
    cpu, memory = gw.resources.cpu or DEFAULT_CPU, gw.resources.memory or DEFAULT_MEMORY
    # Ready only once smg has registered a prefill and a decode worker: /readiness answers 503 until then,
    # /health 200 from the start (tests/contract/test_smg_simulator.py); alive is /health.
    probe = {"periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5}
    drain_grace = parse_duration(plan.spec.rollout.drainGracePeriod)
    container = {
        "name": "smg",
        "image": gw.image or plan.spec.runtime.image,
        "imagePullPolicy": plan.spec.runtime.imagePullPolicy,
        "command": ["smg", "launch"],
        "args": gateway_args(plan),
        "ports": [
            {"name": "http", "containerPort": gw.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": GATEWAY_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, **probe},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, **probe, "periodSeconds": 15,
                          "failureThreshold": 4},
        "lifecycle": prestop(port=GATEWAY_METRICS_PORT, drain_grace_s=drain_grace, gauges=GATEWAY_GAUGES),
    }
    spec: dict[str, Any] = {
        "replicas": 1 if gw.replicas is None else gw.replicas,
        "selector": {"matchLabels": L.selector_labels(name, L.ROLE_GATEWAY, key)},
        "progressDeadlineSeconds": progress_deadline_seconds(plan.spec),
        "template": {
            "metadata": {"labels": labels},
            "spec": {"serviceAccountName": service_account_name(name), "containers": [container],
                     "terminationGracePeriodSeconds": termination_grace_seconds(drain_grace, gateway=True)},
        },
    }
    if gw.nodeSelector:
        spec["template"]["spec"]["nodeSelector"] = dict(gw.nodeSelector)
    if gw.tolerations:
        spec["template"]["spec"]["tolerations"] = [t.model_dump(exclude_none=True) for t in gw.tolerations]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": L.metadata(
                name=L.group_object_name(name, key, L.ROLE_GATEWAY), namespace=ns, labels=labels, owner=owner
            ),
            "spec": spec,
        }
    ]


def render_gateway_shared(plan: Plan, *, serving_key: str, owner: dict | None = None) -> list[dict[str, Any]]:
    """ServiceAccount, Role (pods get/list/watch), RoleBinding, and the user-facing Service of ``serving_key``."""
    name, ns = plan.name, plan.namespace
    sa = service_account_name(name)
    labels = {**L.common_labels(name), "app.kubernetes.io/component": L.ROLE_GATEWAY}
    meta = lambda n: L.metadata(name=n, namespace=ns, labels=labels, owner=owner)  # noqa: E731
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(sa)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(sa),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(sa),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(name),
            "spec": {
                "type": "ClusterIP",
                "selector": L.selector_labels(name, L.ROLE_GATEWAY, serving_key),
                "ports": [
                    {"name": "http", "port": plan.spec.gateway.port, "targetPort": "http", "protocol": "TCP"},
                    {"name": "metrics", "port": GATEWAY_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
                ],
            },
        },
    ]


def endpoint(plan: Plan) -> str:
    """In-cluster URL of the OpenAI-compatible API."""
    return f"http://{plan.name}.{plan.namespace}.svc:{plan.spec.gateway.port}"
