"""The Mooncake Store master's health and metrics, and the KV transfer figures (measurement and export).

With ``kvCache.hicache.storage.backend: mooncake`` the operator runs one Mooncake Store
master per PDDeployment (render/mooncake.py). The scraper (``scraper.py``) probes it every
interval on its pod IP and metrics port, beside the engine scrape:

- ``GET /health`` -> 200 ``{"status":"ok","role":"leader","ha_state":"serving",
  "service_ready":true,...}`` once it serves (mooncake-transfer-engine 0.3.13.post1,
  checked against the real ``mooncake_master`` in tests/e2e/test_mooncake_master.py);
- ``GET /metrics`` -> Prometheus text, ``master_*`` families without labels (key count,
  allocated / capacity bytes, active clients, per-RPC request and failure counters,
  evictions, cache hits).

:func:`probe_master` (blocking) and :func:`probe_master_async` (aiohttp, what the scraper
uses) give a :class:`MasterHealth`; ``reconcilers/kvstore.py`` turns it into the
``KVStoreReady`` condition. :class:`KVStoreCollector` (registered in
``OperatorMetrics``) exports the master's figures and the KV transfer speed;
:func:`transfer_families` / :func:`transfer_summary` name and read the SGLang transfer
families from the SLO evaluator.

Only imports ``exposition`` of this package, so the scraper and ``OperatorMetrics`` can use
it without importing the reconcilers.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from . import exposition as ex
from .health import MasterHealth

PREFIX = "sglang_pd"
DEFAULT_TIMEOUT_S = 2.0

#: Master gauges the operator reads and exports (name -> exported suffix).
MASTER_GAUGES: Mapping[str, str] = {
    "master_key_count": "keys",
    "master_allocated_bytes": "allocated_bytes",
    "master_total_capacity_bytes": "capacity_bytes",
    "master_active_clients": "clients",
}
#: Master counters: (requests, failures) per operation the store's clients issue.
MASTER_OPERATIONS: Mapping[str, tuple[str, str]] = {
    "put_start": ("master_put_start_requests_total", "master_put_start_failures_total"),
    "put_end": ("master_put_end_requests_total", "master_put_end_failures_total"),
    "get_replica_list": ("master_get_replica_list_requests_total", "master_get_replica_list_failures_total"),
    "exist_key": ("master_exist_key_requests_total", "master_exist_key_failures_total"),
    "batch_put_start": ("master_batch_put_start_requests_total", "master_batch_put_start_failures_total"),
    "batch_get_replica_list": (
        "master_batch_get_replica_list_requests_total",
        "master_batch_get_replica_list_failures_total",
    ),
    "batch_exist_key": ("master_batch_exist_key_requests_total", "master_batch_exist_key_failures_total"),
    "mount_segment": ("master_mount_segment_requests_total", "master_mount_segment_failures_total"),
}
MASTER_EVICTIONS = "master_successful_evictions_total"
MASTER_EVICTED_KEYS = "master_evicted_key_count"


HttpGet = Callable[[str, float], tuple[int, str]]


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """GET ``url``: (status code, body text). Raises OSError (URLError) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http to the master only)
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def parse_master_metrics(text: str) -> dict[str, float]:
    """Every sample of the master's ``/metrics`` text, summed over labels (name -> value).

    The master's families carry no labels in 0.3.13.post1; summing keeps a future
    per-segment label harmless. Counters are keyed by their sample name (``..._total``).
    Raises ValueError for text that is not Prometheus exposition.
    """
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def master_health(url: str, code: int, body: str, metrics_text: str | None) -> MasterHealth:
    """The master's health from its ``/health`` answer (``code``, ``body``) and ``/metrics`` text (pure).

    ``metrics_text``: the 200 answer of ``/metrics``, None when it failed (metrics are best
    effort: ``/health`` alone decides readiness).
    """
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    role, state = doc.get("role"), doc.get("ha_state")
    ready = code == 200 and doc.get("status") == "ok" and doc.get("service_ready", True) is True
    error = None if ready else f"/health answered {code}: {body.strip()[:200] or 'empty'}"
    metrics: dict[str, float] = {}
    if metrics_text is not None:
        try:
            metrics = parse_master_metrics(metrics_text)
        except ValueError:
            pass
    return MasterHealth(url=url, reachable=True, ready=ready, role=role, state=state, error=error, metrics=metrics)


def unreachable(url: str, reason: str) -> MasterHealth:
    """A master whose ``/health`` did not answer."""
    return MasterHealth(url=url, reachable=False, ready=False, error=f"unreachable ({reason})")


def probe_master(url: str, *, timeout: float = DEFAULT_TIMEOUT_S, get: HttpGet = http_get) -> MasterHealth:
    """Ask the master at ``url`` (``http://host:metricsPort``) for ``/health`` and ``/metrics`` (blocking).

    Never raises: an unreachable master, an error status or unparsable answers are
    recorded in the result (``reachable``/``ready`` False and ``error``).
    """
    base = url.rstrip("/")
    try:
        code, body = get(f"{base}/health", timeout)
    except (OSError, ValueError) as e:
        return unreachable(base, _reason(e))
    metrics_text = None
    try:
        mcode, mbody = get(f"{base}/metrics", timeout)
        if mcode == 200:
            metrics_text = mbody
    except (OSError, ValueError):
        pass  # health decides readiness; metrics are best effort
    return master_health(base, code, body, metrics_text)


async def probe_master_async(session: aiohttp.ClientSession, url: str, *,
                             timeout: float = DEFAULT_TIMEOUT_S) -> MasterHealth:
    """:func:`probe_master` on an aiohttp session (the scraper's loop); never raises."""
    base = url.rstrip("/")
    limit = aiohttp.ClientTimeout(total=timeout)
    try:
        async with session.get(f"{base}/health", timeout=limit) as resp:
            code, body = resp.status, await resp.text(errors="replace")
    except asyncio.TimeoutError:
        return unreachable(base, f"no answer within {timeout:g}s")
    except aiohttp.ClientConnectorError as e:
        errno = getattr(e.os_error, "errno", None)
        return unreachable(base, os.strerror(errno) if errno else str(e.os_error) or str(e))
    except (aiohttp.ClientError, OSError, ValueError) as e:
        return unreachable(base, str(e) or e.__class__.__name__)
    metrics_text = None
    try:
        async with session.get(f"{base}/metrics", timeout=limit) as resp:
            if resp.status == 200:
                metrics_text = await resp.text(errors="replace")
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError, ValueError):
        pass  # health decides readiness; metrics are best effort
    return master_health(base, code, body, metrics_text)


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None)
    return str(reason or e) or e.__class__.__name__


# --------------------------------------------------------------------------- KV transfer figures
#: Families of SGLang 0.5.23's PD transfer metrics, per role they are read from (the prefill
#: side records latency and speed per request, both sides count failures; every scheduler
#: rank of a DP shard records the same request, and ``exposition.parse_exposition`` reads
#: each shard once: ``exposition.group_by_shard``).
TRANSFER_FAMILIES: Mapping[str, Mapping[str, ex.Kind]] = {
    "prefill": {
        ex.KV_TRANSFER_LATENCY_MS: ex.Kind.HISTOGRAM,
        ex.KV_TRANSFER_SPEED_GB_S: ex.Kind.HISTOGRAM,
        ex.TRANSFER_FAILED: ex.Kind.COUNTER,
        ex.BOOTSTRAP_FAILED: ex.Kind.COUNTER,
    },
    "decode": {ex.TRANSFER_FAILED: ex.Kind.COUNTER, ex.BOOTSTRAP_FAILED: ex.Kind.COUNTER},
}
PERCENTILES: Mapping[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def transfer_families(role: str) -> dict[str, ex.Kind]:
    """The transfer families to scrape from ``role``'s pods.

    The latency histogram and the failure counters are among the SLO evaluator's defaults;
    the speed histogram is not, so the scraper adds these to its evaluator's families and
    to what it reads (and asks with ``name[]``) from prefill pods (``Scraper.families``).
    """
    return dict(TRANSFER_FAMILIES.get(role, {}))


@dataclass(frozen=True)
class TransferSummary:
    """PD KV transfer over a window: latency (seconds) and speed (GB/s) percentiles, failures.

    Percentiles are None without transfers in the window. ``transfers``: requests whose KV
    moved (count of the latency histogram). Latency and speed are those one scheduler
    measured for its part of the KV (the lowest rank of each DP shard: every rank
    observes its own part, req_time_stats.py ``compute_and_observe_kv_transfer_metrics``
    with its sender's ``get_transfer_metric``), so speed is per rank, not per request.
    """

    latency_seconds: Mapping[str, float | None]
    speed_gb_s: Mapping[str, float | None]
    transfers: float
    transfer_failures: float
    bootstrap_failures: float


def transfer_summary(evaluator: Any, deployment_key: str, *, now: float, window_s: float) -> TransferSummary:
    """Read the window's transfer figures from an ``SLOEvaluator`` fed with :func:`transfer_families`."""
    lat = evaluator.window_histogram(deployment_key, "prefill", ex.KV_TRANSFER_LATENCY_MS, now, window_s)
    speed = evaluator.window_histogram(deployment_key, "prefill", ex.KV_TRANSFER_SPEED_GB_S, now, window_s)

    def q(h, scale: float) -> dict[str, float | None]:
        return {p: (None if h is None or (v := h.quantile(x)) is None else v * scale) for p, x in PERCENTILES.items()}

    failures = bootstrap = 0.0
    for role in ("prefill", "decode"):
        failures += evaluator.window_counter(deployment_key, role, ex.TRANSFER_FAILED, now, window_s)
        bootstrap += evaluator.window_counter(deployment_key, role, ex.BOOTSTRAP_FAILED, now, window_s)
    return TransferSummary(
        latency_seconds=q(lat, 1e-3),
        speed_gb_s=q(speed, 1.0),
        transfers=0.0 if lat is None else lat.total,
        transfer_failures=failures,
        bootstrap_failures=bootstrap,
    )


def scrape_transfer(text: str, role: str) -> ex.Scrape:
    """One pod's transfer families from its ``/metrics`` text (cumulative, summed over labels)."""
    return ex.parse_exposition(text, families=transfer_families(role) or TRANSFER_FAMILIES["prefill"])


# --------------------------------------------------------------------------- exporter
def _split(key: str) -> list[str]:
    ns, _, name = key.rpartition("/")
    return [ns, name]


class KVStoreCollector(Collector):
    """Exposes the latest master health and transfer summary of each PDDeployment.

    ``OperatorMetrics`` registers one (``OperatorMetrics.kvstore``) and the scraper calls
    :meth:`publish` after each probe and :meth:`remove` when a PDDeployment goes.
    Families (labels ``namespace``, ``deployment``): ``sglang_pd_kvstore_up``,
    ``sglang_pd_kvstore_{keys,allocated_bytes,capacity_bytes,clients}``,
    ``sglang_pd_kvstore_requests_total`` / ``..._failures_total`` (label ``operation``; the
    master's own counters, reset when it restarts), ``sglang_pd_kvstore_evictions_total``,
    ``sglang_pd_kv_transfer_speed_gb_s`` (label ``percentile``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health: dict[str, MasterHealth] = {}
        self._transfer: dict[str, TransferSummary] = {}

    def publish(self, deployment_key: str, health: MasterHealth | None = None,
                transfer: TransferSummary | None = None) -> None:
        """Record the latest figures of ``namespace/name`` (None leaves that part as it was)."""
        with self._lock:
            if health is not None:
                self._health[deployment_key] = health
            if transfer is not None:
                self._transfer[deployment_key] = transfer

    def clear_health(self, deployment_key: str) -> None:
        """Stop exporting the master figures of a PDDeployment (its spec no longer uses Mooncake storage)."""
        with self._lock:
            self._health.pop(deployment_key, None)

    def remove(self, deployment_key: str) -> None:
        """Forget a PDDeployment (deleted)."""
        with self._lock:
            self._health.pop(deployment_key, None)
            self._transfer.pop(deployment_key, None)

    def describe(self) -> Iterable:
        return []

    def collect(self) -> Iterable:
        with self._lock:
            health, transfer = dict(self._health), dict(self._transfer)
        dl = ["namespace", "deployment"]
        up = GaugeMetricFamily(f"{PREFIX}_kvstore_up", "1 when the Mooncake master serves (KVStoreReady).", labels=dl)
        gauges = {
            name: GaugeMetricFamily(f"{PREFIX}_kvstore_{suffix}", f"Mooncake master {name}.", labels=dl)
            for name, suffix in MASTER_GAUGES.items()
        }
        ol = dl + ["operation"]
        requests = CounterMetricFamily(f"{PREFIX}_kvstore_requests", "Mooncake master RPC requests.", labels=ol)
        failures = CounterMetricFamily(f"{PREFIX}_kvstore_failures", "Mooncake master failed RPC requests.", labels=ol)
        evictions = CounterMetricFamily(f"{PREFIX}_kvstore_evictions", "Mooncake master successful evictions.",
                                        labels=dl)
        speed = GaugeMetricFamily(f"{PREFIX}_kv_transfer_speed_gb_s",
                                  "PD KV transfer speed percentile over the window (prefill pods), GB/s.",
                                  labels=dl + ["percentile"])
        for key, h in health.items():
            d = _split(key)
            up.add_metric(d, 1.0 if h.ready else 0.0)
            for name, fam in gauges.items():
                if name in h.metrics:
                    fam.add_metric(d, h.metrics[name])
            for op, (req, fail) in MASTER_OPERATIONS.items():
                if req in h.metrics:
                    requests.add_metric(d + [op], h.metrics[req])
                if fail in h.metrics:
                    failures.add_metric(d + [op], h.metrics[fail])
            if MASTER_EVICTIONS in h.metrics:
                evictions.add_metric(d, h.metrics[MASTER_EVICTIONS])
        for key, t in transfer.items():
            for p, v in t.speed_gb_s.items():
                if v is not None and not math.isnan(v):
                    speed.add_metric(_split(key) + [p], v)
        yield from (up, *gauges.values(), requests, failures, evictions, speed)
