"""The operator's transfer and HiCache rendering against the real sglang==0.5.23 code (no GPU, no Mooncake).

- ``--disaggregation-ib-device``: the rendered per-GPU JSON parses with
  ``prepare_server_args`` (flat and ``--config`` form); SGLang's own
  ``validate_ib_devices`` (the resolution step that checks the node's
  /sys/class/infiniband, here a simulated node of the catalog's node type) accepts it and
  normalizes it to exactly the rendered string; ``get_ib_devices_for_gpu`` (what every
  Mooncake scheduler rank, and NIXL UCX, calls with its own GPU id) finds each rank's
  NICs; a node that lacks a device is refused with SGLang's message.
- ``--hicache-storage-backend-extra-config``: SGLang's own extra-config parser
  (``HybridCacheController.parse_storage_backend_extra_config``) and
  ``MooncakeStoreConfig`` loading (``MooncakeBaseStore._load_config``) accept it; the real
  ``MooncakeStore.__init__`` (with an in-memory stand-in for the ``mooncake.store`` C++
  module, which needs a GPU driver) builds its key prefix from it: different for two
  specs that differ only in KV layout, equal for every rank and replica of one spec.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import types
from pathlib import Path

import pytest
from helpers import load_example

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402

from sglang_pd_operator.api.load import parse_pddeployment  # noqa: E402
from sglang_pd_operator.catalog import builtin_catalog  # noqa: E402
from sglang_pd_operator.planning.plan import build_plan  # noqa: E402
from sglang_pd_operator.render.engine import CONFIG_DIR, CONFIG_FILE, config_yaml, engine_command  # noqa: E402

pytestmark = pytest.mark.contract
CATALOG = builtin_catalog()
MOONCAKE = {"hostRatio": 2, "storage": {"backend": "mooncake"}, "decodeOffload": True}


def plan_of(doc):
    return build_plan(parse_pddeployment(doc), CATALOG)


def value(role, flag):
    a = list(role.command.args)
    return a[a.index(flag) + 1]


def qwen(acc: str, tp: int, backend: str = "mooncake", **extra) -> dict:
    return {
        "apiVersion": "pd.sglang-operator.io/v1alpha1", "kind": "PDDeployment",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "model": {"name": "Qwen/Qwen3-30B-A3B", "revision": "main", "source": {"pvc": {"claimName": "m"}}},
            "runtime": {"image": "img", "sglangVersion": "0.5.23"}, "accelerator": acc,
            "transfer": {"backend": backend},
            "prefill": {"replicas": 1, "parallelism": {"tp": tp}}, "decode": {"replicas": 1, "parallelism": {"tp": tp}},
            **extra,
        },
    }  # fmt: skip


def parse_both_forms(role, tmp_path: Path):
    """(flat ServerArgs, pod ServerArgs): the command as one list, and as the pod runs it (--config file)."""
    flat = real.parse_engine_args(list(role.command.args), role.command.env_dict())
    cfg = tmp_path / CONFIG_FILE
    cfg.write_text(config_yaml(role))
    pod_args = [str(cfg) if a == f"{CONFIG_DIR}/{CONFIG_FILE}" else a for a in engine_command(role)]
    pod = real.parse_engine_args(pod_args, role.command.env_dict())
    return flat, pod


@pytest.fixture
def node_nics(monkeypatch):
    """Simulate a node's /sys/class/infiniband for SGLang's validate_ib_devices."""
    real._require_sglang()
    from sglang.srt.arg_groups import validation_hook as vh

    def install(names):
        real_isdir, real_listdir = os.path.isdir, os.listdir
        monkeypatch.setattr(vh.os.path, "isdir", lambda p: True if p == "/sys/class/infiniband" else real_isdir(p))
        monkeypatch.setattr(vh.os, "listdir", lambda p: list(names) if p == "/sys/class/infiniband" else real_listdir(p))
        return vh.validate_ib_devices

    return install


@pytest.mark.parametrize("acc_name", ["gb300", "b300", "h200", "mi355x", "l40s"])
@pytest.mark.parametrize("backend", ["mooncake", "nixl"])
def test_ib_device_mapping_parses_validates_and_resolves_per_rank(acc_name, backend, tmp_path, node_nics):
    acc = CATALOG.accelerator(acc_name)
    plan = plan_of(qwen(acc_name, acc.gpusPerNode, backend))
    assert plan.valid, [p.line() for p in plan.problems]
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import get_ib_devices_for_gpu

    for role in (plan.prefill, plan.decode):
        rendered = value(role, "--disaggregation-ib-device")
        flat, pod = parse_both_forms(role, tmp_path)
        assert flat.disaggregation_ib_device == rendered == pod.disaggregation_ib_device
        assert flat.disaggregation_transfer_backend == backend
        # SGLang's resolution on a node of this type: accepted, normalized to the same string
        validate = node_nics([r.device for r in acc.rails])
        assert validate(rendered) == rendered
        # every scheduler rank (gpu_id = tp_rank for one TP group) finds its own NICs
        for gpu in range(acc.gpusPerNode):
            nics = get_ib_devices_for_gpu(rendered, gpu).split(",")
            assert nics == list(role.transfer.nics_of(gpu))
            assert {acc.rail(n).numa for n in nics} == {acc.gpu_numa(gpu)}
        with pytest.raises(ValueError, match="No IB devices configured for GPU"):
            get_ib_devices_for_gpu(rendered, acc.gpusPerNode)
        if backend == "nixl":
            from sglang.srt.disaggregation.nixl.conn import _resolve_ucx_device_list

            assert _resolve_ucx_device_list(rendered, 0) == ", ".join(role.transfer.nics_of(0))


def test_a_node_without_the_device_is_refused_by_sglang(node_nics):
    plan = plan_of(qwen("b300", 8))
    rendered = value(plan.prefill, "--disaggregation-ib-device")
    validate = node_nics(["mlx5_0", "mlx5_1"])
    with pytest.raises(ValueError, match=r"Invalid IB devices specified for GPU 2: \['mlx5_2'\]"):
        validate(rendered)


def test_mori_comma_list_and_partial_node_mapping_parse(tmp_path, node_nics):
    mori = plan_of(qwen("mi355x", 8, "mori"))
    flat, pod = parse_both_forms(mori.prefill, tmp_path)
    assert flat.disaggregation_ib_device == pod.disaggregation_ib_device == ",".join(f"bnxt_re{i}" for i in range(8))
    partial = plan_of(qwen("h200", 2))
    rendered = value(partial.prefill, "--disaggregation-ib-device")
    assert node_nics([f"mlx5_{i}" for i in range(8)])(rendered) == rendered


def test_force_tcp_and_fake_render_no_devices(tmp_path):
    for doc in (qwen("h200", 8, "fake"), qwen("h200", 8, transfer={"backend": "mooncake", "forceTCP": True})):
        flat, _ = parse_both_forms(plan_of(doc).prefill, tmp_path)
        assert flat.disaggregation_ib_device is None


# --------------------------------------------------------------------------- HiCache / Mooncake Store


def hicache_doc(**kv_layout) -> dict:
    doc = load_example()
    doc["spec"].pop("kernels", None)
    doc["spec"]["kvCache"] = {"hicache": copy.deepcopy(MOONCAKE)}
    doc["spec"]["kvLayout"] = {**doc["spec"]["kvLayout"], **kv_layout}
    return doc


def test_hicache_flags_parse(tmp_path):
    plan = plan_of(hicache_doc())
    flat, pod = parse_both_forms(plan.prefill, tmp_path)
    for args in (flat, pod):
        assert args.enable_hierarchical_cache is True
        assert args.hicache_ratio == 2.0
        assert args.hicache_storage_backend == "mooncake"
        assert json.loads(args.hicache_storage_backend_extra_config) == json.loads(
            value(plan.prefill, "--hicache-storage-backend-extra-config")
        )
    dflat, _ = parse_both_forms(plan.decode, tmp_path)
    assert dflat.disaggregation_decode_enable_offload_kvcache is True and dflat.enable_hierarchical_cache is False
    assert dflat.hicache_storage_backend == "mooncake"


def test_extra_config_is_what_mooncake_store_config_loads():
    real._require_sglang()
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    plan = plan_of(hicache_doc())
    raw = value(plan.prefill, "--hicache-storage-backend-extra-config")
    extra, *_ = HybridCacheController.parse_storage_backend_extra_config(raw)
    cfg = real.real_mooncake_store_config(json.dumps(extra), env={"MOONCAKE_LOCAL_HOSTNAME": "10.0.0.7"})
    assert cfg.master_server_address == "dsv41-flash-mooncake-master.inference.svc:50051"
    assert cfg.master_metrics_port == 9003
    assert cfg.metadata_server == "P2PHANDSHAKE"
    assert cfg.protocol == "rdma"
    assert cfg.device_name == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert cfg.global_segment_size == 16 << 30
    assert cfg.local_hostname == "10.0.0.7"  # the pod IP the operator puts in the variable
    assert cfg.check_server is False
    assert cfg.tenant_id == "default"


class _FakeMooncakeStore:
    """In-memory stand-in for mooncake.store.MooncakeDistributedStore (its C++ library needs libcuda)."""

    instances: list["_FakeMooncakeStore"] = []

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.setup_args = None
        _FakeMooncakeStore.instances.append(self)

    def setup(self, *args, **kwargs):
        self.setup_args = (args, kwargs)
        return 0

    def put(self, key, value):
        self.data[key] = bytes(value)
        return 0

    def is_exist(self, key):
        return 1 if key in self.data else 0

    def get(self, key):
        return self.data.get(key, b"")


@pytest.fixture
def mooncake_store(monkeypatch):
    """Build the real sglang MooncakeStore for a rendered extra config; returns (store, fake client)."""
    real._require_sglang()
    pkg = types.ModuleType("mooncake")
    mod = types.ModuleType("mooncake.store")
    mod.MooncakeDistributedStore = _FakeMooncakeStore
    pkg.store = mod
    monkeypatch.setitem(sys.modules, "mooncake", pkg)
    monkeypatch.setitem(sys.modules, "mooncake.store", mod)
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "10.0.0.7")
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    def build(raw: str, *, tp_rank: int = 0, tp_size: int = 4, model_name: str = "deepseek-v4.1-flash"):
        extra, *_ = HybridCacheController.parse_storage_backend_extra_config(raw)
        cfg = HiCacheStorageConfig(
            tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True, model_name=model_name,
            extra_config=extra,
        )  # fmt: skip
        store = MooncakeStore(storage_config=cfg)
        return store, _FakeMooncakeStore.instances[-1]

    return build


def test_key_prefix_differs_between_kv_layouts_and_matches_within_a_group(mooncake_store):
    v41 = plan_of(hicache_doc())
    v4 = plan_of(hicache_doc(attentionBackend="flashmla", layout="v4"))
    assert v41.valid and v4.valid
    assert v41.prefill.kv_layout_string != v4.prefill.kv_layout_string
    raw = lambda p, r: value(p.role(r), "--hicache-storage-backend-extra-config")  # noqa: E731

    a, client = mooncake_store(raw(v41, "prefill"))
    b, _ = mooncake_store(raw(v4, "prefill"))
    assert a.config_prefix == f"sglpd-{v41.compat_key}_deepseek-v4.1-flash"
    assert a.config_prefix != b.config_prefix
    assert a._tag_keys(["page0"]) != b._tag_keys(["page0"])

    # another rank of the same replica, another replica (replica count is not in the key),
    # and decode's offload writer: one namespace
    scaled = hicache_doc()
    scaled["spec"]["prefill"]["replicas"] = 3
    same = [
        mooncake_store(raw(v41, "prefill"), tp_rank=3)[0],
        mooncake_store(raw(plan_of(scaled), "prefill"))[0],
        mooncake_store(raw(v41, "decode"))[0],
    ]
    assert {s.config_prefix for s in same} == {a.config_prefix}
    assert {tuple(s._tag_keys(["page0"])) for s in same} == {tuple(a._tag_keys(["page0"]))}

    # what the store client was set up with: the rendered config, the segment split per rank
    args, kwargs = client.setup_args
    hostname, metadata, per_rank_segment, _local, protocol, device, master, _engine = args
    assert (hostname, metadata, protocol, device) == ("10.0.0.7", "P2PHANDSHAKE", "rdma", "mlx5_0,mlx5_1,mlx5_2,mlx5_3")
    assert master == "dsv41-flash-mooncake-master.inference.svc:50051"
    assert per_rank_segment == (16 << 30) // 4
    assert "tenant_id" not in kwargs  # default tenant: keys are namespaced by the tag
