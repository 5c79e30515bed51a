"""SLO attainment and GPU-hours of the built-in planner against static provisioning, on load traces.

For each load trace (``step``, ``ramp``, ``daily``: a day's curve compressed in time) and each
provisioning (``planner``: spec.autoscaling; ``static-peak``: fixed counts the planner
reached at the trace's peak; ``static-mean``: fixed counts sized for the trace's mean rate,
the peak counts times mean/peak rate, at least one), it runs on a private dev cluster what
tests/e2e/test_autoscale.py runs: the operator as a process (``--slo-interval 2``), a
PDDeployment of one-GPU engine pods (Qwen3-30B-A3B with Paged Experts on L40S), an engine
simulator with the load model per engine pod (started as the pod appears, Ready once its
rendered probes pass), the real smg gateway, and tools/loadgen.py ``--trace`` (open-loop
Poisson arrivals) through it. Every second it samples the engine pods bound to a node (GPUs
allocated) and the ``SLOMet`` condition.

Printed per run:

- ``windows met``: client side, the fraction of 20 s windows (by send time) whose TTFT p90 and
  ITL p90 (loadgen's own measurements) meet the targets;
- ``requests met``: the fraction of requests with TTFT and mean ITL within the targets;
- ``SLOMet``: the fraction of seconds the operator's condition said True (of those it was True or False);
- ``GPU-h``: GPU-hours the engine pods held during the trace, and ``GPU-h/day`` scaled to a
  24 h day (the daily trace compresses one day into its duration);
- ``mean / peak GPUs`` and the prefill / decode counts seen.

Needs the dev cluster binaries (``sglang-pd-operator dev cluster build``) and smg (``hack/setup.sh
--contract``). About 3 minutes per run on a quiet 2-core machine (``--scale`` shortens the traces).

Run: ``.venv/bin/python benchmarks/bench_autoscale.py [--traces step,ramp,daily]
[--configs planner,static-peak,static-mean] [--scale 1.0] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT / "tests" / "e2e", ROOT / "tools"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from loadgen import parse_trace, percentile, rate_at  # noqa: E402
from opkit import kget, wait_for  # noqa: E402
from simkit import (  # noqa: E402
    LOADGEN,
    Processes,
    Prober,
    SimulatorFleet,
    get_json,
    probe_policy,
    start_smg,
    wait_answering,
    with_address,
)

from sglang_pd_operator_dev.cluster import cluster as devcluster  # noqa: E402
from sglang_pd_operator_dev.cluster.demo import OperatorProcess, install_crds, model_store  # noqa: E402

LBL = "pd.sglang-operator.io"
NAME = "bench"
INTERVAL_S = 2.0
WINDOW_S = 20.0
TTFT_TARGET, ITL_TARGET = 0.6, 0.030
MAX_TOKENS = 16
GPUS_PER_POD = 1
#: The simulators' load model: one prefill forward of ~150 ms at a time (~6.5 requests/s per prefill
#: replica), decode steps of 8 ms growing by a quarter per running request.
SIM = ["--load-model", "--prefill-median", "0.15", "--prefill-sigma", "0.2", "--prefill-slots", "1",
       "--kv-transfer-ms-median", "5", "--itl-median", "0.008", "--itl-sigma", "0.1", "--itl-batch-slope", "0.25",
       "--max-running", "256", "--ttft-median", "0.05"]
AUTOSCALING = {"prefill": {"minReplicas": 1, "maxReplicas": 4}, "decode": {"minReplicas": 1, "maxReplicas": 3},
               "maxGPUs": 8, "scaleUpStabilization": "4s", "scaleDownStabilization": "20s"}


def _daily(duration: float, low: float = 1.5, high: float = 16.0, points: int = 24) -> str:
    """A day compressed into ``duration`` s: quiet night, morning rise, a midday peak, evening fall."""
    out = []
    for i in range(points + 1):
        hour = 24.0 * i / points
        shape = max(0.0, math.sin(math.pi * (hour - 6.0) / 16.0)) ** 1.5 if 6.0 <= hour <= 22.0 else 0.0
        out.append(f"{duration * i / points:.1f}:{low + (high - low) * shape:.2f}")
    return ",".join(out)


def traces(scale: float) -> dict[str, str]:
    """Trace name -> ``t:rate`` points (loadgen --trace), ``scale`` x the time axis."""
    s = scale
    return {
        "step": f"0:3,{40 * s:.0f}:3,{40 * s:.0f}:15,{160 * s:.0f}:15",
        "ramp": f"0:2,{120 * s:.0f}:16,{160 * s:.0f}:16",
        "daily": _daily(180 * s),
    }


def mean_and_peak(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Time-averaged and highest rate of a trace (requests/s)."""
    end = points[-1][0]
    steps = 2000
    mean = sum(rate_at(points, end * (i + 0.5) / steps) for i in range(steps)) / steps
    return mean, max(r for _, r in points)


@dataclass
class Run:
    """The figures of one (trace, provisioning) run."""

    trace: str
    config: str
    duration_s: float
    requests: int = 0
    failed: int = 0
    windows_met: float | None = None
    requests_met: float | None = None
    slomet_true: float | None = None
    gpu_hours: float = 0.0
    gpu_hours_per_day: float = 0.0
    mean_gpus: float = 0.0
    peak_gpus: int = 0
    prefill: list[int] = field(default_factory=list)
    decode: list[int] = field(default_factory=list)
    ttft_p90: float | None = None
    itl_p90: float | None = None
    decisions: list[str] = field(default_factory=list)


class Sampler:
    """Every second: engine pods bound to a node (GPUs held), the SLOMet condition, the role counts."""

    def __init__(self, api, namespace: str) -> None:
        from kubernetes import client as k8s

        self.core, self.custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        self.namespace = namespace
        self.gpus: list[tuple[float, int]] = []
        self.slomet: list[str] = []
        self.counts: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{LBL}/role in (prefill,decode)",
                                                     _request_timeout=5).items
                held = [p for p in pods if p.spec.node_name and p.status.phase in ("Pending", "Running")]
                roles = [p.metadata.labels[f"{LBL}/role"] for p in held]
                self.gpus.append((time.monotonic(), len(held) * GPUS_PER_POD))
                self.counts.append((roles.count("prefill"), roles.count("decode")))
                pdd = self.custom.get_namespaced_custom_object(LBL, "v1alpha1", self.namespace, "pddeployments", NAME,
                                                               _request_timeout=5)
                cond = next((c for c in pdd.get("status", {}).get("conditions", []) if c["type"] == "SLOMet"), None)
                self.slomet.append(cond["status"] if cond else "Unknown")
            except Exception:  # noqa: BLE001 - a busy API server: the next second
                continue


def doc(namespace: str, config: str, counts: tuple[int, int] | None) -> dict:
    """The benchmark's PDDeployment: the planner's, or fixed ``counts`` (prefill, decode)."""
    d = yaml.safe_load((ROOT / "examples" / "qwen3-30b-a3b-paged-experts.yaml").read_text())
    d["metadata"] = {"name": NAME, "namespace": namespace}
    spec = d["spec"]
    spec["transfer"] = {"backend": "mooncake", "forceTCP": True}
    spec["gateway"]["replicas"] = 1
    spec["slo"] = {"ttft": {"p90": f"{TTFT_TARGET * 1000:.0f}ms"}, "itl": {"p90": f"{ITL_TARGET * 1000:.0f}ms"},
                   "window": f"{WINDOW_S:.0f}s"}
    if config == "planner":
        spec["prefill"].pop("replicas", None)
        spec["decode"].pop("replicas", None)
        spec["autoscaling"] = AUTOSCALING
    else:
        spec["prefill"]["replicas"], spec["decode"]["replicas"] = counts
    return d


def one_run(cluster, work: Path, trace_name: str, trace: str, config: str, counts: tuple[int, int] | None,
            log) -> Run:
    """Deploy, serve, replay ``trace``, measure, tear down (a fresh namespace per run)."""
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(model_store(ns)))
    policy = probe_policy(ns, role=("prefill", "decode"))
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(policy))
    time.sleep(2)
    procs = Processes(work)
    points = parse_trace(trace)
    run = Run(trace=trace_name, config=config, duration_s=points[-1][0])
    d = doc(ns, config, counts)
    model, served = d["spec"]["model"]["name"], d["spec"]["model"]["servedModelName"]
    out = work / f"{trace_name}-{config}.json"
    try:
        with SimulatorFleet(cluster.api_client(), procs, ns, NAME, model=model, served_model_name=served, extra=SIM), \
                Prober(cluster.api_client(), ns):
            cluster.kubectl("apply", "--server-side", "--field-manager=bench", "-f", "-", input=yaml.safe_dump(d))
            wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                                 ((kget(cluster, "pdd", NAME, "-n", ns) or {}).get("status") or {})
                                 .get("conditions", [])), timeout=180, what="Ready")
            gw = wait_for(lambda: [p for p in (kget(cluster, "pods", "-n", ns, "-l", f"{LBL}/role=gateway")
                                               or {}).get("items", []) if p["status"].get("podIP")],
                          timeout=60, what="gateway pod")[0]
            key = gw["metadata"]["labels"][f"{LBL}/compat-key"]
            dep = kget(cluster, "deployment", f"{NAME}-{key[:6]}-gateway", "-n", ns)
            args = with_address(dep["spec"]["template"]["spec"]["containers"][0]["args"], host=gw["status"]["podIP"])
            gateway = f"http://{gw['status']['podIP']}:{args[args.index('--port') + 1]}"
            start_smg(procs, args, kubeconfig=cluster.kubeconfig)
            wait_answering([gateway + "/health"], timeout=60)
            want = counts or (1, 1)
            wait_for(lambda: (s := get_json(gateway + "/workers")["stats"])["prefill_count"] == want[0]
                     and s["decode_count"] == want[1], timeout=120, what="smg registered the workers")
            log(f"  {trace_name}/{config}: serving {want[0]} prefill + {want[1]} decode; replaying {run.duration_s:.0f}s")
            argv = [sys.executable, str(LOADGEN), "--url", gateway, "--model", served, "--trace", trace,
                    "--max-tokens", str(MAX_TOKENS), "--completions", "--out", str(out), "--timeout", "60"]
            with Sampler(cluster.api_client(), ns) as sampler:
                subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=work, check=False,
                               env={"PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin"},
                               timeout=run.duration_s + 180)
        _measure(run, json.loads(out.read_text()), sampler)
        events = (kget(cluster, "events", "-n", ns, "--field-selector", "reason=PlannerScaled") or {})
        run.decisions = [e["message"] for e in sorted(events.get("items", []),
                                                      key=lambda e: e.get("firstTimestamp") or "")]
    finally:
        procs.stop_all()
        cluster.kubectl("delete", "pdd", NAME, "-n", ns, "--wait=true", "--timeout=60s", check=False)
        for obj in policy:
            cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--wait=false", check=False)
        wait_for(lambda: not (kget(cluster, "pods", "-n", ns) or {"items": [1]})["items"], timeout=120, what="pods gone")
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", f"model-store-{ns}", "--wait=false", check=False)
    return run


def _measure(run: Run, report: dict, sampler: Sampler) -> None:
    samples = report["samples"]
    ok = [s for s in samples if s["ok"]]
    run.requests, run.failed = len(samples), len(samples) - len(ok)
    windows = {}
    for s in ok:
        windows.setdefault(int(s["sent_at"] // WINDOW_S), []).append(s)
    met = [percentile([s["ttft"] for s in w], 0.9) <= TTFT_TARGET
           and (percentile([x for s in w for x in s["itls"]], 0.9) or 0.0) <= ITL_TARGET
           for w in windows.values() if w]
    run.windows_met = sum(met) / len(met) if met else None
    good = [s for s in samples if s["ok"] and s["ttft"] <= TTFT_TARGET
            and (sum(s["itls"]) / len(s["itls"]) if s["itls"] else 0.0) <= ITL_TARGET]
    run.requests_met = len(good) / len(samples) if samples else None
    known = [x for x in sampler.slomet if x in ("True", "False")]
    run.slomet_true = known.count("True") / len(known) if known else None
    g = sampler.gpus
    if len(g) >= 2:
        gpu_s = sum(a[1] * (b[0] - a[0]) for a, b in zip(g, g[1:]))
        span = g[-1][0] - g[0][0]
        run.gpu_hours = gpu_s / 3600
        run.mean_gpus = gpu_s / span
        run.gpu_hours_per_day = run.mean_gpus * 24
        run.peak_gpus = max(x for _, x in g)
    run.prefill = sorted({p for p, _ in sampler.counts})
    run.decode = sorted({d for _, d in sampler.counts})
    run.ttft_p90 = report["summary"]["ttft_seconds"]["p90"]
    run.itl_p90 = report["summary"]["itl_seconds"]["p90"]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def print_table(runs: list[Run]) -> None:
    print(f"\ntargets: TTFT p90 {TTFT_TARGET * 1000:.0f} ms, ITL p90 {ITL_TARGET * 1000:.0f} ms, window {WINDOW_S:.0f}s; "
          f"{MAX_TOKENS} output tokens per request; 1 GPU per engine pod")
    head = (f"{'trace':6s} {'provisioning':12s} {'reqs':>5s} {'fail':>4s} {'windows met':>11s} {'requests met':>12s} "
            f"{'SLOMet':>7s} {'GPU-h':>7s} {'GPU-h/day':>9s} {'mean GPUs':>9s} {'peak':>4s} {'prefill':>8s} "
            f"{'decode':>7s} {'TTFT p90':>9s} {'ITL p90':>8s}")
    print(head)
    print("-" * len(head))
    for r in runs:
        print(f"{r.trace:6s} {r.config:12s} {r.requests:5d} {r.failed:4d} {_pct(r.windows_met):>11s} "
              f"{_pct(r.requests_met):>12s} {_pct(r.slomet_true):>7s} {r.gpu_hours:7.4f} {r.gpu_hours_per_day:9.1f} "
              f"{r.mean_gpus:9.2f} {r.peak_gpus:4d} {'/'.join(map(str, r.prefill)):>8s} "
              f"{'/'.join(map(str, r.decode)):>7s} {1000 * (r.ttft_p90 or 0):8.0f}ms {1000 * (r.itl_p90 or 0):6.1f}ms")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default="step,ramp,daily")
    p.add_argument("--configs", default="planner,static-peak,static-mean")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every trace's time axis")
    p.add_argument("--json", help="write every run's figures here")
    a = p.parse_args(argv)
    all_traces = traces(a.scale)
    chosen = [t.strip() for t in a.traces.split(",") if t.strip()]
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-autoscale-"))
    log = lambda line: print(line, flush=True)  # noqa: E731
    devcluster.sweep_stale_runs(log=log)
    cluster = devcluster.start_cluster(run_dir=work / "cluster", log=log)
    runs: list[Run] = []
    op = None
    try:
        install_crds(cluster, log=log)
        op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=work / "operator.log",
                             extra_args=["--slo-interval", str(INTERVAL_S)]).start()
        for name in chosen:
            trace = all_traces[name]
            mean, peak = mean_and_peak(parse_trace(trace))
            peak_counts: tuple[int, int] | None = None
            for config in configs:
                counts = None
                if config != "planner":
                    if peak_counts is None:  # no planner run before: size by the prefill's capacity
                        per_prefill = 1.0 / 0.15
                        peak_counts = (max(1, math.ceil(peak / per_prefill)), 1)
                    counts = peak_counts if config == "static-peak" else (
                        max(1, math.ceil(peak_counts[0] * mean / peak)), max(1, math.ceil(peak_counts[1] * mean / peak)))
                run = one_run(cluster, work, name, trace, config, counts, log)
                if config == "planner":
                    peak_counts = (max(run.prefill), max(run.decode))
                runs.append(run)
                log(f"  {name}/{config}: {json.dumps(asdict(run))}")
            log(f"  trace {name}: mean {mean:.2f} req/s, peak {peak:.1f} req/s")
        print_table(runs)
        if a.json:
            Path(a.json).write_text(json.dumps([asdict(r) for r in runs], indent=1))
    finally:
        if op is not None:
            op.stop()
        cluster.stop(log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
