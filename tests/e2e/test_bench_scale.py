"""benchmarks/bench_scale.py runs, end to end, at N = 3 (so the benchmark cannot rot).

The benchmark starts its own dev clusters (its node pools and an audit-logging API server,
which the session's ``cluster`` fixture has neither of), a plain-client floor and the
operator of this checkout. Asserted: every phase produced its figures, and the audit log
attributes requests to the operator's own identity (its writes while converging, its
Lease renewals at rest). No assertion on time: figures are printed (docs/scale.md).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from helpers import ROOT

pytestmark = pytest.mark.e2e


def _bench():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through the module
    spec.loader.exec_module(module)
    return module


def test_bench_scale_runs_at_n3(tmp_path, cluster_log):
    bench = _bench()
    lines: list[str] = []
    [res] = bench.main(["--n", "3", "--unrelated", "12", "--rest", "6", "--settle", "2", "--edits", "2",
                        "--edit-gap", "0.2", "--ready-timeout", "240", "--json", str(tmp_path / "out.jsonl")],
                       log=lines.append)
    for line in lines:
        cluster_log(line)
    assert res.plain_s is not None and res.operator_s is not None, lines
    assert res.ready_count == 3 and res.ratio is not None
    assert res.converge_requests.get("patch", 0) >= 3 * 4, res.converge_requests  # its server-side applies
    assert sum(res.rest_lease_per_min.values()) > 0, "the audit log attributes nothing to the operator at rest"
    assert len(res.reactions_s) == 2 and res.edits_missed == 0, res.reactions_s  # both edits reached status
    assert res.operator_rss_mb > 0 and res.apiserver_rss_mb > 0
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 1
    assert any("ratio" in line for line in lines)
