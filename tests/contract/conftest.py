"""Fixtures of the contract tests: one SGLang oracle for the whole session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def oracle(catalog):
    """The SGLang oracle (sglang_pd_operator.oracle) with a worker per catalog accelerator.

    Skips when sglang 0.5.23 is not installed, which fails the run under
    SGLANG_PD_OPERATOR_STRICT=1 (tests/conftest.py): CI installs it.
    """
    pytest.importorskip("sglang", reason="sglang==0.5.23 is not installed (requirements/contract.txt)")
    from sglang_pd_operator.oracle import Oracle, unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with Oracle(catalog=catalog, max_workers=len(catalog.accelerators)) as o:
        yield o
