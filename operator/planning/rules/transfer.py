"""KV transfer rules: backend fits the GPU vendor; TCP fallback warns.

Source: sglang 0.5.23 arg_groups/fields/disagg.py (--disaggregation-transfer-backend:
mooncake, nixl, mori, fake ...); mori is AMD's transfer engine (ROCm); Mooncake's
MC_FORCE_TCP turns RDMA off.
"""

from __future__ import annotations

from ...api.v1alpha1 import PDDeploymentSpec
from ...catalog import Catalog
from ..plan import RolePlan
from ..problems import Problem


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
    if spec.transfer.backend == "fake":
        problems.append(
            Problem(
                field="spec.transfer.backend",
                message="the fake transfer backend moves no KV; for tests only",
                fix="use mooncake, nixl or mori in production",
                rule="transfer_tcp_fallback",
                severity="warning",
            )
        )
    return problems
