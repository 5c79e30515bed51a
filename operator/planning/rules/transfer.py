"""KV transfer rules: backend fits the GPU vendor, NICs exist and reach each other, TCP fallback warns.

Sources (sglang 0.5.23): ``arg_groups/fields/disagg.py`` (--disaggregation-transfer-backend
mooncake, nixl, mori, fake ...; --disaggregation-ib-device formats, "Supported by Mooncake
and NIXL UCX", "a non-empty UCX_NET_DEVICES takes precedence"), ``arg_groups/
validation_hook.validate_ib_devices`` (every name must be in /sys/class/infiniband, else
"Invalid IB devices specified"), ``disaggregation/nixl/conn.py`` (UCX_NET_DEVICES wins;
a device_list in SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS that differs raises "Conflicting
NIXL UCX device_list"; other NIXL backends ignore the devices), ``disaggregation/mori/
conn.py`` (mori is AMD's transfer engine; it overwrites MORI_RDMA_DEVICES), Mooncake's
MC_FORCE_TCP (RDMA off). The NIC mapping itself is planning/transfer.py.
"""

from __future__ import annotations

import json

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Accelerator, Catalog
from ..structs import RolePlan
from ..problems import Problem
from ..transfer import TransferPlan, explicit_devices, shared_rail_classes


def _tp(role: RolePlan) -> TransferPlan | None:
    return role.transfer


def _describe(acc: Accelerator | None, names: tuple[str, ...]) -> str:
    """``mlx5_0 (infiniband), mlx5_1 (infiniband)``: NICs with their rail classes."""
    out = []
    for n in names:
        rail = acc.rail(n) if acc is not None else None
        out.append(f"{n} ({rail.railClass})" if rail is not None else f"{n} (not on this node type)")
    return ", ".join(out) if out else "none"


def _role_nics(spec: PDDeploymentSpec, role: RolePlan) -> tuple[str, ...]:
    """The NICs a role may use before the class filter: its explicit list, else every rail of its node type."""
    names, _ = explicit_devices(spec, role.role)
    if names is not None:
        return names
    acc = role.inputs.accelerator
    return tuple(r.device for r in acc.rails) if acc is not None else ()


def transfer_backend_vendor(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """mori runs on AMD GPUs only."""
    acc = role.inputs.accelerator
    if spec.transfer.backend != "mori" or acc is None or acc.vendor == "amd":
        return []
    return [
        Problem(
            field="spec.transfer.backend",
            message=f"mori is AMD's transfer engine; the {role.role} role runs on {role.inputs.accelerator_name}",
            fix="use mooncake or nixl on NVIDIA GPUs",
            rule="transfer_backend_vendor",
        )
    ]


def transfer_devices_exist(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Explicit IB devices must be NICs of the role's node type (SGLang refuses others at startup).

    SGLang checks the names against the node's /sys/class/infiniband only when the pod
    starts (validate_ib_devices: "Invalid IB devices specified for all GPUs"); the catalog
    knows them before any pod exists.
    """
    names, field = explicit_devices(spec, role.role)
    acc = role.inputs.accelerator
    if names is None or acc is None or spec.transfer.backend == "fake":
        return []
    missing = [n for n in names if acc.rail(n) is None]
    if not missing:
        return []
    have = ", ".join(r.device for r in acc.rails) or "none in the catalog"
    return [
        Problem(
            field=field or "spec.transfer.ibDevices",
            message=(
                f"the {role.role} role runs on {role.inputs.accelerator_name}, which has no RDMA device "
                f"{', '.join(missing)} (its NICs: {have})"
            ),
            fix=f"list NICs of {role.inputs.accelerator_name}, or set spec.{role.role}.transfer.ibDevices for this role",
            rule="transfer_devices_exist",
        )
    ]


def transfer_rail_class_known(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """spec.transfer.railClass must be a class of the role's NICs."""
    want = spec.transfer.railClass
    acc = role.inputs.accelerator
    if not want or acc is None or spec.transfer.backend == "fake":
        return []
    names, _ = explicit_devices(spec, role.role)
    classes = {r.railClass for r in acc.rails if names is None or r.device in names}
    if want in classes:
        return []
    return [
        Problem(
            field="spec.transfer.railClass",
            message=(
                f"the {role.role} role's NICs on {role.inputs.accelerator_name} "
                f"({_describe(acc, _role_nics(spec, role))}) have no rail class {want}"
            ),
            fix=f"use one of {', '.join(sorted(classes)) or 'the catalog rail classes'}, or remove railClass",
            rule="transfer_rail_class_known",
        )
    ]


def transfer_rails_reach(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """Prefill's and decode's NICs must sit on the same rail classes (NICs of one class reach each other).

    A prefill NIC whose class decode lacks (or the reverse) cannot reach its peer: the
    first request would wait out the transfer timeout. The message names both roles'
    devices with their classes.
    """
    if spec.transfer.backend == "fake" or spec.transfer.forceTCP:
        return []
    pacc, dacc = prefill.inputs.accelerator, decode.inputs.accelerator
    if pacc is None or dacc is None:
        return []
    pnames, dnames = _role_nics(spec, prefill), _role_nics(spec, decode)
    if not pnames or not dnames:
        return []
    pclasses = {pacc.rail(n).railClass for n in pnames if pacc.rail(n) is not None}
    dclasses = {dacc.rail(n).railClass for n in dnames if dacc.rail(n) is not None}
    if not pclasses or not dclasses:
        return []  # unknown names: transfer_devices_exist reports them
    if spec.transfer.railClass:
        return []  # transfer_rail_class_known reports a role that lacks the class
    shared = pclasses & dclasses
    pexplicit = explicit_devices(spec, "prefill")[0] is not None
    dexplicit = explicit_devices(spec, "decode")[0] is not None
    # A role whose NICs the catalog picks keeps only the shared classes; an explicit list must
    # lie wholly in them, or its extra NICs would reach nothing on the other role.
    if shared and (not pexplicit or pclasses == shared) and (not dexplicit or dclasses == shared):
        return []
    field = (
        explicit_devices(spec, "prefill")[1]
        or explicit_devices(spec, "decode")[1]
        or next((r.inputs.accelerator_field for r in (decode, prefill) if r.inputs.spec.accelerator), "spec.accelerator")
    )
    return [
        Problem(
            field=field,
            message=(
                f"prefill IB devices {_describe(pacc, pnames)} and decode IB devices {_describe(dacc, dnames)} "
                "sit on rail classes that cannot reach each other"
            ),
            fix="list NICs of the same rail class on both roles (spec.<role>.transfer.ibDevices), or place both "
            "roles on node types of one fabric",
            rule="transfer_rails_reach",
        )
    ]


def transfer_numa_local(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """Every GPU should get a NIC on its own NUMA node; a cross-socket NIC slows every transfer."""
    tp = _tp(role)
    if tp is None or not tp.not_local:
        return []
    acc = role.inputs.accelerator
    gpus = ", ".join(str(g) for g in tp.not_local)
    return [
        Problem(
            field=tp.pool_field or "spec.transfer.ibDevices",
            message=(
                f"{role.role} GPUs {gpus} on {role.inputs.accelerator_name} have no allowed NIC on their NUMA node "
                f"(allowed: {_describe(acc, tp.pool)}); they use NICs across the socket"
            ),
            fix="add a NIC of each GPU's NUMA node to the list (see rails in the accelerator catalog)",
            rule="transfer_numa_local",
            severity="warning",
        )
    ]


def _env(role: RolePlan) -> dict[str, str]:
    return {e.name: e.value for e in role.inputs.spec.env}


def transfer_nixl_devices(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """NIXL (UCX) takes the per-GPU mapping unless the environment overrides or contradicts it."""
    tp = _tp(role)
    if spec.transfer.backend != "nixl" or tp is None or tp.flag is None:
        return []
    env = _env(role)
    field = f"spec.{role.role}.env"
    problems = []
    backend = env.get("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX")
    if backend != "UCX":
        problems.append(Problem(
            field=field,
            message=f"NIXL backend {backend} ignores --disaggregation-ib-device; only UCX reads the NIC mapping",
            fix="remove SGLANG_DISAGGREGATION_NIXL_BACKEND to use UCX, or select NICs through that backend's own settings",
            rule="transfer_nixl_devices", severity="warning",
        ))  # fmt: skip
    if env.get("UCX_NET_DEVICES"):
        problems.append(Problem(
            field=field,
            message="UCX_NET_DEVICES takes precedence over --disaggregation-ib-device: the per-GPU NIC mapping is ignored",
            fix="remove UCX_NET_DEVICES and let the operator map each GPU to its NICs",
            rule="transfer_nixl_devices", severity="warning",
        ))  # fmt: skip
    raw = env.get("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS")
    if raw and backend == "UCX" and not env.get("UCX_NET_DEVICES"):
        try:
            params = json.loads(raw)
        except ValueError:
            params = None
        if isinstance(params, dict) and params.get("device_list") is not None:
            problems.append(Problem(
                field=field,
                message=(
                    "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS sets device_list; SGLang refuses it at startup when it "
                    "differs from the operator's per-GPU mapping (Conflicting NIXL UCX device_list)"
                ),
                fix="remove device_list from SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS",
                rule="transfer_nixl_devices",
            ))  # fmt: skip
    return problems


def transfer_mori_devices(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """mori overwrites MORI_RDMA_DEVICES with the rendered NIC list: a value in env would be lost."""
    tp = _tp(role)
    if spec.transfer.backend != "mori" or tp is None or tp.flag is None or "MORI_RDMA_DEVICES" not in _env(role):
        return []
    return [
        Problem(
            field=f"spec.{role.role}.env",
            message="MORI_RDMA_DEVICES is overwritten by SGLang with --disaggregation-ib-device (the operator's NICs)",
            fix="remove MORI_RDMA_DEVICES; choose NICs with spec.transfer.ibDevices",
            rule="transfer_mori_devices",
            severity="warning",
        )
    ]


def transfer_force_tcp_backend(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """forceTCP is Mooncake's MC_FORCE_TCP: it means nothing to nixl, mori or fake (the CRD refuses it too)."""
    if not spec.transfer.forceTCP or spec.transfer.backend == "mooncake":
        return []
    return [
        Problem(
            field="spec.transfer.forceTCP",
            message=f"forceTCP applies to the mooncake backend only, not {spec.transfer.backend}",
            fix="remove forceTCP or use backend: mooncake",
            rule="transfer_force_tcp_backend",
        )
    ]


def transfer_tcp_fallback(*, spec: PDDeploymentSpec, prefill: RolePlan, decode: RolePlan) -> list[Problem]:
    """forceTCP makes Mooncake move KV over TCP: correct but slow; warn."""
    problems = []
    if spec.transfer.forceTCP:
        problems.append(
            Problem(
                field="spec.transfer.forceTCP",
                message="KV transfer runs over TCP (MC_FORCE_TCP=1): much slower than RDMA, TTFT will suffer",
                fix="remove forceTCP once RDMA works",
                rule="transfer_tcp_fallback",
                severity="warning",
            )
        )
    return problems


__all__ = [
    "mooncake_default_thread_pool",
    "mooncake_failed_session_probe",
    "mooncake_thread_pool_queue_size",
    "shared_rail_classes",
    "staging_buffer_non_mla",
    "staging_buffer_requirements",
    "transfer_backend_vendor",
    "transfer_devices_exist",
    "transfer_force_tcp_backend",
    "transfer_mori_devices",
    "transfer_nixl_devices",
    "transfer_numa_local",
    "transfer_rail_class_known",
    "transfer_rails_reach",
    "transfer_tcp_fallback",
]


def staging_buffer_requirements(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLANG_DISAGG_STAGING_BUFFER needs the mooncake or nixl backend, and not prefill_complete.

    Source: sglang 0.5.23 arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation
    ("SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or
    'nixl'") and _validate_prefill_complete ("prefill_complete does not yet support ...
    staging buffers"); the variable is an EnvBool (environ.py: true, 1, yes, y).
    """
    from .fields import env_field, env_true

    name = "SGLANG_DISAGG_STAGING_BUFFER"
    if not env_true(role, name):
        return []
    problems = []
    if spec.transfer.backend not in ("mooncake", "nixl"):
        problems.append(Problem(
            field=env_field(role, name),
            message=f"{name} on the {role.role} role needs the mooncake or nixl transfer backend, not "
            f"{spec.transfer.backend}; SGLang 0.5.23 refuses to start",
            fix=f"remove {name}, or use transfer.backend mooncake or nixl", rule="staging_buffer_requirements",
        ))  # fmt: skip
    if spec.disaggregation.decodeAllocationPolicy == "prefill_complete":
        problems.append(Problem(
            field=env_field(role, name),
            message=f"{name} with decodeAllocationPolicy prefill_complete: SGLang 0.5.23 does not support staging "
            "buffers there yet", fix=f"remove {name}, or use decodeAllocationPolicy early",
            rule="staging_buffer_requirements",
        ))  # fmt: skip
    return problems


# SGLang 0.5.23 disaggregation/mooncake/conn.py:327: the prefill's transfer thread pool when
# SGLANG_DISAGGREGATION_THREAD_POOL_SIZE is unset, from ``os.cpu_count()`` (in a container:
# the node's CPUs, the catalog's ``cpus``).
def mooncake_default_thread_pool(cpus: int) -> int:
    """``min(max(4, int(0.5 * cpus) // 8), 12)``: the default transfer thread pool of a
    Mooncake prefill on a node with ``cpus`` CPUs (144 -> 9, 192 -> 12, 224 -> 12)."""
    return min(max(4, int(0.5 * cpus) // 8), 12)


def mooncake_thread_pool_queue_size(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """A Mooncake prefill's transfer thread pool must be at least its transfer queue count.

    Source: sglang 0.5.23 disaggregation/mooncake/conn.py:336, ``MooncakeKVManager.__init__``
    of the prefill asserts ``SGLANG_DISAGGREGATION_THREAD_POOL_SIZE >=
    SGLANG_DISAGGREGATION_QUEUE_SIZE`` (EnvInt, default 4), the pool defaulting to
    :func:`mooncake_default_thread_pool` of the node's CPUs. The argument checks never read
    either variable: the oracle's ``transfer`` stage found it (docs/sglang-oracle.md).
    """
    from .fields import env_field, env_value

    if role.role != "prefill" or spec.transfer.backend != "mooncake":
        return []
    pool_name, queue_name = "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "SGLANG_DISAGGREGATION_QUEUE_SIZE"
    acc = role.inputs.accelerator
    pool = env_value(role, pool_name, int, None)
    if pool is None:
        if acc is None:
            return []
        pool = mooncake_default_thread_pool(acc.cpus)
    queues = env_value(role, queue_name, int, 4)
    if pool >= queues:
        return []
    where = queue_name if queue_name in role.command.env_dict() else pool_name
    source = f"{pool_name}={pool}" if pool_name in role.command.env_dict() else (
        f"the default thread pool {pool} ({acc.cpus if acc else '?'} CPUs on the node)")
    return [Problem(
        field=env_field(role, where),
        message=f"{source} is smaller than {queue_name}={queues}: SGLang 0.5.23's Mooncake prefill asserts the "
        "thread pool covers the transfer queues at startup (mooncake/conn.py:336)",
        fix=f"set {pool_name} to at least {queues}, or {queue_name} to at most {pool}",
        rule="mooncake_thread_pool_queue_size",
    )]  # fmt: skip


def mooncake_failed_session_probe(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """The Mooncake failed-session probe's intervals must be ordered and its idle timeout positive.

    Source: sglang 0.5.23 disaggregation/mooncake/conn.py:299-309, ``MooncakeKVManager.__init__``
    of either role, when SGLANG_ENABLE_FAILED_SESSION_PROBE (EnvBool, default true) is on:
    ``0 < SGLANG_FAILED_SESSION_PROBE_INTERVAL_S <= SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S``
    (EnvFloat, defaults 30 and 300) else ``ValueError``, and ``SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S``
    (default 600) > 0. Found by the oracle's ``transfer`` stage.
    """
    from .fields import env_bool, env_field, env_value

    if spec.transfer.backend != "mooncake" or not env_bool(role, "SGLANG_ENABLE_FAILED_SESSION_PROBE", True):
        return []
    interval = env_value(role, "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S", float, 30.0)
    most = env_value(role, "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S", float, 300.0)
    idle = env_value(role, "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S", float, 600.0)
    problems = []
    if not 0 < interval <= most:
        name = ("SGLANG_FAILED_SESSION_PROBE_INTERVAL_S" if "SGLANG_FAILED_SESSION_PROBE_INTERVAL_S"
                in role.command.env_dict() else "SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S")
        problems.append(Problem(
            field=env_field(role, name),
            message=f"the failed-session probe interval {interval:g} s must be above 0 and at most its maximum "
            f"{most:g} s: SGLang 0.5.23's Mooncake manager refuses to start (mooncake/conn.py:299)",
            fix="set 0 < SGLANG_FAILED_SESSION_PROBE_INTERVAL_S <= SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S, or "
            "SGLANG_ENABLE_FAILED_SESSION_PROBE=0",
            rule="mooncake_failed_session_probe",
        ))  # fmt: skip
    if idle <= 0:
        problems.append(Problem(
            field=env_field(role, "SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S"),
            message=f"SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S {idle:g} must be positive: SGLang 0.5.23's Mooncake "
            "manager refuses to start (mooncake/conn.py:307)",
            fix="set SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S above 0, or SGLANG_ENABLE_FAILED_SESSION_PROBE=0",
            rule="mooncake_failed_session_probe",
        ))  # fmt: skip
    return problems


def staging_buffer_non_mla(*, spec: PDDeploymentSpec, role: RolePlan, catalog: Catalog) -> list[Problem]:
    """SGLANG_DISAGG_STAGING_BUFFER is refused on an MLA model (DeepSeek-V4 / V4.1).

    Source: sglang 0.5.23 disaggregation/prefill.py:219 ``PrefillBootstrapQueue.__init__`` and
    disaggregation/decode.py:452 ``DecodePreallocQueue.__init__`` raise "SGLANG_DISAGG_STAGING_BUFFER
    is designed for non-MLA models" when the KV pool is an MLA pool (catalog ``mla: true``).
    The argument checks accept it; the oracle's ``pd-queues`` stage found it.
    """
    from .fields import env_field, env_true

    name = "SGLANG_DISAGG_STAGING_BUFFER"
    model = role.inputs.model
    if not env_true(role, name) or model is None or not model.mla:
        return []
    return [Problem(
        field=env_field(role, name),
        message=f"{name} on {spec.model.name}, an MLA model: SGLang 0.5.23's {role.role} queue refuses to start "
        "(\"designed for non-MLA models\", disaggregation/" + ("prefill.py:219" if role.role == "prefill"
                                                               else "decode.py:452") + ")",
        fix=f"remove {name}",
        rule="staging_buffer_non_mla",
    )]  # fmt: skip
