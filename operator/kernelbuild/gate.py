"""What the PDDeployment reconciler needs from kernel builds (pure): gate, compat input, mount.

``spec.kernels.cache`` of a PDDeployment is

- ``none``: no pre-built cache; pods JIT-compile as SGLang always does (emptyDir cache);
- ``auto``: each role needs the KernelBuild of its own inputs
  (:func:`~sglang_pd_operator.kernelbuild.inputs.kernel_build_inputs`); the operator
  creates it when missing (:func:`missing_builds`) and reuses it when another
  PDDeployment of the namespace already made it (the name derives from the inputs);
- a KernelBuild name: that build, for the role it was built for (``spec.role``; a
  KernelBuild compiles one role's flags). The other role runs without a pre-built cache.
  The build's inputs must equal the role's; otherwise the role is held (Mismatched) with
  the differing inputs named — a cache built for other flags would JIT-compile anyway.

Three pieces for the reconciler:

Wiring (the PDDeployment reconciler): list the namespace's KernelBuilds, ``gates =
kernel_gate(plan, builds)``, create :func:`missing_builds` with
``reconcilers.kernelbuild.ensure_kernelbuild``, render ``render_group(with_kernel_compat(plan,
gates))`` and pass its objects through :func:`gate_objects`; put
:func:`kernels_condition` into status.

1. :func:`kernel_gate` — per role, which build, and whether it is Ready (digest), still
   building, failed (with its retry time) or missing. A role whose state ``blocks`` must
   not start pods: render its Deployment at zero replicas and say ``WaitingForKernels``
   (:func:`kernels_condition`). It never starts pods that would JIT-compile silently.
2. :func:`kernel_compat_input` — the extra compat-key input: the digests of the roles'
   caches. Prefill and decode then carry builds of the same inputs, and a new build (a
   new digest) makes a new compat key, i.e. a paired rollout. With ``cache: none`` it is
   empty, so existing compat keys do not change.
3. :func:`apply_kernel_gate` — on a rendered engine Deployment: mount the build's PVC
   read-only at ``SGLANG_CACHE_DIR`` (``subPath`` = the content-addressed directory),
   point every cache variable under it (``SGLANG_JIT_CACHE_DIR`` does not follow
   ``SGLANG_CACHE_DIR`` by itself), mount small writable emptyDirs over the lock
   directories the engines write into, and set ``SGLANG_CRASH_ON_JIT_COMPILE=1`` only when
   the build proved the cache complete for these flags (only such a cache is mounted);
   or scale to zero while blocked.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Literal
from collections.abc import Mapping

from ..api import lws
from ..planning.engine_args import SGLANG_CACHE_DIR
from ..planning.structs import Plan
from ..planning.roles import ROLES, Role
from .builder import CRASH_ON_JIT, cache_env
from .inputs import LABEL_ROLE, KernelBuildError, KernelBuildInputs, differing_inputs, kernel_build_inputs
from .recipes import BuildCatalog

GateStateName = Literal["NotRequired", "Missing", "Pending", "Building", "Ready", "Failed", "Mismatched"]
BLOCKING: frozenset[str] = frozenset({"Missing", "Pending", "Building", "Failed", "Mismatched"})
CACHE_VOLUME = "kernel-cache"
ENGINE_CONTAINER = "sglang"
ANNOTATION_DIGEST = "pd.sglang-operator.io/kernel-cache-digest"
WRITABLE_SIZE = "16Mi"
REASON_WAITING = "WaitingForKernels"
REASON_FAILED = "KernelBuildFailed"


@dataclass(frozen=True)
class KernelGateState:
    """One role's kernel cache: which build, its state, and what to mount when Ready."""

    role: Role
    mode: Literal["none", "auto", "named"]
    state: GateStateName
    build_name: str | None = None
    input_hash: str | None = None
    digest: str | None = None
    path: str | None = None
    pvc_name: str | None = None
    complete: bool = False
    writable_paths: tuple[str, ...] = ()
    message: str = ""
    next_retry_at: str | None = None
    retries_exhausted: bool = False

    @property
    def ready(self) -> bool:
        """The cache is published for exactly this role's inputs."""
        return self.state == "Ready"

    @property
    def blocks(self) -> bool:
        """The role must not start pods yet (Missing, Pending, Building, Failed, Mismatched)."""
        return self.state in BLOCKING

    @property
    def mountable(self) -> bool:
        """Ready and proven complete (a verify start compiled nothing new): mount it, forbid runtime JIT.

        A cache not proven complete is not mounted: mounted read-only, a runtime compile
        of a missing kernel would fail to write; the role then runs as with ``cache: none``.
        """
        return self.ready and self.complete

    @property
    def crash_on_jit(self) -> bool:
        """Set SGLANG_CRASH_ON_JIT_COMPILE=1: exactly when the cache is mounted."""
        return self.mountable

    @property
    def reason(self) -> str | None:
        """``WaitingForKernels`` while blocked; ``KernelBuildFailed`` for a failed or mismatched build."""
        if not self.blocks:
            return None
        return REASON_FAILED if self.state in ("Failed", "Mismatched") else REASON_WAITING


def cache_mode(cache: str) -> Literal["none", "auto", "named"]:
    """``spec.kernels.cache`` -> none | auto | named."""
    return "none" if cache == "none" else "auto" if cache == "auto" else "named"


def role_inputs(plan: Plan, *, builds: BuildCatalog | None = None) -> dict[Role, KernelBuildInputs]:
    """Every role's KernelBuild inputs (the auto-mode builds), for roles whose plan resolves."""
    out: dict[Role, KernelBuildInputs] = {}
    for role in ROLES:
        try:
            out[role] = kernel_build_inputs(plan, role, builds=builds)
        except KernelBuildError:
            continue
    return out


def required_builds(plan: Plan, *, builds: BuildCatalog | None = None) -> set[str]:
    """Names of the KernelBuilds this PDDeployment uses (retention keeps them); empty with cache none."""
    mode = cache_mode(plan.spec.kernels.cache)
    if mode == "none":
        return set()
    if mode == "named":
        return {plan.spec.kernels.cache}
    return {i.name for i in role_inputs(plan, builds=builds).values()}


def _state_of(
    role: Role, mode: Literal["auto", "named"], name: str, expected: KernelBuildInputs, build: Mapping[str, Any] | None
) -> KernelGateState:
    base = {"role": role, "mode": mode, "build_name": name, "input_hash": expected.input_hash}
    if build is None:
        msg = (
            f"KernelBuild {name} does not exist yet; the operator creates it"
            if mode == "auto"
            else f"KernelBuild {name} (spec.kernels.cache) does not exist: create it or set kernels.cache: auto"
        )
        return KernelGateState(state="Missing", message=msg, **base)
    status = build.get("status") or {}
    phase = status.get("phase")
    got = status.get("inputHash")
    if got and got != expected.input_hash:
        diff = differing_inputs(status.get("inputs"), expected.inputs) or ["(hash only)"]
        return KernelGateState(
            state="Mismatched",
            message=(
                f"KernelBuild {name} was built for other inputs than the {role} role's: {', '.join(diff)} differ; "
                f"a cache for other flags would compile at runtime. Use kernels.cache: auto or rebuild it"
            ),
            **base,
        )
    if phase == "Succeeded" and status.get("digest") and status.get("path") and status.get("pvcName"):
        return KernelGateState(
            state="Ready",
            digest=status["digest"],
            path=status["path"],
            pvc_name=status["pvcName"],
            complete=bool(status.get("complete")),
            writable_paths=tuple(status.get("writablePaths") or ()),
            message=f"KernelBuild {name}: cache {status['digest']}",
            **base,
        )
    if phase == "Failed":
        return KernelGateState(
            state="Failed",
            message=f"KernelBuild {name} failed: {status.get('message') or 'see its status'}",
            next_retry_at=status.get("nextRetryAt"),
            retries_exhausted=bool(status.get("retriesExhausted")),
            **base,
        )
    if phase in ("Building", "Succeeded"):
        return KernelGateState(
            state="Building", message=f"KernelBuild {name}: {status.get('message') or 'building'}", **base
        )
    return KernelGateState(state="Pending", message=f"KernelBuild {name}: not started yet", **base)


def kernel_gate(
    plan: Plan, builds: Mapping[str, Mapping[str, Any]], *, build_catalog: BuildCatalog | None = None
) -> dict[Role, KernelGateState]:
    """Per role: the KernelBuild it needs and whether it is Ready, Building, Failed or Missing (pure).

    ``builds`` maps KernelBuild names to their bodies as read from the API (only
    ``spec.role`` and ``status`` are read); pass every KernelBuild of the namespace, or
    at least those :func:`required_builds` names. Roles with ``cache: none`` (or not
    covered by a named build) are ``NotRequired``.
    """
    mode = cache_mode(plan.spec.kernels.cache)
    out: dict[Role, KernelGateState] = {}
    expected = role_inputs(plan, builds=build_catalog) if mode != "none" else {}
    for role in ROLES:
        if mode == "none":
            out[role] = KernelGateState(role=role, mode="none", state="NotRequired")
            continue
        inputs = expected.get(role)
        if inputs is None:  # the plan does not resolve this role (invalid plan): nothing to build
            out[role] = KernelGateState(role=role, mode=mode, state="NotRequired", message="role does not resolve")
            continue
        if mode == "auto":
            out[role] = _state_of(role, "auto", inputs.name, inputs, builds.get(inputs.name))
            continue
        name = plan.spec.kernels.cache
        build = builds.get(name)
        built_for = ((build or {}).get("spec") or {}).get("role")
        if build is not None and built_for and built_for != role:
            out[role] = KernelGateState(
                role=role,
                mode="named",
                state="NotRequired",
                build_name=None,
                message=f"KernelBuild {name} is a {built_for} build; the {role} role runs without a pre-built cache",
            )
            continue
        out[role] = _state_of(role, "named", name, inputs, build)
    return out


def missing_builds(
    plan: Plan, gates: Mapping[Role, KernelGateState], *, build_catalog: BuildCatalog | None = None
) -> list[dict[str, Any]]:
    """KernelBuild objects to create for ``cache: auto`` roles whose build is Missing (one per distinct name)."""
    if cache_mode(plan.spec.kernels.cache) != "auto":
        return []
    inputs = role_inputs(plan, builds=build_catalog)
    out: dict[str, dict[str, Any]] = {}
    for role, gate in gates.items():
        if gate.state == "Missing" and role in inputs:
            i = inputs[role]
            out.setdefault(i.name, i.manifest(plan.namespace, auto=True))
    return list(out.values())


def kernel_compat_input(gates: Mapping[Role, KernelGateState]) -> dict[str, Any]:
    """The extra compat-key input: ``{"kernelCache": {role: digest}}`` for roles that use a cache, else ``{}``.

    Add it to both roles' compat inputs (``{**role.compat_inputs, **kernel_compat_input(gates)}``):
    it holds both roles' digests, so the key stays equal on both roles. Only the digest
    enters (of a mounted cache): a build's message, retry time or name never changes the
    key, a new digest always does, and ``cache: none`` leaves existing keys as they were. While a role
    is blocked its digest is None; the key changes once the build is Ready (the group
    made while waiting is replaced by the group carrying the digest).
    """
    used = {
        role: (g.digest if g.mountable else None)
        for role, g in gates.items()
        if g.mode != "none" and g.state != "NotRequired"
    }
    return {"kernelCache": dict(sorted(used.items()))} if used else {}


def with_kernel_compat(plan: Plan, gates: Mapping[Role, KernelGateState]) -> Plan:
    """``plan`` with :func:`kernel_compat_input` merged into both roles' compat inputs (pure).

    ``render_group`` of the result names and labels the compat group by the key that
    includes the digests; with ``cache: none`` the plan is returned unchanged.
    """
    extra = kernel_compat_input(gates)
    if not extra:
        return plan
    roles = {r: replace(plan.role(r), compat_inputs={**plan.role(r).compat_inputs, **extra}) for r in ROLES}
    return replace(plan, prefill=roles["prefill"], decode=roles["decode"])


#: The engine workload kinds a gate applies to: a single-node role's Deployment, a multi-node
#: role's LeaderWorkerSet (whose leader and workers mount the same cache: one cache per role
#: serves every rank, all ranks running the same flags on the same node type).
GATED_KINDS = ("Deployment", lws.KIND)


def gate_objects(objects: list[dict[str, Any]], gates: Mapping[Role, KernelGateState]) -> list[dict[str, Any]]:
    """Rendered group objects with :func:`apply_kernel_gate` applied to each engine workload (by its role label)."""
    out = []
    for obj in objects:
        role = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE)
        if obj.get("kind") in GATED_KINDS and role in gates:
            obj = apply_kernel_gate(obj, gates[role])  # type: ignore[index]
        out.append(obj)
    return out


def kernels_condition(gates: Mapping[Role, KernelGateState]) -> dict[str, str] | None:
    """A ``KernelsReady`` condition (type, status, reason, message) for the PDDeployment, or None with no cache.

    reason ``WaitingForKernels`` while a build is missing, pending or building;
    ``KernelBuildFailed`` when one failed (retrying or out of attempts) or does not
    match; ``KernelsReady`` when every role that uses a cache has it.
    """
    used = [g for g in gates.values() if g.mode != "none" and g.state != "NotRequired"]
    if not used:
        return None
    blocked = [g for g in used if g.blocks]
    if not blocked:
        return {
            "type": "KernelsReady",
            "status": "True",
            "reason": "KernelsReady",
            "message": "; ".join(
                f"{g.role}: {g.build_name} {g.digest}" + ("" if g.mountable else " (not proven complete: not mounted)")
                for g in used
            ),
        }
    failed = [g for g in blocked if g.reason == REASON_FAILED]
    parts = []
    for g in blocked:
        text = f"{g.role}: {g.message}"
        if g.next_retry_at:
            text += f" (next attempt at {g.next_retry_at})"
        parts.append(text)
    return {
        "type": "KernelsReady",
        "status": "False",
        "reason": REASON_FAILED if failed else REASON_WAITING,
        "message": "; ".join(parts) + "; pods wait at zero replicas (no silent JIT compile)",
    }


# --------------------------------------------------------------------------- render helpers
def _set_env(env: list[dict[str, Any]], name: str, value: str) -> None:
    for e in env:
        if e.get("name") == name:
            e.clear()
            e.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


def mount_kernel_cache(deployment: dict[str, Any], gate: KernelGateState) -> dict[str, Any]:
    """A copy of an engine workload (Deployment, or LeaderWorkerSet: its leader and worker templates)
    that mounts a Ready build's cache (raises ValueError when not Ready).

    - volume ``kernel-cache`` becomes the build's PVC (read-only), mounted at
      ``SGLANG_CACHE_DIR`` with ``subPath`` = the content-addressed directory;
    - every cache variable points under it (:func:`~sglang_pd_operator.kernelbuild.builder.cache_env`,
      the same values the build used, so the paths recorded in the cache match);
    - each of the build's ``writablePaths`` gets a small emptyDir mounted over it (SGLang's
      DeepGEMM wrapper opens lock files for writing on every start, compile_utils.py:138);
    - ``SGLANG_CRASH_ON_JIT_COMPILE=1`` (only complete caches are mounted: a pod that finds
      a kernel missing stops loudly instead of compiling for minutes);
    - the pod template is annotated with the digest.
    """
    if not gate.mountable or not gate.pvc_name or not gate.path:
        raise ValueError(
            f"{gate.role}: kernel cache is not Ready and complete ({gate.state}, complete={gate.complete}); "
            "gate the Deployment instead"
        )
    out = copy.deepcopy(deployment)
    for template in lws.pod_templates(out):
        _mount_in_template(template, gate)
    return out


def _mount_in_template(template: dict[str, Any], gate: KernelGateState) -> None:
    """:func:`mount_kernel_cache` on one pod template, in place."""
    pod = template["spec"]
    volumes = [
        v
        for v in pod.get("volumes") or []
        if v.get("name") != CACHE_VOLUME and not v.get("name", "").startswith(f"{CACHE_VOLUME}-rw-")
    ]
    volumes.append({"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": gate.pvc_name, "readOnly": True}})
    for i, _ in enumerate(gate.writable_paths):
        volumes.append({"name": f"{CACHE_VOLUME}-rw-{i}", "emptyDir": {"sizeLimit": WRITABLE_SIZE}})
    pod["volumes"] = volumes
    for container in pod.get("containers") or []:
        if container.get("name") != ENGINE_CONTAINER:
            continue
        mounts = [
            m for m in container.get("volumeMounts") or []
            if m.get("name") != CACHE_VOLUME and not m.get("name", "").startswith(f"{CACHE_VOLUME}-rw-")
        ]  # fmt: skip
        mounts.append({"name": CACHE_VOLUME, "mountPath": SGLANG_CACHE_DIR, "subPath": gate.path, "readOnly": True})
        for i, rel in enumerate(gate.writable_paths):
            mounts.append({"name": f"{CACHE_VOLUME}-rw-{i}", "mountPath": f"{SGLANG_CACHE_DIR}/{rel.strip('/')}"})
        container["volumeMounts"] = mounts
        env = container.setdefault("env", [])
        for name, value in cache_env(SGLANG_CACHE_DIR).items():
            _set_env(env, name, value)
        _set_env(env, CRASH_ON_JIT, "1")
    template_meta = template.setdefault("metadata", {})
    template_meta["annotations"] = {**(template_meta.get("annotations") or {}), ANNOTATION_DIGEST: gate.digest or ""}


def hold_at_zero(deployment: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Deployment with ``replicas: 0`` (a role waiting for its kernels)."""
    out = copy.deepcopy(deployment)
    out["spec"] = {**out["spec"], "replicas": 0}
    return out


def apply_kernel_gate(deployment: dict[str, Any], gate: KernelGateState) -> dict[str, Any]:
    """The engine Deployment as the gate wants it: cache mounted (Ready and complete), held at zero (blocked),
    else unchanged (not required, or a cache not proven complete)."""
    if gate.mountable:
        return mount_kernel_cache(deployment, gate)
    if gate.blocks:
        return hold_at_zero(deployment)
    return deployment
