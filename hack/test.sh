#!/usr/bin/env bash
# Run every test: unit, contract (real SGLang/smg parsers, promtool) and e2e (real
# kube-apiserver + etcd + controllers + kwok, the operator as a process).
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -x`.
# SGLANG_PD_TEST_WORKERS=N (default 0: one process, as CI runs) spreads the files over N
# pytest-xdist workers (--dist loadfile: module fixtures stay in one process; the slowest
# files go first; each worker that runs an e2e file starts its own dev cluster; tests
# marked `exclusive` run alone: tests/conftest.py). Not CI's default yet: on the shared,
# loaded 2-core machine 3 workers cut a 26-test e2e sample from 1353 s to 904 s but two
# tests that watch status transitions failed (docs/images.md "CI").
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
xdist=()
workers=${SGLANG_PD_TEST_WORKERS:-0}
[ "$workers" != 0 ] && xdist=(-n "$workers" --dist loadfile --no-loadscope-reorder)
.venv/bin/pytest -q "${xdist[@]}" "${@:-tests}" || status=$?
if [ -f .run/oracle-differential.txt ]; then  # the differential ran: show its confusion matrix
  sed -n '1,/^False refusals/p' .run/oracle-differential.txt
fi
exit $status
