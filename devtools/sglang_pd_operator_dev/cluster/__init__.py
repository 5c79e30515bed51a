"""A local Kubernetes control plane for development and e2e tests (DESIGN.md section 6).

No Docker here, so the real control plane is built from the Kubernetes Go modules pinned
in ``hack/cluster/go.mod`` and run as local processes: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and the kwok controller, which fakes the kubelets
of the GPU nodes listed in ``hack/cluster/node-pools.yaml``; beside them the real
LeaderWorkerSet controller (``hack/cluster/lws/go.mod``), its webhooks on loopback.

Modules, lowest layer first (a module imports only modules above it in this list):

- ``paths``      where the sources, the binary cache and run directories live
- ``procs``      start/identify/stop processes by pid and start time; never others
- ``gomod``      ``go mod download`` with errors that name the module and the proxy
- ``build``      the eight binaries (two ``go build``s: the control plane, LWS) into one cache dir
- ``pki``        CA, serving and client certificates, service-account key
- ``kubeconfig`` kubeconfig files with embedded certificates
- ``netalloc``   free loopback ports; a leased loopback /16 for pod IPs per run
- ``state``      the run directory's state file (what was started, on which ports)
- ``nodes``      node-pools.yaml -> Node objects (pure)
- ``lws``        the LeaderWorkerSet controller's config, CRDs, RBAC, webhook configs (pure)
- ``poddns``     pod DNS names (an LWS leader address) answered from the API server
- ``rest``       a minimal HTTPS client for /readyz and creating objects (no kubernetes lib)
- ``components`` command lines of the five control-plane components, run dir layout (pure)
- ``teardown``   ``stop_run`` (one run, by its state file), ``sweep_stale_runs``
- ``handle``     the ``Cluster`` handle (kubectl, helm, api_client) and the errors
- ``cluster``    ``start_cluster``: the numbered steps that bring a cluster up
- ``supervise``  ``run_status`` and the foreground loop of ``up``
- ``cli``        the ``dev cluster up|down|status|build`` click commands
"""

from sglang_pd_operator_dev.cluster.cluster import (Cluster, ClusterAlreadyRunning, ClusterError,
                                                   ComponentFailed, start_cluster, stop_run,
                                                   sweep_stale_runs)

__all__ = ["Cluster", "ClusterAlreadyRunning", "ClusterError", "ComponentFailed",
           "start_cluster", "stop_run", "sweep_stale_runs"]
