"""Benchmark: the CRD differential on 10,000 generated specs (issue 26) -- check vs the real kube-apiserver vs the operator.

Starts a dev cluster (or reuses the one of ``SGLANG_PD_E2E_RUN_DIR``), installs the CRDs
(and the Prometheus Operator's PodMonitor and PrometheusRule, removed again at the end),
then judges ``--n`` specs generated from ``--seed`` (tests/e2e/crd_differential.py): ``check``,
a server-side apply dry run of the PDDeployment (``fieldValidation=Strict``, as ``kubectl
apply --server-side --dry-run=server``), and for the specs both accept the operator's
reconcile on a dry-run client (every child dry-run applied). Prints the matrix after each
batch and at the end, with every class of disagreement, its count and the (seed, index)
that reproduces its first spec (``crd_differential.replay(seed, index)``). Exit 1 when a
target is missed (a crash, a false accept, a refused child, an unexplained refusal).

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_crd_differential.py [--n 10000] [--seed 26000]``.
Reproduce one spec: ``--replay SEED INDEX`` prints it (JSON) and check's verdict; with
``SGLANG_PD_E2E_RUN_DIR`` set (a running dev cluster, the CRDs installed) the API server's and
the operator's verdicts too, and its cell.
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
    p.add_argument("--specs", type=Path, metavar="FILE.jsonl",
                   help="judge these specs ({seed, index, spec} per line, e.g. bench_crd_differential_before.py "
                        "--dump) instead of generating --n of them")
    p.add_argument("--replay", type=int, nargs=2, metavar=("SEED", "INDEX"),
                   help="print one generated spec and its verdicts, then exit")
    a = p.parse_args(argv)
    log = lambda line: print(line, flush=True)  # noqa: E731
    reuse = os.environ.get("SGLANG_PD_E2E_RUN_DIR")
    if a.replay:
        return replay(*a.replay, run_dir=Path(reuse) if reuse else None)
    if reuse:
        cluster, started = devcluster.Cluster.from_run_dir(Path(reuse)), False
    else:
        devcluster.sweep_stale_runs(log=log)
        cluster = devcluster.start_cluster(run_dir=Path(tempfile.mkdtemp(prefix="bench-crd-diff-")) / "cluster", log=log)
        started = True
    try:
        install_crds(cluster, log=log)
        monitoring = diff.install_monitoring_crds(cluster)
        ns = f"crd-diff-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        specs = None
        if a.specs:
            import json

            rows = [json.loads(line) for line in a.specs.read_text().split("\n") if line.strip()]  # not splitlines: NEL, U+2028
            specs = [[(r["seed"], r["index"], r["spec"]) for r in rows[k:k + diff.BATCH]]
                     for k in range(0, len(rows), diff.BATCH)]
        matrix = diff.run(api_client=cluster.api_client(), namespace=ns, catalog=load_catalog(), n=a.n,
                          seed_value=a.seed, specs=specs, on_batch=lambda m: log(f"{m.total} specs, {m.seconds:.0f} s"))
        log(matrix.render())
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if monitoring:
            diff.remove_monitoring_crds(cluster)
        return 1 if matrix.bad() else 0
    finally:
        if started:
            cluster.stop(log=log)


def replay(seed: int, index: int, *, run_dir: Path | None) -> int:
    """Print spec ``seed`` #``index`` and its verdicts: check's; with a cluster, the API server's and the operator's."""
    import json

    doc = diff.replay(seed, index)
    print(json.dumps(doc, ensure_ascii=False, indent=1))
    v = diff.Verdict(index=index)
    catalog = load_catalog()
    diff.check_verdict(doc, catalog, v)
    print(f"check: {'accepts' if v.check_ok else 'refuses'} {v.check_first or v.check_crash}".rstrip())
    if run_dir is None:
        print("(set SGLANG_PD_E2E_RUN_DIR to a running dev cluster for the API server's and the operator's verdicts)")
        return 0
    cluster = devcluster.Cluster.from_run_dir(run_dir)
    install_crds(cluster)
    monitoring = diff.install_monitoring_crds(cluster)
    ns = f"crd-diff-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    try:
        api = cluster.api_client()
        diff.api_verdict(api, ns, doc, v)
        print(f"API server: {'accepts' if v.api_ok else 'refuses' if v.api_ok is False else 'no verdict'} "
              f"{v.api_message}".rstrip())
        if v.check_ok and v.api_ok:
            kube = diff.DryRunKube(api)
            diff.operator_verdict(kube, ns, doc, catalog, v, served=diff.served_apis(kube))
            print(f"operator: {len(v.children)} children dry-run applied: {', '.join(v.children)}")
            for what in (v.child_refused, v.operator_refused, v.stopped, v.operator_crash):
                if what:
                    print(f"operator: {what}")
        print(f"cell: {v.cell}; class: {diff.classify(v, diff.stricter_classes()) or '-'}")
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if monitoring:
            diff.remove_monitoring_crds(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
