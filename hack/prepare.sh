#!/usr/bin/env bash
# Install and build everything the tests run, so no test waits on a build: the .venv with
# the contract set (hack/setup.sh --contract), the dev cluster's binaries (LWS included) and
# Kueue, and the Go tools of the contract and e2e tests. Each step is a cache hit after its
# first run on a machine (the whole script then takes seconds). hack/test.sh runs it first;
# .ci/run runs it on its own before starting `hack/images.sh ci` alongside the tests.
# The Go tools are built here, not inside a test, where pytest's per-test timeout would cut
# a cold build short on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
./hack/setup.sh --contract
.venv/bin/sglang-pd-operator dev cluster build   # cold: ~13 min once per machine (LWS included); then a cache hit
.venv/bin/sglang-pd-operator dev cluster build --kueue  # + Kueue (test_kueue.py), its own cache: cold 187 s once (after the line above; docs/dev-cluster.md)
.venv/bin/python hack/promtool/build_promtool.py >/dev/null         # cold: ~5 min
.venv/bin/python hack/promtool/build_prometheus.py >/dev/null       # the server, same module (e2e)
.venv/bin/python hack/kubeconform/build_kubeconform.py >/dev/null   # cold: ~1 min
.venv/bin/python hack/imageref/build_imageref.py >/dev/null         # cold: ~13 s CPU (distribution/reference)
