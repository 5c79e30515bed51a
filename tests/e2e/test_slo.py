"""Issue 5's acceptance end to end: the operator measures, exports and acts on latency SLOs.

On the local control plane, a PDDeployment (GB300 example: 1 prefill, 2 decode, 1
gateway) gets one engine simulator process per engine pod, bound to the pod's kwok IP
(loopback) and port 30000, and the REAL smg gateway bound to the gateway pod's IP with
the operator's rendered arguments (it discovers the pods through the API server). The
operator runs as a process with ``--slo-interval 2`` and scrapes them all for real.

1. A bounded load (tools/loadgen.py, as a user would run it) goes through smg. The
   operator's p90 TTFT and ITL — from its ``/metrics`` and from ``status.slo`` — agree
   with the p90s the load script computed from its own client-side measurements within
   the bound of docs/slo.md section 2: the width of the histogram bucket holding the
   percentile, plus (TTFT) the gateway hop the engine never sees or (ITL) the per-token
   jitter the gateway and the client's read loop add. Before comparing, the test waits
   until the operator's window holds exactly the load's requests (its observation
   counts equal the client's).
2. After the window has drained (SLOMet Unknown/NoTraffic), the simulators switch to
   slow mode under load: SLOMet turns False within two intervals of the first slow
   observation, and a Warning event SLOTargetMissed is recorded once per target that
   turned red (not once per interval).
3. KV transfers fail (simulator kv_fail mode): Degraded/KVTransferFailing.
4. Every prefill simulator stops: Degraded/NoPrefill (the pods stay Ready in kwok; the
   operator sees that none answers while decode does).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request

import pytest
from helpers import load_example
from opkit import OperatorProcess, condition, kapply, kget, wait_for
from prometheus_client.parser import text_string_to_metric_families
from simkit import post_json, run_load, serve_pd, smg_binary

from sglang_pd_operator.api.v1alpha1 import parse_duration
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import bucket_width_at

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive, pytest.mark.timeout(420)]
LBL = "pd.sglang-operator.io"
NAME = "slo-e2e"
INTERVAL = 2.0
WINDOW = "30s"
# simulator latencies (seconds): decode TTFT and ITL lognormal medians and shapes
TTFT_MEDIAN, TTFT_SIGMA, ITL_MEDIAN, ITL_SIGMA = 0.25, 0.3, 0.015, 0.2
SLOW_FACTOR = 5.0
# Transport allowances of the agreement bound (docs/slo.md section 2): what the client
# measures beyond the engine on this loopback path, generous for a loaded 2-core machine.
HOP_S = 0.05      # TTFT: smg + client, one way, before the first token reaches the client
JITTER_S = 0.003  # ITL: per-gap timing noise of smg's forwarding and the client's read loop


def _pdd(cluster, ns):
    return kget(cluster, "pddeployment", NAME, "-n", ns)


def _operator_samples(op: OperatorProcess) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _exported(samples, metric: str, **labels) -> float | None:
    for (name, lbls), value in samples.items():
        if name == metric and all(dict(lbls).get(k) == v for k, v in labels.items()):
            return value
    return None


def _status_measured(obj, metric: str) -> float | None:
    for t in ((obj or {}).get("status", {}).get("slo") or {}).get("targets") or []:
        if t["metric"] == metric and t["percentile"] == "p90" and "measured" in t:
            return parse_duration(t["measured"])
    return None


def _events(cluster, ns, reason):
    got = kget(cluster, "events", "-n", ns, "--field-selector", f"involvedObject.name={NAME},reason={reason}")
    return (got or {}).get("items", [])


def test_operator_measures_exports_and_acts_on_slos(cluster, ns, procs, tmp_path):
    if smg_binary() is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed")
    t_start = time.monotonic()
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["gateway"]["replicas"] = 1
    doc["spec"]["slo"] = {"ttft": {"p90": "800ms"}, "itl": {"p90": "40ms"}, "window": WINDOW}
    # --slo-status-period 0: status takes every pass's figures, so they can be compared with the
    # exported ones of the same pass (the default writes figures that only moved once a minute;
    # tests/unit/test_controller.py covers that bound)
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log",
                         extra_args=["--slo-interval", str(INTERVAL), "--slo-status-period", "0"]).start()
    try:
        _run(cluster, ns, procs, op, doc, tmp_path, t_start)
    except BaseException:
        print(op.log_tail(80))
        raise
    finally:
        op.stop()


def _run(cluster, ns, procs, op, doc, tmp_path, t_start):
    kapply(cluster, doc)
    ready = wait_for(lambda: (o := _pdd(cluster, ns)) and (c := condition(o, "Ready")) and c["status"] == "True" and o,
                     timeout=90, what="Ready")
    stack = serve_pd(cluster, procs, ready, sim_extra=[
        "--ttft-median", str(TTFT_MEDIAN), "--ttft-sigma", str(TTFT_SIGMA), "--itl-median", str(ITL_MEDIAN),
        "--itl-sigma", str(ITL_SIGMA), "--prefill-median", "0.1", "--slow-factor", str(SLOW_FACTOR)])
    engine, by_role, gateway, served = stack.engine, stack.by_role, stack.gateway, stack.served
    assert len(by_role["prefill"]) == 1 and len(by_role["decode"]) == 2
    # the operator reaches every pod (baselines taken) and there is no traffic yet
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and (o["status"].get("scrape") or {}).get("decode") == "2/2"
                   and o["status"]["scrape"]["prefill"] == "1/1" and o["status"]["scrape"]["gateway"] == "1/1"
                   and o, timeout=30, what="status.scrape: every pod reachable")
    assert condition(obj, "SLOMet")["status"] == "Unknown" and condition(obj, "SLOMet")["reason"] == "NoTraffic"
    print(f"setup done after {time.monotonic() - t_start:.1f}s")

    # ---- 1. agreement with the load script's own client-side figures
    t_load = time.monotonic()
    load = run_load(gateway, served, tmp_path / "load.json", requests=160, concurrency=8, max_tokens=16)
    summary = load["summary"]
    assert summary["failed"] == 0, summary["errors"]
    n_req = summary["ttft_seconds"]["count"]
    n_itl = summary["itl_seconds"]["count"]
    dec = {"namespace": ns, "deployment": NAME, "role": "decode", "percentile": "p90"}

    def window_holds_the_load():
        s = _operator_samples(op)
        got = (_exported(s, "sglang_pd_operator_slo_window_observations", target="ttft", **dec),
               _exported(s, "sglang_pd_operator_slo_window_observations", target="itl", **dec))
        return s if got == (n_req, n_itl) else None

    samples = wait_for(window_holds_the_load, timeout=4 * INTERVAL + 5, interval=0.5,
                       what=f"operator window = the load's {n_req} requests / {n_itl} ITL samples")
    assert time.monotonic() - t_load < parse_duration(WINDOW), "the load outlasted the window"
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and _status_measured(o, "ttft") and o, timeout=10,
                   what="status.slo")
    report = {}
    for metric, key_, buckets, allowance in (("ttft", "ttft_seconds", ex.SGLANG_BUCKETS[ex.TTFT], HOP_S),
                                             ("itl", "itl_seconds", ex.SGLANG_BUCKETS[ex.ITL], JITTER_S)):
        client = summary[key_]["p90"]
        exported = _exported(samples, "sglang_pd_operator_slo_measured_seconds", target=metric, **dec)
        in_status = _status_measured(obj, metric)
        bounds = list(buckets) + [math.inf]
        width = max(bucket_width_at(client, bounds), bucket_width_at(exported, bounds))
        bound = width + allowance
        report[metric] = dict(client=client, exported=exported, status=in_status, bucket_width=width, bound=bound,
                              diff=exported - client)
        assert abs(exported - client) <= bound, report[metric]
        assert abs(in_status - exported) <= 0.005 * exported + 1e-4, (in_status, exported)  # 3 significant digits
        if metric == "ttft":  # the engine never sees the gateway hop: at most one bucket above the client
            assert exported <= client + width, report[metric]
    print("agreement:", json.dumps(report, indent=1))
    assert condition(obj, "SLOMet")["status"] == "True", condition(obj, "SLOMet")
    assert _exported(samples, "sglang_pd_operator_slo_met", namespace=ns, deployment=NAME) == 1.0

    # ---- 2. slow mode turns SLOMet False within two intervals; Warning events on the transitions
    wait_for(lambda: condition(_pdd(cluster, ns), "SLOMet")["reason"] == "NoTraffic",
             timeout=parse_duration(WINDOW) + 4 * INTERVAL + 5, interval=1, what="window drained (NoTraffic)")
    assert not _events(cluster, ns, "SLOTargetMissed")
    for p in engine:
        post_json(f"http://{p['status']['podIP']}:30000/simulator/mode", {"mode": "slow"})
    t_switch = time.monotonic()
    bg = run_load(gateway, served, tmp_path / "slow.json", requests=24, concurrency=4, max_tokens=8, background=True)
    try:
        obj = wait_for(lambda: (o := _pdd(cluster, ns)) and condition(o, "SLOMet")["status"] == "False" and o,
                       timeout=30, interval=0.2, what="SLOMet False")
        t_red = time.monotonic() - t_switch
        # the first slow observation exists after a slow TTFT (decode records TTFT at its first token)
        first_slow = TTFT_MEDIAN * SLOW_FACTOR * math.exp(2 * TTFT_SIGMA)
        print(f"SLOMet False {t_red:.1f}s after the switch (first slow TTFT <= {first_slow:.1f}s, "
              f"interval {INTERVAL}s): {condition(obj, 'SLOMet')['message']}")
        assert t_red <= first_slow + 2 * INTERVAL + 1.0, t_red
        assert "target" in condition(obj, "SLOMet")["message"] and "by" in condition(obj, "SLOMet")["message"]
        events = wait_for(lambda: _events(cluster, ns, "SLOTargetMissed"), timeout=5, what="Warning event")
        assert events[0]["type"] == "Warning" and "p90" in events[0]["message"]
        bg.wait(timeout=120)
    finally:
        if bg.poll() is None:
            bg.kill()
    # one event per target that turned red (TTFT and ITL may turn in different intervals), none per interval
    messages = [e["message"] for e in _events(cluster, ns, "SLOTargetMissed")]
    for target in ("ttft p90", "itl p90"):
        assert sum(target in m for m in messages) <= 1, messages
    assert 1 <= len(messages) <= 2, messages

    # ---- 3. KV transfers failing
    for p in engine:
        post_json(f"http://{p['status']['podIP']}:30000/simulator/mode", {"mode": "kv_fail"})
    for _ in range(3):
        post_json(gateway + "/v1/chat/completions", {"model": served, "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "x"}]})
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and condition(o, "Degraded")["reason"] == "KVTransferFailing"
                   and o, timeout=3 * INTERVAL + 5, what="Degraded KVTransferFailing")
    print("KVTransferFailing:", condition(obj, "Degraded")["message"])

    # ---- 4. every prefill simulator stops: NoPrefill
    for p in by_role["prefill"]:
        procs.stop(p["metadata"]["name"])
    t_stop = time.monotonic()
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and condition(o, "Degraded")["reason"] == "NoPrefill" and o,
                   timeout=3 * INTERVAL + 5, interval=0.2, what="Degraded NoPrefill")
    print(f"NoPrefill {time.monotonic() - t_stop:.1f}s after stopping prefill: {condition(obj, 'Degraded')['message']}")
    d = condition(obj, "Degraded")
    assert d["status"] == "True" and "0 reachable" in d["message"]
    assert obj["status"]["scrape"]["prefill"] == "0/1" and obj["status"]["scrape"]["decode"] == "2/2"
    assert condition(obj, "Ready")["status"] == "True"  # kwok still reports the pods Ready
    assert _events(cluster, ns, "NoPrefill")
    print(f"test took {time.monotonic() - t_start:.1f}s")
