#!/usr/bin/env bash
# Run every test: unit, contract (real SGLang/smg parsers, promtool) and e2e (real
# kube-apiserver + etcd + controllers + kwok, the operator as a process).
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -x` (`-n 0` runs in one process).
# Tests run in SGLANG_PD_TEST_WORKERS pytest-xdist workers (default 3), a test file per
# worker at a time (--dist loadfile: module fixtures stay in one process); each worker that
# runs an e2e file starts its own dev cluster (fresh run directory, free ports, its own pod
# network), so an operator a test starts cluster-wide never meets another test's. The e2e
# tests mostly wait on the control plane, so 3 workers on 2 cores roughly halve the run
# (docs/testing.md has the figures). The slowest files are sent first (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
export SGLANG_PD_OPERATOR_STRICT=1   # a skipped test fails here: CI installs every dependency (tests/conftest.py)
./hack/prepare.sh   # .venv, the dev cluster's binaries, Kueue, the Go tools (cache hits after the first run)
if [ $# -eq 0 ]; then
  # SGLang's own verdict on every example, per role and for the pair (the SGLang oracle).
  .venv/bin/sglang-pd-operator check --sglang examples/*.yaml | grep -E "^examples/|SGLang 0.5.23|^    (prefill|decode|pair)"
fi
rm -f .run/oracle-differential.txt
status=0
.venv/bin/pytest -q -n "${SGLANG_PD_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "${@:-tests}" || status=$?
if [ -f .run/oracle-differential.txt ]; then  # the differential ran: show its confusion matrix
  sed -n '1,/^False refusals/p' .run/oracle-differential.txt
fi
exit $status
