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
