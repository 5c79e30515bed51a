"""Render a role whose replicas span nodes as one LeaderWorkerSet per compat group (pure).

One *group* of the LeaderWorkerSet (sigs.k8s.io/lws, ``operator/api/lws.py``) is one engine
replica: ``size`` = ``parallelism.nodes`` pods, ``replicas`` = the role's replicas. The pod
templates come from :func:`~.engine.pod_template` (leader and worker differ in their
readiness probe only); every pod runs the role's SGLang arguments with ``--nnodes N
--node-rank $(LWS_WORKER_INDEX) --dist-init-addr $(LWS_LEADER_ADDRESS):20000``
(planning/engine_args.py ``node_args``), SGLANG_HOST_IP from its pod IP, the same bootstrap
port and the same NIC mapping.

Choices, and why:

- ``restartPolicy: RecreateGroupOnPodRestart``: an SGLang replica is one torch.distributed
  world; a rank that restarts cannot rejoin it, so any pod's restart recreates the group.
- ``startupPolicy: LeaderCreated``: workers start as soon as the leader pod exists. The
  other policy, LeaderReady, would deadlock: the leader turns Ready only after its
  ``/health`` answers, i.e. after every rank of the world joined (node 0's schedulers
  cannot finish torch.distributed's init without the workers). The price is lws #746:
  a worker can start before the leader's DNS name resolves (the leader pod still pulling
  its image), and SGLang would fail on an address it cannot resolve. So every pod first
  runs :func:`wait_for_leader_container`, which waits (bounded) until
  ``LWS_LEADER_ADDRESS`` resolves; the leader runs it too (its own name appears once its
  endpoint is published).
- The group's headless Service is the operator's own (named like the LeaderWorkerSet and
  applied before it, so LWS finds it and uses it as the pods' subdomain instead of
  creating one) with ``publishNotReadyAddresses: true``: the leader's DNS record must
  exist before the leader is Ready, or nobody could ever join it. Its owner reference to
  the PDDeployment does not claim control: should LWS have created the Service first (it
  was deleted while the group ran), LWS is its controller, and the operator's apply adds
  its labels, selector and a second, non-controller owner instead of being refused
  ("Only one reference can have Controller set to true", seen on the dev cluster).
- ``rolloutStrategy``: RollingUpdate with the role's in-place strategy (a whole group is
  the unit LWS surges: maxSurge 1 / maxUnavailable 0, or 0 / 1 when rollout.maxSurgeGPUs
  cannot hold one more group).
"""

from __future__ import annotations

from typing import Any

from ..api import lws
from ..planning.rollout import InPlaceStrategy
from ..planning.structs import Plan, RolePlan
from . import labels as L

#: Seconds a pod waits for the leader's DNS name before its init container fails (the
#: kubelet then restarts it; LWS recreates the group).
LEADER_DNS_WAIT_S = 600
WAIT_FOR_LEADER = "wait-for-leader"

#: argv[1]: seconds to wait. Exits 0 once LWS_LEADER_ADDRESS resolves, 1 with a message after the deadline.
WAIT_FOR_LEADER_SCRIPT = """\
import os, socket, sys, time
name, budget = os.environ["LWS_LEADER_ADDRESS"], float(sys.argv[1])
deadline = time.monotonic() + budget
while True:
    try:
        socket.getaddrinfo(name, None)
        sys.exit(0)
    except OSError as e:
        if time.monotonic() >= deadline:
            sys.exit(f"the leader address {name} did not resolve within {budget:.0f}s: {e}")
        time.sleep(1)
"""


def wait_for_leader_container(role: RolePlan) -> dict[str, Any]:
    """The init container of every pod of a multi-node replica: wait until the leader's DNS name resolves.

    ``python3 -I -S`` of the engine image (stdlib only); ``LWS_LEADER_ADDRESS`` is injected
    into init containers too (lws pkg/utils/pod/pod_utils.go AddLWSVariables). Fails loud
    after :data:`LEADER_DNS_WAIT_S` instead of handing SGLang an address it cannot reach.
    """
    return {
        "name": WAIT_FOR_LEADER,
        "image": role.inputs.runtime.image,
        "imagePullPolicy": role.inputs.runtime.imagePullPolicy,
        "command": ["python3", "-I", "-S", "-c", WAIT_FOR_LEADER_SCRIPT, str(LEADER_DNS_WAIT_S)],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    }


def group_service_settings() -> dict[str, Any]:
    """What the role's headless Service adds for a multi-node role: not-ready pods resolve (see the module doc)."""
    return {"publishNotReadyAddresses": True}


def leader_worker_set(
    plan: Plan,
    role: RolePlan,
    *,
    owner: dict | None,
    strategy: InPlaceStrategy,
    leader: dict[str, Any],
    worker: dict[str, Any],
    replicas: int | None = None,
) -> dict[str, Any]:
    """The LeaderWorkerSet of a multi-node ``role`` in the plan's compat group.

    ``leader`` / ``worker``: the pod templates (:func:`~.engine.pod_template`);
    ``strategy``: the role's in-place strategy; ``replicas``: the role's count (groups)
    when ``spec.<role>.replicas`` is omitted (its PDRoleScale's), as for a Deployment
    (:func:`~.engine.render_role`). Named like the role's Deployment would be
    (``<name>-<group id>-<role>``), which is also its Service's name.
    """
    name, ns, key, component = plan.name, plan.namespace, plan.compat_key, role.role
    spec: dict[str, Any] = {
        "startupPolicy": lws.STARTUP_LEADER_CREATED,
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": strategy.rolling_update()},
        "networkConfig": {"subdomainPolicy": "Shared"},
        "leaderWorkerTemplate": {
            "size": role.inputs.nodes,
            "restartPolicy": lws.RESTART_RECREATE_GROUP,
            "leaderTemplate": leader,
            "workerTemplate": worker,
        },
    }
    count = role.inputs.spec.replicas if role.inputs.spec.replicas is not None else replicas
    if count is not None:
        spec = {"replicas": count, **spec}
    return {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": L.metadata(name=L.group_object_name(name, key, component), namespace=ns,
                               labels=L.component_labels(name, component, key), owner=owner),
        "spec": spec,
    }
