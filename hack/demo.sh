#!/usr/bin/env bash
# The main job: a local control plane with fake GPU nodes, the operator, and the GB300
# example applied; prints the resolved plan and every child object. Ctrl-C stops it all.
# Options go to `sglang-pd-operator dev demo` (e.g. --once, --example FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
./hack/setup.sh --contract   # the SGLang oracle service runs from the venv too
exec .venv/bin/sglang-pd-operator dev demo "$@"
