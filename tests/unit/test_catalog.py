"""Catalogs: schema-checked YAML in kernels/, overridable by the cluster admin's ConfigMap."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT

from sglang_pd_operator.catalog import CatalogError, load_catalog
from sglang_pd_operator_dev.cluster.nodes import allocatable, parse_quantity
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


def test_each_example_fits_the_dev_cluster_on_its_own_and_the_readme_promises_no_more():
    """Each example fits on the fake nodes alone: its GB300 trays (one per engine pod) within the
    pool and each multi-node group within one NVLink clique. All of them at once are NOT
    promised (no gang scheduling without Kueue: the other examples' pods fragment the racks
    and the wide-EP decode group of 16 may find no clique with 16 free trays), so the README
    must say "on its own", name what the wide-EP example needs, and never "side by side"."""
    (pool,) = [p for p in yaml.safe_load((ROOT / "hack/cluster/node-pools.yaml").read_text())["pools"]
               if p["name"] == "gb300"]
    size = pool["nvlinkCliques"]["size"]
    cliques = [min(size, pool["count"] - start) for start in range(0, pool["count"], size)]
    biggest_group = 0
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec, trays = doc["spec"], 0
            for role in ("prefill", "decode"):
                rs = spec.get(role) or {}
                if (rs.get("accelerator") or spec.get("accelerator")) != "gb300":
                    continue
                nodes = (rs.get("parallelism") or {}).get("nodes", 1)
                trays += rs.get("replicas", 1) * nodes
                assert nodes <= max(cliques), f"{path.name}: a {role} group of {nodes} trays fits no clique"
                biggest_group = max(biggest_group, nodes)
            assert trays <= pool["count"], f"{path.name}: {trays} GB300 trays, the dev cluster has {pool['count']}"
    readme = " ".join((ROOT / "README.md").read_text().split())
    dev_cluster = " ".join((ROOT / "docs/dev-cluster.md").read_text().split())
    for text in (readme, dev_cluster):
        assert "run side by side" not in text and "All examples run" not in text
    assert "each example in `examples/` fits on the fake nodes on its own" in readme
    assert f"{biggest_group} free trays of one NVLink clique" in readme, biggest_group
    assert f"the racks are {', '.join(map(str, cliques[:-1]))} and {cliques[-1]} trays" in readme, cliques
    assert "`dev cluster up --kueue`" in readme and "`spec.scheduling.queueName`" in readme
    assert "Limit without gang admission" in readme


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


# ------------------------------------------------ model facts agree with the shipped HF configs


def _flat(config: dict) -> dict:
    text = config.get("text_config")
    return {**text, **{k: v for k, v in config.items() if k != "text_config"}} if isinstance(text, dict) else config


@pytest.mark.parametrize("name", sorted(load_catalog().models))
def test_model_facts_agree_with_the_hf_config(name):
    """kernels/models.yaml summarizes kernels/hf-configs/: every fact derivable from the
    config.json SGLang reads must be the config's (the oracle gives SGLang the config)."""
    catalog = load_catalog()
    facts, config = catalog.model(name), catalog.hf_config(name)
    assert config is not None, f"{name}: no kernels/hf-configs/ entry; the SGLang oracle cannot judge it"
    flat = _flat(config)
    experts = flat.get("n_routed_experts", flat.get("num_experts", 0))
    assert facts.numLayers == flat["num_hidden_layers"]
    assert facts.routedExperts == experts
    assert facts.topK == flat["num_experts_per_tok"]
    assert facts.expertParams == 3 * flat["hidden_size"] * flat["moe_intermediate_size"]
    assert facts.sharedExperts == flat.get("n_shared_experts", 0)
    assert facts.compressionRatios == tuple(sorted(set(flat.get("compress_ratios") or []) - {0}))
    assert facts.modelType == config["model_type"]
    bundled = any(flat.get(k) is not None for k in ("dspark_block_size", "dspark_markov_rank",
                                                     "dspark_noise_token_id", "dspark_target_layer_ids"))
    assert facts.dsparkDraftBundled == bundled
    assert facts.engram == bool(flat.get("engram_layer_ids"))
    if facts.engram:
        per_row = flat["engram_head_dim"] + flat["engram_head_dim"] // 32  # fp8 row + e8m0 scale per 32
        assert facts.engramTableBytes == sum(flat["engram_num_embeddings"]) * per_row
    path = ROOT / "kernels" / "hf-configs" / (name.replace("/", "--") + ".yaml")
    weights = (yaml.safe_load(path.read_text()).get("weights") or {})
    expert_dtype = (config.get("quantization_config") or {}).get("expert_dtype") or weights.get("routedExpertDtype")
    quant = (config.get("quantization_config") or {}).get("quant_method")
    want = 0.5 if expert_dtype == "fp4" else 1 if quant == "fp8" else 2
    assert facts.bytesPerExpertParam == want


def test_hf_configs_name_their_model_and_source():
    """Each shipped config names its model and says where its values come from (a comment header)."""
    directory = ROOT / "kernels" / "hf-configs"
    files = sorted(directory.glob("*.yaml"))
    assert len(files) >= len(load_catalog().models)
    for path in files:
        text = path.read_text()
        assert "Provenance:" in text, f"{path.name}: say where the values come from"
        data = yaml.safe_load(text)
        assert path.name == data["model"].replace("/", "--") + ".yaml"
