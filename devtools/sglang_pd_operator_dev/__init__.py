"""sglang-pd-operator's dev tools: what the demo, the tests and the benchmarks use, never the operator.

A distribution of its own (``sglang-pd-operator-dev``, ``devtools/pyproject.toml``),
installed editable by ``hack/setup.sh`` beside the operator; the operator package never
imports it (tests/unit/test_layers.py) and its image does not contain it. It adds the
``dev`` commands to ``sglang-pd-operator`` through the entry point group
``sglang_pd_operator.cli``.

- :mod:`.cluster`      the local control plane (etcd, kube-apiserver, controllers, kwok,
  LeaderWorkerSet) and ``dev demo``; ``sglang-pd-operator dev cluster ...``.
- :mod:`.kernelbuild`  the ``standin`` KernelBuild recipe and its stand-in compile/serve
  program, for builds on machines without GPUs.

Imports nothing at package level: :mod:`.kernelbuild.standin` runs with the standard
library only (copied beside the builder, as a build pod would hold it).
"""
