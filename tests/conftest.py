"""Shared fixtures: repository paths, the built-in catalog, example specs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
GB300_EXAMPLE = EXAMPLES / "dsv41-flash-gb300-low-latency.yaml"


def load_example(path: Path = GB300_EXAMPLE) -> dict:
    """The first document of an example file as a dict (a fresh copy every call)."""
    return copy.deepcopy(yaml.safe_load(path.read_text()))


@pytest.fixture(scope="session")
def catalog():
    from sglang_pd_operator.catalog import load_catalog

    return load_catalog()


@pytest.fixture
def gb300_doc() -> dict:
    return load_example()
