"""Drain, not kill: the preStop hook of engine and gateway pods (pure).

A pod that is going away (a paired rollout's old group, an in-place update, a scale-down
by the planner, an HPA or ``kubectl scale``, a deleted pod) first stops taking new
requests: its deletion timestamp takes it out of its Service's endpoints and smg removes
the worker at once (smg 1.13 ``service_discovery.rs``: a pod event with a deletion
timestamp runs ``handle_pod_deletion``). Then the kubelet runs the preStop hook before it
sends SIGTERM. The hook rendered here waits until the pod has nothing in flight, bounded
by ``rollout.drainGracePeriod``:

- an engine: until SGLang's own gauges (:data:`ENGINE_GAUGES`, ``observability/
  metrics_collector.py``) read 0 on two polls in a row: running and waiting requests and
  the PD queues (a prefill whose KV transfer is still in flight counts as busy, else its
  decode partner fails the request);
- a gateway: until smg's own in-flight gauge (:data:`GATEWAY_GAUGES`) reads 0.

The hook is one ``python3 -c`` program (the SGLang image ships Python) that reads the
pod's own ``/metrics`` on 127.0.0.1; it never fails the pod's stop: when the page cannot
be read (the server is gone) it returns at once. ``terminationGracePeriodSeconds`` is the
drain grace plus a margin for the container's own SIGTERM handling (SGLang's tokenizer
manager drains again and exits, ``SignalHandler.sigterm_handler``).
"""

from __future__ import annotations

import math
from typing import Any

#: SGLang 0.5.23's per-scheduler gauges that count requests a pod still holds.
#: tests/contract/test_sglang_metrics_contract.py holds them to the real metrics collector.
ENGINE_GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
#: smg 1.13's gauges of requests it admitted and of requests it has open to each worker (its
#: Prometheus exporter; tests/contract/test_smg_simulator.py reads them from the real binary).
GATEWAY_GAUGES = ("smg_admission_inflight", "smg_worker_requests_active")
#: Seconds the hook waits before its first look, for the endpoint and smg to drop the pod.
SETTLE_S = 2
#: Seconds added to the drain grace for an engine's own stop after SIGTERM (SGLang drains
#: again and frees the GPUs); with the default 60 s drain grace the pod's grace stays 120 s.
ENGINE_SHUTDOWN_MARGIN_S = 60
#: Seconds added to the drain grace for smg's stop after SIGTERM.
GATEWAY_SHUTDOWN_MARGIN_S = 10

#: The pod's own address inside its network namespace (an argument of the hook, not part of the program).
POD_LOOPBACK = "127.0.0.1"
#: The hook: argv = host, port, grace seconds, settle seconds, gauge names. Exits 0 always.
DRAIN_SCRIPT = """\
import sys, time, urllib.request
host, port, grace, settle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
names = tuple(sys.argv[5:])
start = time.monotonic()
deadline = start + grace
time.sleep(min(settle, grace))
quiet = 0
while time.monotonic() < deadline:
    try:
        page = urllib.request.urlopen("http://%s:%d/metrics" % (host, port), timeout=2).read().decode()
    except Exception:
        break
    busy = 0.0
    for line in page.splitlines():
        if line.startswith(names):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                busy += float(line.rsplit(" ", 1)[1])
    quiet = quiet + 1 if busy == 0 else 0
    if quiet >= 2:
        break
    time.sleep(0.5)
print("drain: %.1fs, %s" % (time.monotonic() - start, "idle" if quiet >= 2 else "grace period over"))
"""


def drain_seconds(drain_grace_s: float) -> int:
    """Whole seconds of the drain bound (at least 1)."""
    return max(1, math.ceil(drain_grace_s))


def termination_grace_seconds(drain_grace_s: float, *, gateway: bool = False) -> int:
    """``terminationGracePeriodSeconds`` of a drained pod: the drain bound plus the container's own stop
    (:data:`ENGINE_SHUTDOWN_MARGIN_S`, or :data:`GATEWAY_SHUTDOWN_MARGIN_S` for a gateway)."""
    return drain_seconds(drain_grace_s) + (GATEWAY_SHUTDOWN_MARGIN_S if gateway else ENGINE_SHUTDOWN_MARGIN_S)


def prestop(*, port: int, drain_grace_s: float, gauges: tuple[str, ...]) -> dict[str, Any]:
    """The container ``lifecycle`` whose preStop waits until ``gauges`` on ``port``'s /metrics read 0.

    ``port``: the container port serving /metrics (an engine's HTTP port, the gateway's
    metrics port); ``drain_grace_s``: ``rollout.drainGracePeriod`` in seconds.
    """
    command = ["python3", "-c", DRAIN_SCRIPT, POD_LOOPBACK, str(port), str(drain_seconds(drain_grace_s)), str(SETTLE_S),
               *gauges]
    return {"preStop": {"exec": {"command": command}}}
