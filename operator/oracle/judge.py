"""SGLang's verdict on a planned PDDeployment: does each role start, and do the two pair?

:func:`judge_plan` takes the operator's :class:`~sglang_pd_operator.planning.structs.Plan`
(valid or not), renders what each role's engine container would start with
(``render.engine.role_launch``: the ConfigMap's SGLang config file, the command-line
flags and the environment) and hands it to the oracle worker of that role's accelerator
(:mod:`.pool`), which runs SGLang 0.5.23's own startup validation on an emulated GPU
(:mod:`.engine_side`). When both roles start, the prefill worker starts SGLang's real
bootstrap server and registers every prefill rank, and the decode worker runs SGLang's
handshake against it. The :class:`Verdict` carries SGLang's own exception text.

A verdict is *indeterminate* (``accepted is None``) when the oracle cannot judge: the
accelerator or the model's HF config is not in the catalog, or SGLang needed a GPU
kernel to decide. Nothing here imports SGLang; the workers do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..catalog import Catalog, hf_config_path
from ..planning.structs import Plan, RolePlan
from ..render.engine import role_launch
from .pool import WorkerPool
from .standin_plugins import assumed_features

#: What the oracle substitutes in the pod's environment (there is no pod): the pod IP
#: for ``fieldRef status.podIP``, a placeholder for secrets.
POD_IP = "127.0.0.1"
SECRET_PLACEHOLDER = "oracle-placeholder-secret"


@dataclass(frozen=True)
class Refusal:
    """SGLang's exception: ``stage`` (parse | resolve | validate | model | kv | bootstrap |
    handshake), exception ``type``, its ``message`` and ``where`` (sglang/<file>:<function>:<line>)."""

    stage: str
    type: str
    message: str
    where: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "Refusal | None":
        """Read the worker's JSON (None stays None)."""
        if not data:
            return None
        return cls(stage=data.get("stage", ""), type=data.get("type", ""), message=data.get("message", ""),
                   where=data.get("where"))

    def line(self) -> str:
        """One line for a person: SGLang's message and where it raised."""
        where = f" ({self.where})" if self.where else ""
        return f"{self.type}: {self.message}{where}"


@dataclass(frozen=True)
class RoleVerdict:
    """One role: ``starts`` True / False, None when indeterminate (``indeterminate`` says why)."""

    role: str
    accelerator: str
    starts: bool | None
    refusal: Refusal | None = None
    facts: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    indeterminate: str | None = None


@dataclass(frozen=True)
class PairVerdict:
    """The PD handshake: ``pairs`` True / False, None when a role did not start or the oracle could not judge."""

    pairs: bool | None
    refusal: Refusal | None = None
    indeterminate: str | None = None


@dataclass(frozen=True)
class Verdict:
    """SGLang's verdict on one PDDeployment, with what the oracle had to assume."""

    name: str
    namespace: str
    prefill: RoleVerdict
    decode: RoleVerdict
    pair: PairVerdict
    assumptions: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool | None:
        """True when both roles start and pair, False when SGLang refuses anything, None when unknown."""
        starts = (self.prefill.starts, self.decode.starts)
        if False in starts or self.pair.pairs is False:
            return False
        if None in starts or self.pair.pairs is None:
            return None
        return True

    @property
    def refusals(self) -> list[tuple[str, Refusal]]:
        """(prefill | decode | pair, refusal) for everything SGLang refused."""
        out = [(v.role, v.refusal) for v in (self.prefill, self.decode) if v.refusal is not None]
        if self.pair.refusal is not None:
            out.append(("pair", self.pair.refusal))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``check --sglang -o json`` (key ``sglang``)."""

        def role(v: RoleVerdict) -> dict[str, Any]:
            facts = dict(v.facts or {})
            facts.pop("dsv41SpecLayout", None)
            return {"accelerator": v.accelerator, "starts": v.starts, "refusal": _refusal_dict(v.refusal),
                    "indeterminate": v.indeterminate, "resolved": facts or None}

        return {
            "accepted": self.accepted,
            "prefill": role(self.prefill),
            "decode": role(self.decode),
            "pair": {"pairs": self.pair.pairs, "refusal": _refusal_dict(self.pair.refusal),
                     "indeterminate": self.pair.indeterminate},
            "assumptions": list(self.assumptions),
        }


def _refusal_dict(r: Refusal | None) -> dict[str, Any] | None:
    return None if r is None else {"stage": r.stage, "type": r.type, "message": r.message, "where": r.where}


def _pod_env(env: dict[str, Any]) -> dict[str, str]:
    """Container env with ``valueFrom`` sources turned into the values a pod would see."""
    out = {}
    for name, value in env.items():
        if isinstance(value, dict):
            field_path = (value.get("fieldRef") or {}).get("fieldPath")
            out[name] = POD_IP if field_path == "status.podIP" else SECRET_PLACEHOLDER
        else:
            out[name] = str(value)
    return out


def _assumptions(plan: Plan, catalog: Catalog) -> tuple[str, ...]:
    out = []
    for role in (plan.prefill, plan.decode):
        if role.inputs.plugin is not None:
            unknown = [f for f in assumed_features(role.inputs.plugin.model_dump(mode="json")) if f in role.features]
            if unknown:
                out.append(
                    f"{role.role}: the stand-in {role.inputs.plugin_name} spec accepts features in use that the "
                    f"catalog marks unknown ({', '.join(unknown)})"
                )
    if any(r.inputs.paged_experts_k is not None for r in (plan.prefill, plan.decode)):
        out.append("Paged Experts: the model's expert quantization is taken as a supported expert format")
    sp = plan.spec.speculative
    model = plan.prefill.inputs.model
    if sp is not None and sp.algorithm == "DSPARK" and model is not None and 2 in model.compressionRatios:
        out.append("DSpark transfer layout: pool byte lengths are taken as equal exactly when KV layout and dtype are")
    return tuple(out)


class Oracle:
    """Judges plans with SGLang's own code, through a :class:`WorkerPool` (close it when done)."""

    def __init__(self, *, catalog: Catalog, pool: WorkerPool | None = None, **pool_options: Any) -> None:
        self.catalog = catalog
        self.pool = pool or WorkerPool(catalog=catalog, **pool_options)

    def close(self) -> None:
        """Stop the workers."""
        self.pool.close()

    def __enter__(self) -> "Oracle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, plan: Plan, role: RolePlan, model_dir: str) -> dict[str, Any]:
        launch = role_launch(plan, role)
        return {
            "role": role.role,
            "configYaml": launch["configYaml"],
            "args": launch["args"],
            "env": _pod_env(launch["env"]),
            "modelDir": model_dir,
            "nnodes": role.inputs.parallelism.nodes,
        }

    def judge_plan(self, plan: Plan) -> Verdict:
        """SGLang's verdict on ``plan``: both roles' startup, then the handshake when both start.

        Raises :class:`~.pool.OracleError` when a worker fails (not a verdict).
        """
        config = self.catalog.hf_config(plan.spec.model.name)
        roles = (plan.prefill, plan.decode)
        why_not: dict[str, str] = {}  # role -> why it cannot be judged
        for r in roles:
            if config is None:
                why_not[r.role] = (f"the catalog has no Hugging Face config for {plan.spec.model.name} "
                                   f"({hf_config_path(plan.spec.model.name)})")
            elif r.inputs.accelerator is None:
                why_not[r.role] = f"{r.role} accelerator {r.inputs.accelerator_name!r} is not in the catalog"
        if why_not:
            unknown = [RoleVerdict(r.role, r.inputs.accelerator_name, None,
                                   indeterminate=why_not.get(r.role, "not run: the other role cannot be judged"))
                       for r in roles]
            pair_why = "; ".join(dict.fromkeys(why_not.values()))
            return Verdict(plan.name, plan.namespace, unknown[0], unknown[1], PairVerdict(None, indeterminate=pair_why))
        model_dir = self.pool.model_dir(plan.spec.model.name, config)
        results: dict[str, dict[str, Any]] = {}
        workers = {r.role: self.pool.worker(r.inputs.accelerator_name) for r in roles}

        def resolve(r: RolePlan) -> None:
            results[r.role] = workers[r.role].call("resolve", request=self._request(plan, r, model_dir))

        if workers["prefill"] is workers["decode"]:
            for r in roles:
                resolve(r)
        else:  # two emulated GPUs: resolve both at once
            threads = [threading.Thread(target=resolve, args=(r,)) for r in roles]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            missing_roles = [r.role for r in roles if r.role not in results]
            if missing_roles:
                results.update({r: workers[r].call("resolve", request=self._request(plan, getattr(plan, r), model_dir))
                                for r in missing_roles})
        verdicts = {
            r.role: RoleVerdict(
                role=r.role, accelerator=r.inputs.accelerator_name, starts=results[r.role].get("starts"),
                refusal=Refusal.from_json(results[r.role].get("refusal")), facts=results[r.role].get("facts"),
                indeterminate=results[r.role].get("indeterminate"),
            )
            for r in roles
        }
        pair = self._pair(workers, results)
        return Verdict(plan.name, plan.namespace, verdicts["prefill"], verdicts["decode"], pair,
                       _assumptions(plan, self.catalog))

    def _pair(self, workers: dict[str, Any], results: dict[str, dict[str, Any]]) -> PairVerdict:
        prefill, decode = results["prefill"], results["decode"]
        if not (prefill.get("starts") and decode.get("starts")):
            for r in (prefill, decode):
                if r.get("handle"):
                    workers[r["role"]].call("release", handle=r["handle"])
            return PairVerdict(None, indeterminate="a role does not start, so the pair was not tried")
        nnodes = max((prefill["facts"] or {}).get("nnodes") or 1, (decode["facts"] or {}).get("nnodes") or 1)
        try:
            if nnodes > 1:
                return PairVerdict(None, indeterminate="the oracle runs the handshake of single-node replicas only")
            boot = workers["prefill"].call("bootstrap", handle=prefill["handle"])
            if "refusal" in boot:
                if boot["refusal"].get("indeterminate"):
                    return PairVerdict(None, indeterminate=boot["refusal"]["indeterminate"])
                return PairVerdict(False, Refusal.from_json(boot["refusal"]))
            shake = workers["decode"].call("handshake", handle=decode["handle"], address=boot["address"])
            refusal = shake.get("refusal") or {}
            if refusal.get("indeterminate"):
                return PairVerdict(None, indeterminate=refusal["indeterminate"])
            return PairVerdict(bool(shake.get("pairs")), Refusal.from_json(shake.get("refusal")))
        finally:
            workers["prefill"].call("release", handle=prefill["handle"])
            workers["decode"].call("release", handle=decode["handle"])
