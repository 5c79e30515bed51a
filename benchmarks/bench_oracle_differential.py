"""Benchmark: the oracle differential over a larger generated corpus.

Not a test (no assertion). Generates ``--n`` distinct PDDeployments with
tests/oracle_corpus.py (``--seed``; the CI test uses 2,000 with seed 13), plans each with
the operator's rules and judges it with SGLang 0.5.23's oracle (one worker per emulated
accelerator), then prints:

- the confusion matrix (operator accepts / refuses x SGLang accepts / refuses /
  indeterminate, with the schema-refused, oracle-error and planning-error counts) and the
  distinct false-accept reasons and false-refuse rules (tests/contract/oracle_differential.py);
- specs per second, time in planning and in the oracle, and each oracle worker's start time;
- with ``--examples N``, the smallest spec of each of the N largest false-accept groups as
  YAML with SGLang's refusals; ``--report FILE`` writes the matrix and those examples there.

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_oracle_differential.py [--n 10000]
[--seed 13] [--examples 10] [--report .run/oracle-differential-bench.txt] [--progress 1000]``.
Needs sglang==0.5.23 (requirements/contract.txt).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "contract")]
import oracle_corpus  # noqa: E402
import oracle_differential as diff  # noqa: E402

from sglang_pd_operator.catalog import builtin_catalog  # noqa: E402
from sglang_pd_operator.oracle import Oracle, unavailable  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="generated specs (distinct), default 10000")
    ap.add_argument("--seed", type=int, default=13, help="generator seed, default 13 (the CI seed)")
    ap.add_argument("--examples", type=int, default=10, help="print the smallest spec of this many false-accept groups")
    ap.add_argument("--report", type=Path, default=None, help="also write the matrix and examples to this file")
    ap.add_argument("--depth", choices=("startup", "args"), default="startup",
                    help="how far each role's startup runs: startup (model build, memory planning; default) or args "
                         "(the CI gate's depth, which then judges every spec both accept again at startup)")
    ap.add_argument("--threads", type=int, default=2, help="specs judged at once (default 2: the CI machine's cores)")
    ap.add_argument("--progress", type=int, default=1000, help="print a progress line every this many specs (0: never)")
    args = ap.parse_args(argv)

    why = unavailable()
    if why is not None:
        print(f"the oracle cannot run: {why}", file=sys.stderr)
        return 2
    catalog = builtin_catalog()
    t0 = time.monotonic()
    docs = [("generated", d) for d in oracle_corpus.corpus(args.n, seed=args.seed)]
    t_gen = time.monotonic() - t0
    print(f"generated {len(docs)} distinct specs (seed {args.seed}) in {t_gen:.1f} s", flush=True)

    start = time.monotonic()

    def progress(i: int, row: diff.Row) -> None:
        if args.progress and (i + 1) % args.progress == 0:
            el = time.monotonic() - start
            print(f"  {i + 1}/{len(docs)} judged, {el:.0f} s, {(i + 1) / el:.1f} specs/s", flush=True)

    with Oracle(catalog=catalog, max_workers=len(catalog.accelerators), depth=args.depth) as oracle:
        rows = diff.judge_corpus(docs, oracle, catalog, progress=progress, threads=args.threads)
        wall = time.monotonic() - start
        starts = list(oracle.pool.started_s)
    timing = diff.Timing(len(rows), wall, sum(r.seconds for r in rows), starts)
    matrix = diff.confusion_matrix(rows, limit=40)
    print()
    print(matrix)
    print(timing.line())
    planning = wall - timing.oracle_seconds
    print(f"planning (operator rules) {planning:.1f} s = {1000 * planning / max(1, len(rows)):.1f} ms/spec; "
          f"oracle {1000 * timing.oracle_seconds / max(1, len(rows)):.1f} ms/spec")
    examples = diff.examples_report(rows, limit=args.examples) if args.examples else ""
    if examples:
        print("\nSmallest example of each false-accept group:\n")
        print(examples)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(matrix + "\n" + timing.line() + "\n\n" + examples + "\n")
        print(f"\nwritten to {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
