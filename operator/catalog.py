"""Catalogs of accelerators, vendor kernel plugins and models, loaded from ``kernels/``.

The catalogs are data (YAML), checked against the pydantic schemas below when loaded.
A cluster admin overrides or extends them with a ConfigMap whose keys are the file
names (``accelerators.yaml``, ``plugins.yaml``, ``models.yaml``); entries are merged by
name, an override entry replacing the built-in one whole.

Lookup is by name; the planning layer turns a missing name into a Problem naming the
spec field, so nothing here raises for a user's typo.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ISA = Literal["sm_103", "sm_100", "sm_90a", "sm_89", "gfx950", "gfx942"]
FeatureSupport = Literal["accepted", "refused", "unknown"]
CATALOG_FILES = ("accelerators.yaml", "plugins.yaml", "models.yaml")
HF_CONFIG_DIR = "hf-configs"


class CatalogError(ValueError):
    """A catalog file or override does not match its schema; the message names file and entry."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rail(_Entry):
    """One RDMA NIC and the GPUs (process-visible ids on the node) closest to it.

    ``gpus`` are the GPUs behind the same PCIe switch (or, without one, the GPUs the NIC
    serves on its NUMA node); ``numa`` is the NIC's NUMA node; ``railClass`` groups NICs
    that reach each other across nodes (one fabric, or one rail of a rail-only fabric):
    prefill and decode must use NICs of the same class. ``pcieSwitch`` names the switch
    the NIC shares with ``gpus`` (informational, from ``nvidia-smi topo -m`` / ``lspci -t``).
    """

    device: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    gpus: tuple[int, ...]
    numa: int = 0
    railClass: str = Field(default="default", description="NICs of one class reach each other across nodes.")
    pcieSwitch: str | None = None


class Accelerator(_Entry):
    """A GPU node type: vendor, ISA, GPUs per node, memory, how pods select it."""

    vendor: Literal["nvidia", "amd"]
    isa: ISA
    gpuProduct: str
    gpusPerNode: int = Field(ge=1)
    gpuMemory: str
    hostMemory: str
    cpus: int = Field(ge=1)
    nvlinkDomain: int = Field(ge=1, description="GPUs reachable over NVLink / xGMI from one GPU.")
    nvlinkCliqueLabel: str | None = Field(
        default=None,
        description=(
            "Node label naming the node's NVLink partition when the NVLink domain spans nodes (NVIDIA's GPU "
            "operator: nvidia.com/gpu.clique = <clusterUUID>.<cliqueID>); None for a domain inside one node."
        ),
    )
    cudaContextMemory: str = Field(
        default="1Gi",
        description=(
            "What the driver and the CUDA context take of each GPU before SGLang allocates (about 0.5-1 GiB on "
            "Hopper/Blackwell with CUDA 12-13; the upper end by default). SGLang's pre_model_load_memory is at most "
            "gpuMemory less this (torch.cuda.mem_get_info): the SGLang oracle's emulated device reports it, and the "
            "memory rules (rules/weights.py, rules/dsv4_memory.py) plan with it."
        ),
    )
    gpuResource: str
    rdmaResource: str = "rdma/hca"
    sharedMemory: str = "64Gi"
    nodeLabels: dict[str, str]
    rails: tuple[Rail, ...] = ()
    gpuNuma: tuple[int, ...] = Field(
        default=(), description="NUMA node of each GPU, indexed by GPU id (nvidia-smi topo -m, NUMA Affinity)."
    )

    @model_validator(mode="after")
    def _rails_consistent(self) -> "Accelerator":
        """Rails name GPUs of this node, each NIC once, on the NUMA node of the GPUs it serves."""
        if self.gpuNuma and len(self.gpuNuma) != self.gpusPerNode:
            raise ValueError(f"gpuNuma lists {len(self.gpuNuma)} GPUs, gpusPerNode is {self.gpusPerNode}")
        seen: set[str] = set()
        for rail in self.rails:
            if rail.device in seen:
                raise ValueError(f"rail device {rail.device} is listed twice")
            seen.add(rail.device)
            for gpu in rail.gpus:
                if not 0 <= gpu < self.gpusPerNode:
                    raise ValueError(f"rail {rail.device} names GPU {gpu}; the node has GPUs 0..{self.gpusPerNode - 1}")
                if self.gpuNuma and self.gpuNuma[gpu] != rail.numa:
                    raise ValueError(
                        f"rail {rail.device} is on NUMA node {rail.numa} but serves GPU {gpu} on NUMA node "
                        f"{self.gpuNuma[gpu]}"
                    )
        return self

    def gpu_numa(self, gpu: int) -> int | None:
        """NUMA node of GPU ``gpu``: from ``gpuNuma``, else from a rail that serves it, else None."""
        if self.gpuNuma:
            return self.gpuNuma[gpu]
        for rail in self.rails:
            if gpu in rail.gpus:
                return rail.numa
        return None

    @property
    def rail_classes(self) -> tuple[str, ...]:
        """The rail classes of this node type's NICs, sorted."""
        return tuple(sorted({r.railClass for r in self.rails}))

    def rail(self, device: str) -> Rail | None:
        """The rail of NIC ``device``, or None when this node type has no such NIC."""
        return next((r for r in self.rails if r.device == device), None)

    @property
    def multi_node_nvlink(self) -> bool:
        """NVLink reaches GPUs of other nodes (GB200 / GB300 NVL72): nvlinkDomain above gpusPerNode and a clique label."""
        return self.nvlinkCliqueLabel is not None and self.nvlinkDomain > self.gpusPerNode

    @property
    def nodes_per_clique(self) -> int:
        """Nodes of one NVLink partition (18 trays of 4 GPUs on NVL72); 1 without multi-node NVLink."""
        return self.nvlinkDomain // self.gpusPerNode if self.multi_node_nvlink else 1

    @property
    def is_blackwell(self) -> bool:
        """SM100 or SM103: where SGLang 0.5.23 serves V4.1 KV layouts and flashmla_mega."""
        return self.isa in ("sm_100", "sm_103")


class PluginPackage(_Entry):
    """Where the plugin library comes from (the runtime image build installs it)."""

    source: str
    version: str


class KernelPlugin(_Entry):
    """A vendor kernel plugin as SGLang's plugin spec contract describes it."""

    vendor: Literal["nvidia", "amd"]
    flag: str
    entryPoint: str
    package: PluginPackage
    isas: tuple[ISA, ...]
    tpSizes: tuple[int, ...]
    architectures: tuple[str, ...]
    modelTypes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    decodeGraphBackends: tuple[str, ...] = ("full", "disabled")
    roles: tuple[Literal["prefill", "decode"], ...] = ("decode",)
    features: dict[str, FeatureSupport]
    sources: tuple[str, ...] = ()


class DraftWeightBytes(_Entry):
    """SGLang 0.5.23's bytes on one GPU for a bundled speculative draft, by ISA, in the same three
    figures as :class:`ModelFacts` keeps for the target (``deviceWeightBytes`` at tp 1,
    ``replicatedWeightBytes`` held whole on every GPU, ``attentionWeightBytes`` split over the
    attention-TP group); measured by the SGLang oracle's speculative stage (the draft worker's
    model build, ``facts.speculative.draftWeightBytes``)."""

    deviceWeightBytes: dict[ISA, int] = Field(default_factory=dict)
    replicatedWeightBytes: dict[ISA, int] = Field(default_factory=dict)
    attentionWeightBytes: dict[ISA, int] = Field(default_factory=dict)


class ModelFacts(_Entry):
    """Facts about a model the rules need before weights load (or from its config.json)."""

    architecture: str
    modelType: str
    numLayers: int = Field(ge=1)
    routedExperts: int = Field(ge=0)
    topK: int = Field(ge=0)
    expertParams: int = Field(ge=0, description="Parameters of one routed expert in one layer.")
    bytesPerExpertParam: float = Field(gt=0)
    sharedExperts: int = 0
    mla: bool = False
    compressionRatios: tuple[int, ...] = ()
    engram: bool = False
    engramTableBytes: int | None = Field(
        default=None, ge=0, description="Bytes of the Engram table (host placement keeps one copy per node)."
    )
    dsparkDraftBundled: bool = Field(
        default=False, description="The checkpoint bundles a DSpark draft head (dspark_* keys in its config.json)."
    )
    deviceWeightBytes: dict[ISA, int] = Field(
        default_factory=dict,
        description=(
            "Bytes SGLang 0.5.23 puts on one GPU for the whole model at tp 1, by the GPU's ISA: every parameter and "
            "buffer of its model build (quantization create_weights included), without an Engram table or a DSpark "
            "draft. Measured by the SGLang oracle's model stage; tests/contract/test_weight_bytes.py holds each "
            "value to it. rules/weights.py weights_fit_gpu divides it by tp for a lower bound per GPU."
        ),
    )
    replicatedWeightBytes: dict[ISA, int] = Field(
        default_factory=dict,
        description=(
            "Bytes of deviceWeightBytes that every GPU holds whole (parameters SGLang 0.5.23 does not shard), by ISA: "
            "the least over tp 2, 4 and 8 and the attention backends of (tp x one GPU's bytes - deviceWeightBytes) / "
            "(tp - 1), less 16 MiB. A parameter sharded at all is split over at "
            "most tp ranks, so replicated + (deviceWeightBytes - replicated) / tp is a lower bound per GPU at any tp "
            "(rules/weights.py weights_per_gpu_lower_bound). Measured by the SGLang oracle's model stage; "
            "tests/contract/test_weight_bytes.py holds it to SGLang's tp-2 build, the differential to every build. Missing: 0."
        ),
    )
    attentionWeightBytes: dict[ISA, int] = Field(
        default_factory=dict,
        description=(
            "Bytes of deviceWeightBytes that attention DP splits over the attention-TP group (tp / dp) instead of "
            "the TP group, by ISA: (one GPU's bytes at tp t with dp t - at dp 1) / (1 - 1/t), less 16 MiB. "
            "Measured by the SGLang oracle's model stage at tp 2, 4 and 8 (equal to the byte); "
            "rules/weights.py adds its replication under attention DP to the lower bound. Missing: 0."
        ),
    )
    lmHeadWeightBytes: int = Field(
        default=0, ge=0,
        description=(
            "Bytes of the LM head at tp 1 (vocab x hidden, its dtype), which --enable-dp-lm-head splits over the "
            "attention-TP group too (measured: the difference of the oracle's builds with and without it). Missing: 0."
        ),
    )
    dsparkDraftWeightBytes: DraftWeightBytes | None = Field(
        default=None,
        description="The bundled DSpark draft's bytes on a GPU (dsparkDraftBundled), the target's three figures.",
    )

    @property
    def expert_bytes_total(self) -> int:
        """Bytes of every routed expert of every layer, as stored (Paged Experts pins them all)."""
        return int(self.numLayers * self.routedExperts * self.expertParams * self.bytesPerExpertParam)

    @property
    def is_deepseek_v41(self) -> bool:
        """model_type deepseek_v41: the model SGLang's V4.1 KV layouts and flashmla_mega serve."""
        return self.modelType == "deepseek_v41"


class Catalog(BaseModel):
    """All three catalogs, immutable. Build with :func:`load_catalog`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerators: dict[str, Accelerator]
    plugins: dict[str, KernelPlugin]
    models: dict[str, ModelFacts]
    hfConfigs: dict[str, dict] = Field(
        default_factory=dict, description="Model id -> its Hugging Face config.json (kernels/hf-configs/)."
    )

    def accelerator(self, name: str) -> Accelerator | None:
        """The accelerator named ``name`` (case-insensitive), or None."""
        return self.accelerators.get(name.lower())

    def plugin(self, name: str) -> KernelPlugin | None:
        """The kernel plugin named ``name``, or None (also for ``none``)."""
        return self.plugins.get(name)

    def model(self, name: str) -> ModelFacts | None:
        """Model facts for a model id such as ``deepseek-ai/DeepSeek-V4.1-Flash``, or None."""
        return self.models.get(name)

    def hf_config(self, name: str) -> dict | None:
        """The model's Hugging Face config.json mapping (kernels/hf-configs/), or None."""
        return self.hfConfigs.get(name)


def default_catalog_dir() -> Path:
    """The kernel catalog folder: ``$SGLANG_PD_CATALOG_DIR``, else the copy installed in
    the package (``sglang_pd_operator/kernels/``, a wheel or ``pip install .``), else the
    repository's ``kernels/`` folder (an editable install or a checkout)."""
    env = os.environ.get("SGLANG_PD_CATALOG_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    packaged = here / "kernels"
    return packaged if (packaged / "models.yaml").is_file() else here.parent / "kernels"


def _parse(name: str, text: str) -> dict:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise CatalogError(f"{name}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise CatalogError(f"{name}: expected a mapping at the top level")
    return data


def load_catalog(directory: Path | None = None, overrides: Mapping[str, str] | None = None) -> Catalog:
    """Load ``accelerators.yaml``, ``plugins.yaml`` and ``models.yaml`` and merge overrides.

    ``overrides`` maps a catalog file name to YAML text (the data of the admin's
    ConfigMap). Raises :class:`CatalogError` naming the file and entry when anything
    does not match the schema.
    """
    directory = directory or default_catalog_dir()
    merged: dict[str, dict] = {"accelerators": {}, "plugins": {}, "models": {}}
    sources: list[tuple[str, str]] = []
    for fname in CATALOG_FILES:
        path = directory / fname
        if not path.is_file():
            raise CatalogError(f"{path}: catalog file missing")
        sources.append((str(path), path.read_text()))
    for fname, text in (overrides or {}).items():
        if fname not in CATALOG_FILES:
            raise CatalogError(f"override key {fname!r}: expected one of {', '.join(CATALOG_FILES)}")
        sources.append((f"override {fname}", text))
    for name, text in sources:
        data = _parse(name, text)
        for section, entries in data.items():
            if section not in merged:
                raise CatalogError(f"{name}: unknown section {section!r}; expected {sorted(merged)}")
            if not isinstance(entries, dict):
                raise CatalogError(f"{name}: section {section!r} must map names to entries")
            merged[section].update({str(k): v for k, v in entries.items()})
    hf_configs = {}
    for path in sorted((directory / HF_CONFIG_DIR).glob("*.yaml")):
        data = _parse(str(path), path.read_text())
        if not isinstance(data.get("config"), dict) or not isinstance(data.get("model"), str):
            raise CatalogError(f"{path}: expected `model: <id>` and a `config` mapping")
        hf_configs[data["model"]] = data["config"]
    try:
        return Catalog(**merged, hfConfigs=hf_configs)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"catalog entry {loc}: {first['msg']}") from e


def hf_config_path(model: str, directory: Path | None = None) -> Path:
    """Where the catalog keeps ``model``'s Hugging Face config: ``hf-configs/<org>--<name>.yaml``."""
    return (directory or default_catalog_dir()) / HF_CONFIG_DIR / f"{model.replace('/', '--')}.yaml"


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The catalog shipped in ``kernels/`` (cached; no overrides)."""
    return load_catalog()
