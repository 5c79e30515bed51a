"""The compat key: a stable hash over exactly the inputs that must be equal on both roles.

Pods are labelled with it, the gateway's selectors include it, and a HiCache store is
namespaced by it, so a prefill and a decode pair only when SGLang's PD handshake would
accept them. The inputs (documented in docs/compat-key.md) are:

- model name and revision, SGLang version and runtime image (an older decode cannot parse
  a newer handshake: seed 003, sglang #45075);
- the predicted PD KV layout string and resolved attention backend
  (disaggregation/common/conn.py "KV layout mismatch");
- page size and KV cache dtype (conn.py refuses differing ones);
- transfer backend, --disaggregation-decode-allocation-policy,
  --sampling-mask-max-tokens and --disaggregation-enable-kv-checksum (the flags'
  help texts in arg_groups/fields/disagg.py: "set the same ... on both roles");
- the speculative configuration (DSpark layout is part of the handshake);
- the kernel cache digest, when a KernelBuild is mounted (issue: kernels travel with pods).
- the Kueue queue of a plan whose multi-node roles are queued (``plan.with_queue_compat``):
  not SGLang's, but Kueue refuses to change a running LeaderWorkerSet's queue, so another
  queue must be another group.

Anything else (replicas, resources, gateway policy, node selectors) is deliberately
left out: changing it must not start a new compat group.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

KEY_LENGTH = 10


def compat_key(inputs: Mapping[str, Any]) -> str:
    """A 10-hex-digit sha256 prefix of the canonical JSON of ``inputs`` (sorted keys).

    Stable across processes and Python versions; changes when and only when a value in
    ``inputs`` changes. Raises ``TypeError`` for values JSON cannot encode.
    """
    canonical = json.dumps(dict(inputs), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def differing_inputs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Names of the compat inputs whose values differ between two roles, sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
