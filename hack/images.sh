#!/usr/bin/env bash
# Build, start and push the operator and oracle images without a Docker engine (docs/images.md):
#   hack/images.sh build operator|oracle   OCI image under .run/images/ (mmdebstrap + umoci; digest printed)
#   hack/images.sh smoke operator|oracle   start it with runc, read-only root, user 65532
#   hack/images.sh push [operator|oracle]  to the local registry (built from its Go module, on loopback)
#   hack/images.sh chart-check [--oracle]  the chart pinned to the built digest(s) resolves in that registry
#   hack/images.sh verify-reproducible operator|oracle   build twice from nothing (no cached base), compare digests
#   hack/images.sh ci                      what .ci/run runs: rebuild and check only when the inputs changed
#   hack/images.sh lock-base               resolve the Debian base anew (images/base/debian.yaml + Dockerfile pins)
# Needs root (mmdebstrap, chroot, runc); installs Debian's mmdebstrap/umoci/runc/skopeo when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONSAFEPATH=1
[ -x .venv/bin/python ] || ./hack/setup.sh
exec .venv/bin/python hack/images/images.py "$@"
