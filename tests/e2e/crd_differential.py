"""The CRD differential: ``check``, the real kube-apiserver and the operator's reconcile, on generated PDDeployments.

Issue 26's promise is that ``check`` in CI says what the cluster will say. This module
generates specs with hypothesis, driven by the CRD's own schema (``crds/pddeployments.yaml``
as ``api.crd.all_crds`` generates it): a valid example, then one to three of its fields (any
path the schema has) replaced by a value drawn for that node: boundary numbers (the
schema's bounds, one past them, int32/int64 edges), huge strings and lists (the schema's
max and one past it), unicode, control and bidirectional characters, hostile durations,
paths and image references, wrong types, nulls, missing required and unknown fields, and a
list item repeated (an env name, a toleration, an extra argument twice).

Each spec meets three judges:

1. ``check`` (``planning.plan.plan_object``, what the ``check`` command runs): valid or not;
   an exception is a crash;
2. the real API server: a server-side apply of the PDDeployment with ``dryRun=All`` and
   ``fieldValidation=Strict``, as ``kubectl apply --server-side --dry-run=server`` sends it
   (:func:`kubectl_verdict` runs kubectl itself on a sample, to hold the two equal);
3. for a spec both accept, the operator's own ``reconcile`` on a dry-run ``Kube``
   (``Kube(dry_run=True)``), told what the cluster serves (:func:`served_apis`: the dev
   cluster serves LeaderWorkerSets, ComputeDomains and, once their CRDs are installed,
   the Prometheus Operator's PodMonitor and PrometheusRule): every child it would write is
   sent with ``dryRun=All``, so the API server judges every rendered Deployment, Service,
   ConfigMap, LeaderWorkerSet, ComputeDomain, PDRoleScale, KernelBuild, PodMonitor and
   PrometheusRule; a refused child or an exception is a disagreement, and so is a
   reconcile that stops before applying anything (a Missing-API condition such as
   ComputeDomainMissing) or refuses what ``check`` accepted. Only requests really sent
   with ``dryRun=All`` count as children (each object once per spec, though a new group's
   workloads are sent twice: the all-or-nothing dry run, then the "write"); status patches and
   deletes, which a dry-run client does not send, are counted apart.

Every disagreement where ``check`` refuses and the API server accepts is classified by
``tests/e2e/crd_stricter_by_design.yaml`` (a field pattern and a rule, with the reason
``check`` is stricter); one no class covers is reported as unexplained.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from sglang_pd_operator.api import computedomain as cd
from sglang_pd_operator.api import lws
from sglang_pd_operator.api.crd import all_crds
from sglang_pd_operator.api.v1alpha1 import GROUP, VERSION
from sglang_pd_operator.metrics.monitoring import MONITORING_API_VERSION
from sglang_pd_operator.planning.plan import plan_object
from sglang_pd_operator.reconcilers.apierrors import server_message
from sglang_pd_operator.reconcilers.kube import Kube, apply_body

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
STRICTER_BY_DESIGN = Path(__file__).with_name("crd_stricter_by_design.yaml")
NAME = "diff"
#: Specs per hypothesis run: a disagreement is reproduced by (seed, index), the batch's seed
#: being the run's seed + the batch number (``replay``).
BATCH = 250

# ------------------------------------------------------------------------------ generation
_CONTROLS = "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x80\x85\x9f"
_BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNICODE = "é中😀Ωß\u00a0\ufeff"
_HOSTILE_STRINGS = [
    "", " ", "a b", " leading", "trailing ", "UPPER", "-", "..", "/", "/..", "/../../../etc/shadow", "/a//b", "/./a",
    "relative/path", "99999999999999h", "596523h14m7s", "596523h14m8s", "2562047h47m16s", "0s", "0.5s", "1h30m",
    "1.000000001s", "800ms", "-5m", "5 m", "1d", "Inf", "1e3", "64Gi", "0", "-1", "1.5", "true", "null", "~",
    "lmsysorg/sglang:v0.5.23-cu130", "lmsysorg/sglang:v0.5.23 cu130", "Lmsysorg/sglang", "localhost:5000/a/b:c",
    "a" * 64, "a@sha256:" + "0" * 64, "a:" + "t" * 129, "[::1]:5000/x", "x" * 63, "x" * 64, "x" * 253, "x" * 254,
    "--flag=value", "--log-level", "$(HOME)", "${HOME}", "`id`", "a;rm -rf /", "\\", "'", '"', "{}", "[]",
    "example.com/gpu", "a/b/c", "nvidia.com/gpu.product", "0.5.23", "0.5.24.post1", "auto",
]


def _text() -> st.SearchStrategy[str]:
    alphabet = st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",)),
                         st.sampled_from(_CONTROLS + _BIDI + _UNICODE))
    return st.one_of(st.sampled_from(_HOSTILE_STRINGS), st.text(alphabet, max_size=24),
                     st.builds(lambda c, n: c * n, st.sampled_from("ax/é.-"), st.sampled_from([255, 256, 1025, 4097])))


def _string_for(node: dict[str, Any]) -> st.SearchStrategy[str]:
    options: list[st.SearchStrategy[str]] = [_text()]
    if node.get("enum"):
        options.append(st.sampled_from(node["enum"]))
        options.append(st.sampled_from([str(v).upper() for v in node["enum"]] + [str(v) + " " for v in node["enum"]]))
    for bound in ("maxLength", "minLength"):
        if bound in node:
            n = node[bound]
            options.append(st.sampled_from(["a" * max(n - 1, 0), "a" * n, "a" * (n + 1), "é" * n, "é" * (n + 1)]))
    return st.one_of(*options)


def _int_for(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    edges = [0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 10**30]
    for bound in ("minimum", "maximum"):
        if bound in node:
            b = int(node[bound])
            edges += [b - 1, b, b + 1]
    return st.one_of(st.sampled_from(edges), st.integers(-5, 300), st.sampled_from([1.5, 8.0, -0.0, 1e20, "8", True]))


def _value_for(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """A value for the schema ``node``: often of its type and near its bounds, sometimes hostile or of another type."""
    kind = node.get("type")
    wrong = st.sampled_from([None, "x", 7, 2.5, True, [], {}, ["x"], {"a": "b"}])
    if kind == "string":
        typed = _string_for(node)
    elif kind == "integer":
        typed = _int_for(node)
    elif kind == "number":
        typed = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=64), _int_for(node),
                          st.sampled_from([0.0, 1.0, 0.99, 1e-300, 1e300]))
    elif kind == "boolean":
        typed = st.sampled_from([True, False, "true", 1, 0, "yes"])
    elif kind == "array":
        item = _value_for(node.get("items") or {}, depth + 1) if depth < 2 else st.just("x")
        sizes = [0, 1, 3]
        if "maxItems" in node:
            sizes += [node["maxItems"], node["maxItems"] + 1]
        typed = st.one_of(st.lists(item, max_size=3),
                          st.builds(lambda v, n: [v] * n, item, st.sampled_from(sizes)))
    elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
        value = _value_for(node["additionalProperties"], depth + 1) if depth < 2 else st.just("v")
        keys = st.one_of(st.sampled_from(_HOSTILE_STRINGS), st.text(max_size=12))
        counts = [0, 1, 2] + ([node["maxProperties"], node["maxProperties"] + 1] if "maxProperties" in node else [])
        typed = st.one_of(st.dictionaries(keys, value, max_size=3),
                          st.builds(lambda v, n: {f"k{i}.example.com/x": v for i in range(n)}, value, st.sampled_from(counts)))
    elif kind == "object":
        props = node.get("properties") or {}
        if props and depth < 2:
            typed = st.fixed_dictionaries({}, optional={k: _value_for(v, depth + 1) for k, v in props.items()})
        else:
            typed = st.just({})
        typed = st.one_of(typed, st.just({"unknownField": 1}))
    else:
        typed = _text()
    return st.one_of(typed, typed, typed, wrong)


def schema_paths(node: dict[str, Any], path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every (path, schema node) under ``node``: properties by name, list items as index 0, map values as key 'k'."""
    out = [(path, node)] if path else []
    for name, sub in (node.get("properties") or {}).items():
        out += schema_paths(sub, path + (name,))
    if isinstance(node.get("items"), dict):
        out += schema_paths(node["items"], path + (0,))
    if isinstance(node.get("additionalProperties"), dict):
        out += schema_paths(node["additionalProperties"], path + ("gpu",))
    return out


def _spec_schema() -> dict[str, Any]:
    crd = next(c for c in all_crds().values() if c["spec"]["names"]["kind"] == "PDDeployment")
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@functools.cache
def examples() -> list[dict[str, Any]]:
    """Every example PDDeployment, named ``diff`` (one name: each verdict is a dry run)."""
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "PDDeployment":
                out.append(doc)
    return out


_MISSING = object()


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set ``doc['spec'][path...]`` to ``value`` (``_MISSING`` deletes it), making parents as needed."""
    node: Any = doc["spec"]
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, list):
            if not node:
                node.append({} if isinstance(nxt, str) else [])
            if not isinstance(node[0], (dict, list)):
                node[0] = {} if isinstance(nxt, str) else []
            node = node[0]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = {} if isinstance(nxt, str) else []
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        if value is _MISSING:
            node.clear()
        elif node:
            node[0] = value
        else:
            node.append(value)
    elif value is _MISSING:
        node.pop(last, None)
    else:
        node[last] = value


def _repeat(doc: dict[str, Any], path: tuple[Any, ...]) -> None:
    """Append a copy of the first item of the list at ``doc['spec'][path...]`` (nothing when it is missing or
    empty): a list item twice, e.g. one env name or one toleration repeated (a fresh user's finding: ``check``
    accepted a repeated env name that the API server refuses in the rendered Deployment)."""
    node: Any = doc["spec"]
    for part in path:
        if isinstance(node, list):
            node = node[0] if node else None
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            return
    if isinstance(node, list) and node:
        node.append(copy.deepcopy(node[0]))


@functools.cache
def _paths_and_values() -> tuple[list[tuple[Any, ...]], dict[tuple[Any, ...], st.SearchStrategy[Any]]]:
    """Every schema path of the spec and its value strategy, built once (building them is the slow part)."""
    found = schema_paths(_spec_schema())
    return [p for p, _ in found], {p: _value_for(node) for p, node in found}


@functools.cache
def _list_paths() -> list[tuple[Any, ...]]:
    """The schema paths of the spec's lists (type array), where a repeated item can go."""
    return [p for p, node in schema_paths(_spec_schema()) if node.get("type") == "array"]


@st.composite
def spec_cases(draw) -> dict[str, Any]:
    """One generated PDDeployment: an example with zero to three fields replaced, removed or added, or a list item repeated."""
    doc = copy.deepcopy(draw(st.sampled_from(examples())))
    doc["metadata"] = {"name": NAME}
    paths, values = _paths_and_values()
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2, 2, 3]))):
        how = draw(st.sampled_from(["value", "value", "value", "value", "remove", "unknown", "repeat"]))
        if how == "repeat":
            _repeat(doc, draw(st.sampled_from(_list_paths())))
            continue
        path = draw(st.sampled_from(paths))
        if how == "remove":
            _set(doc, path, _MISSING)
        elif how == "unknown":
            _set(doc, path[:-1] + ("notAField",) if len(path) > 1 else ("notAField",), draw(_text()))
        else:
            _set(doc, path, copy.deepcopy(draw(values[path])))  # a drawn constant is shared: never edit it in place
    return doc


def generate(n: int, *, seed_value: int) -> list[dict[str, Any]]:
    """``n`` specs, the same ones for the same ``seed_value`` (hypothesis's example generation, seeded)."""
    out: list[dict[str, Any]] = []

    @seed(seed_value)
    @settings(max_examples=n, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), phases=("generate",))
    @given(spec_cases())
    def collect(doc):
        out.append(doc)

    collect()
    return out[:n]


# ------------------------------------------------------------------------------ the judges
@dataclass
class Verdict:
    """One spec's three verdicts and the disagreement class, if any."""

    index: int
    check_ok: bool | None = None  #: None: check crashed
    check_first: str = ""  #: check's first error: "<field>: <message> [rule]"
    check_rules: tuple[str, ...] = ()
    check_fields: tuple[str, ...] = ()
    api_ok: bool | None = None  #: None: not asked (JSON-unencodable) or the API server failed
    api_message: str = ""
    judged_children: bool = True  #: False: the operator's reconcile was not run (``run(children=False)``)
    children: tuple[str, ...] = ()  #: "Kind ns/name" of each child sent with dryRun=All (once each)
    requests: int = 0  #: requests sent with dryRun=All (a new group's workloads go twice)
    not_sent: int = 0  #: status writes and deletes the dry-run client did not send
    child_refused: str = ""
    operator_crash: str = ""
    operator_refused: str = ""  #: the reconcile refused (Valid=False) what check accepted
    stopped: str = ""  #: the reconcile stopped before applying anything: the status reason and message
    check_crash: str = ""

    @property
    def cell(self) -> str:
        if self.check_crash:
            return "check crashed"
        if self.api_ok is None:
            return "API server gave no verdict"
        if self.check_ok and not self.api_ok:
            return "check accepts, API server refuses"
        if not self.check_ok and self.api_ok:
            return "check refuses, API server accepts"
        if not self.check_ok:
            return "both refuse"
        if not self.judged_children:
            return "both accept (children not judged)"
        if self.operator_crash:
            return "operator crashed"
        if self.child_refused:
            return "both accept, a child refused"
        if self.operator_refused:
            return "both accept, the operator refuses"
        if self.stopped:
            return "both accept, reconcile stopped before any child"
        return "both accept, every child accepted"


def check_verdict(doc: dict[str, Any], catalog, v: Verdict) -> None:
    try:
        _, problems = plan_object(copy.deepcopy(doc), catalog)
    except Exception:  # a crash is the finding
        v.check_crash = traceback.format_exc(limit=3)
        return
    errs = [p for p in problems if p.severity == "error"]
    v.check_ok = not errs
    v.check_rules = tuple(p.rule for p in errs)
    v.check_fields = tuple(p.field for p in errs)
    if errs:
        v.check_first = f"{errs[0].field}: {errs[0].message} [{errs[0].rule}]"


def api_verdict(api_client, namespace: str, doc: dict[str, Any], v: Verdict) -> None:
    """The API server's verdict on the PDDeployment: server-side apply, dryRun=All, fieldValidation=Strict."""
    body = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    try:
        data = apply_body(body)
    except (UnicodeEncodeError, ValueError) as e:  # not representable as JSON text: no YAML file can hold it
        v.api_ok, v.api_message = None, f"unencodable: {e}"
        return
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/pddeployments/{NAME}"
    request = api_client.param_serialize(
        "PATCH", path, query_params=[("dryRun", "All"), ("fieldManager", "crd-differential"),
                                     ("fieldValidation", "Strict"), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=data, auth_settings=["BearerToken"])
    try:
        response = api_client.call_api(*request, _request_timeout=30)
        response.read()
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        v.api_ok = True
    except ApiException as e:
        # server-side apply answers 500 "failed to create typed patch object" for an unknown
        # field or a wrong type (the structured-merge-diff type check); kubectl fails on it too
        # 413: a body over the API server's 3 MiB request limit, refused unread (kubectl apply fails on it too)
        if e.status in (400, 413, 422) or "failed to create typed patch object" in server_message(e):
            v.api_ok, v.api_message = False, server_message(e)[:400]
        else:
            v.api_ok, v.api_message = None, f"{e.status}: {server_message(e)[:300]}"


def kubectl_verdict(cluster, namespace: str, doc: dict[str, Any]) -> tuple[bool, str]:
    """``kubectl apply --server-side --dry-run=server`` on the spec as a file: (accepted, stderr)."""
    body = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    res = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=crd-differential",
                          "-f", "-", input=json.dumps(body, ensure_ascii=False), check=False)
    return res.returncode == 0, res.stderr.strip()[:400]


@dataclass(frozen=True)
class Served:
    """The optional APIs the cluster serves, as the operator's ``run`` finds them (discovery)."""

    lws: bool
    cd: bool
    monitoring: bool


def served_apis(kube: Kube) -> Served:
    """What the cluster serves: LeaderWorkerSets, ComputeDomains, PodMonitor and PrometheusRule."""
    return Served(lws=kube.has_kind(lws.API_VERSION, lws.KIND), cd=kube.has_kind(cd.API_VERSION, cd.KIND),
                  monitoring=kube.has_kind(MONITORING_API_VERSION, "PodMonitor")
                  and kube.has_kind(MONITORING_API_VERSION, "PrometheusRule"))


class DryRunKube(Kube):
    """A dry-run ``Kube`` that also keeps the status each reconcile would write (a dry-run client
    sends none): how a reconcile that stopped early (LeaderWorkerSetMissing, ComputeDomainMissing)
    is told from one that applied its children."""

    def __init__(self, api_client) -> None:
        super().__init__(api_client, dry_run=True)
        self.statuses: list[dict[str, Any]] = []

    def patch_status(self, api_version, kind, name, namespace, status, **kw) -> None:
        if kind == "PDDeployment":
            self.statuses.append(status)
        super().patch_status(api_version, kind, name, namespace, status, **kw)


def _reconciled(status: dict[str, Any] | None) -> dict[str, Any]:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == "Reconciled"), {})


def operator_verdict(kube: DryRunKube, namespace: str, doc: dict[str, Any], catalog, v: Verdict, *,
                     served: Served) -> None:
    """The operator's reconcile of an accepted spec on a dry-run client: every child judged by the API server.

    ``served``: what the cluster serves (:func:`served_apis`), passed as the operator passes it.
    """
    from sglang_pd_operator.reconcilers.pddeployment import reconcile

    body = copy.deepcopy(doc)
    body["metadata"] = {**body["metadata"], "namespace": namespace, "uid": "00000000-0000-0000-0000-00000000d1ff",
                        "generation": 1}
    sent, skipped, statuses = len(kube.dry_run_writes), len(kube.dry_run_skipped), len(kube.statuses)
    outcome = None
    try:
        outcome = reconcile(kube=kube, body=body, catalog=catalog, now=time.time(), lws_served=served.lws,
                            cd_served=served.cd, monitoring=served.monitoring)
    except ApiException as e:
        v.child_refused = f"{e.status}: {server_message(e)[:400]}"
    except Exception:
        v.operator_crash = traceback.format_exc(limit=4)
    requests = kube.dry_run_writes[sent:]
    v.requests = len(requests)
    v.children = tuple(dict.fromkeys(r.split(" ", 1)[1] for r in requests))  # "Kind ns/name", once each
    v.not_sent = len(kube.dry_run_skipped) - skipped
    if outcome is None:
        return
    status = kube.statuses[-1] if len(kube.statuses) > statuses else None
    if not outcome.valid:
        problems = [p for p in (status or {}).get("problems") or [] if p.get("severity") == "error"]
        first = problems[0] if problems else {}
        v.operator_refused = f"{first.get('field')}: {first.get('message')} [{first.get('rule')}]"
    elif outcome.decision is None:  # LeaderWorkerSetMissing, ComputeDomainMissing, held for SGLang's verdict
        cond = _reconciled(status)
        v.stopped = f"{cond.get('reason')}: {str(cond.get('message'))[:200]}"
    elif not v.children:
        v.stopped = "nothing applied: " + str(_reconciled(status).get("reason"))


MONITORING_CRD_NAMES = ("podmonitors.monitoring.coreos.com", "prometheusrules.monitoring.coreos.com")


def _kubeconform_schemas():
    """hack/kubeconform/schemas.py (not a package): the pinned Prometheus Operator module's CRDs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kschemas", ROOT / "hack" / "kubeconform" / "schemas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_monitoring_crds(cluster) -> bool:
    """The Prometheus Operator's real PodMonitor and PrometheusRule CRDs (its pinned Go module, v0.85.0:
    their schemas, not the open stand-ins of tests/e2e/fixtures), Established. Returns False when they
    were installed already (then the caller leaves them)."""
    if cluster.kubectl("get", "crd", *MONITORING_CRD_NAMES, check=False).returncode == 0:
        return False
    crds = [c for c in _kubeconform_schemas().prometheus_operator_crds() if c["metadata"]["name"] in MONITORING_CRD_NAMES]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    cluster.kubectl("wait", "--for=condition=Established", *(f"crd/{n}" for n in MONITORING_CRD_NAMES), "--timeout=60s")
    return True


def remove_monitoring_crds(cluster) -> None:
    """Delete the two CRDs again, so later tests meet a cluster without the Prometheus Operator."""
    cluster.kubectl("delete", "crd", *MONITORING_CRD_NAMES, "--ignore-not-found", "--wait=false", check=False)


# ------------------------------------------------------------------------------ classes
def stricter_classes() -> list[dict[str, str]]:
    """The classes where check is stricter than the API server by design (crd_stricter_by_design.yaml)."""
    return yaml.safe_load(STRICTER_BY_DESIGN.read_text())["classes"]


def classify(v: Verdict, classes: list[dict[str, str]]) -> str | None:
    """The name of the first class that explains every error check reported, or None."""
    for cls in classes:
        rule = re.compile(cls.get("rule", ".*"))
        fld = re.compile(cls.get("field", ".*"))
        message = re.compile(cls.get("message", ".*"), re.S)
        if all(rule.fullmatch(r) for r in v.check_rules) and any(fld.fullmatch(f) for f in v.check_fields) \
                and message.search(v.check_first):
            return cls["name"]
    return None


@dataclass
class Matrix:
    """Counts per cell, the classes of disagreement and the first spec index of each."""

    total: int = 0
    cells: Counter = field(default_factory=Counter)
    classes: Counter = field(default_factory=Counter)
    examples: dict[str, tuple[int, int, str]] = field(default_factory=dict)  #: class -> (seed, index, detail)
    children: int = 0  #: children sent with dryRun=All, each object once per spec
    kinds: Counter = field(default_factory=Counter)  #: the same, by kind
    requests: int = 0  #: requests sent with dryRun=All
    not_sent: int = 0  #: status writes and deletes a dry-run client does not send
    served: Served | None = None
    seconds: float = 0.0

    def add(self, v: Verdict, *, seed_value: int, classes: list[dict[str, str]]) -> None:
        self.total += 1
        self.children += len(v.children)
        self.kinds.update(child.split(" ", 1)[0] for child in v.children)
        self.requests += v.requests
        self.not_sent += v.not_sent
        cell = v.cell
        self.cells[cell] += 1
        name = None
        if cell == "check refuses, API server accepts":
            name = classify(v, classes) or f"UNEXPLAINED: {v.check_first[:120]}"
        elif cell in ("check accepts, API server refuses",):
            name = f"FALSE ACCEPT: {v.api_message[:160]}"
        elif cell == "both accept, a child refused":
            name = f"CHILD REFUSED: {v.child_refused[:160]}"
        elif cell in ("check crashed", "operator crashed"):
            name = f"CRASH: {(v.check_crash or v.operator_crash).strip().splitlines()[-1][:160]}"
        elif cell == "API server gave no verdict":
            name = f"NO VERDICT: {v.api_message[:160]}"
        elif cell == "both accept, the operator refuses":
            name = f"OPERATOR REFUSES: {v.operator_refused[:160]}"
        elif cell == "both accept, reconcile stopped before any child":
            name = f"STOPPED: {v.stopped[:160]}"
        if name is not None:
            self.classes[name] += 1
            self.examples.setdefault(name, (seed_value, v.index, v.check_first or v.api_message or v.child_refused
                                            or v.operator_refused or v.stopped))

    def bad(self) -> dict[str, int]:
        """The classes the targets forbid: false accepts, refused children, crashes, unexplained strictness,
        a reconcile that refused what check accepted or stopped before applying a child (not every child judged),
        a spec the API server gave no verdict on (an error other than a refusal: the spec was not judged)."""
        return {k: n for k, n in self.classes.items()
                if k.startswith(("FALSE ACCEPT", "CHILD REFUSED", "CRASH", "UNEXPLAINED", "OPERATOR REFUSES",
                                 "STOPPED", "NO VERDICT"))}

    def render(self) -> str:
        lines = [f"CRD differential: {self.total} specs, {self.children} children dry-run applied, "
                 f"{self.seconds:.0f} s ({self.total / max(self.seconds, 1e-9):.1f} specs/s)"]
        if self.served is not None:
            lines.append(f"  served: LeaderWorkerSet {self.served.lws}, ComputeDomain {self.served.cd}, "
                         f"PodMonitor/PrometheusRule {self.served.monitoring}")
        if self.cells.get("both accept (children not judged)"):  # run(children=False): no reconcile
            cells = ("both accept (children not judged)", "both refuse", "check refuses, API server accepts",
                     "check accepts, API server refuses", "check crashed", "API server gave no verdict")
        else:
            cells = ("both accept, every child accepted", "both refuse", "check refuses, API server accepts",
                     "check accepts, API server refuses", "both accept, a child refused",
                     "both accept, the operator refuses", "both accept, reconcile stopped before any child",
                     "check crashed", "operator crashed", "API server gave no verdict")
        for cell in cells:
            lines.append(f"  {cell:<48} {self.cells.get(cell, 0):>6}")
        if self.served is not None:
            lines.append(f"  children dry-run applied by kind (each object once per spec; {self.requests} requests "
                         f"with dryRun=All; {self.not_sent} status writes and deletes not sent):")
            for kind, n in sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"    {n:>6}  {kind}")
        if self.classes:
            lines.append("  classes (count, seed, spec index):")
            for name, n in self.classes.most_common():
                s, i, _ = self.examples[name]
                lines.append(f"    {n:>5}  seed {s} #{i}  {name}")
        return "\n".join(lines)


def batches(n: int, seed_value: int, batch: int = BATCH):
    """The generated specs as batches: for each, a list of (seed, index, spec), the batch's seed being
    ``seed_value`` + its number."""
    done = 0
    for b in range((n + batch - 1) // batch):
        s = seed_value + b
        yield [(s, i, doc) for i, doc in enumerate(generate(min(batch, n - done), seed_value=s))]
        done += min(batch, n - done)


def run(*, api_client, namespace: str, catalog, n: int = 0, seed_value: int = 0, batch: int = BATCH,
        served: Served | None = None, matrix: Matrix | None = None,
        on_batch: Callable[[Matrix], None] | None = None, children: bool = True, specs=None) -> Matrix:
    """Generate ``n`` specs from ``seed_value`` in batches of ``batch`` (seed + batch number) and judge each.

    ``served``: what the reconcile is told the cluster serves; None asks the cluster (:func:`served_apis`).
    ``children``: False judges with check and the API server only (no reconcile): the "before"
    matrix of benchmarks/bench_crd_differential_before.py, for a commit without a dry-run ``Kube``.
    ``specs``: batches of (seed, index, spec) to judge instead of generating them (:func:`batches`;
    the "before" specs judged by today's check and CRD, ``bench_crd_differential.py --specs``).
    """
    matrix = matrix or Matrix()
    classes = stricter_classes()
    kube = DryRunKube(api_client) if children else None
    if kube is not None:
        matrix.served = served = served or served_apis(kube)
    started = time.monotonic()
    for chunk in (specs if specs is not None else batches(n, seed_value, batch)):
        for s, i, doc in chunk:
            v = Verdict(index=i, judged_children=kube is not None)
            check_verdict(doc, catalog, v)
            if not v.check_crash:
                api_verdict(api_client, namespace, doc, v)
                if v.check_ok and v.api_ok and kube is not None:
                    operator_verdict(kube, namespace, doc, catalog, v, served=served)
            matrix.add(v, seed_value=s, classes=classes)
        matrix.seconds = time.monotonic() - started
        if on_batch is not None:
            on_batch(matrix)
    return matrix


def replay(seed_value: int, index: int, *, batch: int = BATCH) -> dict[str, Any]:
    """The spec of ``seed_value`` #``index`` (a batch's seed is the run's seed + batch number)."""
    return generate(batch, seed_value=seed_value)[index]
