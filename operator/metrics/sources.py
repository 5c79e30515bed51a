"""Pick the SLO source the operator runs: its own scrape of every pod, or the cluster's Prometheus.

``--slo-source scrape`` (the default, no monitoring stack needed):
:class:`~sglang_pd_operator.metrics.scraper.Scraper` fetches every ready engine and
gateway pod's ``/metrics`` each interval. ``--slo-source prometheus``:
:class:`~sglang_pd_operator.metrics.prometheus_source.PrometheusSource` asks the
cluster's Prometheus one batched set of PromQL queries per interval (the PodMonitor and
PrometheusRule's expressions). Both have the same shape: an async ``run()`` loop that
calls ``on_health(Health)``, ``on_forget(key)`` and ``on_pass()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .operator_metrics import OperatorMetrics
from .prometheus_source import PrometheusSettings, PrometheusSource
from .scraper import HealthCallback, Scraper, ServingKeyOf

SCRAPE, PROMETHEUS = "scrape", "prometheus"
SLO_SOURCES = (SCRAPE, PROMETHEUS)


def make_slo_source(
    kind: str,
    *,
    list_deployments: Callable[[], list[dict[str, Any]]],
    serving_key_of: ServingKeyOf,
    list_pods: Callable[[str], list[dict[str, Any]]],
    on_health: HealthCallback,
    on_forget: Callable[[str], None],
    on_pass: Callable[[], None],
    metrics: OperatorMetrics | None,
    interval: float,
    namespaces: Sequence[str] | None = None,
    prometheus: PrometheusSettings | None = None,
) -> Scraper | PrometheusSource:
    """The SLO loop for ``kind`` (:data:`SLO_SOURCES`), wired to the given callables.

    ``serving_key_of(namespace, name)``: the compat key a PDDeployment's user-facing Service
    selects (the operator's cache); ``list_pods``: what the scraper scrapes, and what the
    Prometheus source counts the serving group's ready pods from and finds Mooncake masters in. ``prometheus``: required for ``prometheus``. Raises ValueError for an
    unknown kind or a missing Prometheus setting (the CLI refuses both first).
    """
    if kind == SCRAPE:
        return Scraper(list_deployments=list_deployments, serving_key_of=serving_key_of, list_pods=list_pods, on_health=on_health,
                       on_forget=on_forget, metrics=metrics, interval=interval, on_pass=on_pass)
    if kind == PROMETHEUS:
        if prometheus is None:
            raise ValueError("--slo-source prometheus needs --prometheus-url")
        return PrometheusSource(list_deployments=list_deployments, serving_key_of=serving_key_of, prometheus=prometheus, on_health=on_health,
                                on_forget=on_forget, on_pass=on_pass, metrics=metrics, namespaces=namespaces,
                                interval=interval, list_pods=list_pods)
    raise ValueError(f"unknown SLO source {kind!r}: one of {', '.join(SLO_SOURCES)}")
