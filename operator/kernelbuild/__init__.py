"""Kernel builds: pre-compiled SGLang kernel caches that travel with the engine pods.

This package imports nothing at package level on purpose: :mod:`.builder` runs inside
the SGLang runtime image with the standard library only (the build pod's init container
copies it there), so importing the package must not pull in pydantic, kopf or the
kubernetes client.

Modules:

- :mod:`.recipes`  the build catalog ``kernels/builds.yaml`` (recipes, image builds).
- :mod:`.inputs`   pure: a PDDeployment plan role -> the KernelBuild inputs, hash and name.
- :mod:`.render`   pure: a KernelBuild -> its PVC, request ConfigMap and build Job.
- :mod:`.lifecycle` pure: observed Jobs and status -> the next status and actions
  (reuse, retry with backoff, retention).
- :mod:`.gate`     pure: for the PDDeployment reconciler, per role: which build, ready or
  not; the extra compat-key input; the render helpers that mount the cache.
- :mod:`.builder`  the Job's entrypoint (stdlib only): build, verify, publish atomically.

The ``standin`` recipe (stand-in compile/serve commands for machines without GPUs) is a
dev tool (the repository's devtools/ package), never in this catalog.
"""
