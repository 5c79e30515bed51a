"""Shared fixtures: the built-in catalog, example specs."""

from __future__ import annotations

import pytest
from helpers import load_example


@pytest.fixture(scope="session")
def catalog():
    from sglang_pd_operator.catalog import load_catalog

    return load_catalog()


@pytest.fixture
def gb300_doc() -> dict:
    return load_example()
