"""Shared fixtures: the built-in catalog, example specs."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

import pytest
from helpers import load_example


@pytest.fixture(scope="session")
def catalog():
    from sglang_pd_operator.catalog import load_catalog

    return load_catalog()


@pytest.fixture
def gb300_doc() -> dict:
    return load_example()


# ---------------------------------------------------------------- no silent skips in CI
# hack/test.sh (and so CI) sets SGLANG_PD_OPERATOR_STRICT=1: there every dependency is
# installed, so a test that skips would hide a failure (a missing package, a Go toolchain
# that cannot build, a binary not found). Under strict mode a skip is reported as a
# failure carrying the skip's reason. Locally, without the variable, skips stay skips.
STRICT_ENV = "SGLANG_PD_OPERATOR_STRICT"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    import os

    if os.environ.get(STRICT_ENV) != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under {STRICT_ENV}=1 (CI installs every dependency): {reason}"


# ---------------------------------------------------------------- the slowest files first
# With SGLANG_PD_TEST_WORKERS, hack/test.sh runs pytest-xdist with --dist loadfile
# --no-loadscope-reorder: a worker takes a whole file, in collection order. A file of
# several minutes handed out last runs on alone while the other workers idle, so under
# xdist the files that take minutes go first, slowest first (per-file sums of --durations
# with 3 workers, docs/images.md "CI"); the rest keep pytest's order. One process keeps
# pytest's order throughout.
SLOWEST_FILES = (
    "tests/e2e/test_crd_differential.py",
    "tests/contract/test_oracle_differential.py",
    "tests/e2e/test_cluster.py",
    "tests/e2e/test_sglang_gate.py",
    "tests/e2e/test_autoscale.py",
    "tests/e2e/test_demo.py",
    "tests/e2e/test_operator.py",
    "tests/e2e/test_multinode.py",
    "tests/e2e/test_release_upgrade.py",
    "tests/e2e/test_resilience.py",
    "tests/e2e/test_rollout.py",
    "tests/e2e/test_kueue.py",
    "tests/e2e/test_status_truth.py",
    "tests/e2e/test_bench_scale.py",
    "tests/e2e/test_no_request_lost.py",
    "tests/e2e/test_no_request_lost_rollout.py",
)


def pytest_collection_modifyitems(config, items):
    """Move the items of SLOWEST_FILES to the front, in that order (a stable sort: the
    tests of one file stay together and in their order; every xdist worker sorts alike)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: pytest's own order
        return
    rank = {config.rootpath / path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


# ---------------------------------------------------------------- exclusive tests
# A test marked ``exclusive`` (its timing assertions measure latency on this machine: the
# SLO agreement tests) runs with no other test beside it when pytest-xdist runs several
# workers: every test holds a shared lock from the setup of its fixtures to its teardown,
# an exclusive test the exclusive lock. A second lock, taken briefly by every test before
# the first, lets a waiting exclusive test in before tests that arrive after it (flock
# alone could starve it). The locks are acquired outside pytest-timeout's timer (tryfirst:
# the outermost wrapper), so waiting for another worker's test never counts against a
# test's own timeout. In one process (``-n 0``, a plain pytest) there is nothing to hold.


def _lock_path(config, name: str) -> Path:
    """A lock file shared by the workers of this xdist run: in the run's base temporary
    directory (the parent of each worker's own, which pytest prunes like any other)."""
    try:
        shared = config._tmp_path_factory.getbasetemp().parent
    except AttributeError:
        shared = Path(tempfile.gettempdir())
    return shared / f"xdist-{os.environ['PYTEST_XDIST_TESTRUNUID']}.{name}.lock"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if "PYTEST_XDIST_WORKER" not in os.environ or "PYTEST_XDIST_TESTRUNUID" not in os.environ:
        yield
        return
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(_lock_path(item.config, "gate"), "a") as gate, open(_lock_path(item.config, "run"), "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(run, fcntl.LOCK_UN)
