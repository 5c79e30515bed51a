"""Catalogs: schema-checked YAML in kernels/, overridable by the cluster admin's ConfigMap."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT

from sglang_pd_operator.catalog import CatalogError, load_catalog
from sglang_pd_operator.devcluster.nodes import allocatable, parse_quantity
from sglang_pd_operator.planning.memory import quantity_bytes


def test_builtin_catalog_matches_the_dev_cluster_node_pools():
    catalog = load_catalog()
    pools = yaml.safe_load((ROOT / "hack/cluster/node-pools.yaml").read_text())["pools"]
    for pool in pools:
        acc = catalog.accelerator(pool["name"])
        assert acc is not None, pool["name"]
        for k, v in acc.nodeLabels.items():
            assert pool["labels"].get(k) == v, f"{pool['name']}: node label {k} differs from the catalog"
        assert int(pool["capacity"][acc.gpuResource]) == acc.gpusPerNode
        assert int(pool["capacity"][acc.rdmaResource]) == len(acc.rails), f"{pool['name']}: one {acc.rdmaResource} per rail"
        assert int(pool["capacity"]["cpu"]) >= acc.cpus, pool["name"]
        # the planner sizes pods for the catalog's hostMemory: the fake node must fit it
        fits = parse_quantity(allocatable(pool["capacity"], pool["reserved"])["memory"]) >= quantity_bytes(acc.hostMemory)
        assert fits, f"{pool['name']}: allocatable memory below the catalog's hostMemory {acc.hostMemory}"


def test_every_example_runs_on_the_dev_cluster():
    """Each accelerator an example asks for (spec-wide or per role) has a node pool, so the demo can run it."""
    pools = {p["name"] for p in yaml.safe_load((ROOT / "hack/cluster/node-pools.yaml").read_text())["pools"]}
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc["spec"]
            wanted = {spec.get("accelerator")} | {(spec.get(r) or {}).get("accelerator") for r in ("prefill", "decode")}
            missing = sorted(a for a in wanted - {None} if a not in pools)
            assert not missing, f"{path.name}: no node pool in hack/cluster/node-pools.yaml for {missing}"


def test_override_replaces_an_entry_and_adds_new_ones():
    override = {
        "plugins.yaml": yaml.safe_dump(
            {"plugins": {"sgl-nvidia-mega": {**load_catalog().plugins["sgl-nvidia-mega"].model_dump(mode="json"),
                                             "features": {"pd_disaggregation": "accepted"}}}}
        ),
        "accelerators.yaml": yaml.safe_dump(
            {"accelerators": {"gb300-lab": {**load_catalog().accelerators["gb300"].model_dump(mode="json"), "hostMemory": "480Gi"}}}
        ),
    }
    catalog = load_catalog(overrides=override)
    assert catalog.plugins["sgl-nvidia-mega"].features == {"pd_disaggregation": "accepted"}
    assert catalog.accelerator("gb300-lab").hostMemory == "480Gi"
    assert catalog.accelerator("gb300").hostMemory != "480Gi"


@pytest.mark.parametrize(
    "override, words",
    [
        ({"plugins.yaml": "plugins: {sgl-nvidia-mega: {vendor: intel}}"}, ["plugins.sgl-nvidia-mega"]),
        ({"accelerators.yaml": "accelerators: [gb300]"}, ["accelerators", "must map names"]),
        ({"models.yaml": "models: {a/b: {architecture: X, modelType: y, numLayers: 0, routedExperts: 1, topK: 1, "
                         "expertParams: 1, bytesPerExpertParam: 1}}"}, ["models.a/b.numLayers"]),
        ({"gpus.yaml": "x: 1"}, ["gpus.yaml", "expected one of"]),
        ({"plugins.yaml": "plugins: {a: [unclosed"}, ["not valid YAML"]),
    ],
)
def test_bad_override_names_the_file_and_entry(override, words):
    with pytest.raises(CatalogError) as err:
        load_catalog(overrides=override)
    for w in words:
        assert w in str(err.value)
