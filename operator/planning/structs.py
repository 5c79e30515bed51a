"""The value types of planning: a resolved role (:class:`RolePlan`) and a deployment (:class:`Plan`).

Frozen values with no behaviour beyond derived properties. ``plan.py`` builds them and
the rules in ``rules/`` read them; both import this module, never each other (the way
kopf keeps its structs in ``_cogs/structs/``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api.v1alpha1 import PDDeploymentSpec
from . import compat
from .engine_args import EngineCommand
from .kvlayout import LayoutPrediction
from .memory import MemoryPlan
from .problems import Problem, errors
from .roles import Role, RoleInputs
from .transfer import TransferPlan


@dataclass(frozen=True)
class RolePlan:
    """Everything decided for one role.

    ``layout`` is None when the model is not a DeepSeek-V4 family model (no PD layout
    string to predict) or when SGLang would refuse the layout (then ``layout_refusal``
    holds SGLang's reason). ``compat_inputs`` are the values hashed into the compat key.
    ``transfer`` is the role's KV transfer wiring (NIC per GPU, rail classes).
    """

    inputs: RoleInputs
    kv_cache_dtype: str
    layout: LayoutPrediction | None
    layout_refusal: str | None
    command: EngineCommand
    features: frozenset[str]
    memory: MemoryPlan
    compat_inputs: dict[str, Any] = field(hash=False)
    transfer: TransferPlan | None = None

    @property
    def role(self) -> Role:
        """prefill or decode."""
        return self.inputs.role

    @property
    def compat_key(self) -> str:
        """This role's compat key (equal on both roles when the pair is valid)."""
        return compat.compat_key(self.compat_inputs)

    @property
    def kv_layout_string(self) -> str | None:
        """The predicted PD KV layout string, e.g. v41,c4:v41,c128:v41, or None."""
        return self.layout.pd_string if self.layout else None


@dataclass(frozen=True)
class Plan:
    """The resolved deployment: both roles, the compat key and every problem found.

    ``default_queue``: the operator's default Kueue LocalQueue (``run --default-queue-name``,
    the chart's ``scheduling.defaultQueueName``; ``check --default-queue-name``) the plan was
    made with, an explicit input like the catalog: None when the operator has none. It
    applies only where ``spec.scheduling.queueName`` is unset (:attr:`queue_name`).
    """

    name: str
    namespace: str
    generation: int
    spec: PDDeploymentSpec
    prefill: RolePlan
    decode: RolePlan
    problems: tuple[Problem, ...]
    default_queue: str | None = None

    @property
    def queue_name(self) -> str | None:
        """The Kueue LocalQueue of the plan's LeaderWorkerSets: ``spec.scheduling.queueName``, else
        :attr:`default_queue`, else None (no queue label from the operator)."""
        return self.spec.scheduling.queueName or self.default_queue

    @property
    def queue_source(self) -> str | None:
        """Where :attr:`queue_name` comes from: ``spec``, ``operatorDefault``, or None without a queue."""
        if self.spec.scheduling.queueName:
            return "spec"
        return "operatorDefault" if self.default_queue else None

    @property
    def queued(self) -> bool:
        """Kueue admits this plan's groups: a queue applies and at least one role spans nodes (only
        LeaderWorkerSets carry the queue label, render/multinode.py)."""
        return bool(self.queue_name) and (self.prefill.inputs.multi_node or self.decode.inputs.multi_node)

    @property
    def valid(self) -> bool:
        """No problem of severity error."""
        return not errors(self.problems)

    @property
    def compat_key(self) -> str:
        """The prefill role's compat key; equal to decode's whenever ``valid``."""
        return self.prefill.compat_key

    def role(self, role: Role) -> RolePlan:
        """The plan of ``role``."""
        return self.prefill if role == "prefill" else self.decode
