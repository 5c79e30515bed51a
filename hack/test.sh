#!/usr/bin/env bash
# Run every test: unit, contract (real SGLang/smg parsers, promtool) and e2e (real
# kube-apiserver + etcd + controllers + kwok, the operator as a process).
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
./hack/setup.sh --contract
.venv/bin/sglang-pd-operator dev cluster build   # cold: ~9 min once per machine; then a cache hit
exec .venv/bin/pytest -q "${@:-tests}"
