"""Generate CustomResourceDefinitions from the pydantic models in ``api``.

The pydantic JSON schema (draft 2020-12, with ``$ref``/``anyOf``) is turned into a
Kubernetes *structural* OpenAPI v3 schema: references inlined, ``Optional[X]`` unwrapped,
``const`` turned into a one-value ``enum``, exclusive bounds in OpenAPI 3.0 form, titles
and defaults stripped (defaults stay in the operator, so stored objects equal what Git
holds), ``extra="allow"`` models marked ``x-kubernetes-preserve-unknown-fields``.

``crds/*.yaml`` is written by ``python -m sglang_pd_operator.api.crd`` (or
``sglang-pd-operator crds``) and checked in; ``tests/unit/test_crds.py`` fails when it is
stale.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import kernelbuild, rolescale, v1alpha1

_DROP_KEYS = {"title", "default", "examples"}
MAX_NAME_LENGTH = 40
#: Longest PDDeployment name when a role spans nodes. Its LeaderWorkerSet is named
#: ``<name>-<group id>-<role>`` (name + 15), LWS names each group's worker StatefulSet
#: ``<lws>-<group index>`` (+ up to 5 for 1024 replicas), and the StatefulSet controller
#: labels every pod ``controller-revision-hash: <statefulset>-<hash>`` (+ up to 11), a
#: label value of at most 63 characters: 32 + 15 + 5 + 11 = 63.
MAX_MULTI_NODE_NAME_LENGTH = 32


def structural_schema(model: type[BaseModel], *, path: str | None = None) -> dict[str, Any]:
    """Return the structural OpenAPI v3 schema of ``model`` as a plain dict.

    ``path``: where the model's object sits in the custom object (``spec``). When given, a
    ``pattern`` of :data:`v1alpha1.CEL_PATTERN_FORMS` becomes a CEL rule (:func:`pattern_rule`),
    so the API server's error names the field and says the form in words instead of quoting
    the regex. Raises ``ValueError`` when the model uses a construct a structural schema
    cannot express (a union of two object types, say), naming the offending schema.
    """
    raw = model.model_json_schema(mode="validation", ref_template="#/$defs/{model}")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, path, 1)


#: The most a pattern's CEL rule may cost by the API server's static estimate (times how many
#: values it runs on): the API server refuses a rule over 10,000,000 and a CRD whose rules add
#: up to over 100,000,000 (apiextensions-apiserver, StaticEstimatedCostLimit /
#: StaticEstimatedCRDCostLimit). A pattern whose rule would cost more stays a ``pattern``: the
#: extraArgs items and env values (4,096 and 32,768 characters, 256 of each per role).
PATTERN_RULE_COST_BUDGET = 1_000_000


def pattern_rule_cost(max_length: int, pattern: str, cardinality: int) -> int:
    """The API server's static cost estimate of ``self.matches(pattern)`` on a string of at most
    ``max_length`` characters, run on ``cardinality`` values (cel-go's checker: the string's
    traversal cost, 0.1 per byte, times the regex's, 0.25 per character; k8s sizes a string of
    maxLength characters as 4 bytes each). Checked against kube-apiserver v1.36: an extraArgs
    item (4,096 characters, 256 items) comes out at 12.2M here, 1.217 x 10M there."""
    return math.ceil(max_length * 4 * 0.1) * math.ceil(len(pattern) * 0.25) * cardinality


def pattern_rule(field: str, pattern: str) -> dict[str, str]:
    """The CEL rule that replaces ``pattern`` on ``field``: the same RE2 regex (``matches`` is an
    unanchored RE2 search, as ``pattern`` is), with a message naming the field, the form in
    words and the fix."""
    form = v1alpha1.CEL_PATTERN_FORMS[pattern]
    return {"rule": f"self.matches({v1alpha1.cel_string(pattern)})",
            "message": f"{field}: must be {form}; change the value to that form"}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
    merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return merged


def _unwrap_optional(node: dict[str, Any]) -> dict[str, Any]:
    variants = node.get("anyOf")
    if variants is None:
        return node
    non_null = [v for v in variants if v.get("type") != "null"]
    if len(non_null) != 1:
        raise ValueError(f"cannot express a union in a structural schema: {node}")
    out = {k: v for k, v in node.items() if k != "anyOf"}
    return {**non_null[0], **out}


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str | None = None,
             cardinality: int | None = 1) -> dict[str, Any]:
    """``node`` (pydantic's JSON schema) as a structural schema node; ``path`` is the node's field
    path (None: no pattern becomes a CEL rule), ``cardinality`` the most values it can hold in one
    object (None: unbounded, a list or map without a maximum above it)."""
    node = dict(node)
    while "$ref" in node or "anyOf" in node:  # Optional[Model]: anyOf [$ref, null] -> $ref -> Model
        node = _unwrap_optional(_resolve(node, defs))
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out["properties"] = {name: _convert(sub, defs, path and f"{path}.{name}", cardinality)
                                 for name, sub in value.items()}
        elif key == "items":
            bound = node.get("maxItems")
            out["items"] = _convert(value, defs, path and f"{path}[*]",
                                    cardinality * bound if cardinality and bound else None)
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                bound = node.get("maxProperties")
                out["additionalProperties"] = _convert(value, defs, path and f"{path}.*",
                                                       cardinality * bound if cardinality and bound else None)
            # False (extra="forbid"): structural schemas prune unknown fields and
            # kubectl's strict field validation reports them; nothing to emit.
        else:
            out[key] = value
    pattern = out.get("pattern")
    if (path and cardinality and pattern in v1alpha1.CEL_PATTERN_FORMS and "maxLength" in out
            and pattern_rule_cost(out["maxLength"], pattern, cardinality) <= PATTERN_RULE_COST_BUDGET):
        del out["pattern"]
        out["x-kubernetes-validations"] = [pattern_rule(path, pattern), *out.get("x-kubernetes-validations", [])]
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Valid", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Valid")].reason',
         "description": "Why the latest generation is (not) valid: Valid, InvalidSpec, SGLangAccepted, "
                        "AwaitingSGLangVerdict, SGLangRefused ..."},
        {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.replicas"},
        {"name": "Decode", "type": "string", "jsonPath": ".status.decode.replicas"},
        {"name": "Pods", "type": "string", "jsonPath": ".status.pods",
         "description": "Ready/desired engine pods: a replica spanning nodes has one pod per node"},
        {"name": "KV Layout", "type": "string", "jsonPath": ".status.kvLayout"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def pddeployment_crd() -> dict[str, Any]:
    """The PDDeployment CRD (``pdd``) as a dict, from ``PDDeploymentSpec``/``Status``."""
    spec_schema = structural_schema(v1alpha1.PDDeploymentSpec, path="spec")
    status_schema = structural_schema(v1alpha1.PDDeploymentStatus)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    return _crd(
        kind="PDDeployment",
        plural="pddeployments",
        short_names=["pdd"],
        description=v1alpha1.PDDeployment.__doc__ or "",
        spec_schema=spec_schema,
        status_schema=status_schema,
        printer_columns=_printer_columns(),
        extra_rules=[_PDD_MULTI_NODE_NAME_RULE],
    )


def _multi_node(role: str) -> str:
    p = f"self.spec.{role}.parallelism"
    return f"(has(self.spec.{role}) && has({p}) && has({p}.nodes) && {p}.nodes > 1)"


_PDD_MULTI_NODE_NAME_RULE = {
    "rule": f"!({_multi_node('prefill')} || {_multi_node('decode')}) || "
    f"self.metadata.name.size() <= {MAX_MULTI_NODE_NAME_LENGTH}",
    "message": f"metadata.name: at most {MAX_MULTI_NODE_NAME_LENGTH} characters when a role spans nodes "
    "(parallelism.nodes > 1): its LeaderWorkerSet's StatefulSets label their pods with a revision name built from "
    "<name>-<group id>-<role>-<group index>, which Kubernetes limits to 63 characters; choose a shorter name",
}

_PDD_NAME_RULE = {
    "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "message": f"metadata.name: must be a DNS label (lower case letters, digits, '-', starting with a letter) of at "
    f"most {MAX_NAME_LENGTH} characters, since child objects are Services named <name>-<group id>-<role>; "
    "choose such a name",
}


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    spec_schema: dict[str, Any],
    status_schema: dict[str, Any],
    printer_columns: list[dict[str, Any]],
    name_rule: dict[str, str] = _PDD_NAME_RULE,
    extra_rules: list[dict[str, str]] = (),
    subresources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{v1alpha1.GROUP}"},
        "spec": {
            "group": v1alpha1.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["sglang"],
            },
            "versions": [
                {
                    "name": v1alpha1.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources or {"status": {}},
                    "additionalPrinterColumns": printer_columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description.strip(),
                            "required": ["spec"],
                            "x-kubernetes-validations": [dict(name_rule), *(dict(r) for r in extra_rules)],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "API version."},
                                "kind": {"type": "string", "description": "Kind."},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def _kernelbuild_printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Role", "type": "string", "jsonPath": ".spec.role"},
        {"name": "Accelerator", "type": "string", "jsonPath": ".spec.accelerator"},
        {"name": "Digest", "type": "string", "jsonPath": ".status.digest", "priority": 1},
        {"name": "Size", "type": "integer", "jsonPath": ".status.sizeBytes"},
        {"name": "Attempts", "type": "integer", "jsonPath": ".status.attempts"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def _kind_crd(module: Any, model: type[BaseModel], spec_model: type[BaseModel], status_model: type[BaseModel], *,
              printer_columns: list[dict[str, Any]], name_rule: dict[str, str],
              subresources: dict[str, Any] | None = None) -> dict[str, Any]:
    """The CRD of a kind whose module names it (``KIND``, ``PLURAL``, ``SHORT_NAME``): schema from the
    spec and status models (status keeps unknown fields), description from the kind's docstring."""
    status_schema = structural_schema(status_model)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True
    return _crd(
        kind=module.KIND,
        plural=module.PLURAL,
        short_names=[module.SHORT_NAME],
        description=model.__doc__ or "",
        spec_schema=structural_schema(spec_model, path="spec"),
        status_schema=status_schema,
        printer_columns=printer_columns,
        name_rule=name_rule,
        subresources=subresources,
    )


def kernelbuild_crd() -> dict[str, Any]:
    """The KernelBuild CRD (``kb``) as a dict, from ``KernelBuildSpec``/``Status``."""
    return _kind_crd(
        kernelbuild, kernelbuild.KernelBuild, kernelbuild.KernelBuildSpec, kernelbuild.KernelBuildStatus,
        printer_columns=_kernelbuild_printer_columns(),
        name_rule={
            "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
            "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters: the build Jobs are named "
            "<name>-<inputs>-<attempt> and Job names are limited to 63; choose a shorter name",
        },
    )


def _rolescale_printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Current", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Controller", "type": "string", "jsonPath": ".status.controller"},
        {"name": "Applied", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Applied")].reason',
         "description": "Applied, or why the count waits (the PDDeployment's reason: InvalidSpec, SGLangRefused, ...)"},
        {"name": "Selector", "type": "string", "jsonPath": ".status.selector", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def rolescale_crd() -> dict[str, Any]:
    """The PDRoleScale CRD (``pdrs``) with the ``/scale`` subresource, from ``PDRoleScaleSpec``/``Status``.

    ``/scale`` maps ``spec.replicas``, ``status.replicas`` and ``status.selector`` (the string
    form the HPA controller parses), so kubectl scale, HPA and KEDA drive it as a Deployment.
    """
    return _kind_crd(
        rolescale, rolescale.PDRoleScale, rolescale.PDRoleScaleSpec, rolescale.PDRoleScaleStatus,
        printer_columns=_rolescale_printer_columns(),
        name_rule={
            "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH + len('-prefill')}",
            "message": f"metadata.name must be at most {MAX_NAME_LENGTH + len('-prefill')} characters "
            "(<PDDeployment>-<role>); the operator names these objects, do not create them by hand",
        },
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": rolescale.SPEC_REPLICAS_PATH,
                "statusReplicasPath": rolescale.STATUS_REPLICAS_PATH,
                "labelSelectorPath": rolescale.LABEL_SELECTOR_PATH,
            },
        },
    )


def all_crds() -> dict[str, dict[str, Any]]:
    """File name (under ``crds/``) -> CRD dict, for every kind this operator serves."""
    return {"pddeployments.yaml": pddeployment_crd(), "kernelbuilds.yaml": kernelbuild_crd(),
            "pdrolescales.yaml": rolescale_crd()}


def render_yaml(crd: dict[str, Any]) -> str:
    """Serialize one CRD as the checked-in YAML text (stable key order, header comment)."""
    header = "# Generated from sglang_pd_operator.api by `sglang-pd-operator crds`. Do not edit.\n"
    return header + yaml.safe_dump(crd, sort_keys=False, width=120)


def write_crds(directory: Path) -> list[Path]:
    """Write every CRD into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, crd in all_crds().items():
        path = directory / name
        path.write_text(render_yaml(crd))
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    for p in write_crds(Path(__file__).resolve().parents[2] / "crds"):
        print(p)
