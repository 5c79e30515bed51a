"""Helpers shared by the test suites (importable as ``helpers``: pytest's pythonpath has tests/)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GB300_EXAMPLE = EXAMPLES / "dsv41-flash-gb300-low-latency.yaml"


def load_example(path: Path = GB300_EXAMPLE) -> dict:
    """The first document of an example file as a dict (a fresh copy every call)."""
    return copy.deepcopy(yaml.safe_load(path.read_text()))


def with_fields(doc: dict, changes: dict) -> dict:
    """``doc`` with ``spec`` fields set by dotted path (``{"decode.replicas": 2}``); changes ``doc`` and returns it."""
    for path, value in changes.items():
        node = doc["spec"]
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return doc


def merge_patched(old, patch):
    """``old`` with the JSON merge patch ``patch`` applied (RFC 7386: None deletes), e.g. status patches in order."""
    if not isinstance(patch, dict):
        return patch
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patched(out.get(k), v)
    return out


def load_script(path: Path, name: str):
    """The Python file ``path`` (a script under hack/, a test file) as a module named ``name``, loaded by path
    (registered in ``sys.modules`` first: dataclasses look their module up while it loads)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def images_build():
    """hack/images/images.py (the image build: its Dockerfile parser, pins and smoke helpers) as a module."""
    return load_script(ROOT / "hack" / "images" / "images.py", "images_build")


def rules_table():
    """tests/unit/test_rules_table.py as a module, loaded by path: its CASES, bases and build_doc()."""
    return load_script(ROOT / "tests" / "unit" / "test_rules_table.py", "rules_table_cases")


def all_deployments_ready(objects: dict) -> None:
    """Every Deployment in ``objects`` ((kind, name) -> object, as a MemoryKube holds them) rolled
    out and Ready, as the Deployment controller and the kubelet would report it: its status
    observes its generation and counts ``spec.replicas`` (default 1) ready, updated and available."""
    for (kind, _), obj in objects.items():
        if kind == "Deployment":
            n = obj["spec"].get("replicas", 1)
            gen = obj["metadata"].setdefault("generation", 1)
            obj["status"] = {"observedGeneration": gen, "replicas": n, "readyReplicas": n,
                             "updatedReplicas": n, "availableReplicas": n}


class MemoryKube:
    """The reads and writes the reconciler makes, on dicts in memory (no API server)."""

    def __init__(self, objects: list[dict] = ()):
        self.objects = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        self.applied: list[dict] = []
        self.created: list[dict] = []
        self.deleted: list[tuple[str, str]] = []
        self.status: list[dict] = []
        self.events: list[tuple[str, str]] = []
        self.total_writes = 0

    def uncached(self):
        """The same objects: this Kube has no cache."""
        return self

    def get(self, api_version, kind, name, namespace=None):
        return copy.deepcopy(self.objects.get((kind, name)))

    def list(self, api_version, kind, namespace, label_selector):
        want = dict(p.split("=", 1) for p in label_selector.split(",") if "=" in p)
        return [copy.deepcopy(o) for (k, _), o in self.objects.items()
                if k == kind and all((o["metadata"].get("labels") or {}).get(a) == b for a, b in want.items())]

    def apply(self, desired, live=None, *, fetch=True, dry_run=False):
        if dry_run:  # the API server's verdict only: nothing stored
            return True
        self.applied.append(desired)
        self.objects[(desired["kind"], desired["metadata"]["name"])] = copy.deepcopy(desired)
        self.total_writes += 1
        return True

    def create(self, obj):
        if (obj["kind"], obj["metadata"]["name"]) in self.objects:
            return False
        self.created.append(obj)
        self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        self.total_writes += 1
        return True

    def delete(self, api_version, kind, name, namespace):
        self.deleted.append((kind, name))
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, api_version, kind, name, namespace, status, resource_version=None):
        self.status.append(status)
        self.total_writes += 1

    def event(self, involved, *, type_, reason, message):
        self.events.append((reason, message))
