"""Network resources of one run: free loopback ports and a loopback pod network.

Ports are asked from the kernel (bind to port 0) at start time, so parallel clusters do
not collide; the tiny window between choosing a port and the component binding it is
covered by ``cluster`` retrying on "address already in use".

Pod IPs must be bindable on this machine (an engine simulator listens on them), so every
run leases its own /16 inside 127.0.0.0/8 (127.100.0.0/16, 127.101.0.0/16, ...). A lease
is a file naming the run directory; it is free again when that run is no longer live
(the caller decides liveness, see ``state``), so crashed runs do not leak networks.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import socket
from collections.abc import Callable
from pathlib import Path

#: Second octets tried for pod networks 127.<octet>.0.0/16, in order.
POD_NETWORK_OCTETS = range(100, 200)


def free_ports(count: int, *, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that are free on ``host`` right now."""
    sockets, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
            port = sock.getsockname()[1]
            if port not in ports:
                ports.append(port)
    finally:
        for sock in sockets:
            sock.close()
    return ports


def lease_pod_network(*, lease_dir: Path, run_dir: Path,
                      is_live: Callable[[Path], bool]) -> ipaddress.IPv4Network:
    """Lease a free 127.<octet>.0.0/16 for ``run_dir`` and return it.

    ``is_live(other_run_dir)`` tells whether the holder of an existing lease still runs;
    leases of runs that are not live are taken over. A run that already holds a lease
    gets the same network back. Raises RuntimeError when all are taken.
    """
    lease_dir.mkdir(parents=True, exist_ok=True)
    me = str(run_dir.resolve())
    with open(lease_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        free: int | None = None
        for octet in POD_NETWORK_OCTETS:
            lease = lease_dir / f"127.{octet}.json"
            holder = _holder(lease)
            if holder == me:
                return _network(octet)
            if free is None and (holder is None or not is_live(Path(holder))):
                free = octet
        if free is None:
            raise RuntimeError(f"no free loopback pod network left (all leases in {lease_dir} live)")
        (lease_dir / f"127.{free}.json").write_text(json.dumps({"run_dir": me}))
        return _network(free)


def release_pod_network(*, lease_dir: Path, run_dir: Path) -> None:
    """Drop the lease(s) held by ``run_dir`` (no-op when it holds none)."""
    me = str(run_dir.resolve())
    if not lease_dir.is_dir():
        return
    with open(lease_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for lease in lease_dir.glob("127.*.json"):
            if _holder(lease) == me:
                lease.unlink(missing_ok=True)


def _holder(lease: Path) -> str | None:
    try:
        return json.loads(lease.read_text())["run_dir"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _network(octet: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"127.{octet}.0.0/16")
