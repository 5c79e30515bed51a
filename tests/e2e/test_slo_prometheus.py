"""Issue 17's acceptance end to end: ``--slo-source prometheus`` against a REAL Prometheus.

On the local control plane, a PDDeployment (GB300 example: 1 prefill, 2 decode, 1
gateway) is served by one engine simulator per engine pod at the pod's kwok IP and the
real smg on the gateway pod's address (``simkit.serve_pd``, as in test_slo.py). A
Prometheus 3.16 server built from the Go module promtool comes from runs on loopback
(``promkit``): file service discovery hands it the pods with their kubernetes_sd meta
labels, and the PodMonitor the operator renders decides, through Prometheus' own
relabeling, which pods it keeps and how their series are labelled; the PrometheusRule's
recording rules are loaded too (evaluated every 2 s here, the SLO interval, instead of the
rendered 15 s floor, so that a record follows the load within the test's timing). The
operator runs as a process with ``--slo-source prometheus`` and reads its SLO figures from
those records.

1. Before Prometheus scrapes the pods: ``SLOMet`` Unknown/NoSeries (no figure from nothing).
2. Once it does: ``status.scrape`` says ``source: prometheus``, every pod reachable, with
   a ``measuredAt``; no traffic yet: NoTraffic.
3. On the same traffic (160 requests through smg), the scrape source (the operator's
   ``Scraper``, run in the test against the same pods) and the Prometheus source
   (``PrometheusSource``, which reads the recorded ``sglang_pd:*`` series, at the first
   record after the load) agree on TTFT and ITL p90 within one bucket of the engines'
   histograms, and on the verdict; the operator's own status (Prometheus source) agrees
   with them as well. Both take the serving group from the user-facing Service, not from
   status.
4. Prometheus stops: ``SLOMet`` turns Unknown/PrometheusUnavailable within a few
   intervals and ``status.slo`` goes: never a stale True.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from helpers import load_example
from opkit import OperatorProcess, condition, kapply, kget, pods, wait_for
from promkit import PrometheusServer
from simkit import run_load, serve_pd, smg_binary

from sglang_pd_operator.api.v1alpha1 import SLOSpec, parse_duration
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import bucket_width_at
from sglang_pd_operator.metrics.monitoring import render_monitoring
from sglang_pd_operator.metrics.prometheus_source import PrometheusSettings, PrometheusSource
from sglang_pd_operator.metrics.scraper import Scraper
from sglang_pd_operator.render import labels as L

pytestmark = [pytest.mark.e2e, pytest.mark.exclusive, pytest.mark.timeout(480)]
LBL = "pd.sglang-operator.io"
NAME = "slo-prom"
INTERVAL = 2.0
WINDOW = "30s"
SLO = {"ttft": {"p90": "800ms"}, "itl": {"p90": "40ms"}, "window": WINDOW}
SIM = ["--ttft-median", "0.25", "--ttft-sigma", "0.3", "--itl-median", "0.015", "--itl-sigma", "0.2",
       "--prefill-median", "0.1"]


def _pdd(cluster, ns):
    return kget(cluster, "pddeployment", NAME, "-n", ns)


def _slomet(obj) -> tuple[str, str] | None:
    c = condition(obj, "SLOMet")
    return (c["status"], c["reason"]) if c else None


def _measured(targets, metric: str) -> float | None:
    for t in targets:
        if t.metric == metric and t.percentile == "p90":
            return t.measured
    return None


def _status_measured(obj, metric: str) -> float | None:
    for t in ((obj or {}).get("status", {}).get("slo") or {}).get("targets") or []:
        if t["metric"] == metric and t["percentile"] == "p90" and "measured" in t:
            return parse_duration(t["measured"])
    return None


def _one_bucket(family: str, *values: float) -> float:
    """Width of the widest engine bucket holding any of ``values`` (the simulators use SGLang's defaults)."""
    bounds = [*ex.SGLANG_BUCKETS[family], math.inf]
    return max(bucket_width_at(v, bounds) for v in values)


def _first_record_after(prom: PrometheusServer, metric: str, ns: str, after: float,
                        interval: float) -> tuple[float, float] | None:
    """(unix time, value) of the recording rule's first sample at or after ``after``, if any yet."""
    series = prom.samples(f'sglang_pd:{metric}_seconds:p90{{namespace="{ns}",deployment="{NAME}"}}',
                          seconds=int(interval * 3))
    later = sorted((t, v) for _, values in series for t, v in values if t >= after)
    return later[0] if later else None


def test_prometheus_source_matches_the_scrape_source_and_never_goes_stale(cluster, ns, procs, tmp_path):
    if smg_binary() is None:
        pytest.skip("the smg binary (smg==1.13.0) is not installed")
    t_start = time.monotonic()
    doc = load_example()
    doc["metadata"] = {"name": NAME, "namespace": ns}
    doc["spec"]["prefill"]["replicas"] = 1
    doc["spec"]["decode"]["replicas"] = 2
    doc["spec"]["gateway"]["replicas"] = 1
    doc["spec"]["slo"] = SLO
    spec = SLOSpec.model_validate(SLO)
    # the PodMonitor and PrometheusRule exactly as the reconcile renders them (pddeployment._apply_monitoring)
    pod_monitor, rule = render_monitoring(
        name=NAME, namespace=ns, slo_spec=spec,
        pod_selector={L.LABEL_DEPLOYMENT: NAME, "app.kubernetes.io/managed-by": L.MANAGED_BY},
        role_label=L.LABEL_ROLE, compat_key_label=L.LABEL_COMPAT_KEY, labels=L.common_labels(NAME))
    rules = rule["spec"]
    for group in rules["groups"]:
        group["interval"] = f"{INTERVAL:g}s"  # the test's pace (module docstring)
    prom = PrometheusServer(procs, tmp_path / "prometheus", pod_monitor, rules=rules).start()
    print(f"Prometheus ready at {prom.url} after {time.monotonic() - t_start:.1f}s")
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log", extra_args=[
        "--slo-interval", str(INTERVAL), "--slo-source", "prometheus", "--prometheus-url", prom.url]).start()
    try:
        _run(cluster, ns, procs, prom, doc, tmp_path, t_start)
    except BaseException:
        print(op.log_tail(80))
        print(procs.log("prometheus"))
        raise
    finally:
        op.stop()


def _run(cluster, ns, procs, prom: PrometheusServer, doc, tmp_path, t_start):
    group_interval = parse_duration(prom.rules["groups"][0]["interval"])  # the recording group's
    kapply(cluster, doc)
    ready = wait_for(lambda: (o := _pdd(cluster, ns)) and (c := condition(o, "Ready")) and c["status"] == "True" and o,
                     timeout=90, what="Ready")

    # ---- 1. Prometheus scrapes none of its pods yet: Unknown/NoSeries, never a figure
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and _slomet(o) == ("Unknown", "NoSeries") and o,
                   timeout=6 * INTERVAL + 10, what="SLOMet Unknown/NoSeries")
    assert "PodMonitor" in condition(obj, "SLOMet")["message"]
    assert obj["status"]["scrape"]["source"] == "prometheus" and obj["status"]["scrape"]["problem"] == "NoSeries"
    assert "slo" not in obj["status"]

    # ---- 2. Prometheus scrapes them (file SD of the pods; the PodMonitor's relabeling)
    stack = serve_pd(cluster, procs, ready, sim_extra=SIM)
    deployment_pods = pods(cluster, ns, f"{LBL}/deployment={NAME}")
    prom.set_pods(deployment_pods)
    seen: dict[str, object] = {}

    def every_pod_answers():
        o = _pdd(cluster, ns)
        seen.update(scrape=(o or {}).get("status", {}).get("scrape"), prometheus=prom.target_health())
        s = seen["scrape"] or {}
        return (s.get("decode"), s.get("prefill"), s.get("gateway")) == ("2/2", "1/1", "1/1") and o

    t_pods = time.monotonic()
    try:  # the simulators' and smg's first answers on a loaded 2-core machine: seconds each
        obj = wait_for(every_pod_answers, timeout=90, what="status.scrape: every pod answers Prometheus")
    except AssertionError as e:
        raise AssertionError(f"{e}; last status.scrape and Prometheus' targets: {seen}") from None
    print(f"every pod answered Prometheus {time.monotonic() - t_pods:.1f}s after the targets were set")
    scrape = obj["status"]["scrape"]
    assert scrape["source"] == "prometheus" and scrape["group"] == stack.key[:6]
    assert scrape["measuredAt"].endswith("Z")
    assert _slomet(obj) == ("Unknown", "NoTraffic")
    labels = {tuple(sorted((k, v) for k, v in lbls.items() if k in ("namespace", "deployment", "role", "compat_key")))
              for lbls, _ in prom.query(f'up{{namespace="{ns}"}}')}
    assert len(labels) == 3 and all(dict(l_)["compat_key"] == stack.key for l_ in labels), labels  # 1 per role
    print(f"setup done after {time.monotonic() - t_start:.1f}s")

    # ---- 3. the same traffic through both sources
    def list_deployments():
        return [_pdd(cluster, ns)]

    def serving_key_of(namespace: str, name: str) -> str | None:  # the user-facing Service's selector
        return kget(cluster, "service", name, "-n", namespace)["spec"]["selector"].get(L.LABEL_COMPAT_KEY)

    def list_pods(namespace: str) -> list[dict]:
        return pods(cluster, namespace, f"{LBL}/deployment={NAME}")

    assert serving_key_of(ns, NAME) == stack.key
    scraper = Scraper(list_deployments=list_deployments, serving_key_of=serving_key_of, interval=INTERVAL,
                      list_pods=list_pods)
    source = PrometheusSource(list_deployments=list_deployments, serving_key_of=serving_key_of, list_pods=list_pods,
                              prometheus=PrometheusSettings(url=prom.url), interval=INTERVAL)
    assert asyncio.run(scraper.scrape_once()) == []  # first pass: baselines only
    t_load_start = time.time()
    load = run_load(stack.gateway, stack.served, tmp_path / "load.json", requests=160, concurrency=8, max_tokens=16)
    t_load_done = time.monotonic()
    summary = load["summary"]
    assert summary["failed"] == 0, summary["errors"]
    n_req = summary["ttft_seconds"]["count"]
    # Prometheus has scraped every decode pod since the last request finished
    wait_for(lambda: sum(v for _, v in prom.query(f'{ex.TTFT}_count{{namespace="{ns}",role="decode"}}')) == n_req,
             timeout=10, interval=0.3, what=f"Prometheus holds the {n_req} requests")
    t_held = time.time()  # every sample of the load is in Prometheus' TSDB from here on
    # the Prometheus source reads the records: wait for the rule groups' first evaluation after t_held
    records = {m: wait_for(lambda m=m: _first_record_after(prom, m, ns, t_held, group_interval), interval=0.3,
                           timeout=group_interval + 10, what=f"a sglang_pd:{m}_seconds:p90 record after the load")
               for m in ("ttft", "itl")}
    (scraped,) = asyncio.run(scraper.scrape_once())
    (queried,) = asyncio.run(source.query_once())
    assert time.monotonic() - t_load_done < parse_duration(WINDOW) / 2, "too slow: the window slid past the load"
    assert queried.source == "prometheus" and queried.problem is None and scraped.source == "scrape"
    assert queried.reachable == scraped.reachable == {"prefill": 1, "decode": 2, "gateway": 1}
    assert queried.ready == scraped.ready
    report = {}
    for metric, family in (("ttft", ex.TTFT), ("itl", ex.ITL)):
        a, b = _measured(scraped.slo.targets, metric), _measured(queried.slo.targets, metric)
        width = _one_bucket(family, a, b)
        report[metric] = {"scrape": a, "prometheus": b, "difference": b - a, "bucket": width}
        assert abs(a - b) <= width, report
    obs = {t.metric: (t.observations, u.observations) for t, u in zip(scraped.slo.targets, queried.slo.targets)}
    print("scrape vs prometheus:", json.dumps(report, indent=1), "observations:", obs)
    assert obs["ttft"][0] == n_req
    assert abs(obs["ttft"][1] - n_req) <= 0.2 * n_req, obs  # increase() extrapolates to the window's edges
    assert scraped.slo.met is queried.slo.met is True
    assert scraped.slo.no_traffic is queried.slo.no_traffic is False
    assert scraped.kv_transfer.failures == queried.kv_transfer.failures == 0
    assert queried.kv_transfer.transfers > 0 and queried.kv_transfer.latency_seconds["p90"] is not None

    # the operator's own status (Prometheus source: the same records)
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and _status_measured(o, "ttft") and o, timeout=4 * INTERVAL + 5,
                   what="status.slo from the Prometheus source")
    assert _slomet(obj) == ("True", "TargetsMet"), condition(obj, "SLOMet")
    for metric, family in (("ttft", ex.TTFT), ("itl", ex.ITL)):
        a, in_status = report[metric]["scrape"], _status_measured(obj, metric)
        assert abs(in_status - a) <= _one_bucket(family, a, in_status), (metric, in_status, a)
        recorded = records[metric]
        assert recorded[0] - t_load_start < parse_duration(WINDOW), ("the record's window misses the load", recorded)
        assert abs(recorded[1] - a) <= _one_bucket(family, a, recorded[1]), (metric, recorded, a)
    assert obj["status"]["scrape"]["source"] == "prometheus"

    # ---- 4. Prometheus goes away: Unknown with the reason, the figures go; never a stale True
    prom.stop()
    t_stop = time.monotonic()
    obj = wait_for(lambda: (o := _pdd(cluster, ns)) and _slomet(o) == ("Unknown", "PrometheusUnavailable") and o,
                   timeout=3 * INTERVAL + 15, interval=0.3, what="SLOMet Unknown/PrometheusUnavailable")
    print(f"PrometheusUnavailable {time.monotonic() - t_stop:.1f}s after Prometheus stopped: "
          f"{condition(obj, 'SLOMet')['message']}")
    assert "slo" not in obj["status"]
    assert obj["status"]["scrape"]["problem"] == "PrometheusUnavailable"
    print(f"test took {time.monotonic() - t_start:.1f}s")
