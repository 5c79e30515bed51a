"""Pod DNS names of the dev cluster, answered from the API server (there is no cluster DNS).

A LeaderWorkerSet pod learns its leader as ``LWS_LEADER_ADDRESS=<lws>-<group>.<lws>.<ns>``
(sigs.k8s.io/lws pkg/utils/pod AddLWSVariables): the leader pod's hostname under the
LWS's headless Service, which a real cluster's DNS answers. The dev cluster has no DNS
server, and could not feed one the usual way either (its loopback pod IPs are refused in
EndpointSlices, see docs/dev-cluster.md "Limits"), so a test or a simulator that must dial
such a name asks :func:`resolve`, which applies the same rules to the pods and Services
the API server holds:

- a pod gets the record ``<hostname>.<subdomain>.<namespace>.svc.<zone>`` when it sets
  ``spec.hostname`` and ``spec.subdomain``, and a headless Service named ``<subdomain>``
  in its namespace selects it (Kubernetes DNS specification, section 2.4 "Records for a
  Headless Service"; the endpoint slice controller sets the hostname only when
  ``pod.spec.subdomain`` equals the Service's name: kubernetes pkg/api/v1/endpoints
  ShouldSetHostname);
- only pods with an IP, and only Ready ones unless the Service sets
  ``publishNotReadyAddresses`` (LWS's Service does);
- a name with fewer than 5 dots is tried with the pod's search list first
  (``<ns>.svc.<zone> svc.<zone> <zone>``, ``ndots:5``: kubelet's resolv.conf for
  ``dnsPolicy: ClusterFirst``), then as given.

Pure functions over API JSON (dicts) plus :func:`resolve`, which lists what it needs
through a ``kubernetes`` ApiClient.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The cluster domain (kubelet's --cluster-domain default).
ZONE = "cluster.local"
_NDOTS = 5


def _ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _selects(selector: dict | None, labels: dict | None) -> bool:
    return bool(selector) and all((labels or {}).get(k) == v for k, v in selector.items())


def hostname_records(*, pods: Iterable[dict], services: Iterable[dict], zone: str = ZONE) -> dict[str, str]:
    """``{fqdn: pod IP}`` of every pod hostname record the pods and headless Services make.

    ``pods``/``services``: API JSON objects (any namespaces). fqdn has no trailing dot.
    """
    headless = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services
                if (s.get("spec") or {}).get("clusterIP") == "None"}
    records: dict[str, str] = {}
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        hostname, subdomain, ip = spec.get("hostname"), spec.get("subdomain"), status.get("podIP")
        service = headless.get((meta["namespace"], subdomain))
        if not (hostname and subdomain and ip and service):
            continue
        if not _selects(service["spec"].get("selector"), meta.get("labels")):
            continue
        if not (_ready(pod) or service["spec"].get("publishNotReadyAddresses")):
            continue
        records[f"{hostname}.{subdomain}.{meta['namespace']}.svc.{zone}"] = ip
    return records


def candidates(name: str, *, namespace: str, zone: str = ZONE) -> list[str]:
    """The fully qualified names a pod in ``namespace`` tries for ``name``, in order."""
    name = name.rstrip(".")
    search = [f"{namespace}.svc.{zone}", f"svc.{zone}", zone]
    if name.count(".") >= _NDOTS:
        return [name] + [f"{name}.{s}" for s in search]
    return [f"{name}.{s}" for s in search] + [name]


def lookup(name: str, *, namespace: str, records: dict[str, str], zone: str = ZONE) -> str | None:
    """The IP ``name`` resolves to for a pod in ``namespace``, or None (NXDOMAIN)."""
    for fqdn in candidates(name, namespace=namespace, zone=zone):
        if fqdn in records:
            return records[fqdn]
    return None


def resolve(api_client, name: str, *, namespace: str, zone: str = ZONE) -> str | None:
    """Resolve ``name`` as a pod in ``namespace`` would, from the API server's pods and
    Services (``api_client``: a ``kubernetes.client.ApiClient``). Returns the pod IP or None.

    Lists the pods and Services of each namespace a candidate name points into.
    """
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(api_client)
    suffix = f".svc.{zone}"
    spaces = {fqdn[:-len(suffix)].rsplit(".", 1)[-1]
              for fqdn in candidates(name, namespace=namespace, zone=zone)
              if fqdn.endswith(suffix) and fqdn[:-len(suffix)].count(".") == 2}
    pods: list[dict] = []
    services: list[dict] = []
    for space in sorted(spaces):
        pods += api_client.sanitize_for_serialization(core.list_namespaced_pod(space)).get("items", [])
        services += api_client.sanitize_for_serialization(core.list_namespaced_service(space)).get("items", [])
    return lookup(name, namespace=namespace, records=hostname_records(pods=pods, services=services, zone=zone),
                  zone=zone)
