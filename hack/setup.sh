#!/usr/bin/env bash
# Create .venv and install the project with its test dependencies, at the versions of
# requirements/lock.txt (a pip constraints file; hack/lock.py writes it).
#   hack/setup.sh             the operator + test tools + the dev tools (devtools/: the dev
#                             cluster, the demo), both editable
#   hack/setup.sh --contract  also the real sglang==0.5.23 and smg==1.13.0 (CPU-only, see
#                             requirements/contract.txt) for the contract and gateway tests
#                             and the SGLang oracle (check --sglang)
# Idempotent: a stamp keyed on the dependency files skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1   # operator/ must never shadow the standard library's operator module
contract=""
[ "${1:-}" = "--contract" ] && contract="-contract"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
hash=$(cat pyproject.toml devtools/pyproject.toml requirements/*.txt operator/oracle/requirements/*.txt operator/oracle/cuda_stubs.py | sha256sum | cut -c1-16)
stamp=".venv/.installed-${hash}${contract}"
if [ ! -f "$stamp" ]; then
  echo "setup: installing the project into .venv"
  lock=(-c requirements/lock.txt)
  .venv/bin/pip install -q "${lock[@]}" -e '.[test]' -e ./devtools
  if [ -n "$contract" ]; then
    # mooncake_master (the KV store e2e) links libibverbs; Debian's package provides it.
    if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 '; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing libibverbs1 (Debian) for mooncake_master"
        apt-get install -y -q libibverbs1 >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null; }
      else
        echo "setup: warning: libibverbs.so.1 missing; the Mooncake master e2e test will fail (apt-get install libibverbs1)" >&2
      fi
    fi
    echo "setup: installing the real SGLang and smg parsers (CPU) into .venv"
    .venv/bin/pip install -q "${lock[@]}" -r requirements/contract.txt
    .venv/bin/pip install -q "${lock[@]}" --no-deps -r requirements/contract-nodeps.txt
    .venv/bin/pip install -q "${lock[@]}" -r requirements/lint.txt
    .venv/bin/python -m sglang_pd_operator.oracle.cuda_stubs
  fi
  touch "$stamp"
fi
