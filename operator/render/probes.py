"""Engine container probes (pure): what the kubelet checks before a pod gets traffic.

Decode and every startup/liveness probe ask SGLang's HTTP ``/health``. A prefill pod is
Ready only when its bootstrap server answers as well: smg registers a prefill worker as
soon as the pod is Ready, and decode rendezvous through the bootstrap port, so a prefill
whose bootstrap server is not listening yet (sglang #23430: smg registered one in 1.3 s
with the port closed) fails every request routed to it. A container has one readiness
probe, so both checks are one exec probe.

Why exec and not httpGet: an httpGet probe reaches one port; SGLang's ``/health`` does not
look at the bootstrap server. The probe is ``python3 -I -S -c`` (the engine image's own
interpreter, no site-packages: about 10 ms CPU per run, every ``READINESS_PERIOD_S``)
with stdlib ``socket`` only: an HTTP/1.0 ``GET /health`` to the bootstrap server
(CommonKVBootstrapServer's route, sglang 0.5.23 disaggregation/common/conn.py) and to
the engine, on 127.0.0.1 (both bind ``--host 0.0.0.0``). The script keeps its own
deadline (``PROBE_BUDGET_S``), shorter than the kubelet's ``timeoutSeconds``, so a slow
engine fails with a message the kubelet records in the pod's events, never a killed
probe.
"""

from __future__ import annotations

from typing import Any

from ..planning.engine_args import ENGINE_PORT

READINESS_PERIOD_S = 5
READINESS_FAILURES = 3
#: Seconds the combined check may spend; the bootstrap server gets at most BOOTSTRAP_BUDGET_S of it.
PROBE_BUDGET_S = 5
BOOTSTRAP_BUDGET_S = 1
#: The kubelet's timeout: one second above the script's own budget.
PROBE_TIMEOUT_S = PROBE_BUDGET_S + 1
#: The address the exec probe checks: the pod's own loopback (its network namespace).
PROBE_HOST = "127.0.0.1"

#: argv[1] host, then (port, seconds) pairs checked in order; exit 0 only when each answers 200.
PREFILL_READY_SCRIPT = """\
import socket, sys, time
host, checks = sys.argv[1], sys.argv[2:]
deadline = time.monotonic() + float(checks[-1])
for port, budget in zip(checks[0::2], checks[1::2]):
    what, end = f"{host}:{port}/health", min(deadline, time.monotonic() + float(budget))
    try:
        with socket.create_connection((host, int(port)), timeout=end - time.monotonic()) as s:
            s.settimeout(max(0.05, end - time.monotonic()))
            s.sendall(b"GET /health HTTP/1.0\\r\\nHost: " + host.encode() + b"\\r\\n\\r\\n")
            line = s.recv(64).split(b"\\r\\n", 1)[0].decode(errors="replace")
    except (OSError, ValueError) as e:
        sys.exit(f"{what}: {e or type(e).__name__}")
    if line.split(" ")[1:2] != ["200"]:
        sys.exit(f"{what}: {line or 'no answer'}")
"""


def http_probe(path: str, *, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    """An httpGet probe of ``path`` on the container's ``http`` port."""
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def prefill_readiness_probe(bootstrap_port: int) -> dict[str, Any]:
    """The prefill container's readiness probe: its bootstrap server and SGLang's ``/health`` both answer 200.

    The bootstrap server is asked first, within ``BOOTSTRAP_BUDGET_S``; the engine gets the
    rest of ``PROBE_BUDGET_S`` (its ``/health`` runs a one-token generation).
    """
    argv = [
        "python3", "-I", "-S", "-c", PREFILL_READY_SCRIPT, PROBE_HOST,
        str(bootstrap_port), str(BOOTSTRAP_BUDGET_S), str(ENGINE_PORT), str(PROBE_BUDGET_S),
    ]  # fmt: skip
    return {
        "exec": {"command": argv},
        "periodSeconds": READINESS_PERIOD_S,
        "failureThreshold": READINESS_FAILURES,
        "timeoutSeconds": PROBE_TIMEOUT_S,
    }


def readiness_probe(role: str, *, bootstrap_port: int) -> dict[str, Any]:
    """The engine container's readiness probe for ``role`` (prefill: combined, decode: ``/health``).

    The probe of a single-node replica's pod and of a multi-node replica's leader (node 0,
    which runs the HTTP server and, on prefill, the bootstrap server).
    """
    if role == "prefill":
        return prefill_readiness_probe(bootstrap_port)
    return http_probe("/health", period=READINESS_PERIOD_S, failures=READINESS_FAILURES)


def worker_readiness_probe() -> dict[str, Any]:
    """Readiness of a multi-node replica's worker pod (node 1..N-1): its stand-in ``/health`` answers.

    What it means, from sglang 0.5.23 entrypoints/engine.py ``_launch_subprocesses``: a
    node of rank >= 1 runs no tokenizer and no HTTP server; it waits until its own
    schedulers are ready (``scheduler_init_result.wait_for_ready()``: torch.distributed
    joined with every rank of the replica, weights loaded) and only then starts
    ``launch_dummy_health_check_server`` (utils/common.py) on ``--port``, whose ``/health``
    always answers 200; when its schedulers exit, the process returns and the container
    stops. So the port answering means "this node's schedulers joined the replica and
    live", nothing more: the worker has no generation path to test. Whether the replica
    serves is the leader's real ``/health`` (a one-token generation through every rank,
    SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION on by default), and LeaderWorkerSet counts a
    group ready only when its leader and every worker are (its ``readyReplicas``), so the
    PDDeployment counts a replica Ready only when its whole group is.
    """
    return http_probe("/health", period=READINESS_PERIOD_S, failures=READINESS_FAILURES)
