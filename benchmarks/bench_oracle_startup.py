"""Benchmark: the SGLang oracle's startup stages, per accelerator and per role.

Not a test (no assertion). For each example of examples/ (grouped by accelerator), it
measures with a fresh oracle:

- the first spec on each accelerator: the worker's start (importing SGLang on the emulated
  GPU) plus the first verdict (resolution, the model built on the meta device, memory
  planning and the handshake), in seconds;
- later specs: the same example again with a different ``--mem-fraction-static`` (the
  meta-device model is reused: a memory-only flag does not change the model's shape) and
  with a different environment variable (a new build), seconds per role;
- each worker's resident memory (RSS from /proc, MiB) after its specs.

Targets (issue 23): first spec per accelerator <= 20 s on the 2-core CI machine, later
specs <= 1 s per role, a worker <= 2 GiB.

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_oracle_startup.py [--examples a.yaml b.yaml]``.
Needs sglang==0.5.23 (requirements/contract.txt).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

from sglang_pd_operator.catalog import builtin_catalog  # noqa: E402
from sglang_pd_operator.oracle import Oracle, unavailable  # noqa: E402
from sglang_pd_operator.planning.plan import plan_object  # noqa: E402


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _with(doc: dict, *, extra: list[str] = (), env: dict[str, str] | None = None) -> dict:
    out = copy.deepcopy(doc)
    for role in ("prefill", "decode"):
        spec = out["spec"][role]
        spec["extraArgs"] = [*(spec.get("extraArgs") or []), *extra]
        if env:
            spec["env"] = [*(spec.get("env") or []), *({"name": k, "value": v} for k, v in env.items())]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", nargs="*", default=None, help="example file names (default: all)")
    args = ap.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"the oracle cannot run: {why}", file=sys.stderr)
        return 2
    catalog = builtin_catalog()
    paths = sorted((ROOT / "examples").glob("*.yaml"))
    if args.examples:
        paths = [p for p in paths if p.name in args.examples]
    seen: set[str] = set()
    print(f"{'example':44} {'accelerator':10} {'first s':>8} {'memflag s/role':>15} {'newenv s/role':>14} {'verdict':>8}")
    with Oracle(catalog=catalog, max_workers=len(catalog.accelerators)) as oracle:
        for path in paths:
            doc = yaml.safe_load(path.read_text())
            plan, _ = plan_object(doc, catalog)
            acc = plan.decode.inputs.accelerator_name
            t0 = time.monotonic()
            verdict = oracle.judge_plan(plan)
            first = time.monotonic() - t0
            label = "first" if acc not in seen else "again"
            seen.add(acc)
            timings = []
            for variant in (_with(doc, extra=["--mem-fraction-static", "0.93"]),
                            _with(doc, env={"SGLANG_PD_ORACLE_BENCH": "1"})):
                vplan, _ = plan_object(variant, catalog)
                t0 = time.monotonic()
                oracle.judge_plan(vplan)
                roles = vplan.prefill.inputs.nodes + vplan.decode.inputs.nodes  # one startup per pod
                timings.append((time.monotonic() - t0) / roles)
            print(f"{path.name:44} {acc:10} {first:8.1f} {timings[0]:15.2f} {timings[1]:14.2f} "
                  f"{str(verdict.accepted):>8}  ({label} on {acc})")
        print()
        print("worker starts (s):", " ".join(f"{s:.1f}" for s in oracle.pool.started_s))
        for key, worker in oracle.pool._workers.items():
            print(f"worker {key}: RSS {_rss_mib(worker.proc.pid):.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
