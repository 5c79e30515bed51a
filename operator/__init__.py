"""sglang-pd-operator: SGLang prefill/decode disaggregation on Kubernetes.

Rooms, lowest first (a module imports only from its own room or lower ones;
tests/unit/test_layers.py):

- ``api``         pydantic models of the custom resources (the one source of the CRDs);
  facts of the LeaderWorkerSet API (``api.lws``).
- ``catalog``     accelerator, kernel-plugin and model catalogs loaded from ``kernels/``.
- ``planning``    pure functions: spec -> resolved per-role plan, KV layout, compat key, rules.
- ``render``      pure functions: plan -> desired Kubernetes objects as plain dicts.
- ``kernelbuild``, ``metrics``, ``oracle``  kernel builds; Prometheus exporter and SLOs;
  SGLang's own verdict (``check --sglang``).
- ``reconcilers`` the only code that talks to the API server: apply, observe, status.
- ``runtime``     the process: control loop, work queue, object cache, leader election,
  liveness, heap, kopf glue, entry point.
- ``cli``         the command line.

The dev tools (the dev cluster, the demo, the KernelBuild stand-in) are not here: they are
the distribution ``sglang-pd-operator-dev`` (``devtools/``), which this package never imports.
"""

__version__ = "0.2.0"
