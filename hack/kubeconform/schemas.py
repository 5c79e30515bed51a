"""JSON schemas for kubeconform, made here because kubeconform cannot download them.

kubeconform looks schemas up by a path template; by default it fetches them from GitHub
(yannh/kubernetes-json-schema), which this environment cannot reach. So they are
generated, in the layout kubeconform's ``-schema-location`` templates expect:

- **Kubernetes kinds** from a running API server's OpenAPI v3 (``/openapi/v3``, one
  document per group-version): the dev cluster's kube-apiserver v1.36.3 is the same
  version the chart targets. Each kind with ``x-kubernetes-group-version-kind`` becomes
  ``<dir>/v<version>-standalone-strict/<kind><suffix>.json``: a ``$ref`` into a local
  ``definitions`` table holding every schema of that group-version (references rewritten,
  so recursive types such as JSONSchemaProps stay finite), with ``additionalProperties:
  false`` wherever properties are declared (kubectl's strict field validation).
- **Custom resources** from CRD manifests (ours in ``crds/``, the Prometheus Operator's
  and LeaderWorkerSet's from their pinned Go modules, see :func:`prometheus_operator_crds`
  and :func:`lws_crds`): each served version's
  ``openAPIV3Schema`` becomes ``<dir>/crds/<group>/<kind>_<version>.json``, strict except
  where the schema says ``x-kubernetes-preserve-unknown-fields``.

Use :func:`kube_schemas` with a callable that GETs a path from the API server, and
:func:`crd_schemas` with CRD dicts; :func:`schema_locations` gives the matching
``-schema-location`` arguments. The conversion follows the rules of kubeconform's own
``openapi2jsonschema.py`` (strict additionalProperties, int-or-string as a union); the
code is ours.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

#: The Prometheus Operator release whose CRD manifests validate ServiceMonitor,
#: PodMonitor and PrometheusRule; the Go checksum of its module pins the content.
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "v0.85.0",
                       "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=")
PROMETHEUS_OPERATOR_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
#: The LeaderWorkerSet release whose CRD validates the operator's multi-node workloads
#: (sglang_pd_operator.api.lws.TESTED_VERSIONS[0]); the Go checksum of its module pins the content.
LWS = ("sigs.k8s.io/lws", "v0.9.0", "h1:DcJCgxjjoGOx//QHZkeKpyiblxYq70aCRZNYSfykWyI=")
LWS_CRD = "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def kind_suffix(api_version: str) -> str:
    """kubeconform's ``{{.KindSuffix}}``: ``apps/v1`` -> ``-apps-v1``, ``v1`` -> ``-v1``,
    ``rbac.authorization.k8s.io/v1`` -> ``-rbac-v1``."""
    parts = api_version.split("/")
    suffix = "-" + parts[0].split(".")[0].lower()
    if len(parts) > 1:
        suffix += "-" + parts[1].lower()
    return suffix


def _strict(node: Any) -> Any:
    """Copy of a schema with additionalProperties false on every object that declares properties."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewrite_refs(v) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        out["$ref"] = "#/definitions/" + ref.rsplit("/", 1)[1]
    return out


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, list):
        for n in node:
            yield from _refs(n)
    elif isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref[len("#/definitions/"):]
        for v in node.values():
            yield from _refs(v)


def _reachable(name: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The definitions ``name`` refers to, transitively (itself included)."""
    seen: dict[str, Any] = {}
    todo = [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in defs:
            continue
        seen[n] = defs[n]
        todo.extend(_refs(defs[n]))
    return seen


def kube_schemas(get_json: Callable[[str], dict[str, Any]], out_dir: Path, *, version: str) -> int:
    """Write a standalone strict schema per Kubernetes kind served by the API server; returns how many.

    ``get_json(path)`` GETs ``path`` (e.g. ``/openapi/v3``) and returns the parsed JSON;
    ``version`` (``1.36.3``) names the folder as kubeconform's ``-kubernetes-version``.
    """
    target = out_dir / f"v{version}-standalone-strict"
    target.mkdir(parents=True, exist_ok=True)
    written = 0
    index = get_json("/openapi/v3")
    for path in sorted(index["paths"]):
        if not (path == "api/v1" or (path.startswith("apis/") and path.count("/") == 2)):
            continue
        doc = get_json("/openapi/v3/" + path)
        defs = {name: _strict(_rewrite_refs(schema)) for name, schema in doc.get("components", {}).get("schemas", {}).items()}
        for name, schema in defs.items():
            for gvk in schema.get("x-kubernetes-group-version-kind") or []:
                api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                if path != ("api/v1" if not gvk["group"] else f"apis/{gvk['group']}/{gvk['version']}"):
                    continue  # e.g. DeleteOptions, listed under every group-version
                standalone = {"$ref": f"#/definitions/{name}", "definitions": _reachable(name, defs)}
                file = target / f"{gvk['kind'].lower()}{kind_suffix(api_version)}.json"
                file.write_text(json.dumps(standalone))
                written += 1
    return written


def crd_schemas(crds: Iterable[dict[str, Any]], out_dir: Path) -> list[str]:
    """Write ``crds/<group>/<kind>_<version>.json`` for every served version of every CRD; returns the GVKs."""
    written = []
    for crd in crds:
        spec = crd["spec"]
        kind, group = spec["names"]["kind"], spec["group"]
        for version in spec["versions"]:
            if not version.get("served"):
                continue
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            props = schema.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            target = out_dir / "crds" / group
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{kind.lower()}_{version['name']}.json").write_text(json.dumps(_strict(schema)))
            written.append(f"{group}/{version['name']}/{kind}")
    return written


def schema_locations(out_dir: Path) -> list[str]:
    """``-schema-location`` values for :func:`kube_schemas` and :func:`crd_schemas` output (no network)."""
    return [
        f"{out_dir}/{{{{.NormalizedKubernetesVersion}}}}-standalone{{{{.StrictSuffix}}}}/{{{{.ResourceKind}}}}{{{{.KindSuffix}}}}.json",
        f"{out_dir}/crds/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json",
    ]


def go_module_dir(module: str, version: str, pinned: str) -> Path:
    """The module cache folder of ``module@version``, fetched by ``go mod download`` when missing.

    The download goes through GOPROXY and is checked against the Go checksum database;
    its sum must also equal ``pinned``. Raises RuntimeError naming the module otherwise.
    """
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "go.mod").write_text("module schemas\n\ngo 1.26\n")
        env = {**os.environ, "GOFLAGS": "-mod=mod"}
        proc = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=tmp, env=env,
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"go mod download {module}@{version} failed: {proc.stdout}{proc.stderr}")
    info = json.loads(proc.stdout)
    if info.get("Sum") != pinned:
        raise RuntimeError(f"{module}@{version} has sum {info.get('Sum')}, pinned {pinned}")
    return Path(info["Dir"])


def prometheus_operator_crds() -> list[dict[str, Any]]:
    """The ServiceMonitor, PodMonitor and PrometheusRule CRDs of the pinned Prometheus Operator module."""
    folder = go_module_dir(*PROMETHEUS_OPERATOR) / "example" / "prometheus-operator-crd"
    return [yaml.safe_load((folder / f"monitoring.coreos.com_{name}.yaml").read_text()) for name in PROMETHEUS_OPERATOR_CRDS]


def lws_crds() -> list[dict[str, Any]]:
    """The LeaderWorkerSet CRD of the pinned LWS module (the schema its API server validates against)."""
    return [yaml.safe_load((go_module_dir(*LWS) / LWS_CRD).read_text())]
