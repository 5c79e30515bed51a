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


def load_script(path: Path, name: str):
    """The Python file ``path`` (a script under hack/, a test file) as a module named ``name``, loaded by path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rules_table():
    """tests/unit/test_rules_table.py as a module, loaded by path: its CASES, bases and build_doc()."""
    return load_script(ROOT / "tests" / "unit" / "test_rules_table.py", "rules_table_cases")
