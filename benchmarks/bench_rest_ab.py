"""Benchmark: two operators at rest on ONE converged cluster, one after the other (issue 29, item 6).

``bench_scale.py`` measures a case on fresh clusters (convergence against a plain client,
then rest); on a busy shared machine one case at N = 1,000 with 10,000 unrelated pods
takes most of an hour, and two cases (before / after) see different neighbours. This
measures only what happens at rest, and both operators in the same cluster state:

1. a dev cluster with the benchmark's pools (``bench_scale.start_bench_cluster``), ``--unrelated``
   pods bound to their own nodes, ``--n`` PDDeployments applied by 4 kubectl processes;
2. operator A (``--a``, default this checkout's) until every PDDeployment is Ready for its
   generation; ``--settle`` seconds; then ``--rest`` seconds at rest: its RSS (and peak),
   CPU seconds per minute, reconciles per minute by result (``reconciled``: a worker ran
   one; ``unchanged``: a resync skipped it), and the machine's load meanwhile;
3. A stops; operator B (``--b``) starts on the same objects (its LIST, one reconcile of
   every key: nothing to write), the same settle and rest.

Run: ``PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_rest_ab.py --n 1000 --unrelated 10000
--b "/work/wt/before/.venv/bin/sglang-pd-operator" --b-label before``. Not a test: no
assertion; prints one line per operator and appends JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale as B  # noqa: E402

from sglang_pd_operator_dev.cluster.demo import OperatorProcess, operator_command  # noqa: E402


def rest(label: str, command: list[str], cluster, kubeconfig: Path, work: Path, docs: list[dict],
         a: argparse.Namespace) -> dict:
    """Run one operator to Ready, settle, measure ``a.rest`` seconds at rest; returns its figures."""
    api = cluster.api_client()
    tracker = B.Tracker(api, f"/apis/{B.GROUP}/{B.VERSION}/{B.PLURAL}", B.pdd_ready)
    op = OperatorProcess(kubeconfig=kubeconfig, log_path=work / f"operator-{label}.log", resync=None,
                         command=command).start()
    try:
        started = time.monotonic()
        keys = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs}
        ready_s, done = B.wait_all(tracker, keys, a.ready_timeout, started, op)
        B.wait_until(lambda: B.operator_metrics(op.metrics_port).get("sglang_pd_operator_queue_depth", 1) == 0,
                     600, "the work queue drains", op)
        time.sleep(a.settle)
        pid = op.proc.pid
        if a.before_rest:  # a diagnostic of the settled process (e.g. a heap census), before the window opens
            subprocess.run(a.before_rest.format(pid=pid), shell=True, check=False, timeout=300)
            time.sleep(5)
        pids = B.cluster_pids(cluster)
        meter = B.LoadMeter(lambda: [*pids.values(), pid, os.getpid()])
        s0, m0, t0 = B.proc_sample(pid), _looks(op), time.time()
        time.sleep(a.rest)
        s1, m1, t1 = B.proc_sample(pid), _looks(op), time.time()
        minutes = (t1 - t0) / 60
        out = {"label": label, "n": a.n, "unrelated": a.unrelated, "ready_s": ready_s, "ready": done,
               "rss_mb": s1.rss_mb, "peak_rss_mb": s1.hwm_mb, "cpu_s_per_min": (s1.cpu_s - s0.cpu_s) / minutes,
               "reconciled_per_min": (m1[0] - m0[0]) / minutes, "unchanged_per_min": (m1[1] - m0[1]) / minutes,
               "rest_s": t1 - t0, "load": meter.report()}
        print(f"{label}: Ready {done}/{len(keys)} after {ready_s or float('nan'):.0f}s; at rest ({out['rest_s']:.0f}s): "
              f"RSS {out['rss_mb']:.0f} MB (peak {out['peak_rss_mb']:.0f}), CPU {out['cpu_s_per_min']:.2f} s/min "
              f"({out['cpu_s_per_min'] / 60:.1%} of a core), reconciles/min {out['reconciled_per_min']:.1f} "
              f"(resyncs skipped/min {out['unchanged_per_min']:.1f}); {B.load_text(out['load'])}", flush=True)
        return out
    finally:
        tracker.stop()
        op.stop()


def _looks(op) -> tuple[float, float]:
    """(reconciles a worker finished, resyncs skipped) so far; an operator without the ``result`` label
    counts every look as a reconcile."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=10).read().decode()
    done = skipped = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "sglang_pd_operator_reconciles_total":
                if s.labels.get("result") == "unchanged":
                    skipped += s.value
                else:
                    done += s.value
    return done, skipped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--unrelated", type=int, default=10000)
    p.add_argument("--per-namespace", type=int, default=100)
    p.add_argument("--settle", type=float, default=60.0)
    p.add_argument("--rest", type=float, default=300.0, help="seconds at rest (default: one resync period)")
    p.add_argument("--ready-timeout", type=float, default=5400.0)
    p.add_argument("--a", default=None, help="operator A's command (default: this checkout's)")
    p.add_argument("--a-label", default="after")
    p.add_argument("--b", default=None, help="operator B's command (none: A only)")
    p.add_argument("--b-label", default="before")
    p.add_argument("--crds", type=Path, default=B.REPO / "crds", help="the CRDs both operators accept")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--before-rest", default="",
                   help="shell command run after the settle, before the window ({pid}: the operator's PID), "
                        "e.g. a heap census through gdb; its own CPU falls outside the window")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix=f"bench-rest-{a.n}-"))
    docs = B.pddeployments(a.n, a.per_namespace)
    cluster, _ = B.start_bench_cluster(work, "cluster", print, a.n)
    try:
        B.prepare_namespaces(cluster, B.namespaces_for(a.n, a.per_namespace))
        B.add_unrelated_pods(cluster, a.unrelated, print, 4)
        cluster.kubectl("apply", "--server-side", "-f", str(a.crds))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        kubeconfig = B.operator_kubeconfig(cluster, work)
        applied = B.run_parallel(cluster, [docs[i::4] for i in range(4)])
        print(f"  {len(docs)} PDDeployments applied in {applied:.0f}s", flush=True)
        results = [rest(a.a_label, a.a.split() if a.a else operator_command(), cluster, kubeconfig, work, docs, a)]
        if a.b:
            results.append(rest(a.b_label, a.b.split(), cluster, kubeconfig, work, docs, a))
        if a.json:
            with a.json.open("a") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
    finally:
        cluster.stop(log=lambda m: None)


if __name__ == "__main__":
    main()
