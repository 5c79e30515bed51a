#!/usr/bin/env bash
# Create .venv and install the project with its test dependencies.
#   hack/setup.sh             the operator + test tools
#   hack/setup.sh --contract  also the real sglang==0.5.23 and smg==1.13.0 (CPU-only, see
#                             requirements/contract.txt) for the contract and gateway tests
# Idempotent: a stamp keyed on the dependency files skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1   # operator/ must never shadow the standard library's operator module
contract=""
[ "${1:-}" = "--contract" ] && contract="-contract"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
hash=$(cat pyproject.toml requirements/contract.txt requirements/contract-nodeps.txt requirements/cuda_stubs.py | sha256sum | cut -c1-16)
stamp=".venv/.installed-${hash}${contract}"
if [ ! -f "$stamp" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/pip install -q -e '.[test]'
  if [ -n "$contract" ]; then
    echo "setup: installing the real SGLang and smg parsers (CPU) into .venv"
    .venv/bin/pip install -q -r requirements/contract.txt
    .venv/bin/pip install -q --no-deps -r requirements/contract-nodeps.txt
    .venv/bin/python requirements/cuda_stubs.py
  fi
  touch "$stamp"
fi
