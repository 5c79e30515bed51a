"""Benchmark: the CRD differential on 10,000 generated specs (issue 26) -- check vs the real kube-apiserver vs the operator.

Starts a dev cluster (or reuses the one of ``SGLANG_PD_E2E_RUN_DIR``), installs the CRDs,
then judges ``--n`` specs generated from ``--seed`` (tests/e2e/crd_differential.py): ``check``,
a server-side apply dry run of the PDDeployment (``fieldValidation=Strict``, as ``kubectl
apply --server-side --dry-run=server``), and for the specs both accept the operator's
reconcile on a dry-run client (every child dry-run applied). Prints the matrix after each
batch and at the end, with every class of disagreement, its count and the (seed, index)
that reproduces its first spec (``crd_differential.replay(seed, index)``). Exit 1 when a
target is missed (a crash, a false accept, a refused child, an unexplained refusal).

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_crd_differential.py [--n 10000] [--seed 26000]``.
Not a test: tests/e2e/test_crd_differential.py runs 2,000 of the same specs in CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests")]

import crd_differential as diff  # noqa: E402

from sglang_pd_operator.catalog import load_catalog  # noqa: E402
from sglang_pd_operator_dev.cluster import cluster as devcluster  # noqa: E402
from sglang_pd_operator_dev.cluster.demo import install_crds  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10000, help="generated specs (default 10000)")
    p.add_argument("--seed", type=int, default=26000, help="seed of the first batch (default 26000, CI's)")
    a = p.parse_args(argv)
    log = lambda line: print(line, flush=True)  # noqa: E731
    reuse = os.environ.get("SGLANG_PD_E2E_RUN_DIR")
    if reuse:
        cluster, started = devcluster.Cluster.from_run_dir(Path(reuse)), False
    else:
        devcluster.sweep_stale_runs(log=log)
        cluster = devcluster.start_cluster(run_dir=Path(tempfile.mkdtemp(prefix="bench-crd-diff-")) / "cluster", log=log)
        started = True
    try:
        install_crds(cluster, log=log)
        ns = f"crd-diff-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        matrix = diff.run(api_client=cluster.api_client(), namespace=ns, catalog=load_catalog(), n=a.n,
                          seed_value=a.seed, lws_served=True,
                          on_batch=lambda m: log(f"{m.total} specs, {m.seconds:.0f} s"))
        log(matrix.render())
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        return 1 if matrix.bad() else 0
    finally:
        if started:
            cluster.stop(log=log)


if __name__ == "__main__":
    sys.exit(main())
