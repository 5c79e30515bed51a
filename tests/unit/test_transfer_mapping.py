"""KV transfer wiring: the per-GPU NIC mapping over the catalog's node types, rail classes, RDMA resources.

Properties (hypothesis over every accelerator of the built-in catalog and the parallelism
shapes a pod can take): every GPU of a whole-node pod gets NICs of its own NUMA node;
both roles use the same rail classes; the rendered value is one string per role (so every
rank of a replica reads the same mapping) and names every process-visible GPU id a rank
of the replica can have.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from helpers import load_example
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.catalog import builtin_catalog, load_catalog
from sglang_pd_operator.planning.memory import quantity_bytes
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.render import render_all

CATALOG = builtin_catalog()
RAILED = sorted(n for n, a in CATALOG.accelerators.items() if a.rails)


def qwen_doc(accelerator: str, *, prefill: dict | None = None, decode: dict | None = None, transfer=None) -> dict:
    """A small valid non-DeepSeek spec (no KV layout rules in the way) on ``accelerator``."""
    return {
        "apiVersion": "pd.sglang-operator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "model": {"name": "Qwen/Qwen3-30B-A3B", "revision": "main", "source": {"pvc": {"claimName": "m"}}},
            "runtime": {"image": "img", "sglangVersion": "0.5.23"},
            "accelerator": accelerator,
            "transfer": transfer or {"backend": "mooncake"},
            "prefill": {"replicas": 1, "parallelism": {"tp": 1}, **(prefill or {})},
            "decode": {"replicas": 1, "parallelism": {"tp": 1}, **(decode or {})},
        },
    }


def plan_of(doc: dict, catalog=CATALOG):
    return build_plan(parse_pddeployment(doc), catalog)


def flag(role_plan) -> str | None:
    args = list(role_plan.command.args)
    return args[args.index("--disaggregation-ib-device") + 1] if "--disaggregation-ib-device" in args else None


def ranks_gpu_ids(parallelism: dict) -> list[int]:
    """Process-visible GPU id of every scheduler rank of one pod, as SGLang assigns them.

    Each data-parallel replica starts at base_gpu_id = dp_rank * tp (data_parallel_
    controller), each TP rank adds tp_rank * gpu_id_step (1); DP attention keeps one set
    of tp GPUs.
    """
    tp, dp = parallelism.get("tp", 1), parallelism.get("dp", 1)
    replicas = 1 if parallelism.get("dpAttention") else dp
    return [d * tp + r for d in range(replicas) for r in range(tp)]


@st.composite
def whole_node_specs(draw):
    acc = draw(st.sampled_from(RAILED))
    n = CATALOG.accelerator(acc).gpusPerNode
    shape = draw(st.sampled_from(["tp", "dep", "dp"]))
    if shape == "tp":
        par = {"tp": n}
    elif shape == "dep" and n > 1:
        par = {"tp": n, "dp": n, "ep": n, "dpAttention": True}
    else:
        # Qwen3-30B-A3B's 62 GB of weights fill one GPU of less memory (weights_fit_gpu): tp 2 at least there
        fits = [d for d in (1, 2, 4) if n % d == 0 and CATALOG.model("Qwen/Qwen3-30B-A3B").deviceWeightBytes[
            CATALOG.accelerator(acc).isa] // d < quantity_bytes(CATALOG.accelerator(acc).gpuMemory)]
        tp = draw(st.sampled_from(fits))
        par = {"tp": tp, "dp": n // tp} if n // tp > 1 else {"tp": tp}
    backend = draw(st.sampled_from(["mooncake", "nixl"]))
    return acc, par, backend


@settings(max_examples=60, deadline=None)
@given(whole_node_specs())
def test_whole_node_mapping_is_numa_local_same_class_and_rank_independent(case):
    acc_name, par, backend = case
    acc = CATALOG.accelerator(acc_name)
    plan = plan_of(qwen_doc(acc_name, prefill={"parallelism": par}, decode={"parallelism": par},
                            transfer={"backend": backend}))  # fmt: skip
    assert plan.valid, [p.line() for p in plan.problems]
    classes = set()
    for rp in (plan.prefill, plan.decode):
        tp = rp.transfer
        assert tp is not None and tp.exact and tp.rdma
        value = flag(rp)
        mapping = json.loads(value)
        # every rank of the replica finds its GPU in the one string every rank reads
        assert set(ranks_gpu_ids(par)) <= {int(k) for k in mapping}
        assert sorted(int(k) for k in mapping) == list(range(acc.gpusPerNode))
        for gpu, nics in mapping.items():
            names = nics.split(",")
            assert names and all(acc.rail(n) is not None for n in names)
            # every GPU gets NICs of its own NUMA node
            assert {acc.rail(n).numa for n in names} == {acc.gpuNuma[int(gpu)]}
            classes |= {acc.rail(n).railClass for n in names}
        # deterministic: planning the same spec again renders the identical string
        assert flag(plan_of(qwen_doc(acc_name, prefill={"parallelism": par}, decode={"parallelism": par},
                                     transfer={"backend": backend})).role(rp.role)) == value  # fmt: skip
    assert len(classes) == 1  # both roles, one rail class
    assert plan.prefill.transfer.classes == plan.decode.transfer.classes


@pytest.mark.parametrize("acc_name", RAILED)
def test_each_gpu_gets_the_nic_behind_its_own_switch(acc_name):
    acc = CATALOG.accelerator(acc_name)
    n = acc.gpusPerNode
    plan = plan_of(qwen_doc(acc_name, prefill={"parallelism": {"tp": n}}, decode={"parallelism": {"tp": n}}))
    mapping = json.loads(flag(plan.prefill))
    for gpu in range(n):
        own = [r.device for r in acc.rails if gpu in r.gpus]
        assert mapping[str(gpu)].split(",") == own


def test_flag_is_identical_on_both_roles_and_every_replica_count():
    base = qwen_doc("b300", prefill={"parallelism": {"tp": 8}}, decode={"parallelism": {"tp": 8}, "replicas": 1})
    more = copy.deepcopy(base)
    more["spec"]["decode"]["replicas"] = 7
    a, b = plan_of(base), plan_of(more)
    assert flag(a.prefill) == flag(a.decode) == flag(b.decode)
    assert flag(a.prefill) == json.dumps({str(g): f"mlx5_{g}" for g in range(8)}, separators=(",", ":"))


def test_partial_node_pod_lists_every_nic_of_the_class_for_each_visible_gpu():
    plan = plan_of(qwen_doc("h200", prefill={"parallelism": {"tp": 2}}, decode={"parallelism": {"tp": 1}}))
    tp = plan.prefill.transfer
    assert not tp.exact
    every = ",".join(f"mlx5_{i}" for i in range(8))
    assert json.loads(flag(plan.prefill)) == {"0": every, "1": every}
    assert json.loads(flag(plan.decode)) == {"0": every}


def test_explicit_devices_restrict_the_pool_and_stay_numa_local():
    doc = qwen_doc("b300", prefill={"parallelism": {"tp": 8}}, decode={"parallelism": {"tp": 8}},
                   transfer={"backend": "mooncake", "ibDevices": ["mlx5_0", "mlx5_4"]})  # fmt: skip
    plan = plan_of(doc)
    assert plan.valid
    mapping = json.loads(flag(plan.prefill))
    assert mapping == {**{str(g): "mlx5_0" for g in range(4)}, **{str(g): "mlx5_4" for g in range(4, 8)}}
    assert not [p for p in plan.problems if p.rule == "transfer_numa_local"]


def test_explicit_devices_of_one_socket_warn_that_other_gpus_cross_it():
    doc = qwen_doc("b300", prefill={"parallelism": {"tp": 8}}, decode={"parallelism": {"tp": 8}},
                   transfer={"backend": "mooncake", "ibDevices": ["mlx5_0"]})  # fmt: skip
    plan = plan_of(doc)
    assert plan.valid
    warn = [p for p in plan.problems if p.rule == "transfer_numa_local"]
    assert warn and warn[0].severity == "warning" and "GPUs 4, 5, 6, 7" in warn[0].message
    assert json.loads(flag(plan.prefill))["7"] == "mlx5_0"


def test_devices_the_node_type_lacks_are_refused():
    doc = qwen_doc("mi355x", transfer={"backend": "mooncake", "ibDevices": ["mlx5_0"]})
    plan = plan_of(doc)
    errs = [p for p in plan.problems if p.rule == "transfer_devices_exist"]
    assert not plan.valid and len(errs) == 2  # both roles run on mi355x
    assert errs[0].field == "spec.transfer.ibDevices"
    assert "mlx5_0" in errs[0].message and "bnxt_re0" in errs[0].message


def test_rails_that_cannot_reach_each_other_are_refused_naming_both_roles_devices():
    # prefill on H200 (InfiniBand), decode on MI355X (RoCE): explicit NICs of each node type.
    doc = qwen_doc("h200", decode={"accelerator": "mi355x", "transfer": {"ibDevices": ["bnxt_re0", "bnxt_re1"]}},
                   prefill={"transfer": {"ibDevices": ["mlx5_0"]}})  # fmt: skip
    plan = plan_of(doc)
    errs = [p for p in plan.problems if p.rule == "transfer_rails_reach"]
    assert not plan.valid and len(errs) == 1
    msg = errs[0].message
    assert "prefill IB devices mlx5_0 (infiniband)" in msg
    assert "decode IB devices bnxt_re0 (roce), bnxt_re1 (roce)" in msg
    assert errs[0].field == "spec.prefill.transfer.ibDevices"
    # without explicit lists the roles share no class either: refused, naming every NIC
    auto = plan_of(qwen_doc("h200", decode={"accelerator": "mi355x"}))
    assert [p.rule for p in auto.problems if p.rule == "transfer_rails_reach"]
    assert "bnxt_re7 (roce)" in next(p.message for p in auto.problems if p.rule == "transfer_rails_reach")


RAIL_ONLY = yaml.safe_dump({"accelerators": {"b300r": {
    **{k: v for k, v in CATALOG.accelerator("b300").model_dump().items() if k not in ("rails",)},
    "rails": [{"device": f"mlx5_{i}", "gpus": [i], "numa": i // 4, "railClass": f"rail{i}"} for i in range(8)],
}}})  # fmt: skip


def test_rail_only_fabric_refuses_explicit_devices_on_different_rails():
    catalog = load_catalog(overrides={"accelerators.yaml": RAIL_ONLY})
    doc = qwen_doc("b300r", prefill={"parallelism": {"tp": 8}, "transfer": {"ibDevices": ["mlx5_0"]}},
                   decode={"parallelism": {"tp": 8}, "transfer": {"ibDevices": ["mlx5_1"]}})  # fmt: skip
    plan = plan_of(doc, catalog)
    errs = [p for p in plan.problems if p.rule == "transfer_rails_reach"]
    assert errs and "mlx5_0 (rail0)" in errs[0].message and "mlx5_1 (rail1)" in errs[0].message
    # the same rail on both roles is fine; a catalog-picked role follows the other's rail
    ok = copy.deepcopy(doc)
    ok["spec"]["decode"]["transfer"] = {"ibDevices": ["mlx5_0"]}
    assert not [p for p in plan_of(ok, catalog).problems if p.rule == "transfer_rails_reach"]
    follow = copy.deepcopy(doc)
    del follow["spec"]["decode"]["transfer"]
    fplan = plan_of(follow, catalog)
    assert not [p for p in fplan.problems if p.rule == "transfer_rails_reach"]
    assert set(fplan.decode.transfer.devices) == {"mlx5_0"} and fplan.decode.transfer.classes == ("rail0",)


def test_rail_class_must_exist_on_the_roles_nics():
    plan = plan_of(qwen_doc("h200", transfer={"backend": "mooncake", "railClass": "roce"}))
    assert [p.field for p in plan.problems if p.rule == "transfer_rail_class_known"] == ["spec.transfer.railClass"] * 2


def _container(plan, role):
    objs = render_all(plan)
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{role}"))
    return dep["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    ("transfer", "rdma"),
    [
        ({"backend": "mooncake"}, True),
        ({"backend": "nixl"}, True),
        ({"backend": "mooncake", "forceTCP": True}, False),
        ({"backend": "fake"}, False),
    ],
)
def test_rdma_resource_and_ipc_lock_only_when_rdma_is_used(transfer, rdma):
    plan = plan_of(qwen_doc("h200", transfer=transfer))
    assert plan.valid, [p.line() for p in plan.problems]
    for role in ("prefill", "decode"):
        c = _container(plan, role)
        assert ("rdma/hca" in c["resources"]["requests"]) is rdma
        assert ("rdma/hca" in c["resources"]["limits"]) is rdma
        caps = (c.get("securityContext") or {}).get("capabilities", {}).get("add", [])
        assert ("IPC_LOCK" in caps) is rdma
        assert (flag(plan.role(role)) is not None) is rdma


def test_force_tcp_sets_mc_force_tcp_and_warns():
    plan = plan_of(qwen_doc("h200", transfer={"backend": "mooncake", "forceTCP": True}))
    assert plan.prefill.command.env_dict()["MC_FORCE_TCP"] == "1"
    warn = [p for p in plan.problems if p.rule == "transfer_tcp_fallback"]
    assert warn and warn[0].severity == "warning" and "slower" in warn[0].message
    plain = plan_of(qwen_doc("h200"))
    assert "MC_FORCE_TCP" not in plain.prefill.command.env_dict()
    assert not [p for p in plain.problems if p.rule == "transfer_tcp_fallback"]


def test_force_tcp_with_another_backend_is_refused():
    plan = plan_of(qwen_doc("h200", transfer={"backend": "nixl", "forceTCP": True}))
    assert [p.rule for p in plan.problems if p.severity == "error"] == ["transfer_force_tcp_backend"]


def test_mori_gets_a_comma_list_and_runs_on_amd_only():
    plan = plan_of(qwen_doc("mi355x", prefill={"parallelism": {"tp": 8}}, decode={"parallelism": {"tp": 8}},
                            transfer={"backend": "mori"}))  # fmt: skip
    assert plan.valid
    assert flag(plan.prefill) == ",".join(f"bnxt_re{i}" for i in range(8))
    bad = plan_of(qwen_doc("h200", transfer={"backend": "mori"}))
    assert [p.rule for p in bad.problems if p.severity == "error"] == ["transfer_backend_vendor"] * 2


def test_nixl_environment_overrides_are_reported():
    env = [{"name": "UCX_NET_DEVICES", "value": "mlx5_0:1"}]
    plan = plan_of(qwen_doc("h200", transfer={"backend": "nixl"}, prefill={"env": env}))
    assert [p.severity for p in plan.problems if p.rule == "transfer_nixl_devices"] == ["warning"]
    params = [{"name": "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "value": '{"device_list": "mlx5_3"}'}]
    plan = plan_of(qwen_doc("h200", transfer={"backend": "nixl"}, decode={"env": params}))
    errs = [p for p in plan.problems if p.rule == "transfer_nixl_devices"]
    assert errs and errs[0].severity == "error" and errs[0].field == "spec.decode.env"


def test_catalog_refuses_rails_on_the_wrong_numa_node():
    bad = yaml.safe_dump({"accelerators": {"x": {
        **{k: v for k, v in CATALOG.accelerator("b300").model_dump().items() if k != "rails"},
        "rails": [{"device": "mlx5_0", "gpus": [0, 7], "numa": 0}],
    }}})  # fmt: skip
    from sglang_pd_operator.catalog import CatalogError

    with pytest.raises(CatalogError, match="NUMA node"):
        load_catalog(overrides={"accelerators.yaml": bad})


def test_the_gb300_example_renders_the_per_gpu_mapping():
    plan = build_plan(parse_pddeployment(load_example()), CATALOG)
    assert json.loads(flag(plan.decode)) == {str(g): f"mlx5_{g}" for g in range(4)}
