#!/usr/bin/env bash
# Run every test: unit, contract (real SGLang/smg parsers, promtool) and e2e (real
# kube-apiserver + etcd + controllers + kwok, the operator as a process).
# Extra arguments go to pytest, e.g. `hack/test.sh tests/unit -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
export SGLANG_PD_OPERATOR_STRICT=1   # a skipped test fails here: CI installs every dependency (tests/conftest.py)
./hack/setup.sh --contract
.venv/bin/sglang-pd-operator dev cluster build   # cold: ~13 min once per machine (LWS included); then a cache hit
.venv/bin/sglang-pd-operator dev cluster build --kueue  # + Kueue (test_kueue.py), its own cache: cold ~4-6 min once (365 s CPU)
# The Go tools the contract tests run, built here (not inside a test, where pytest's
# per-test timeout would cut a cold build short on a busy machine); then a cache hit.
.venv/bin/python hack/promtool/build_promtool.py >/dev/null         # cold: ~5 min
.venv/bin/python hack/promtool/build_prometheus.py >/dev/null       # the server, same module (e2e)
.venv/bin/python hack/kubeconform/build_kubeconform.py >/dev/null   # cold: ~1 min
.venv/bin/python hack/imageref/build_imageref.py >/dev/null         # cold: ~13 s CPU (distribution/reference)
if [ $# -eq 0 ]; then
  # SGLang's own verdict on every example, per role and for the pair (the SGLang oracle).
  .venv/bin/sglang-pd-operator check --sglang examples/*.yaml | grep -E "^examples/|SGLang 0.5.23|^    (prefill|decode|pair)"
fi
rm -f .run/oracle-differential.txt
status=0
.venv/bin/pytest -q "${@:-tests}" || status=$?
if [ -f .run/oracle-differential.txt ]; then  # the differential ran: show its confusion matrix
  sed -n '1,/^False refusals/p' .run/oracle-differential.txt
fi
exit $status
