"""Metrics: SLO measurement from SGLang's histograms, and the operator's own exporter.

Modules, lowest layer first (each imports only from those above it in this list):

- ``histogram``         classic Prometheus histograms and ``histogram_quantile`` (pure math).
- ``exposition``        parse one pod's ``/metrics`` text into the SGLang / smg series we use
                        (the scheduler ranks of one DP shard record the same requests: counted once).
- ``slo``               :class:`~sglang_pd_operator.metrics.slo.SLOEvaluator`: per-pod increases
                        over the window, percentiles, attainment, burn rates -> ``SLOResult``.
- ``kvstore``           the Mooncake Store master's probe (``/health``, ``/metrics``) ->
                        ``MasterHealth``; KV transfer figures; ``KVStoreCollector``.
- ``operator_metrics``  :class:`~sglang_pd_operator.metrics.operator_metrics.OperatorMetrics`:
                        a dedicated registry with reconcile metrics, the published SLO figures
                        and the Mooncake masters' figures (``OperatorMetrics.kvstore``).
- ``promql``            the PromQL expressions of the SLO figures (pure): the PrometheusRule records
                        them per deployment, ``prometheus_source`` asks them for all deployments.
- ``monitoring``        pure rendering of the PodMonitor and PrometheusRule for clusters that run
                        the Prometheus Operator.
- ``scraper``           the asyncio loop of the operator process: every interval it fetches
                        ``/metrics`` of each PDDeployment's ready pods (with ``?name[]=`` only
                        where that provably returns the series: real SGLang answers it with an
                        empty page), feeds the evaluator, probes each Mooncake master, publishes
                        to ``OperatorMetrics`` and hands a ``Health`` per deployment to the
                        operator (which writes it into status).
- ``prometheus_source`` ``--slo-source prometheus``: the same ``Health`` per deployment from one
                        batched set of PromQL queries per interval to the cluster's Prometheus.
- ``sources``           picks the scraper or the Prometheus source (``make_slo_source``).

Each interval the scraper parses, for every ready pod, the families
``evaluator.families_for(role, spec.slo)`` from its page
(``exposition.parse_exposition``) and calls ``evaluator.observe_scrape(key, role, pod,
scrape, now)`` (``evaluator.observe`` does both for a whole text), then ``result = evaluator.evaluate(key, spec.slo, now)`` and
``operator_metrics.publish(result)``; ``slo.slo_condition(result)`` and
``result.to_status()`` give the ``SLOMet`` condition and the ``status.slo`` block
(``reconcilers/status.py``). docs/slo.md explains the choices (sources per role, windows,
burn rates, the scraper, the agreement bound).
"""
