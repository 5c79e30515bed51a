"""Which RDMA NICs each GPU of an engine pod uses for PD KV transfer (pure).

SGLang 0.5.23 takes the NICs in ``--disaggregation-ib-device`` (sglang
``arg_groups/fields/disagg.py``) as a single device, a comma list, a per-GPU JSON
mapping ``{"0": "mlx5_0", "1": "mlx5_1"}`` whose keys are process-visible GPU ids, or a
path to a JSON file with that mapping. Each scheduler process looks up its own GPU with
``get_ib_devices_for_gpu(value, gpu_id)`` (``srt/distributed/device_communicators/
mooncake_transfer_engine.py``; NIXL UCX uses the same function, ``disaggregation/nixl/
conn.py``), and a missing key raises "No IB devices configured for GPU N" at startup.
Mooncake validates every name against ``/sys/class/infiniband`` (``validation_hook.
validate_ib_devices``) and rewrites the mapping as compact JSON; mori passes the raw
string to ``MORI_RDMA_DEVICES`` (``disaggregation/mori/conn.py``), so mori gets a comma
list.

The operator renders the per-GPU mapping from the accelerator catalog (``kernels/
accelerators.yaml``: each rail is a NIC with the GPUs behind its PCIe switch, its NUMA
node and its rail class):

- both roles use NICs of the same rail classes (NICs of one class reach each other
  across nodes); the default is the class(es) both roles' node types share, or
  ``spec.transfer.railClass``;
- each GPU gets the NICs of its own PCIe switch, else of its own NUMA node, within the
  allowed pool (``ibDevices`` of the role, else of ``spec.transfer``, else every NIC of
  the class);
- the value is a function of the role's spec and node type only, never of a rank, so
  every rank of a replica (and every pod of a role) reads the same string.

When a pod takes the whole node, process-visible GPU ids are the node's GPU ids and the
mapping is exact. When it takes part of a node, the device plugin picks which GPUs at
bind time, so the operator cannot know their NUMA node: every visible GPU then lists all
NICs of the class, and Mooncake's own topology discovery picks the nearest among them
(``TransferPlan.exact`` is False). docs/transfer.md has the details.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..api.v1alpha1 import PDDeploymentSpec
from ..catalog import Accelerator, Catalog, Rail
from .roles import Role, RoleInputs

#: Backends that move KV over RDMA NICs (and so need the RDMA resource and IPC_LOCK).
RDMA_BACKENDS = ("mooncake", "nixl", "mori")
#: Backends that read --disaggregation-ib-device as SGLang's per-GPU JSON mapping.
JSON_MAPPING_BACKENDS = ("mooncake", "nixl")


@dataclass(frozen=True)
class TransferPlan:
    """One role's KV transfer wiring.

    ``rdma``: KV moves over RDMA (a real backend, no TCP fallback). ``classes``: the rail
    classes both roles use. ``pool``: NICs this role may use (after the explicit list and
    the class filter), ``pool_field``: the spec path the explicit list came from (None when
    it came from the catalog). ``unknown``: explicit names this node type lacks.
    ``mapping``: (visible GPU id, NICs) for every GPU of the pod. ``not_local``: GPUs that
    got no NIC of their own NUMA node (they were given the whole pool). ``exact``: the pod
    owns the whole node, so GPU ids are the node's. ``flag``: the
    --disaggregation-ib-device value, or None when none is rendered.
    """

    role: Role
    backend: str
    rdma: bool
    classes: tuple[str, ...]
    pool: tuple[str, ...]
    pool_field: str | None
    unknown: tuple[str, ...]
    mapping: tuple[tuple[int, tuple[str, ...]], ...]
    not_local: tuple[int, ...]
    exact: bool
    flag: str | None

    @property
    def devices(self) -> tuple[str, ...]:
        """Every NIC the mapping uses, in node order of first use."""
        return tuple(dict.fromkeys(d for _, nics in self.mapping for d in nics))

    def nics_of(self, gpu: int) -> tuple[str, ...]:
        """The NICs GPU ``gpu`` (process-visible id) uses; () when it has none."""
        return dict(self.mapping).get(gpu, ())


def uses_rdma(spec: PDDeploymentSpec) -> bool:
    """KV moves over RDMA: a real transfer backend and no TCP fallback."""
    return spec.transfer.backend in RDMA_BACKENDS and not spec.transfer.forceTCP


def explicit_devices(spec: PDDeploymentSpec, role: Role) -> tuple[tuple[str, ...] | None, str | None]:
    """(the role's explicit NIC list, its spec path), or (None, None) when the catalog decides."""
    rt = getattr(spec, role).transfer
    if rt is not None and rt.ibDevices:
        return tuple(rt.ibDevices), f"spec.{role}.transfer.ibDevices"
    if spec.transfer.ibDevices:
        return tuple(spec.transfer.ibDevices), "spec.transfer.ibDevices"
    return None, None


def role_accelerator(spec: PDDeploymentSpec, role: Role, catalog: Catalog) -> Accelerator | None:
    """The node type of ``role`` (its override, else spec.accelerator), or None when unknown."""
    return catalog.accelerator(getattr(spec, role).accelerator or spec.accelerator)


def shared_rail_classes(spec: PDDeploymentSpec, catalog: Catalog) -> tuple[str, ...]:
    """The rail classes KV transfer uses on both roles.

    ``spec.transfer.railClass`` when set; else the classes of the NICs both roles' node
    types have in common (explicit NIC lists narrow each side first). Empty when the roles
    share none (a rule then refuses the spec, naming both roles' NICs).
    """
    if spec.transfer.railClass:
        return (spec.transfer.railClass,)
    sides = []
    for role in ("prefill", "decode"):
        acc = role_accelerator(spec, role, catalog)
        if acc is None:
            return ()
        names, _ = explicit_devices(spec, role)
        rails = [r for r in acc.rails if names is None or r.device in names]
        sides.append({r.railClass for r in rails})
    return tuple(sorted(sides[0] & sides[1]))


def _local_nics(acc: Accelerator, gpu: int, pool: list[Rail]) -> list[str]:
    """NICs of ``pool`` behind GPU ``gpu``'s PCIe switch, else on its NUMA node, else []."""
    switch = [r.device for r in pool if gpu in r.gpus]
    if switch:
        return switch
    numa = acc.gpu_numa(gpu)
    return [r.device for r in pool if numa is not None and r.numa == numa]


def render_flag(backend: str, mapping: tuple[tuple[int, tuple[str, ...]], ...]) -> str | None:
    """The --disaggregation-ib-device value for ``backend``.

    mooncake and nixl: the per-GPU JSON mapping in the compact form SGLang's
    ``validate_ib_devices`` normalizes to (keys in GPU order, NICs comma-joined), so the
    resolved value equals the rendered one. mori: a comma list of every mapped NIC (mori
    reads one MORI_RDMA_DEVICES string per process). None for an empty mapping.
    """
    if not mapping or not any(nics for _, nics in mapping):
        return None
    if backend in JSON_MAPPING_BACKENDS:
        return json.dumps({str(gpu): ",".join(nics) for gpu, nics in mapping}, separators=(",", ":"))
    return ",".join(dict.fromkeys(d for _, nics in mapping for d in nics))


def plan_transfer(*, spec: PDDeploymentSpec, role: RoleInputs, catalog: Catalog) -> TransferPlan:
    """Map every GPU of one pod of ``role`` to its NICs and render the flag (see the module doc).

    Total: never raises; unknown node types, unknown NIC names and GPUs without a local
    NIC are recorded for the rules (rules/transfer.py) to report.
    """
    backend = spec.transfer.backend
    rdma = uses_rdma(spec)
    classes = shared_rail_classes(spec, catalog)
    names, field = explicit_devices(spec, role.role)
    acc = role.accelerator
    empty = TransferPlan(role.role, backend, rdma, classes, (), field, (), (), (), False, None)
    if acc is None:
        return empty
    unknown = tuple(n for n in names or () if acc.rail(n) is None)
    pool = [r for r in acc.rails if (names is None or r.device in names) and r.railClass in classes]
    gpus = role.gpus_per_pod  # one pod per node: every rank of a multi-node replica gets the same mapping
    exact = gpus == acc.gpusPerNode
    if not rdma or not pool:
        return TransferPlan(role.role, backend, rdma, classes, tuple(r.device for r in pool), field, unknown,
                            (), (), exact, None)  # fmt: skip
    every = tuple(r.device for r in pool)
    mapping: list[tuple[int, tuple[str, ...]]] = []
    not_local: list[int] = []
    for gpu in range(gpus):
        if not exact:
            mapping.append((gpu, every))
            continue
        local = _local_nics(acc, gpu, pool)
        if not local:
            not_local.append(gpu)
            local = list(every)
        mapping.append((gpu, tuple(local)))
    frozen = tuple(mapping)
    return TransferPlan(
        role=role.role,
        backend=backend,
        rdma=rdma,
        classes=classes,
        pool=every,
        pool_field=field,
        unknown=unknown,
        mapping=frozen,
        not_local=tuple(not_local),
        exact=exact,
        flag=render_flag(backend, frozen),
    )
