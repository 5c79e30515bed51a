"""IMEX channels on the dev cluster: the ComputeDomain API, DRA ResourceSlices, and a STAND-IN controller.

On a real GB200 / GB300 cluster NVIDIA's DRA driver for GPUs (github.com/NVIDIA/
k8s-dra-driver-gpu) serves ``computedomains.resource.nvidia.com``, publishes each node's
IMEX channels as DRA devices (driver ``compute-domain.nvidia.com``), creates each
ComputeDomain's channel ResourceClaimTemplate, and runs an IMEX daemon on every node
whose pod got a channel, writing that node into the ComputeDomain's ``status.nodes``
once the daemon is ready. The driver's Go module is not served by the Go module proxy
this project builds from (its list answers 403), so the dev cluster cannot build it.
What runs here instead:

- **Real**: kube-apiserver serving the CRD below (its schema restates the fields of the
  driver's api/nvidia.com/resource/v1beta1/computedomain.go: ``spec.numNodes``,
  ``spec.channel.resourceClaimTemplate.name``, ``allocationMode`` Single | All, the
  immutable spec; ``status.status``, ``status.nodes[]`` name / ipAddress / cliqueID /
  index / status); the DeviceClass and one ResourceSlice per node with a clique label
  (resource.k8s.io/v1, one ``channel-0`` device each, as the driver publishes a node's
  channel); kube-controller-manager's resourceclaim controller making each pod's
  ResourceClaim from the template; kube-scheduler's DRA allocation of those claims.
- **Stand-in** (:func:`run_standin`, process ``imex-standin``, named so in every log):
  for each ComputeDomain it creates the channel template (as the driver's controller
  does: one request of the channel DeviceClass, the claim labelled with the domain's
  uid) and writes ``status.nodes`` from the *allocated* claims: a node is listed, Ready,
  with its clique label's value as cliqueID, as soon as the scheduler allocated a channel
  on it. The real driver lists a node only once its IMEX daemon pod runs and is ready,
  and its daemons of one clique reach each other over the NVLink fabric; nothing here
  runs a daemon or checks a fabric. ``status.status`` is Ready once at least ``numNodes``
  nodes are listed, as the driver's default mode does.

The operator's side reads only ``status.nodes`` (reconcilers/observe.py); tests that need
the real driver's behaviour beyond that are not possible on this machine.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from typing import Any

from sglang_pd_operator_dev.cluster import rest

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
CRD_NAME = f"computedomains.{GROUP}"
DRIVER = "compute-domain.nvidia.com"
#: The DeviceClass of one IMEX channel (the driver's name for it).
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
#: Label the channel claims carry: the uid of their ComputeDomain (what the driver labels them with).
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
COMPONENT = "imex-standin"
POLL_S = 1.0


def _str(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def crd() -> dict[str, Any]:
    """The ComputeDomain CRD (v1beta1): the fields of the driver's Go types, status subresource, immutable spec."""
    node = {"type": "object", "required": ["name", "ipAddress", "cliqueID"], "properties": {
        "name": _str("Node name."), "ipAddress": _str("Node IP."), "cliqueID": _str("NVLink clique of the node."),
        "index": {"type": "integer", "description": "Index of the node within its clique."},
        "status": _str("IMEX daemon state.", enum=["Ready", "NotReady", "Failed"], default="NotReady"),
    }}
    schema = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["numNodes", "channel"],
                 "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}],
                 "properties": {
                     "numNodes": {"type": "integer", "description": "Intended number of nodes (IMEX daemons)."},
                     "channel": {"type": "object", "required": ["resourceClaimTemplate"], "properties": {
                         "resourceClaimTemplate": {"type": "object", "required": ["name"],
                                                   "properties": {"name": _str("Template to generate.")}},
                         "allocationMode": _str("One channel or all.", enum=["All", "Single"], default="Single"),
                     }},
                 }},
        "status": {"type": "object", "properties": {
            "status": _str("Ready when numNodes nodes joined.", enum=["Ready", "NotReady"], default="NotReady"),
            "nodes": {"type": "array", "items": node, "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"]},
        }},
    }}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "sglang-pd-operator-dev-cluster"},
                     "annotations": {"sglang-pd-operator.dev/stand-in": "restated from NVIDIA/k8s-dra-driver-gpu "
                                     "api/nvidia.com/resource/v1beta1/computedomain.go"}},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"kind": "ComputeDomain", "listKind": "ComputeDomainList", "plural": "computedomains",
                           "singular": "computedomain"},
                 "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": schema}}]},
    }


def device_class() -> dict[str, Any]:
    """The DeviceClass of an IMEX channel: every device of the compute-domain driver."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CHANNEL_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}


def resource_slices(nodes: list[dict[str, Any]], *, clique_label: str) -> list[dict[str, Any]]:
    """One ResourceSlice per node carrying ``clique_label``: its IMEX channel ``channel-0`` (pool = node name)."""
    out = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if clique_label not in labels:
            continue
        name = node["metadata"]["name"]
        out.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "channel-0", "attributes": {
                         "type": {"string": "channel"}, "id": {"int": 0},
                         "cliqueID": {"string": labels[clique_label]}}}]},
        })
    return out


def claim_template(domain: dict[str, Any]) -> dict[str, Any]:
    """The channel ResourceClaimTemplate of ``domain`` (owned by it; claims labelled with its uid)."""
    meta = domain["metadata"]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": domain["spec"]["channel"]["resourceClaimTemplate"]["name"], "namespace": meta["namespace"],
                     "labels": {DOMAIN_LABEL: meta["uid"]},
                     "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ComputeDomain",
                                          "name": meta["name"], "uid": meta["uid"]}]},
        "spec": {"metadata": {"labels": {DOMAIN_LABEL: meta["uid"]}},
                 "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
                     "deviceClassName": CHANNEL_CLASS, "allocationMode": "ExactCount", "count": 1}}]}}},
    }


def domain_status(domain: dict[str, Any], claims: list[dict[str, Any]], nodes: dict[str, dict[str, Any]], *,
                  clique_label: str) -> dict[str, Any]:
    """``status`` of ``domain`` from its allocated channel claims (see the module doc: allocated = listed Ready)."""
    joined = sorted({r["pool"] for c in claims
                     for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
                     if r.get("driver") == DRIVER})
    listed, per_clique = [], {}
    for name in joined:
        node = nodes.get(name) or {"metadata": {"labels": {}}, "status": {}}
        clique = (node["metadata"].get("labels") or {}).get(clique_label, "")
        ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or []
                   if a.get("type") == "InternalIP"), "")
        index = per_clique.get(clique, 0)
        per_clique[clique] = index + 1
        listed.append({"name": name, "ipAddress": ip, "cliqueID": clique, "index": index, "status": "Ready"})
    want = int(domain["spec"].get("numNodes") or 0)
    return {"status": "Ready" if listed and len(listed) >= want else "NotReady", "nodes": listed}


def reconcile_once(api: rest.Api, *, clique_label: str, log: Any = functools.partial(print, flush=True)) -> int:
    """One pass over every ComputeDomain: template created, status written when it changed; returns domains seen.

    A domain whose calls fail (its namespace terminating refuses the template with 403, a
    status write loses a race with 409) is logged and left to the next pass; the others are
    still reconciled, as a controller's per-object work queue would (a failing domain that
    sorted first once starved every later one: a CI run's second replica never got its
    template while an earlier test's namespace was terminating).
    """
    domains = (api.get_json(f"/apis/{GROUP}/{VERSION}/computedomains") or {}).get("items") or []
    if not domains:
        return 0
    nodes = {n["metadata"]["name"]: n for n in (api.get_json("/api/v1/nodes") or {}).get("items") or []}
    for domain in domains:
        meta = domain["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        try:
            _reconcile_domain(api, domain, nodes, clique_label=clique_label)
        except rest.ApiError as err:
            log(f"{COMPONENT}: ComputeDomain {meta['namespace']}/{meta['name']}: {err}")
    return len(domains)


def _reconcile_domain(api: rest.Api, domain: dict[str, Any], nodes: dict[str, dict[str, Any]], *,
                      clique_label: str) -> None:
    """Template and status of one ComputeDomain (raises rest.ApiError)."""
    meta = domain["metadata"]
    ns, uid = meta["namespace"], meta["uid"]
    api.create(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", claim_template(domain))
    claims = (api.get_json(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
                           f"?labelSelector={DOMAIN_LABEL.replace('/', '%2F')}%3D{uid}") or {}).get("items") or []
    status = domain_status(domain, claims, nodes, clique_label=clique_label)
    if status != (domain.get("status") or {}):
        api.request("PUT", f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/computedomains/{meta['name']}/status",
                    {**domain, "status": status})


def run_standin(api: rest.Api, *, clique_label: str, poll_s: float = POLL_S) -> None:  # pragma: no cover - loop
    """The stand-in controller's loop (until killed): :func:`reconcile_once` every ``poll_s`` seconds."""
    print(f"{COMPONENT}: STAND-IN for NVIDIA's ComputeDomain controller and IMEX daemons (see "
          "sglang_pd_operator_dev/cluster/imex.py); a node joins when its channel claim is allocated", flush=True)
    while True:
        try:
            reconcile_once(api, clique_label=clique_label)
        except rest.ApiError as err:
            print(f"{COMPONENT}: {err}", flush=True)
        time.sleep(poll_s)


def standin_argv(*, python: str, server: str, ca_cert: Path, client_cert: Path, client_key: Path,
                 clique_label: str) -> list[str]:
    """How the cluster starts the stand-in as its own process."""
    return [python, "-m", "sglang_pd_operator_dev.cluster.imex", "--server", server, "--ca-cert", str(ca_cert),
            "--client-cert", str(client_cert), "--client-key", str(client_key), "--clique-label", clique_label]


def main() -> None:  # pragma: no cover - process entry
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--server", "--ca-cert", "--client-cert", "--client-key", "--clique-label"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()
    api = rest.Api(server=args.server, ca_cert=Path(args.ca_cert), client_cert=Path(args.client_cert),
                   client_key=Path(args.client_key))
    run_standin(api, clique_label=args.clique_label)


if __name__ == "__main__":  # pragma: no cover
    main()
