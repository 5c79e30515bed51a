"""The chart's RBAC grants exactly what the operator's code uses: nothing missing, nothing extra.

The permissions the operator needs are derived from the code, five ways, and compared
with the rules ``helm template`` renders (cluster-wide and with ``watchNamespaces``):

1. every call on the API door ``reconcilers/kube.py`` (``kube.get/list/delete/patch_status/
   event``) in the modules the operator process imports, found by reading their syntax
   tree; (apiVersion, kind) come from literals, module constants or the constant a ``for``
   loop walks (``GROUP_KINDS``). Each Kube method maps to verbs (:data:`KUBE_VERBS`);
2. what ``kube.apply`` is given, found by running the real reconcilers with a recording
   stand-in for ``Kube`` (a unit test, no API server): the PDDeployment ``reconcile`` over
   every example, as written and with ``kernels.cache: auto`` (which creates the roles'
   KernelBuilds), then the KernelBuild ``reconcile`` over every KernelBuild so created
   (its cache PVC, request ConfigMap and build Job). Server-side apply needs create and
   patch (a patch that creates is authorized as create too), and get when the applier
   reads first (``fetch``, no ``live`` given). Every ``kube.apply`` call site (module and
   line) must have been reached by that run, so a new apply site cannot hide;
3. what is watched: the control loop's reflectors (``runtime/informer.py``) LIST and WATCH
   every kind of ``runtime.cache.WATCHED`` (``Controller.start`` makes one per kind), and
   any handler in kopf's registry after importing ``runtime.kopf_glue`` would need list and
   watch too; there must be no change/timer/daemon handlers (they would patch finalizers
   and annotations onto the user's object);
4. what RBAC itself demands: the operator creates a Role for the gateway and may grant
   only what it holds (escalation check), and children carry ``blockOwnerDeletion``
   owner references (update on the owner's ``finalizers`` where
   OwnerReferencesPermissionEnforcement is on);
5. leader election and the CRD check: the Lease calls of ``leader.py`` and the library's
   ``LeaseLock`` (read/create/replace), and get (check) or get/create/patch (apply) of our
   CRDs by name.

Nothing may mention Secrets or a ``*``.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import importlib.util
import inspect
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import EXAMPLES, ROOT

_spec = importlib.util.spec_from_file_location("chart_check", ROOT / "hack" / "chart_check.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)

PACKAGE_DIR = ROOT / "operator"
API_DOOR = "reconcilers/kube.py"

#: Kube method -> the RBAC verbs one call needs (apply: create or patch, plus get when it reads first).
KUBE_VERBS = {
    "get": {"get"},
    "list": {"list"},
    "apply": {"create", "patch"},  # + "get" unless the caller passes ``live`` or ``fetch=False``
    "delete": {"delete"},
    "patch_status": {"patch"},  # on <plural>/status
    "patch_metadata": {"patch"},  # a group's record in its workloads' annotations (reconcilers/upgrade.py)
    "scale": {"patch"},  # on <plural>/scale (a PDRoleScale's or a Deployment's count)
    "create": {"create"},  # a PDRoleScale at its seed count (the object is dynamic, as apply's)
    "event": {"create"},  # a core/v1 Event
    "has_kind": set(),  # discovery, allowed to every authenticated user
}

Perm = tuple[str, str, str]  # (apiGroup, resource, verb)


# ---------------------------------------------------------------- helpers


@functools.cache
def crd_plurals() -> dict[tuple[str, str], str]:
    out = {}
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        out[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd["spec"]["names"]["plural"]
    return out


def resource_of(api_version: str, kind: str) -> tuple[str, str]:
    """(apiGroup, plural) of a kind: our CRDs by their names, built-in kinds by the English rule."""
    group = api_version.rpartition("/")[0]
    plural = crd_plurals().get((group, kind))
    if plural is None:
        low = kind.lower()
        plural = low[:-1] + "ies" if low.endswith("y") else low + "es" if low.endswith("s") else low + "s"
    return group, plural


def expand(rules: list[dict[str, Any]], *, with_names: bool = False) -> set:
    out = set()
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    if with_names:
                        for n in r.get("resourceNames") or [None]:
                            out.add((g, res, v, n))
                    else:
                        assert not r.get("resourceNames"), f"unexpected resourceNames in {r}"
                        out.add((g, res, v))
    return out


def operator_modules() -> list[Any]:
    """The package modules the running operator imports (runtime.main and its closure)."""
    importlib.import_module("sglang_pd_operator.runtime.main")
    return sorted((m for name, m in list(sys.modules.items())
                   if name.startswith("sglang_pd_operator.") and getattr(m, "__file__", None)),
                  key=lambda m: m.__name__)


# ---------------------------------------------------------------- 1. static: Kube call sites


class KubeCall:
    def __init__(self, module, func: str, method: str, node: ast.Call, tree: ast.Module):
        self.module, self.func, self.method, self.node, self.tree = module, func, method, node, tree

    @property
    def where(self) -> str:
        return f"{Path(self.module.__file__).relative_to(PACKAGE_DIR)}:{self.node.lineno} ({self.func})"


@functools.cache
def kube_calls() -> list[KubeCall]:
    """Calls ``<...>kube.<method>(...)`` (or ``<...>kube.uncached().<method>(...)``) outside the door itself.

    ``kube.list_kind`` (the control loop's LIST of each watched kind) is not among them:
    it lists exactly the kinds the reflectors watch, which point 3 derives (checked in
    ``test_derivation_sees_the_known_calls``).
    """
    out = []
    for module in operator_modules():
        path = Path(module.__file__)
        if str(path.relative_to(PACKAGE_DIR)) == API_DOOR:
            continue
        source = path.read_text()
        tree = ast.parse(source)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in KUBE_VERBS
                        and ast.unparse(node.func.value).removesuffix(".uncached()").split(".")[-1] == "kube"):
                    out.append(KubeCall(module, func.name, node.func.attr, node, tree))
    # a function nested in another is walked twice: keep each call once
    return list({(c.module.__name__, c.node.lineno, c.node.col_offset): c for c in out}.values())


def _resolve(call: KubeCall, expr: ast.expr) -> list[Any]:
    """Possible values of an argument: a literal, a module-level constant, or a for-loop over a constant."""
    if isinstance(expr, ast.Constant):
        return [expr.value]
    try:
        return [eval(compile(ast.Expression(expr), "<arg>", "eval"), vars(call.module))]  # noqa: S307
    except NameError:
        pass
    name = ast.unparse(expr)
    for node in ast.walk(call.tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple):
            names = [ast.unparse(t) for t in node.target.elts]
            if name in names and any(n is call.node for n in ast.walk(node)):
                seq = eval(compile(ast.Expression(node.iter), "<iter>", "eval"), vars(call.module))  # noqa: S307
                return [item[names.index(name)] for item in seq]
    raise AssertionError(f"{call.where}: cannot resolve argument `{name}` of kube.{call.method}; "
                         "use a literal or a module constant, or teach tests/unit/test_chart_rbac.py")


@functools.cache
def static_permissions() -> tuple[set[Perm], set[tuple[str, str, str, str]]]:
    """(permissions where PDDeployments live, permissions in the operator's namespace by name)."""
    workload: set[Perm] = set()
    own_ns: set[tuple[str, str, str, str]] = set()
    for call in kube_calls():
        if call.method in ("apply", "create", "has_kind"):
            continue  # apply, create: dynamic (below); has_kind: discovery
        if call.method == "event":
            workload.add(("", "events", "create"))
            continue
        args = call.node.args
        pairs = list(zip(_resolve(call, args[0]), _resolve(call, args[1])))
        ns_arg = args[3] if len(args) > 3 else next((k.value for k in call.node.keywords if k.arg == "namespace"), None)
        in_own_ns = ns_arg is not None and "operator_namespace" in ast.unparse(ns_arg)
        for api_version, kind in pairs:
            if kind == "CustomResourceDefinition":
                continue  # the CRD check, scoped separately (5.)
            group, plural = resource_of(api_version, kind)
            if call.method == "patch_status":
                plural += "/status"
            elif call.method == "scale":
                plural += "/scale"
            for verb in KUBE_VERBS[call.method]:
                if in_own_ns:
                    own_ns.add((group, plural, verb, _resolve(call, args[2])[0]))
                else:
                    workload.add((group, plural, verb))
    return workload, own_ns


# ---------------------------------------------------------------- 2. dynamic: what apply is given


class RecordingKube:
    """Stands in for reconcilers.kube.Kube in a unit test: nothing exists; records every call.

    ``applied``: (object, verbs) of every apply, the verbs as :meth:`Kube.apply` needs them
    (it reads the object first only when given no ``live`` and ``fetch``);
    ``apply_sites``: (module, line) of the code that called ``apply``.
    """

    def __init__(self):
        self.created: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.applied: list[tuple[dict[str, Any], set[str]]] = []
        self.apply_sites: set[tuple[str, int]] = set()
        self.total_writes = 0

    def get(self, api_version, kind, name, namespace=None):
        self.calls.append(("get", api_version, kind))
        return copy.deepcopy(self.created.get((kind, namespace, name)))

    def create(self, obj):
        """Records like apply (verbs: create) and remembers the object, so a second reconcile finds it."""
        self.calls.append(("create", obj["apiVersion"], obj["kind"]))
        self.applied.append((obj, {"create"}))
        self.created[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        self.total_writes += 1
        return True

    def scale(self, api_version, kind, name, namespace, replicas, *, field_manager=None):
        self.calls.append(("scale", api_version, kind))
        self.total_writes += 1

    def list(self, api_version, kind, namespace, label_selector):
        self.calls.append(("list", api_version, kind))
        return []

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        self.calls.append(("apply", desired["apiVersion"], desired["kind"]))
        reads = live is None and fetch  # Kube.apply: `if live is None and fetch: live = self.get(...)`
        self.applied.append((desired, KUBE_VERBS["apply"] | ({"get"} if reads else set())))
        caller = sys._getframe(1)
        while caller.f_globals["__name__"].endswith(".reconcilers.apierrors"):  # CallTracker passes calls on
            caller = caller.f_back
        self.apply_sites.add((caller.f_globals["__name__"], caller.f_lineno))
        self.total_writes += 1
        return True

    def delete(self, api_version, kind, name, namespace):
        self.calls.append(("delete", api_version, kind))
        return False

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.calls.append(("patch_status", api_version, kind))
        self.total_writes += 1

    def event(self, involved, *, type_, reason, message):
        self.calls.append(("event", "v1", "Event"))

    def has_kind(self, api_version, kind):
        return True


def example_bodies() -> list[dict[str, Any]]:
    """Every example PDDeployment as written, then each again with ``kernels.cache: auto``, then the
    first one with both roles' counts left to PDRoleScales and the planner (twice: creation, then
    the objects exist)."""
    out, auto = [], []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "PDDeployment":
                doc.setdefault("metadata", {}).setdefault("namespace", "default")
                doc["metadata"].update(uid=f"uid-{doc['metadata']['name']}", generation=1)
                out.append(doc)
                cached = copy.deepcopy(doc)
                cached["metadata"]["name"] += "-kernels-auto"
                cached["metadata"]["uid"] += "-kernels-auto"
                cached["spec"]["kernels"] = {**(cached["spec"].get("kernels") or {}), "cache": "auto"}
                auto.append(cached)
    scaled = copy.deepcopy(out[0])
    scaled["metadata"].update(name=scaled["metadata"]["name"] + "-scaled", uid="uid-scaled")
    for role in ("prefill", "decode"):
        scaled["spec"][role].pop("replicas", None)
    scaled["spec"]["slo"] = scaled["spec"].get("slo") or {"ttft": {"p90": "800ms"}}
    scaled["spec"]["autoscaling"] = {"prefill": {"maxReplicas": 2}, "decode": {"maxReplicas": 4}}
    return out + auto + [scaled, copy.deepcopy(scaled)]


@pytest.fixture(scope="module")
def recorded(catalog) -> RecordingKube:
    from sglang_pd_operator.reconcilers import kernelbuild
    from sglang_pd_operator.reconcilers.pddeployment import reconcile

    kube = RecordingKube()
    params = inspect.signature(reconcile).parameters
    for body in example_bodies():
        kwargs = {"kube": kube, "body": body, "catalog": catalog}
        if "monitoring" in params:
            kwargs["monitoring"] = True  # a cluster with the Prometheus Operator: the widest case
        if "lws_served" in params:
            kwargs["lws_served"] = True  # and with LeaderWorkerSet: the multi-node examples apply theirs
        if "cd_served" in params:
            kwargs["cd_served"] = True  # and NVIDIA's DRA driver: the GB300 multi-node ones create their ComputeDomain
        outcome = reconcile(**kwargs)
        assert outcome.valid, body["metadata"]["name"]
    # the KernelBuilds kernels.cache: auto created (nothing exists yet: storage, request, attempt 1's Job)
    builds = [copy.deepcopy(obj) for obj, _ in kube.applied if obj["kind"] == "KernelBuild"]
    assert builds, "kernels.cache: auto created no KernelBuild"
    for body in builds:
        body["metadata"].update(uid=f"uid-{body['metadata']['name']}", generation=1)
        outcome = kernelbuild.reconcile(kube=kube, body=body, catalog=catalog, in_use=True)
        assert outcome.created_job, (body["metadata"]["name"], outcome)
    return kube


def applied_permissions(recorded: RecordingKube) -> set[Perm]:
    perms = set()
    for obj, verbs in recorded.applied:
        group, plural = resource_of(obj["apiVersion"], obj["kind"])
        perms |= {(group, plural, v) for v in verbs}
    return perms


def test_every_apply_site_was_reached_by_the_recorded_reconcile(recorded):
    from sglang_pd_operator.reconcilers import crds

    def reached(call: KubeCall) -> bool:
        return any(module == call.module.__name__ and call.node.lineno <= line <= call.node.end_lineno
                   for module, line in recorded.apply_sites)

    sites = [c for c in kube_calls() if c.method == "apply" and c.module is not crds]  # CRDs: scoped apart (5.)
    assert sites
    missed = [c.where for c in sites if not reached(c)]
    assert not missed, (
        f"kube.apply at {missed} is not reached by the recorded reconciles (examples, kernels.cache: auto, "
        "their KernelBuilds): extend the recorded run so the RBAC check sees what it applies")


# ---------------------------------------------------------------- 3.-5.


def kopf_permissions() -> set[Perm]:
    import kopf

    importlib.import_module("sglang_pd_operator.runtime.kopf_glue")
    registry = kopf.get_default_registry()
    for kind in ("_changing", "_spawning", "_webhooks"):
        handlers = getattr(registry, kind).get_all_handlers()
        assert not handlers, f"kopf {kind} handlers {handlers}: they write finalizers/annotations on objects"
    perms = set()
    for kind in ("_watching", "_indexing"):
        for h in getattr(registry, kind).get_all_handlers():
            sel = h.selector
            plural = sel.plural or sel.any_name  # kopf.on.event(group, version, "<plural>")
            assert plural and plural == plural.lower() and plural.endswith("s"), f"kopf selector {sel}: use the plural"
            perms |= {(sel.group or "", plural, v) for v in ("list", "watch")}
    from sglang_pd_operator.runtime.cache import WATCHED

    return perms | {(w.group, w.plural, v) for w in WATCHED for v in ("list", "watch")}


def rbac_imposed_permissions(recorded: RecordingKube) -> set[Perm]:
    """What the operator must hold to create what it creates."""
    perms = set()
    for obj, _ in recorded.applied:
        if obj["kind"] == "Role":
            perms |= expand(obj["rules"])
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("blockOwnerDeletion"):
                group, plural = resource_of(ref["apiVersion"], ref["kind"])
                perms.add((group, f"{plural}/finalizers", "update"))
    return perms


def lease_verbs() -> set[str]:
    """Lease calls of leader.py and of the library's LeaseLock (read -> get, replace -> update)."""
    import kubernetes.leaderelection.resourcelock.leaselock as leaselock

    from sglang_pd_operator.runtime import leader

    verbs = set()
    for module in (leaselock, leader):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.Attribute) and node.attr.endswith("_namespaced_lease"):
                verbs.add({"read": "get", "replace": "update"}.get(node.attr.split("_")[0], node.attr.split("_")[0]))
    return verbs


def required_workload(recorded: RecordingKube) -> set[Perm]:
    workload, _ = static_permissions()
    return workload | applied_permissions(recorded) | kopf_permissions() | rbac_imposed_permissions(recorded)


def rendered(values: list[Path] = (), sets: list[str] = ()) -> list[dict[str, Any]]:
    return cc.helm_template(values=values, sets=sets)


def rules_of(objs, kind, name_suffix="") -> dict[tuple[str | None, str], list]:
    return {(o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"] for o in objs
            if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)}


# ---------------------------------------------------------------- the checks


def test_workload_rules_equal_what_the_code_uses(recorded):
    need = required_workload(recorded)
    objs = rendered()
    cluster_roles = rules_of(objs, "ClusterRole")
    granted = expand(cluster_roles[(None, "pd-sglang-pd-operator")])
    assert not need - granted, f"the chart lacks {sorted(need - granted)}"
    assert not granted - need, f"the chart grants what the operator never uses: {sorted(granted - need)}"
    # namespaced: the same rules, once per watched namespace, and no cluster-wide workload access
    ns_objs = rendered(sets=["watchNamespaces={team-a,team-b}"])
    roles = rules_of(ns_objs, "Role")
    for ns in ("team-a", "team-b"):
        assert expand(roles[(ns, "pd-sglang-pd-operator")]) == need
    assert [n for _, n in rules_of(ns_objs, "ClusterRole")] == ["pd-sglang-pd-operator-crds"]


def test_operator_namespace_rules_are_the_lease_and_the_catalog_by_name(recorded):
    _, own_ns = static_permissions()
    lease = "pd-sglang-pd-operator"
    verbs = lease_verbs()
    assert verbs == {"get", "create", "update"}, verbs
    need = own_ns | {("coordination.k8s.io", "leases", v, None if v == "create" else lease) for v in verbs}
    for values in ([], ["watchNamespaces={team-a}"]):
        granted = expand(rules_of(rendered(sets=values), "Role", "-self")[("sglang-system", "pd-sglang-pd-operator-self")],
                         with_names=True)
        assert granted == need, (sorted(granted - need), sorted(need - granted))
    # without leader election: only a read of our Lease (``leader.refuse_if_led`` at start)
    granted = expand(rules_of(rendered(sets=["replicaCount=1", "leaderElection.enabled=false"]), "Role", "-self")[
        ("sglang-system", "pd-sglang-pd-operator-self")], with_names=True)
    assert granted == own_ns | {("coordination.k8s.io", "leases", "get", lease)}


@pytest.mark.parametrize(("policy", "verbs"), [("check", {"get"}), ("apply", {"get", "create", "patch"}), ("skip", None)])
def test_crd_rules_follow_the_crd_policy(policy, verbs):
    from sglang_pd_operator.reconcilers import crds as crd_module

    # the code: get always (check/apply), apply only with policy apply
    calls = {c.method for c in kube_calls() if c.module is crd_module}
    assert calls == {"get", "apply"}
    roles = rules_of(rendered(sets=[f"operator.crds={policy}"]), "ClusterRole", "-crds")
    if verbs is None:
        assert not roles
        return
    names = sorted(yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "crds").glob("*.yaml"))
    granted = expand(next(iter(roles.values())), with_names=True)
    assert granted == {("apiextensions.k8s.io", "customresourcedefinitions", v, n) for v in verbs for n in names}


@pytest.mark.parametrize("values", sorted((ROOT / "charts/sglang-pd-operator/ci").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_secrets_no_wildcards_no_escalation_verbs(values):
    for obj in rendered(values=[values]):
        for rule in obj.get("rules") or []:
            text = yaml.safe_dump(rule)
            assert "secrets" not in rule.get("resources", []), (obj["metadata"]["name"], rule)
            assert "*" not in text, (obj["metadata"]["name"], rule)
            assert not {"escalate", "bind", "impersonate"} & set(rule.get("verbs", [])), rule


def test_derivation_sees_the_known_calls(recorded):
    """Guard the derivation itself: it finds the calls we know are there."""
    workload, own_ns = static_permissions()
    assert ("pd.sglang-operator.io", "pddeployments/status", "patch") in workload
    assert ("apps", "deployments", "delete") in workload  # drained groups, via GROUP_KINDS
    assert ("", "pods", "list") in workload
    assert ("", "configmaps", "get", "sglang-pd-operator-catalog") in own_ns
    assert ("", "events", "create") in workload
    assert ("rbac.authorization.k8s.io", "roles", "create") in applied_permissions(recorded)
    assert ("pd.sglang-operator.io", "pddeployments", "watch") in kopf_permissions()
    # KernelBuilds: the reconciler, the watches, and what kernels.cache: auto creates
    assert {("pd.sglang-operator.io", "kernelbuilds/status", "patch"), ("pd.sglang-operator.io", "kernelbuilds", "delete"),
            ("batch", "jobs", "list"), ("batch", "jobs", "delete"), ("", "persistentvolumeclaims", "get")} <= workload
    assert {("pd.sglang-operator.io", "kernelbuilds", "create"), ("batch", "jobs", "create"),
            ("", "persistentvolumeclaims", "create")} <= applied_permissions(recorded)
    assert {("pd.sglang-operator.io", "kernelbuilds", "watch"), ("batch", "jobs", "watch")} <= kopf_permissions()
    assert ("pd.sglang-operator.io", "kernelbuilds/finalizers", "update") in rbac_imposed_permissions(recorded)
    from sglang_pd_operator.runtime.cache import WATCHED

    assert {(w.group, w.plural, v) for w in WATCHED for v in ("list", "watch")} <= kopf_permissions()
    # apply without a read (fetch=False after the caller's own get): create and patch only
    kb_apply = {frozenset(v) for obj, v in recorded.applied if obj["kind"] == "KernelBuild"}
    assert kb_apply == {frozenset({"create", "patch"})}, kb_apply
    by_method = defaultdict(int)
    for c in kube_calls():
        by_method[c.method] += 1
    assert by_method["apply"] >= 2 and by_method["list"] >= 2

