"""The dev cluster's IMEX pieces (issue 27, item 4): clique labels, ResourceSlices, the ComputeDomain CRD and
the STAND-IN controller's pure parts (devtools/sglang_pd_operator_dev/cluster/imex.py).

The e2e (tests/e2e/test_nvlink.py) runs them with the real scheduler and controllers.
"""

from __future__ import annotations

import ipaddress

from helpers import EXAMPLES, ROOT, load_example

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.render import render_all
from sglang_pd_operator_dev.cluster import imex, nodes

CLIQUE = "nvidia.com/gpu.clique"


def _gb300_nodes() -> list[dict]:
    pools = nodes.load_pools(ROOT / "hack/cluster/node-pools.yaml")
    objs = nodes.node_objects(pools, pod_network=ipaddress.ip_network("127.42.0.0/16"))
    return [n for n in objs if n["metadata"]["labels"].get("pd.sglang-operator.io/accelerator") == "gb300"]


def test_gb300_trays_fill_nvl72_racks_of_18_two_full_and_one_partial():
    trays = _gb300_nodes()
    by_clique: dict[str, list[str]] = {}
    for n in trays:
        by_clique.setdefault(n["metadata"]["labels"][CLIQUE], []).append(n["metadata"]["name"])
    sizes = sorted(len(v) for v in by_clique.values())
    assert sizes[-2:] == [18, 18] and 0 < sizes[0] < 18 and len(sizes) == 3
    cluster_ids = {c.rsplit(".", 1)[0] for c in by_clique}
    assert len(cluster_ids) == 1  # <clusterUUID>.<cliqueID>, as the GPU operator labels them
    other = [n for n in nodes.node_objects(nodes.load_pools(ROOT / "hack/cluster/node-pools.yaml"),
                                           pod_network=ipaddress.ip_network("127.42.0.0/16"))
             if n["metadata"]["labels"].get("pd.sglang-operator.io/accelerator") != "gb300"]
    assert all(CLIQUE not in n["metadata"]["labels"] for n in other)


def test_every_tray_publishes_one_imex_channel_the_device_class_selects():
    trays = _gb300_nodes()
    slices = imex.resource_slices(trays, clique_label=CLIQUE)
    assert len(slices) == len(trays)
    s = slices[0]
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["spec"]["driver"] == imex.DRIVER
    assert s["spec"]["nodeName"] == s["spec"]["pool"]["name"] == trays[0]["metadata"]["name"]
    assert [d["name"] for d in s["spec"]["devices"]] == ["channel-0"]
    assert imex.DRIVER in imex.device_class()["spec"]["selectors"][0]["cel"]["expression"]


def _walk(schema: dict, obj, path: str = "") -> list[str]:
    """Paths of ``obj`` the structural ``schema`` does not declare (what the API server would prune)."""
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is None:
            return []
        out = []
        for k, v in obj.items():
            if k not in props:
                out.append(f"{path}.{k}")
            else:
                out += _walk(props[k], v, f"{path}.{k}")
        return out
    if isinstance(obj, list):
        return [p for item in obj for p in _walk(schema.get("items") or {}, item, f"{path}[]")]
    return []


def test_the_stand_in_crd_declares_every_field_the_operator_writes_and_reads(catalog):
    """Drift guard: the operator's ComputeDomain (render) and the status it reads (observe) fit the CRD."""
    plan = build_plan(parse_pddeployment(load_example(EXAMPLES / "dsv41-flash-gb300-wide-ep.yaml")), catalog)
    [domain] = [o for o in render_all(plan) if o["kind"] == cd.KIND]
    crd = imex.crd()
    assert crd["metadata"]["name"] == cd.CRD_NAME and crd["spec"]["group"] == cd.GROUP
    version = crd["spec"]["versions"][0]
    assert version["name"] == cd.VERSION and crd["spec"]["names"]["plural"] == cd.PLURAL
    schema = version["schema"]["openAPIV3Schema"]
    assert _walk(schema, {"spec": domain["spec"]}) == []
    status = imex.domain_status(domain | {"metadata": {"uid": "u"}}, [], {}, clique_label=CLIQUE)
    assert _walk(schema, {"status": {**status, "nodes": [{"name": "n", "ipAddress": "1", "cliqueID": "c",
                                                          "index": 0, "status": "Ready"}]}}) == []
    assert schema["properties"]["status"]["properties"]["status"]["enum"][0] == cd.STATUS_READY
    assert schema["properties"]["spec"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"


def test_the_stand_in_lists_a_node_once_its_channel_claim_is_allocated():
    domain = {"metadata": {"name": "d", "namespace": "ns", "uid": "u1"},
              "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "d-channel"}}}}
    template = imex.claim_template(domain)
    assert template["metadata"]["name"] == "d-channel"
    assert template["spec"]["metadata"]["labels"] == {imex.DOMAIN_LABEL: "u1"}
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == imex.CHANNEL_CLASS

    def claim(node: str | None) -> dict:
        alloc = {"allocation": {"devices": {"results": [{"driver": imex.DRIVER, "pool": node, "device": "channel-0",
                                                          "request": "channel"}]}}} if node else {}
        return {"status": alloc}

    trays = {n["metadata"]["name"]: n for n in _gb300_nodes()}
    one = imex.domain_status(domain, [claim("gb300-3"), claim(None)], trays, clique_label=CLIQUE)
    assert one["status"] == "NotReady" and [n["name"] for n in one["nodes"]] == ["gb300-3"]
    both = imex.domain_status(domain, [claim("gb300-3"), claim("gb300-4")], trays, clique_label=CLIQUE)
    assert both["status"] == "Ready"
    assert [(n["cliqueID"], n["index"], n["status"]) for n in both["nodes"]] == [
        (trays["gb300-3"]["metadata"]["labels"][CLIQUE], 0, "Ready"),
        (trays["gb300-4"]["metadata"]["labels"][CLIQUE], 1, "Ready")]
    assert both["nodes"][0]["ipAddress"].startswith("127.42.")


class _TerminatingNamespaceApi:
    """The stand-in's API calls against two ComputeDomains: ``old`` in a namespace being deleted (the API
    server refuses any create there with 403), ``new`` in a live one. Records the templates made and the
    status writes."""

    def __init__(self) -> None:
        self.domains = [
            {"metadata": {"name": n, "namespace": ns, "uid": n}, "spec": {"numNodes": 1, "channel": {
                "resourceClaimTemplate": {"name": f"{n}-channel"}}}}
            for n, ns in (("old", "a-terminating"), ("new", "b-live"))]
        self.templates: list[str] = []
        self.status_writes: list[str] = []

    def get_json(self, path: str) -> dict:
        if path.endswith("/computedomains"):
            return {"items": self.domains}
        return {"items": []}

    def create(self, path: str, body: dict) -> bool:
        if "/namespaces/a-terminating/" in path:
            raise imex.rest.ApiError(403, "unable to create new content in namespace a-terminating because it is "
                                          "being terminated")
        self.templates.append(body["metadata"]["name"])
        return True

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        self.status_writes.append(path.rsplit("/", 2)[-2])
        return 200, "{}"


def test_a_domain_whose_namespace_is_terminating_does_not_starve_the_others():
    """The CI failure of test_kueue's two replicas: one domain's refused template ended the whole pass."""
    api, logged = _TerminatingNamespaceApi(), []
    assert imex.reconcile_once(api, clique_label=CLIQUE, log=logged.append) == 2
    assert api.templates == ["new-channel"] and api.status_writes == ["new"]
    assert len(logged) == 1 and "a-terminating/old" in logged[0] and "403" in logged[0]
