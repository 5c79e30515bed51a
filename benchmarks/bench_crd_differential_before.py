"""The CRD differential's "before" matrix: check and the CRD of an older commit, judged by today's harness.

Issue 26's five hostile specs were fixed (f437b43) before the differential existed, so no
matrix was recorded before them. This script runs today's generator and judges
(tests/e2e/crd_differential.py) against an older tree: its package (``check``: its
``plan_object`` and catalog), its examples (the specs are drawn from them and from its CRD
schema) and its CRDs (installed in a fresh dev cluster without LeaderWorkerSet, IMEX or the
oracle). Only two judges run, ``check`` and the API server: the operator's reconcile needs a
dry-run ``Kube``, which older commits lack, so the "both accept" cell is not split by children.

Run, from this checkout (the tree of the commit before the five fixes, f437b43^ = 13f4809)::

    git archive 13f4809 | (mkdir -p /tmp/before26 && tar -x -C /tmp/before26)
    PYTHONSAFEPATH=1 nice .venv/bin/python benchmarks/bench_crd_differential_before.py \\
        --source /tmp/before26 --n 2000 --seed 26000

A class is reproduced by (seed, index) with the same script's ``--replay SEED INDEX`` (it
prints the spec as generated from the older tree). ``--dump FILE`` writes the generated specs
instead, for ``bench_crd_differential.py --specs FILE`` to judge them as they are judged today
(the same specs, before and after). Not a test.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import tempfile
import types
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _use_old_package(source: Path) -> Path:
    """Put the older tree's package first on sys.path (operator/ as sglang_pd_operator, kernels/ inside it,
    as its pyproject's package-dir maps them), with the two names today's harness imports that it lacks."""
    pkg_root = Path(tempfile.mkdtemp(prefix="before26-pkg-"))
    shutil.copytree(source / "operator", pkg_root / "sglang_pd_operator")
    shutil.copytree(source / "kernels", pkg_root / "sglang_pd_operator" / "kernels", dirs_exist_ok=True)
    sys.path.insert(0, str(pkg_root))
    for name in [m for m in sys.modules if m.startswith("sglang_pd_operator")]:
        del sys.modules[name]
    kube = importlib.import_module("sglang_pd_operator.reconcilers.kube")
    if not hasattr(kube, "apply_body"):  # today's: JSON as UTF-8 (kube.apply_body); the API judge's body only
        kube.apply_body = lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    try:
        importlib.import_module("sglang_pd_operator.api.computedomain")
    except ImportError:  # only named by the operator judge, which this script does not run
        stub = types.ModuleType("sglang_pd_operator.api.computedomain")
        stub.API_VERSION, stub.KIND = "resource.nvidia.com/v1beta1", "ComputeDomain"
        sys.modules[stub.__name__] = stub
    loaded = importlib.import_module("sglang_pd_operator")
    assert Path(loaded.__file__).resolve().is_relative_to(pkg_root), loaded.__file__
    return pkg_root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, required=True, help="the older commit's tree (git archive)")
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seed", type=int, default=26000)
    p.add_argument("--replay", type=int, nargs=2, metavar=("SEED", "INDEX"), help="print one spec and exit")
    p.add_argument("--dump", type=Path, metavar="FILE.jsonl",
                   help="write the --n specs generated from the older tree ({seed, index, spec} per line) and exit; "
                        "bench_crd_differential.py --specs judges them with today's check, CRD and reconcile")
    a = p.parse_args(argv)
    source = a.source.resolve()
    _use_old_package(source)
    sys.path[:0] = [str(ROOT / "tests" / "e2e"), str(ROOT / "tests")]
    import crd_differential as diff

    diff.EXAMPLES = source / "examples"
    diff.examples.cache_clear()
    if a.replay:
        print(json.dumps(diff.replay(*a.replay), ensure_ascii=False, indent=1))
        return 0
    if a.dump:
        with a.dump.open("w") as out:
            for chunk in diff.batches(a.n, a.seed):
                for s, i, doc in chunk:
                    out.write(json.dumps({"seed": s, "index": i, "spec": doc}, ensure_ascii=False) + "\n")
        return 0

    from sglang_pd_operator.catalog import load_catalog
    from sglang_pd_operator_dev.cluster import cluster as devcluster

    log = lambda line: print(line, flush=True)  # noqa: E731
    cluster = devcluster.start_cluster(run_dir=Path(tempfile.mkdtemp(prefix="bench-crd-before-")) / "cluster",
                                       log=log, lws=False, imex_channels=False, oracle=False)
    try:
        for crd in sorted((source / "crds").glob("*.yaml")):
            cluster.kubectl("apply", "--server-side", "-f", str(crd))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        ns = f"crd-before-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        matrix = diff.run(api_client=cluster.api_client(), namespace=ns, catalog=load_catalog(), n=a.n,
                          seed_value=a.seed, children=False,
                          on_batch=lambda m: log(f"{m.total} specs, {m.seconds:.0f} s"))
        log(matrix.render())
        return 0
    finally:
        cluster.stop(log=log)


if __name__ == "__main__":
    sys.exit(main())
