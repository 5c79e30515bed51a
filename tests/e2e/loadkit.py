"""Bounded load through the real smg, and the parts of a node the dev cluster lacks (issue 25, item 5).

Used by ``test_no_request_lost.py`` (scaling, pod deletion, in-place updates, operator
restarts) and ``test_no_request_lost_rollout.py`` (paired rollouts, a deleted gateway pod,
the release upgrade). Three stand-ins, each named for what it stands in for:

- :class:`KubeletStandIn`: the kubelet's container start and stop. kwok runs no container:
  this starts an engine simulator for every engine pod that gets an IP and the REAL smg
  (the pod's rendered arguments on the pod's address) for every gateway pod; when a pod is
  deleted it runs the pod's rendered preStop hook (the exact command: ``python3`` is this
  interpreter, the pod's loopback is its IP, as ``simkit.run_probe`` does for exec probes),
  timed (the drain cost), then stops the process (SIGTERM); with ``drain = False`` (a control)
  it kills it outright instead (SIGKILL, no preStop). It holds each pod with a
  finalizer until its process stopped, as a kubelet holds a terminating pod (and its IP)
  until its containers are gone: kwok alone deletes a pod at once and hands its IP on.
- :class:`ServiceProxyStandIn`: kube-proxy's part for one Service port. The real kube-proxy
  builds from the Kubernetes module (``k8s.io/kubernetes/cmd/kube-proxy`` v1.36.3, about
  5 minutes with a warm Go build cache) and runs here in nftables mode (root, in a private
  network namespace), but it routes only what EndpointSlices say, and the API server
  refuses every EndpointSlice of this cluster: kwok's pod IPs are loopback addresses
  (127.10x.0.0/16, ``netalloc``) and EndpointSlice validation rejects "may not be in the
  loopback range" (kube-controller-manager logs ``FailedToUpdateEndpointSlices`` for every
  Service). So this proxy computes the endpoints the EndpointSlice controller would publish
  (the Service's selector; pods Ready and not terminating: ``endpointslice`` util
  ``podToEndpoint``'s ``ready`` condition) and, like kube-proxy, picks one for each NEW
  connection while an established connection keeps its pod (what conntrack does).
- :class:`Load`: open-loop requests at a fixed rate, each on a new connection, stopping by
  itself after ``max_requests``; every request's (start, end, ok, why) is kept.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from opkit import pods, wait_for
from simkit import POD_LOOPBACK, get_json, smg_binary, start_simulator

LBL = "pd.sglang-operator.io"


@dataclass
class Load:
    """Open-loop requests at ``rate_per_s`` to ``url`` (/v1/chat/completions); each one's (start, end, ok, why)."""

    url: str
    model: str
    rate_per_s: float = 3.0
    max_requests: int = 1500
    max_tokens: int = 20
    results: list[tuple[float, float, bool, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _one(self) -> None:
        t0 = time.monotonic()
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": self.max_tokens}).encode()
        req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", "Connection": "close"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer = json.loads(resp.read())
                ok = resp.status == 200 and bool(answer["choices"][0]["message"]["content"])
                why = "" if ok else f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            ok, why = False, f"HTTP {err.code} {err.read()[:120]!r}"
        except Exception as err:  # noqa: BLE001 - every failure is counted, with its reason
            ok, why = False, f"{type(err).__name__}: {err}"
        self.results.append((t0, time.monotonic(), ok, why))

    def _run(self) -> None:
        sent = 0
        next_at = time.monotonic()
        while not self.stop.is_set() and sent < self.max_requests:
            threading.Thread(target=self._one, daemon=True, name="load-request").start()
            sent += 1
            next_at += 1.0 / self.rate_per_s
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "Load":
        self.thread = threading.Thread(target=self._run, daemon=True, name="load")
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        deadline = time.monotonic() + 70
        while time.monotonic() < deadline and any(t.name == "load-request" and t.is_alive() for t in threading.enumerate()):
            time.sleep(0.2)

    def between(self, start: float, end: float) -> list[tuple[float, float, bool, str]]:
        """Requests sent in [start, end)."""
        return [r for r in list(self.results) if start <= r[0] < end]

    def ended(self, start: float, end: float) -> list[tuple[float, float, bool, str]]:
        """Requests that ended (answered or failed) in [start, end), whenever they were sent: a
        change breaks a request where it ends, also one sent before the change began."""
        return [r for r in list(self.results) if start <= r[1] < end]


def _with_own_address(args: list[str], host: str) -> list[str]:
    """smg arguments with every listening address (--host, --prometheus-host when present) set to ``host``."""
    out = list(args)
    for flag in ("--host", "--prometheus-host"):
        if flag in out:
            out[out.index(flag) + 1] = host
    return out


class KubeletStandIn:
    """The kubelet's container start and stop for the engine and gateway pods of one PDDeployment
    (see the module docstring). ``drains``: (pod, role, seconds, hook output) per pod stopped
    with its preStop (seconds None: the pod has no preStop, e.g. one rendered by v0.1.0);
    ``in_flight``: pod -> the requests its preStop hook's gauges counted when the hook started
    (read once from the pod's /metrics, the gauges the hook waits on: what the drain waited for);
    ``killed``: pods killed outright (``drain = False``, the control: SIGKILL, no preStop)."""

    FINALIZER = "e2e.sglang-operator.io/kubelet-stand-in"

    def __init__(self, cluster, procs, ns: str, name: str, *, model: dict, sim_extra: list[str],
                 drain: bool = True, gateways: bool = True) -> None:
        self.cluster, self.procs, self.ns, self.name = cluster, procs, ns, name
        self.model, self.sim_extra, self.drain, self.gateways = model, list(sim_extra), drain, gateways
        self.running: dict[str, dict] = {}  # pod name -> pod as it was started
        self.drains: list[tuple[str, str, float | None, str]] = []
        self.in_flight: dict[str, float] = {}
        self.killed: list[str] = []
        self.stop = threading.Event()
        self.busy = 0
        self.lock = threading.Lock()
        if gateways and smg_binary() is None:
            raise AssertionError("the smg binary (smg==1.13.0) is not installed: ./hack/setup.sh --contract installs it")

    def adopt(self, pods_: list[dict]) -> None:
        """Pods whose processes the test started itself."""
        for p in pods_:
            self._hold(p["metadata"]["name"], True)
            self.running[p["metadata"]["name"]] = p

    def _hold(self, name: str, on: bool) -> None:
        """Add (or remove) the finalizer that keeps a terminating pod, and its IP, until its process stopped."""
        patch = {"metadata": {"finalizers": [self.FINALIZER] if on else None}}
        self.cluster.kubectl("patch", "pod", name, "-n", self.ns, "--type", "merge", "-p", json.dumps(patch),
                             check=False)

    def _start(self, pod: dict) -> None:
        role = pod["metadata"]["labels"][f"{LBL}/role"]
        if role == "gateway":
            args = _with_own_address(pod["spec"]["containers"][0]["args"], pod["status"]["podIP"])
            self.procs.start(pod["metadata"]["name"], [smg_binary(), "launch", *args],
                             env={"KUBECONFIG": str(self.cluster.kubeconfig)})
        else:
            start_simulator(self.procs, pod, model=self.model["name"],
                            served_model_name=self.model["servedModelName"], extra=self.sim_extra)

    def _stop_pod(self, name: str, pod: dict) -> None:
        role = pod["metadata"]["labels"][f"{LBL}/role"]
        try:
            hook = ((pod["spec"]["containers"][0].get("lifecycle") or {}).get("preStop") or {}).get("exec")
            if not self.drain:
                self.killed.append(name)
            elif hook is None:
                self.drains.append((name, role, None, "no preStop"))
            else:
                argv = [pod["status"]["podIP"] if a == POD_LOOPBACK else a for a in hook["command"]]
                argv[0] = sys.executable
                self.in_flight[name] = gauges_sum(argv[3], int(argv[4]), argv[7:])
                t0 = time.monotonic()
                res = subprocess.run(argv, capture_output=True, text=True,
                                     timeout=pod["spec"]["terminationGracePeriodSeconds"])
                self.drains.append((name, role, time.monotonic() - t0, (res.stdout + res.stderr).strip()))
            if self.drain:
                self.procs.stop(name)  # SIGTERM, as the kubelet sends after the preStop
            else:
                self._kill(name)
            self._hold(name, False)
        finally:
            with self.lock:
                self.busy -= 1

    def crash(self, name: str) -> None:
        """The pod's process dies now (SIGKILL), before anything takes the pod out of service: a crash."""
        self._kill(name)

    def _kill(self, name: str) -> None:
        """SIGKILL the pod's process group: a container killed outright (no preStop, no SIGTERM)."""
        proc = self.procs.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def _loop(self) -> None:
        roles = "prefill,decode,gateway" if self.gateways else "prefill,decode"
        sel = f"{LBL}/deployment={self.name},{LBL}/role in ({roles})"
        while not self.stop.is_set():
            try:
                now = {p["metadata"]["name"]: p for p in pods(self.cluster, self.ns, sel)}
            except Exception:  # noqa: BLE001 - the next look retries
                now = None
            if now is not None:
                for name, p in now.items():
                    if (name not in self.running and not p["metadata"].get("deletionTimestamp")
                            and p["status"].get("podIP")):
                        self._hold(name, True)
                        self._start(p)
                        self.running[name] = p
                for name in list(self.running):
                    p = now.get(name)
                    if p is None or p["metadata"].get("deletionTimestamp"):
                        pod = self.running.pop(name)
                        with self.lock:
                            self.busy += 1
                        threading.Thread(target=self._stop_pod, args=(name, pod), daemon=True).start()
            self.stop.wait(0.2)

    def settled(self) -> bool:
        """No pod is being stopped right now."""
        with self.lock:
            return self.busy == 0

    def __enter__(self) -> "KubeletStandIn":
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        deadline = time.monotonic() + 60
        while not self.settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        for name in list(self.running):  # the namespace's teardown waits for its pods to go
            self._hold(name, False)
            self.procs.stop(name)


def gauges_sum(host: str, port: int, names: list[str]) -> float:
    """The sum of the gauges ``names`` on ``host:port``'s /metrics, as the drain hook reads them (-1: unreadable)."""
    try:
        page = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2).read().decode()
    except Exception:  # noqa: BLE001 - the server is gone: the hook returns at once too
        return -1.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.split("{", 1)[0].split(" ", 1)[0] in names)


class ServiceProxyStandIn:
    """kube-proxy's part for one port of one Service, on 127.0.0.1 (see the module docstring for why
    the real kube-proxy cannot route here). ``url``: where clients connect (the Service's stand-in
    ClusterIP:port); ``connections``: pod name -> connections sent to it; ``refused``: connections
    that found no endpoint (kube-proxy rejects those too); :meth:`awaiting`: connections to a pod
    whose answer has not begun (a request in flight there, as the client sees it)."""

    def __init__(self, api, namespace: str, service: str, *, port_name: str = "http", poll_s: float = 0.2) -> None:
        from kubernetes import client as k8s

        self.core = k8s.CoreV1Api(api)
        self.namespace, self.service, self.port_name, self.poll_s = namespace, service, port_name, poll_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.endpoints: list[tuple[str, str, int]] = []  # (pod, ip, port)
        self.connections: dict[str, int] = {}
        self.refused = 0
        self._awaiting: dict[str, set[int]] = {}  # pod -> ids of connections with no answer byte yet
        self._ids = itertools.count()
        self._rr = itertools.count()
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @staticmethod
    def ready_endpoints(service: dict[str, Any], pods_: list[dict[str, Any]], port_name: str) -> list[tuple[str, str, int]]:
        """(pod, ip, port) of every pod the EndpointSlice controller would publish as ready for the
        Service port ``port_name``: selected by the Service, an IP, no deletion timestamp, the Ready
        condition True; a named targetPort resolved in the pod's containers (pure)."""
        selector = service["spec"].get("selector") or {}
        (port,) = [p for p in service["spec"]["ports"] if p.get("name") == port_name]
        target = port.get("targetPort", port["port"])
        out = []
        for pod in pods_:
            labels = pod["metadata"].get("labels") or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                continue
            if pod["metadata"].get("deletionTimestamp") or not (pod.get("status") or {}).get("podIP"):
                continue
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
            if not ready:
                continue
            if isinstance(target, str):
                named = [cp["containerPort"] for c in pod["spec"]["containers"] for cp in c.get("ports") or []
                         if cp.get("name") == target]
                if not named:
                    continue
                number = named[0]
            else:
                number = int(target)
            out.append((pod["metadata"]["name"], pod["status"]["podIP"], number))
        return sorted(out)

    def _refresh(self) -> None:
        while not self._stop.is_set():
            try:
                svc = self.core.read_namespaced_service(self.service, self.namespace, _request_timeout=5)
                svc = self.core.api_client.sanitize_for_serialization(svc)
                items = self.core.list_namespaced_pod(self.namespace, _request_timeout=5).items
                found = self.ready_endpoints(svc, [self.core.api_client.sanitize_for_serialization(p) for p in items],
                                             self.port_name)
                with self._lock:
                    self.endpoints = found
            except Exception:  # noqa: BLE001 - kube-proxy keeps its last rules while the API server is away
                pass
            self._stop.wait(self.poll_s)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                continue
            with self._lock:
                eps = list(self.endpoints)
            if not eps:
                self.refused += 1
                client.close()
                continue
            pod, ip, port = eps[next(self._rr) % len(eps)]
            try:
                upstream = socket.create_connection((ip, port), timeout=5)
            except OSError:
                self.refused += 1
                client.close()
                continue
            upstream.settimeout(None)
            self.connections[pod] = self.connections.get(pod, 0) + 1
            conn = next(self._ids)
            with self._lock:
                self._awaiting.setdefault(pod, set()).add(conn)

            def answered(pod=pod, conn=conn) -> None:
                with self._lock:
                    self._awaiting[pod].discard(conn)

            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, answered), daemon=True).start()

    def awaiting(self, pod: str) -> int:
        """Connections sent to ``pod`` that have not received a byte of their answer yet."""
        with self._lock:
            return len(self._awaiting.get(pod, ()))

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, first: Callable[[], None] | None = None) -> None:
        """Copy ``src`` to ``dst`` until EOF; ``first`` is called once, when the copy ends or its first byte came."""
        try:
            while data := src.recv(65536):
                if first is not None:
                    first()
                    first = None
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if first is not None:
                first()
            for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    s.shutdown(how)
                except OSError:
                    pass

    def __enter__(self) -> "ServiceProxyStandIn":
        for target in (self._refresh, self._accept):
            threading.Thread(target=target, daemon=True).start()
        wait_for(lambda: self.endpoints, timeout=60, interval=0.2, what=f"a ready endpoint of Service {self.service}")
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.server.close()


@dataclass
class ChangeTable:
    """One row per change made under ``load``: requests / failed (``sent``: the requests that ended in
    its window, each row's its own), and what drained. :meth:`failed_outside` lists failures that
    ended in no window: none may hide between the rows."""

    load: Load
    kubelet: KubeletStandIn
    rows: list[dict[str, Any]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)

    def failed_outside(self) -> list[tuple[float, float, bool, str]]:
        """Failed requests of the load that ended in no change's window."""
        return [r for r in list(self.load.results) if not r[2]
                and not any(start <= r[1] < end for start, end in self.windows)]

    def change(self, what: str, act: Callable[[], Any], converged: Callable[[], Any], *, timeout: float = 180) -> dict:
        """Run ``act`` and wait for ``converged`` inside :meth:`window`; returns the row added."""
        with self.window(what) as row:
            act()
            wait_for(lambda: converged() and self.kubelet.settled(), timeout=timeout, interval=0.3, what=what)
        return row

    @contextlib.contextmanager
    def window(self, what: str) -> Iterator[dict[str, Any]]:
        """The body makes one change; afterwards (every stopped pod drained, then 2 s more: requests sent
        just before the body ended finish inside the window) the row is filled in and added."""
        drains_before = len(self.kubelet.drains)
        start = time.monotonic()
        row: dict[str, Any] = {"change": what}
        yield row
        wait_for(self.kubelet.settled, timeout=120, interval=0.3, what=f"{what}: every stopped pod drained")
        time.sleep(2)
        end = time.monotonic()
        sent = self.load.ended(start, end)
        failed = [r for r in sent if not r[2]]
        drains = self.kubelet.drains[drains_before:]
        self.windows.append((start, end))
        row.update({"sent": len(sent), "failed": len(failed),
                    "drain_s": {d[0]: (round(d[2], 1) if d[2] is not None else d[3]) for d in drains},
                    "in_flight": {d[0]: self.kubelet.in_flight[d[0]] for d in drains if d[0] in self.kubelet.in_flight},
                    "seconds": round(end - start, 1), "failures": sorted({r[3] for r in failed})[:3]})
        self.rows.append(row)


def smg_registered(cluster, ns: str, name: str, key: str, *, gateways: int, prefill: int, decode: int) -> bool:
    """``gateways`` live gateway pods of group ``key`` serve, and each one's smg registered ``prefill``
    prefill and ``decode`` decode workers (its ``/workers``)."""
    sel = f"{LBL}/deployment={name},{LBL}/compat-key={key},{LBL}/role=gateway"
    live = [p for p in pods(cluster, ns, sel) if not p["metadata"].get("deletionTimestamp")]
    if len(live) != gateways:
        return False
    for gw in live:
        args = gw["spec"]["containers"][0]["args"]
        try:
            stats = get_json(f"http://{gw['status']['podIP']}:{args[args.index('--port') + 1]}/workers")["stats"]
        except Exception:  # noqa: BLE001 - not serving yet
            return False
        if (stats["prefill_count"], stats["decode_count"]) != (prefill, decode):
            return False
    return True


def print_table(rows: list[dict[str, Any]], log: Callable[[str], None], title: str) -> None:
    """The requests sent / failed and drain seconds per change, one line each."""
    for row in rows:
        log(f"== {title}: {row['change']}: sent {row['sent']}, failed {row['failed']}, drain {row['drain_s']}, "
            f"in flight at preStop {row.get('in_flight') or {}}, window {row['seconds']} s "
            f"{row.get('note') or ''}{row['failures'] or ''}")
