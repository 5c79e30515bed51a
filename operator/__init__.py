"""sglang-pd-operator: SGLang prefill/decode disaggregation on Kubernetes.

Layers, lowest first (a module imports only from its own layer or lower ones):

- ``api``         pydantic models of the custom resources; the one source of the CRDs.
- ``catalog``     accelerator, kernel-plugin and model catalogs loaded from ``kernels/``.
- ``planning``    pure functions: spec -> resolved per-role plan, KV layout, compat key, rules.
- ``render``      pure functions: plan -> desired Kubernetes objects as plain dicts.
- ``reconcilers`` the only code that talks to the API server: apply, observe, status.
- ``metrics``     Prometheus exporter and SLO computation.
- ``handlers``    thin kopf handlers; ``cli`` the command line.
"""

__version__ = "0.1.0"
