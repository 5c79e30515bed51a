"""A TCP proxy in front of the dev cluster's API server that can freeze and cut the operator's connections.

Used by the e2e tests that take the operator's API connections away: ``test_resilience.py``
(half-open connections, an API server that vanishes) and ``test_informer.py`` (watch
streams cut while a child is deleted and etcd compacted: the watch must start over with a
real 410 Gone).
"""

from __future__ import annotations

import select
import socket
import threading
from pathlib import Path

import yaml


def proxied_kubeconfig(cluster, proxy: "StallingProxy", path: Path) -> Path:
    """A copy of the cluster's kubeconfig whose server is the proxy (the serving certificate covers 127.0.0.1)."""
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(cfg))
    return path


class StallingProxy:
    """A loopback TCP proxy in front of the API server that can freeze connections.

    ``stall()``: every established connection stops forwarding in both directions and is
    not closed (a half-open connection: the peer is gone, no FIN, no RST) until
    ``sever()`` closes every stalled connection (what a reset looks like to both ends).
    ``blackhole(True)``: new connections are accepted and never answered (not even the
    TLS handshake); ``blackhole(False)``: new connections are forwarded again. Frozen and
    blackholed sockets stay open until :meth:`close`.
    """

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self._holed = False
        self._generation = 0  # connections of an older generation are frozen
        self._held: list[socket.socket] = []
        self._pairs: list[tuple[int, socket.socket, socket.socket]] = []  # (generation, client, upstream)
        self._guard = threading.Lock()
        self._forward = threading.Lock()  # held while a chunk is forwarded (stall() waits for it)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        """Freeze every established connection; once this returns no byte of theirs is forwarded."""
        with self._forward, self._guard:  # waits for a forward in progress: none after this
            self._generation += 1

    def sever(self) -> None:
        """Close every stalled connection (both sockets); connections made since the last stall go on."""
        with self._guard:
            gen = self._generation
            doomed = [pair for pair in self._pairs if pair[0] != gen]
            self._pairs = [pair for pair in self._pairs if pair[0] == gen]
        for _, a, b in doomed:
            for sock in (a, b):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def blackhole(self, on: bool) -> None:
        with self._guard:
            self._holed = on
            self._generation += 1

    def _accept(self) -> None:
        self.server.settimeout(0.2)
        while not self._closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            with self._guard:
                self._held.append(client)
                holed, gen = self._holed, self._generation
            if not holed:
                threading.Thread(target=self._pump, args=(client, gen), daemon=True).start()

    def _pump(self, client: socket.socket, gen: int) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        with self._guard:
            self._held.append(upstream)
            self._pairs.append((gen, client, upstream))
        peers = {client: upstream, upstream: client}
        while not self._closed.is_set():
            with self._guard:
                frozen = gen != self._generation
            if frozen:  # hold both sockets open, forward nothing, until sever() or close()
                while not self._closed.wait(0.2) and client.fileno() != -1:
                    pass
                return
            ready, _, _ = select.select(list(peers), [], [], 0.2)
            for sock in ready:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    for s in peers:
                        s.close()
                    return
                with self._forward:
                    with self._guard:
                        if gen != self._generation:
                            break  # stalled meanwhile: this chunk is never delivered
                    peers[sock].sendall(data)

    def close(self) -> None:
        self._closed.set()
        self.server.close()
        with self._guard:
            for s in self._held:
                try:
                    s.close()
                except OSError:
                    pass
