"""Command lines of the five control-plane components, and the run directory layout (pure).

The sixth process of a run, the LeaderWorkerSet controller, gets its command line and
configuration from ``lws``.

Flags are chosen for a fast, loopback-only, single-user development cluster:

- etcd: plain HTTP on 127.0.0.1, ``--unsafe-no-fsync`` (data is thrown away anyway).
- kube-apiserver: RBAC + Node authorization, client-cert authentication, service-account
  tokens signed by our key, no endpoint reconciler (a loopback advertise address is not
  a valid Endpoints IP), API priority and fairness off (fewer goroutines on 2 cores).
- kube-controller-manager and kube-scheduler: no leader election (one replica), no
  serving port (nothing scrapes them), generous client QPS.
- kwok: manages only nodes annotated ``kwok.x-k8s.io/node=fake``; stages from
  ``hack/cluster/kwok/``; pods of nodes without a pod CIDR get IPs from a loopback /24.

Nothing here starts a process; ``cluster`` does, with these argv lists.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_pd_operator_dev.cluster.pki import Pki

#: Service CIDR (ClusterIPs are API objects only; there is no kube-proxy).
SERVICE_CIDR = ipaddress.IPv4Network("10.96.0.0/16")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
#: Seconds a kwok node lease lasts (kwok renews it; the node lifecycle controller reads it).
NODE_LEASE_SECONDS = 40
#: Start order; teardown runs in reverse.
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
         "lws-controller", "kueue-controller")


@dataclass(frozen=True)
class Layout:
    """Where a run keeps its files, all under ``run_dir``."""

    run_dir: Path

    @property
    def pki(self) -> Pki:
        return Pki(dir=self.run_dir / "pki")

    @property
    def logs(self) -> Path:
        return self.run_dir / "logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def etcd_data(self) -> Path:
        return self.run_dir / "etcd-data"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig handed to users and tests."""
        return self.run_dir / "kubeconfig"

    def component_kubeconfig(self, name: str) -> Path:
        return self.run_dir / "kubeconfigs" / f"{name}.yaml"

    @property
    def kwok_home(self) -> Path:
        """HOME of the kwok process, so a user's ~/.kwok/kwok.yaml is never loaded."""
        return self.run_dir / "kwok-home"

    @property
    def lws_config_file(self) -> Path:
        """The LWS controller's ``--config`` file (``lws.controller_config``)."""
        return self.run_dir / "lws" / "config.yaml"

    @property
    def helm_home(self) -> Path:
        return self.run_dir / "helm"


def service_ip() -> str:
    """ClusterIP of the ``kubernetes`` Service: the first address of SERVICE_CIDR."""
    return str(SERVICE_CIDR.network_address + 1)


def etcd_argv(*, binary: Path, layout: Layout, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary), "--name=dev", f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=dev={peer}", "--initial-cluster-state=new",
        "--unsafe-no-fsync=true", "--log-level=warn",
    ]


def apiserver_argv(*, binary: Path, layout: Layout, port: int, etcd_port: int,
                   extra: Sequence[str] = ()) -> list[str]:
    """kube-apiserver argv; ``extra`` flags go last (e.g. the scale benchmark's audit log flags)."""
    pki = layout.pki
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={pki.dir}",
        f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--event-ttl=15m",
        *extra,
    ]


def controller_manager_argv(*, binary: Path, layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        str(binary),
        f"--kubeconfig={layout.component_kubeconfig('controller-manager')}",
        "--leader-elect=false", "--secure-port=0",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*",
        "--kube-api-qps=200", "--kube-api-burst=400",
    ]


def scheduler_argv(*, binary: Path, layout: Layout) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={layout.component_kubeconfig('scheduler')}",
        "--leader-elect=false", "--secure-port=0",
        "--kube-api-qps=200", "--kube-api-burst=400",
    ]


def kwok_argv(*, binary: Path, layout: Layout, stage_files: list[Path],
              pod_network: ipaddress.IPv4Network) -> list[str]:
    """kwok controller argv; ``pod_network`` is the run's loopback /16 (see ``nodes``)."""
    base = pod_network.network_address.packed
    fallback_cidr = f"{base[0]}.{base[1]}.250.0/24"
    node_ip = f"{base[0]}.{base[1]}.255.254"
    return [
        str(binary),
        f"--kubeconfig={layout.component_kubeconfig('kwok')}",
        *(f"--config={f}" for f in stage_files),
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={fallback_cidr}", f"--node-ip={node_ip}",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
    ]
