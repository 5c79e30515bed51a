"""Facts of Kueue (sigs.k8s.io/kueue), the optional gang admission of a multi-node replica.

With ``spec.scheduling.queueName`` each LeaderWorkerSet the operator renders carries
Kueue's queue label; Kueue's LeaderWorkerSet integration then makes one ``Workload`` per
LWS group (leader and workers as two pod sets), holds every pod of the group behind a
scheduling gate until the Workload is admitted (quota reserved in its ClusterQueue and,
with topology-aware scheduling, one topology domain found for the whole group), and
ungates them together: a group is admitted whole or waits whole. render/multinode.py
renders the label and the topology annotations; reconcilers/observe.py reads the
Workloads' conditions while a group's pods are gated.

The names below were read from Kueue's Go module at :data:`TESTED_VERSIONS`:
pkg/controller/constants/constants.go (``QueueLabel``, ``JobUIDLabel``),
apis/kueue/v1beta2/topology_types.go (the podset annotations), apis/kueue/v1beta2/
workload_types.go (``QuotaReserved``, ``Admitted``), pkg/controller/jobs/pod/constants
(``kueue.x-k8s.io/admission`` and ``kueue.x-k8s.io/topology`` scheduling gates).

No I/O here: planning, rendering and the reconcilers all import it.
"""

from __future__ import annotations

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOAD_KIND = "Workload"
WORKLOAD_PLURAL = "workloads"

#: Kueue releases the operator is tested with (the dev cluster runs the first; Go module sigs.k8s.io/kueue).
TESTED_VERSIONS = ("v0.17.0",)

#: The label that sends a LeaderWorkerSet (each of its groups) to a LocalQueue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The label Kueue puts on the Workload of an LWS group: the LeaderWorkerSet's uid.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: Pod template annotations of topology-aware scheduling (TAS): the level (a node label key of the
#: Topology) every pod of the pod set must share (required) or should share (preferred).
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
#: Pod sets with the same group name (an LWS group's leader and workers) are placed in one domain together.
PODSET_GROUP_NAME = "kueue.x-k8s.io/podset-group-name"
#: The podset group name the operator gives a replica's leader and workers.
REPLICA_PODSET_GROUP = "replica"

#: Workload condition types.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"

#: The pod condition while a scheduling gate holds the pod (Kubernetes' own reason).
SCHEDULING_GATED = "SchedulingGated"


def _condition(workload: dict, type_: str) -> dict | None:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def admitted(workload: dict) -> bool:
    """The Workload's ``Admitted`` condition is True (quota reserved and every admission check passed)."""
    return (_condition(workload, ADMITTED) or {}).get("status") == "True"


def waiting_reason(workload: dict) -> str:
    """Why Kueue has not admitted ``workload``: its QuotaReserved condition's message (e.g. "couldn't assign
    flavors to pod set worker: topology ... doesn't allow to fit any of 15 pod(s)"), else its Admitted
    condition's, else that Kueue has not looked at it yet. One line."""
    for type_ in (QUOTA_RESERVED, ADMITTED):
        cond = _condition(workload, type_)
        if cond and cond.get("status") != "True" and cond.get("message"):
            return " ".join(str(cond["message"]).split())
    return "Kueue has not evaluated the Workload yet"


def group_index(workload: dict) -> str | None:
    """The LWS group (index, as a string) a Workload stands for (Kueue's component-workload-index annotation)."""
    return ((workload.get("metadata") or {}).get("annotations") or {}).get("kueue.x-k8s.io/component-workload-index")
