"""SGLang's verdict on a planned PDDeployment: does each role start, and do the two pair?

:func:`judge_plan` takes the operator's :class:`~sglang_pd_operator.planning.structs.Plan`
(valid or not), renders what each role's engine container would start with
(``render.engine.role_launch``: the ConfigMap's SGLang config file, the command-line
flags and the environment) and hands it to the oracle worker of that role's accelerator
(:mod:`.pool`), which runs SGLang 0.5.23's own startup validation on an emulated GPU
(:mod:`.engine_side`). A replica spanning nodes is judged pod by pod: each node rank's
command (``--node-rank k --dist-init-addr <node 0>:<port>``, expanded as the kubelet does
from the LeaderWorkerSet variables, :func:`pod_launches`) on its own emulated node. When
both roles start, the prefill worker starts SGLang's real bootstrap server and registers
every prefill rank from the node that runs it, and the decode worker runs SGLang's
handshake against it. The :class:`Verdict` carries SGLang's own exception text.

A verdict is *indeterminate* (``accepted is None``) when the oracle cannot judge: the
accelerator or the model's HF config is not in the catalog, or SGLang needed a GPU
kernel to decide. Nothing here imports SGLang; the workers do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..api import lws
from ..catalog import Catalog, hf_config_path
from ..planning.structs import Plan, RolePlan
from ..render.engine import role_launch
from .pool import WorkerPool
from .stages import IMPORT_TIME_ENV, PHASES
from .standin_plugins import assumed_features

#: What the oracle substitutes in the pod's environment (there is no pod): the pod IP
#: for ``fieldRef status.podIP``, a placeholder for secrets.
POD_IP = "127.0.0.1"
SECRET_PLACEHOLDER = "oracle-placeholder-secret"


def node_pod_ip(node_rank: int) -> str:
    """The pod IP of node ``node_rank`` of a multi-node replica in the oracle: its own loopback
    address (127.0.0.1 for node 0, the leader), so each node's ranks register their own address."""
    return f"127.0.0.{node_rank + 1}"


def expand_refs(text: str, env: dict[str, str]) -> str:
    """``text`` with every ``$(NAME)`` of a variable in ``env`` replaced, as the kubelet expands container args.

    Kubernetes' rule (k8s.io/kubernetes third_party/forked/golang/expansion, used for
    ``command``/``args``): ``$(NAME)`` becomes the variable's value when the container
    defines it and stays as written otherwise; ``$$`` is an escaped ``$``; any other ``$``
    stays as is.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 >= len(text):
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2:end]
            out.append(env[name] if name in env else text[i:end + 1])
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Refusal:
    """SGLang's exception: ``stage`` (parse | resolve | validate | model | kv | memory |
    bootstrap | handshake), exception ``type``, its ``message``, ``where``
    (sglang/<file>:<function>:<line>) and ``phase``, the part of SGLang's startup the stage
    belongs to (args | model | kv | memory | handshake; engine_side.PHASES)."""

    stage: str
    type: str
    message: str
    where: str | None = None
    phase: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> "Refusal | None":
        """Read the worker's JSON (None stays None)."""
        if not data:
            return None
        stage = data.get("stage", "")
        return cls(stage=stage, type=data.get("type", ""), message=data.get("message", ""),
                   where=data.get("where"), phase=data.get("phase") or PHASES.get(stage, stage))

    def line(self) -> str:
        """One line for a person: SGLang's message and where it raised."""
        where = f" ({self.where})" if self.where else ""
        return f"{self.type}: {self.message}{where}"


@dataclass(frozen=True)
class RoleVerdict:
    """One role: ``starts`` True / False, None when indeterminate (``indeterminate`` says why).

    ``steps``: SGLang's startup steps that ran for it (up to the refusing one), each naming
    its sglang source; ``assumes``: the steps that did not run here (no GPU, no weights)
    and the stand-ins a step used, taken as passing."""

    role: str
    accelerator: str
    starts: bool | None
    refusal: Refusal | None = None
    facts: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    indeterminate: str | None = None
    steps: tuple[str, ...] = field(default=(), hash=False, compare=False)
    assumes: tuple[str, ...] = field(default=(), hash=False, compare=False)


@dataclass(frozen=True)
class PairVerdict:
    """The PD handshake: ``pairs`` True / False, None when a role did not start or the oracle could not judge."""

    pairs: bool | None
    refusal: Refusal | None = None
    indeterminate: str | None = None
    #: ``ip:port`` of every prefill rank the decode's requests reached (the nodes' own addresses).
    prefill_ranks: tuple[str, ...] = ()


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
                    "indeterminate": v.indeterminate, "resolved": facts or None, "steps": list(v.steps),
                    "assumes": list(v.assumes)}

        return {
            "accepted": self.accepted,
            "prefill": role(self.prefill),
            "decode": role(self.decode),
            "pair": {"pairs": self.pair.pairs, "refusal": _refusal_dict(self.pair.refusal),
                     "indeterminate": self.pair.indeterminate, "prefillRanks": list(self.pair.prefill_ranks)},
            "assumptions": list(self.assumptions),
        }


def _refusal_dict(r: Refusal | None) -> dict[str, Any] | None:
    return None if r is None else {"stage": r.stage, "phase": r.phase, "type": r.type, "message": r.message,
                                   "where": r.where}


def _pod_env(env: dict[str, Any], *, pod_ip: str = POD_IP) -> dict[str, str]:
    """Container env with ``valueFrom`` sources turned into the values a pod would see."""
    out = {}
    for name, value in env.items():
        if isinstance(value, dict):
            field_path = (value.get("fieldRef") or {}).get("fieldPath")
            out[name] = pod_ip if field_path == "status.podIP" else SECRET_PLACEHOLDER
        else:
            out[name] = str(value)
    return out


def pod_launches(plan: Plan, role: RolePlan) -> list[dict[str, Any]]:
    """What each pod of one replica of ``role`` starts with, node 0 first: {"configYaml", "args", "env"}.

    One pod for a single-node replica. For a replica spanning N nodes (a LeaderWorkerSet
    group), pod k gets the variables the LWS pod webhook injects (LWS_LEADER_ADDRESS: node
    0's address; LWS_GROUP_SIZE N; LWS_WORKER_INDEX k), its own pod IP for
    ``fieldRef status.podIP`` (:func:`node_pod_ip`), and its args expanded the kubelet's way
    (:func:`expand_refs`): ``--node-rank k --dist-init-addr <node 0>:<port>``.
    """
    launch = role_launch(plan, role)
    nodes = role.inputs.nodes
    out = []
    for rank in range(nodes):
        pod_ip = node_pod_ip(rank) if nodes > 1 else POD_IP
        env = _pod_env(launch["env"], pod_ip=pod_ip)
        if nodes > 1:
            env = {lws.ENV_LEADER_ADDRESS: node_pod_ip(0), lws.ENV_GROUP_SIZE: str(nodes),
                   lws.ENV_WORKER_INDEX: str(rank), **env}
        out.append({"configYaml": launch["configYaml"], "args": [expand_refs(a, env) for a in launch["args"]],
                    "env": env})
    return out


def pod_gpus(plan: Plan, role: RolePlan) -> int | None:
    """The GPUs one pod of ``role`` requests as the operator renders it (the device plugin's
    limit, ``render.engine._resources``): what ``torch.cuda.device_count()`` and
    ``nvidia-smi`` show inside that pod. None when the plan cannot be rendered (an
    accelerator outside the catalog); the worker then shows the node's GPUs."""
    from ..render.engine import _resources

    acc = role.inputs.accelerator
    if acc is None:
        return None
    try:
        return int(_resources(plan, role)["limits"][acc.gpuResource])
    except (AssertionError, KeyError, ValueError, TypeError):
        return None


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
        out.append("DSpark transfer layout: the pool byte lengths of the two roles are taken as equal exactly when their "
                   "KV layouts and KV dtypes are equal")
    return tuple(out)


class Oracle:
    """Judges plans with SGLang's own code, through a :class:`WorkerPool` (close it when done)."""

    def __init__(self, *, catalog: Catalog, pool: WorkerPool | None = None, depth: str = "startup",
                 **pool_options: Any) -> None:
        if depth not in ("startup", "args"):
            raise ValueError(f"depth must be 'startup' or 'args', not {depth!r}")
        self.catalog = catalog
        #: ``startup``: SGLang's argument checks, the scheduler's model build and memory
        #: planning; ``args``: without the model build and memory planning (engine_side.DEPTHS).
        self.depth = depth
        self.pool = pool or WorkerPool(catalog=catalog, **pool_options)

    def close(self) -> None:
        """Stop the workers."""
        self.pool.close()

    def __enter__(self) -> "Oracle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _requests(self, plan: Plan, role: RolePlan, model_dir: str) -> list[dict[str, Any]]:
        """One resolve request per pod of a replica of ``role`` (node 0 first), with the GPUs
        the pod requests (``gpus``): the pod sees those, not the node's."""
        gpus = pod_gpus(plan, role)
        return [{"role": role.role, **launch, "modelDir": model_dir, "gpus": gpus, "depth": self.depth}
                for launch in pod_launches(plan, role)]

    @staticmethod
    def _import_env(plan: Plan, role: RolePlan) -> dict[str, str]:
        """The role's values of the variables SGLang reads when it is imported (stages.IMPORT_TIME_ENV):
        the pool gives the role a worker that imported SGLang with them."""
        env = _pod_env(role_launch(plan, role)["env"])
        return {k: v for k, v in env.items() if k in IMPORT_TIME_ENV}

    @staticmethod
    def _role_verdict(role: RolePlan, ranks: list[dict[str, Any]]) -> RoleVerdict:
        """One role's verdict from every node's result: refused when a node is refused (its
        message names the node rank on a multi-node replica), indeterminate when one is,
        else started, with node 0's facts."""
        multi = len(ranks) > 1
        for rank, result in enumerate(ranks):
            if result.get("starts") is False:
                refusal = dict(result.get("refusal") or {})
                if multi:
                    refusal["message"] = f"node rank {rank} of {len(ranks)}: {refusal.get('message', '')}"
                return RoleVerdict(role.role, role.inputs.accelerator_name, False, Refusal.from_json(refusal),
                                   steps=tuple(result.get("steps") or ()))
        for rank, result in enumerate(ranks):
            if result.get("starts") is None:
                why = result.get("indeterminate") or "no verdict"
                return RoleVerdict(role.role, role.inputs.accelerator_name, None,
                                   indeterminate=f"node rank {rank}: {why}" if multi else why,
                                   steps=tuple(result.get("steps") or ()))
        return RoleVerdict(role.role, role.inputs.accelerator_name, True, facts=ranks[0].get("facts"),
                           steps=tuple(ranks[0].get("steps") or ()), assumes=tuple(ranks[0].get("assumes") or ()))

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
        results: dict[str, list[dict[str, Any]]] = {}  # role -> one result per node
        workers = {r.role: self.pool.worker(r.inputs.accelerator_name, import_env=self._import_env(plan, r))
                   for r in roles}

        def resolve(r: RolePlan) -> None:
            results[r.role] = [workers[r.role].call("resolve", request=req) for req in self._requests(plan, r, model_dir)]

        if workers["prefill"] is workers["decode"]:
            for r in roles:
                resolve(r)
        else:  # two emulated GPUs: resolve both at once
            threads = [threading.Thread(target=resolve, args=(r,)) for r in roles]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r in roles:
                if r.role not in results:
                    resolve(r)
        verdicts = {r.role: self._role_verdict(r, results[r.role]) for r in roles}
        pair = self._pair(workers, results, verdicts)
        return Verdict(plan.name, plan.namespace, verdicts["prefill"], verdicts["decode"], pair,
                       _assumptions(plan, self.catalog))

    def _pair(self, workers: dict[str, Any], results: dict[str, list[dict[str, Any]]],
              verdicts: dict[str, RoleVerdict]) -> PairVerdict:
        """The handshake: every prefill rank registers from its own node, then decode node 0's handshake."""
        handles = {role: [r["handle"] for r in ranks if r.get("handle")] for role, ranks in results.items()}
        try:
            if not (verdicts["prefill"].starts and verdicts["decode"].starts):
                return PairVerdict(None, indeterminate="a role does not start, so the pair was not tried")
            boot = workers["prefill"].call("bootstrap", handles=handles["prefill"])
            if "refusal" in boot:
                if boot["refusal"].get("indeterminate"):
                    return PairVerdict(None, indeterminate=boot["refusal"]["indeterminate"])
                return PairVerdict(False, Refusal.from_json(boot["refusal"]))
            shake = workers["decode"].call("handshake", handle=handles["decode"][0], address=boot["address"])
            refusal = shake.get("refusal") or {}
            if refusal.get("indeterminate"):
                return PairVerdict(None, indeterminate=refusal["indeterminate"])
            return PairVerdict(bool(shake.get("pairs")), Refusal.from_json(shake.get("refusal")),
                               prefill_ranks=tuple(shake.get("prefillRanks") or ()))
        finally:
            for role, held in handles.items():
                for handle in held:
                    workers[role].call("release", handle=handle)
