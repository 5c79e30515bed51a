"""Fake GPU nodes: ``hack/cluster/node-pools.yaml`` -> Node objects for the API (pure).

Each pool becomes ``count`` nodes named ``<pool>-<i>``, annotated ``kwok.x-k8s.io/node:
fake`` so the kwok controller manages them (keeps them Ready, runs their pods). Status
(capacity, allocatable, addresses) is set at creation, the way a kubelet registers its
node; kwok's node-initialize stage keeps it. Node ``n`` (counting across pools) gets the
pod CIDR ``127.<X>.<n>.0/24`` of the run's loopback /16 and the InternalIP
``127.<X>.255.<n+1>``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml

#: Annotation (and value) by which kwok recognises the nodes it must manage.
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
#: Label naming the pool a node belongs to.
POOL_LABEL = "pd.sglang-operator.io/node-pool"
#: Last third octet usable for node pod CIDRs; .250-.254 are kwok's fallback CIDR, .255
#: holds node IPs.
MAX_NODES = 250

_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
           "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


@dataclass(frozen=True)
class NodePool:
    """One pool of identical nodes (see the field list at the top of node-pools.yaml)."""

    name: str
    count: int
    arch: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    reserved: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict, ...] = ()
    #: NVLink partitions (rack-scale NVLink, GB200 / GB300 NVL72): nodes in order fill cliques of ``size``
    #: trays, each node labelled ``<label>: <clusterUUID>.<cliqueID>`` as NVIDIA's GPU operator does.
    clique_label: str | None = None
    clique_size: int = 0
    clique_cluster: str = ""

    def clique_of(self, index: int) -> str | None:
        """The clique label value of node ``index`` of the pool, None without cliques."""
        if not self.clique_label:
            return None
        return f"{self.clique_cluster}.{index // self.clique_size}"


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity ("144", "960Gi", "500m", "1k") as a Decimal of base units.

    Raises ValueError for anything else (exponent forms like "1e3" are not needed here).
    """
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return Decimal(match[1]) * Decimal(_SUFFIX[match[2] or ""])


def format_quantity(value: Decimal) -> str:
    """Shortest exact spelling: "142", "944Gi", "1500m", or plain bytes."""
    if value != value.to_integral_value():
        return f"{int(value * 1000)}m"
    number = int(value)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _SUFFIX[suffix]
        if number >= unit and number % unit == 0:
            return f"{number // unit}{suffix}"
    return str(number)


def allocatable(capacity: dict[str, str], reserved: dict[str, str]) -> dict[str, str]:
    """capacity minus reserved, per resource. Raises ValueError if reserved > capacity."""
    result = {}
    for name, quantity in capacity.items():
        left = parse_quantity(quantity) - parse_quantity(reserved.get(name, "0"))
        if left < 0:
            raise ValueError(f"reserved {name} {reserved[name]} exceeds capacity {quantity}")
        result[name] = format_quantity(left)
    return result


def _cliques(raw: dict | None) -> dict:
    """NodePool fields from a pool's ``nvlinkCliques: {label, size, clusterUUID}`` (none without it)."""
    if not raw:
        return {}
    size = int(raw["size"])
    if size < 1:
        raise ValueError("nvlinkCliques.size must be at least 1")
    return {"clique_label": str(raw["label"]), "clique_size": size, "clique_cluster": str(raw["clusterUUID"])}


def load_pools(path: Path) -> list[NodePool]:
    """Read and check node-pools.yaml. Raises ValueError naming the pool and field."""
    data = yaml.safe_load(path.read_text()) or {}
    pools = []
    for i, raw in enumerate(data.get("pools") or []):
        where = f"{path}: pools[{i}]"
        try:
            pool = NodePool(
                name=str(raw["name"]), count=int(raw["count"]), arch=str(raw.get("arch", "amd64")),
                labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
                capacity={str(k): str(v) for k, v in (raw.get("capacity") or {}).items()},
                reserved={str(k): str(v) for k, v in (raw.get("reserved") or {}).items()},
                taints=tuple(raw.get("taints") or ()),
                **_cliques(raw.get("nvlinkCliques")),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: bad or missing field ({err})") from err
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", pool.name):
            raise ValueError(f"{where}.name {pool.name!r} is not a DNS label")
        for resource in ("cpu", "memory", "pods"):
            if resource not in pool.capacity:
                raise ValueError(f"{where}.capacity lacks {resource}")
        try:
            allocatable(pool.capacity, pool.reserved)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err
        pools.append(pool)
    if not pools:
        raise ValueError(f"{path}: no pools")
    if sum(p.count for p in pools) > MAX_NODES:
        raise ValueError(f"{path}: more than {MAX_NODES} nodes")
    return pools


def node_objects(pools: list[NodePool], *, pod_network: ipaddress.IPv4Network,
                 kubelet_version: str = "v1.36.3") -> list[dict]:
    """The Node objects of all pools, ready to POST to /api/v1/nodes.

    ``pod_network`` is the run's /16 in 127.0.0.0/8. ``kubelet_version`` is reported in
    ``status.nodeInfo`` (the version the fake kubelets pretend to be).
    """
    base = pod_network.network_address.packed
    nodes = []
    index = 0
    for pool in pools:
        for i in range(pool.count):
            name = f"{pool.name}-{i}"
            pod_cidr = f"{base[0]}.{base[1]}.{index}.0/24"
            node_ip = f"{base[0]}.{base[1]}.255.{index + 1}"
            labels = {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": pool.arch, "type": "kwok", POOL_LABEL: pool.name,
                **pool.labels,
            }
            clique = pool.clique_of(i)
            if clique is not None:
                labels[pool.clique_label] = clique  # type: ignore[index]
            nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels,
                             "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1],
                                             "node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
                         **({"taints": list(pool.taints)} if pool.taints else {})},
                "status": {
                    "capacity": dict(pool.capacity),
                    "allocatable": allocatable(pool.capacity, pool.reserved),
                    "addresses": [{"type": "InternalIP", "address": node_ip},
                                  {"type": "Hostname", "address": name}],
                    "nodeInfo": {"architecture": pool.arch, "operatingSystem": "linux",
                                 "kubeletVersion": kubelet_version,
                                 "kubeProxyVersion": kubelet_version,
                                 "containerRuntimeVersion": "kwok://v0.8.0",
                                 "kernelVersion": "kwok", "osImage": "kwok fake GPU node",
                                 "machineID": "", "systemUUID": "", "bootID": ""},
                },
            })
            index += 1
    return nodes
