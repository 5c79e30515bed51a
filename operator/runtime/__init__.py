"""The operator process: everything that runs the reconcilers, and nothing they decide.

- :mod:`.main`       the entry point (``sglang-pd-operator run``): API client, metrics
  endpoint, CRD check, leader election, then kopf's loop.
- :mod:`.kopf_glue`  the kopf event handlers: every watch event to the control loop.
- :mod:`.controller` the control loop: one work queue, bounded workers, the spread resync,
  the SLO scraper thread.
- :mod:`.workqueue`  the work queue (client-go's semantics: coalescing, one worker per key, backoff).
- :mod:`.cache`      the in-memory view of the watched objects that reconciles read.
- :mod:`.leader`     leader election on a Lease.
- :mod:`.liveness`   heartbeats and the ``/healthz`` answer built from them.
- :mod:`.heap`       giving the heap's free memory back after a burst.

Ranks above the reconcilers and below the command line (tests/unit/test_layers.py), except
three floors the lower layers use: :mod:`.cache` (read through by ``reconcilers.kube``),
:mod:`.liveness` and :mod:`.workqueue` (beaten by reconciles, served and read by
``metrics``). Imports nothing at package level, so importing a floor loads no more.
"""
