"""Read PDDeployment objects from YAML or dicts, turning validation errors into field-named problems.

Used by the CLI (``check``, ``render``) and by the reconciler on the object it receives.
The CRD schema refuses most of these errors at ``kubectl apply`` already; this is the
same check for files that never went through an API server (GitOps pre-merge checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import difflib
import re

import yaml
from pydantic import ValidationError

from .cel import violations
from .crd import MAX_NAME_LENGTH
from .structural import StructuralError, structural_errors

from .v1alpha1 import API_VERSION, GROUP, PATTERN_FORMS, PDDeployment


@dataclass(frozen=True)
class FieldError:
    """A schema or CEL error: the field path (``spec.decode.parallelism.tp``), the message and the fix."""

    field: str
    message: str
    fix: str = ""


class SpecError(ValueError):
    """The object does not match the v1alpha1 schema; ``errors`` lists every field error."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))


def _path(loc: Iterable[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def as_api_server_reads(value: Any) -> Any:
    """``value`` as the API server holds it after decoding: whole floats as integers (JSON
    has one number type: ``tp: 8.0`` is the integer 8). Nulls stay: the CRD declares no
    field nullable, and a server-side apply (``kubectl apply --server-side``) of a field
    set to null is refused ("must be of type boolean"), so ``check`` refuses them too
    (``api/structural.py``). Returns a copy."""
    if isinstance(value, dict):
        return {k: as_api_server_reads(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_api_server_reads(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: Top-level fields of a custom object, and the ObjectMeta fields (metav1.ObjectMeta).
TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
OBJECT_META_FIELDS = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
)
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _envelope_errors(obj: dict[str, Any]) -> list[FieldError]:
    """Unknown top-level and metadata fields, and labels/annotations the API server refuses
    (strict field validation and ObjectMeta validation, as ``kubectl apply`` meets them)."""
    out = []
    for key in obj:
        if key not in TOP_LEVEL_FIELDS:
            close = difflib.get_close_matches(str(key), TOP_LEVEL_FIELDS, n=1, cutoff=0.6)
            out.append(FieldError(str(key), "unknown field", f"did you mean {close[0]}?" if close else "remove it"))
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return out
    for key in meta:
        if key not in OBJECT_META_FIELDS:
            close = difflib.get_close_matches(str(key), OBJECT_META_FIELDS, n=1, cutoff=0.6)
            out.append(FieldError(f"metadata.{key}", "unknown field",
                                  f"did you mean metadata.{close[0]}?" if close else "remove it"))
    for field in ("labels", "annotations"):
        entries = meta.get(field) or {}
        if not isinstance(entries, dict):
            out.append(FieldError(f"metadata.{field}", "must be a map of strings to strings", "write key: value pairs"))
            continue
        for k, v in entries.items():
            if not isinstance(v, str):
                out.append(FieldError(f"metadata.{field}.{k}", f"value must be a string (got {v!r})", "quote the value"))
            elif field == "labels" and not _LABEL_VALUE.match(v):
                out.append(FieldError(f"metadata.labels.{k}", f"invalid label value {v!r}",
                                      "use at most 63 letters, digits, '-', '_' or '.', starting and ending "
                                      "with a letter or digit"))
            if not _LABEL_KEY.match(str(k)):
                out.append(FieldError(f"metadata.{field}.{k}", f"invalid key {k!r}",
                                      "use an optional DNS prefix and '/', then a name of letters, digits, '-', "
                                      "'_' or '.' (at most 63), starting and ending with a letter or digit"))
    return out


OTHER_KINDS_OF_THE_GROUP = ("KernelBuild",)


def meant_as_pddeployment(obj: dict[str, Any]) -> bool:
    """Whether ``obj`` is (or was meant to be) a PDDeployment, rather than another object
    that shares a file with it (a Namespace, a PVC, a KernelBuild): its API group is ours,
    its kind is close to ``PDDeployment``, or it names neither apiVersion nor kind.
    ``check`` skips the other objects and checks these."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    if kind in OTHER_KINDS_OF_THE_GROUP:
        return False
    if not api_version and not kind:
        return True
    return api_version.split("/")[0] == GROUP or bool(difflib.get_close_matches(kind, ["PDDeployment"], cutoff=0.75))


def _type_errors(obj: dict[str, Any]) -> list[FieldError]:
    """apiVersion and kind problems, each with the value to set."""
    out = []
    if obj.get("apiVersion") != API_VERSION:
        got = obj.get("apiVersion")
        out.append(FieldError("apiVersion", "required field is missing" if got is None else
                              f"{got!r} is not served by this operator", f"set apiVersion: {API_VERSION}"))
    if obj.get("kind") != "PDDeployment":
        got = obj.get("kind")
        out.append(FieldError("kind", "required field is missing" if got is None else f"{got!r} is not PDDeployment",
                              "set kind: PDDeployment"))
    return out


def parse_pddeployment(obj: dict[str, Any]) -> PDDeployment:
    """Validate one object (a dict as read from YAML or the API) as a PDDeployment.

    The object is first read as the API server holds it (:func:`as_api_server_reads`);
    then apiVersion/kind, the envelope (top-level and metadata fields, labels), a
    ``metadata.name``, and the spec with the structural schema's strict types; then the
    generated CRD schema itself (``api/structural.py``: the keywords pydantic does not
    enforce, as ``maxProperties``, Go's regex and integer semantics) for fields pydantic
    found no fault with. Raises :class:`SpecError` with one :class:`FieldError` per
    problem; paths start at the object's root (``spec.kvLayout.pageSize``). The CRD's CEL
    rules are checked by :func:`rule_violations`.
    """
    obj = as_api_server_reads(obj)
    problems = _type_errors(obj)
    if problems:
        raise SpecError(problems)
    problems = _envelope_errors(obj)
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        problems.append(FieldError("metadata.name", "required field is missing",
                                   f"add metadata.name: a DNS label of at most {MAX_NAME_LENGTH} characters"))
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        # strict: no "64" for an integer, no "yes" for a boolean, no 2.5 for replicas, as
        # the API server's structural schema refuses them (pydantic would convert them)
        pdd = PDDeployment.model_validate(body, strict=True)
    except ValidationError as e:
        problems += [_field_error(err) for err in e.errors()]
    reported = {p.field for p in problems}
    problems += [_structural_error(err) for err in structural_errors(body)
                 if not any(err.field == f or err.field.startswith(f + ".") or err.field.startswith(f + "[")
                            for f in reported)]
    if problems:
        raise SpecError(problems)
    return pdd


def _structural_error(err: StructuralError) -> FieldError:
    """A structural schema error as a field error; a pattern's fix in words (as pydantic's)."""
    if err.pattern is None or not err.field.startswith("spec"):
        return FieldError(err.field, err.message, err.fix)
    loc: list[Any] = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]\.?", err.field) if p]
    explain = f"`kubectl explain pdd.{err.field}`"
    return FieldError(err.field, err.message, _pattern_fix(loc, {"ctx": {"pattern": err.pattern}}, explain))


def _schema_at(loc: list[Any]) -> dict[str, Any]:
    """The structural schema node at ``loc`` (a pydantic error location under ``spec``)."""
    from .crd import structural_schema
    from .v1alpha1 import PDDeploymentSpec

    node: dict[str, Any] = {"properties": {"spec": structural_schema(PDDeploymentSpec)}}
    for part in loc:
        if isinstance(part, int):
            node = node.get("items") or {}
        else:
            node = (node.get("properties") or {}).get(str(part)) or node.get("additionalProperties") or {}
    return node


def _unknown_field_fix(loc: list[Any]) -> str:
    """For an unknown field: the allowed field it most likely means (a close spelling at the
    same level, or the same name one level down, as ``spec.extraArgs`` for
    ``spec.decode.extraArgs``), else "remove it"."""
    parent, name = _path(loc[:-1]), str(loc[-1])
    node = _schema_at(loc[:-1]) if loc and loc[0] == "spec" else {}
    fields = node.get("properties") or {}
    close = difflib.get_close_matches(name, sorted(fields), n=1, cutoff=0.6)
    if close:
        return f"did you mean {parent}.{close[0]}?"
    below = [f"{parent}.{child}.{name}" for child, sub in fields.items() if name in (sub.get("properties") or {})]
    if below:
        return f"did you mean {', '.join(below[:-1]) + ' or ' if len(below) > 1 else ''}{below[-1]}?"
    return f"remove it; see `kubectl explain pdd.{parent}`" if parent else "remove it"


def _type_fix(err: dict[str, Any]) -> str | None:
    """The fix for a value of the wrong YAML type, or None for other errors."""
    got, kind = err.get("input"), err["type"]
    if kind == "string_type" and isinstance(got, (int, float, bool)):
        read_as = "a boolean" if isinstance(got, bool) else "a number"
        return f"quote the value: YAML reads {got!r} as {read_as}, the field is a string"
    if kind == "int_type" and isinstance(got, str):
        return f"write a number without quotes: {got}" if got.strip().lstrip("-").isdigit() else "write a whole number"
    if kind == "int_type" and isinstance(got, float):
        return "write a whole number"
    if kind == "bool_type":
        return "write true or false"
    if kind == "float_type" and isinstance(got, str):
        return "write a number without quotes"
    return None


def _field_error(err: dict[str, Any]) -> FieldError:
    """One pydantic error as a field error whose fix says what to do."""
    loc = [p for p in err["loc"] if p not in ("function-after",)]
    path = _path(loc)
    explain = f"`kubectl explain pdd.{path}`" if path.startswith("spec") else "`kubectl explain pdd`"
    if err["type"] == "extra_forbidden":
        return FieldError(path, "unknown field", _unknown_field_fix(loc))
    if err["type"] == "missing":
        return FieldError(path, "required field is missing", f"add {path} (see {explain})")
    got = err.get("input")
    if got is None and "input" in err:
        return FieldError(path, "must not be null (kubectl apply --server-side refuses a null field)",
                          "remove the field or give it a value")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) else ""
    if err["type"] == "string_pattern_mismatch" and loc and loc[0] == "spec":
        return FieldError(path, f"{got!r} is not of the form this field takes", _pattern_fix(loc, err, explain))
    if err["type"] == "value_error":  # our validators' messages: "<what>; <fix>"
        what, sep, fix = str(err["msg"]).removeprefix("Value error, ").rpartition("; ")
        if sep:
            return FieldError(path, what, fix)
    if err["type"] == "literal_error" and isinstance(got, str):
        return FieldError(path, f"{err['msg']}{shown}", _enum_fix(loc, got, explain))
    return FieldError(path, f"{err['msg']}{shown}", _type_fix(err) or f"see {explain} for the allowed values")


def _pattern_fix(loc: list[Any], err: dict[str, Any], explain: str) -> str:
    """For a string that fails its pattern: the field's own description (what it takes, with
    an example), then the pattern itself for the exact grammar."""
    pattern = (err.get("ctx") or {}).get("pattern")
    if pattern in PATTERN_FORMS:
        return f"write {PATTERN_FORMS[pattern]}"
    described = (_schema_at(loc).get("description") or "").strip().rstrip(".")
    grammar = f" (the pattern is {pattern})" if pattern else ""
    if described:
        return f"the field takes: {described}{grammar}"
    return f"see {explain}{grammar}"


def _enum_fix(loc: list[Any], got: str, explain: str) -> str:
    """For a value outside an enum: the allowed value it most likely means (case or a close
    spelling, as ``flashmla-mega`` for ``flashmla_mega``), else where the values are listed."""
    allowed = [str(v) for v in (_schema_at(loc).get("enum") or [])]
    same_case = [v for v in allowed if v.lower() == got.lower().replace("-", "_")
                 or v.lower() == got.lower().replace("_", "-")]
    close = same_case or difflib.get_close_matches(got, allowed, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"see {explain} for the allowed values"


def rule_violations(obj: dict[str, Any]) -> list[FieldError]:
    """The CRD's CEL rules ``obj`` breaks (api/cel.py), as field errors with the rule's fix.

    ``parse_pddeployment`` checks the schema; this checks the rules the API server
    evaluates on top of it, so offline ``check`` refuses what ``kubectl apply`` would.
    """
    body = {k: v for k, v in as_api_server_reads(obj).items() if k != "status"}
    return [FieldError(v.field, *_split_rule_message(v.field, v.message)) for v in violations(body)]


def _split_rule_message(field: str, message: str) -> tuple[str, str]:
    """A CEL message (written for kubectl: "<field>: <what>; <fix>") as (what, fix)."""
    head, colon, rest = message.partition(": ")
    if colon and " " not in head and (field == head or field.endswith("." + head)):
        message = rest  # the message names its field for kubectl; the problem names it already
    what, sep, fix = message.rpartition("; ")
    return (what, fix) if sep else (message, "change the field as the message says")


class _KubectlYAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading plain scalars as kubectl does (sigs.k8s.io/yaml on
    go-yaml): ``3e5`` and ``1e-3`` are numbers there and a lone ``y``/``n`` is a boolean,
    all strings in PyYAML's YAML 1.1 rules, so an unquoted ``revision: 3e5`` must be
    refused here as the API server refuses it."""

    yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def construct_document(self, node: yaml.Node) -> Any:
        """Refuse a document whose aliases expand it past :data:`MAX_EXPANDED_NODES` before
        building it (a "billion laughs" file grew ``check`` to 3 GB; kubectl refuses it with
        "document contains excessive aliasing")."""
        expanded = _expanded_nodes(node, MAX_EXPANDED_NODES)
        if expanded > MAX_EXPANDED_NODES:
            raise yaml.YAMLError(
                f"document contains excessive aliasing: more than {MAX_EXPANDED_NODES:,} nodes once its aliases are "
                "expanded (or an alias that contains itself); write the values out instead of aliasing them")
        return super().construct_document(node)


#: Nodes one document may have with its aliases expanded; a PDDeployment has a few hundred.
MAX_EXPANDED_NODES = 100_000


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """Nodes under ``root`` counting an aliased node at every place it is used, in time linear
    in the distinct nodes (each node's expanded size is computed once); ``limit + 1`` as soon
    as the count passes ``limit`` or a node contains itself (a recursive alias)."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1
            for child in _children(node):
                total += size[id(child)]
                if total > limit:
                    return limit + 1
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            return limit + 1
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                return limit + 1
            if id(child) not in size:
                stack.append((child, False))
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return loader.construct_scalar(node).lower() in ("y", "yes", "true", "on")


_KubectlYAMLLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
for _first in "yYnN":  # go-yaml also reads a lone y / n as a boolean
    _KubectlYAMLLoader.yaml_implicit_resolvers.setdefault(_first, []).insert(
        0, ("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"))
    )
for _first in "-+0123456789.":
    _KubectlYAMLLoader.yaml_implicit_resolvers.setdefault(_first, []).insert(
        0, ("tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"))
    )


def load_documents(text: str) -> list[dict[str, Any]]:
    """Every object of ``text`` as a dict: each YAML document, with ``kind: List`` (or
    ``...List``, as ``kubectl get -o yaml`` prints) expanded into its items.

    Raises ``yaml.YAMLError`` on bad YAML, on a document that is not a mapping, and when
    there is no object at all (an empty file is not a valid deployment).
    """
    docs: list[dict[str, Any]] = []
    for d in yaml.load_all(text, Loader=_KubectlYAMLLoader):
        if d is None:
            continue
        if not isinstance(d, dict):
            raise yaml.YAMLError(f"expected a mapping, got {type(d).__name__}")
        if str(d.get("kind", "")).endswith("List") and isinstance(d.get("items"), list):
            if not d["items"]:
                raise yaml.YAMLError(f"the {d['kind']} has no items")
            docs += [i for i in d["items"] if isinstance(i, dict)]
        else:
            docs.append(d)
    if not docs:
        raise yaml.YAMLError("no object in the input (empty, or only comments)")
    return docs
