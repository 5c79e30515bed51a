"""Bring a dev cluster up: ``start_cluster`` returns a ``Cluster`` handle once it is usable.

``start_cluster`` runs these steps, each a function below:

1. ``ensure_binaries``    find or build the eight binaries (``build``)
2. ``_claim_run_dir``     refuse a live run, clean a stale one (its own processes only)
3. ``_write_pki``         certificates, keys, kubeconfigs (``pki``, ``kubeconfig``)
4. ``_start_api``         etcd + kube-apiserver on free ports, wait for /readyz
                          (new ports and a retry when a port was taken meanwhile)
5. ``_start_controllers`` kube-controller-manager, kube-scheduler, kwok
6. ``_install_lws_api``   LWS's CRDs and ClusterRole (from its module, ``lws``)
7. ``_create_nodes``      the fake GPU nodes of node-pools.yaml (``nodes``)
8. ``_wait_settled``      nodes Ready and untainted, the default ServiceAccount exists
9. ``_start_lws``         the LeaderWorkerSet controller, once its CRDs are served; its
                          webhook configurations once its webhook server answers
10. ``_start_imex``       NVIDIA's ComputeDomain API (CRD), the IMEX channel DeviceClass and
                          one ResourceSlice per clique-labelled node, and the STAND-IN
                          ComputeDomain controller (``imex``; the driver cannot be built here)
11. ``_spawn_oracle``     (``oracle=True``, what ``dev cluster up`` asks for) the SGLang oracle
                          service, ``sglang-pd-operator oracle serve`` from this venv, as a
                          process of the run (spawned right after the API is up, waited for
                          last: it imports SGLang meanwhile); its URL is the handle's
                          ``oracle_url`` and ``shell_exports`` sets SGLANG_PD_ORACLE_URL
12. ``_start_kueue``      optional (``kueue_queue=True``, or later ``start_kueue``): Kueue's CRDs,
                          ClusterRole, the controller, then its webhook configurations (``kueue``)

Every started process is recorded in the state file at once (``state``), so whatever
happens later (an exception, Ctrl-C, a SIGKILLed harness), ``teardown.stop_run`` or the next
``up`` can stop exactly those processes. When a component exits early or the API does
not get ready, the error names each component's log file and shows the failing one's
last lines.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from sglang_pd_operator_dev.cluster import (build, components, imex, kubeconfig, kueue, lws, netalloc,
                                           nodes, paths, pki, procs, rest, state, teardown)
from sglang_pd_operator_dev.cluster.handle import (ORACLE_COMPONENT, Cluster, ClusterAlreadyRunning,
                                                  ClusterError, ComponentFailed, Log,
                                                  ToolFailed, oracle_url)
from sglang_pd_operator_dev.cluster.teardown import stop_run, sweep_stale_runs

__all__ = ["Cluster", "ClusterAlreadyRunning", "ClusterError", "ComponentFailed",
           "ToolFailed", "start_cluster", "start_kueue", "start_lws_controller", "stop_kueue",
           "stop_lws_controller", "stop_run", "sweep_stale_runs"]
#: Seconds allowed for kube-apiserver to answer /readyz after it was started.
READYZ_TIMEOUT_S = 90.0
#: Seconds allowed, after /readyz, for nodes to be Ready and the default SA to exist.
SETTLE_TIMEOUT_S = 90.0
#: Seconds allowed for LWS's CRDs to be served and its controller's webhooks to answer.
LWS_TIMEOUT_S = 90.0
#: Name of the LWS controller's process record (and log file).
LWS_COMPONENT = "lws-controller"
#: Name of Kueue's process record (and log file).
KUEUE_COMPONENT = "kueue-controller"
#: Seconds allowed for the oracle service's /readyz (its warm workers import SGLang: ~20 s on an idle machine).
ORACLE_TIMEOUT_S = 300.0
_PORT_RETRIES = 3


def start_cluster(*, run_dir: Path, detach: bool = False, log: Log = print,
                  node_pools: Path | None = None, lws: bool = True,
                  apiserver_args: Sequence[str] = (), imex_channels: bool = True,
                  oracle: bool = False, oracle_warm: Sequence[str] = ("gb300",),
                  kueue_queue: bool = False) -> Cluster:
    """Start a cluster in ``run_dir`` and return once it is usable.

    "Usable": /readyz answers 200, every fake node is Ready without the not-ready taint
    and the ``default`` ServiceAccount exists, so Deployments and Jobs run at once; the
    LeaderWorkerSet API is served and the LWS controller's webhooks answer and are
    registered, so LeaderWorkerSets run at once too. ``lws=False`` leaves LWS out
    entirely (no CRDs, no controller, no webhooks): a cluster without LeaderWorkerSet.
    ``detach=False`` ties the components to this process (they get SIGTERM if it dies,
    and an atexit hook stops them); ``detach=True`` leaves them running for ``down``.

    Raises ClusterAlreadyRunning, ComponentFailed (with log paths and the failing log's
    tail), ClusterError, build.BuildError or gomod.GoModuleDownloadError.
    ``node_pools``: another node-pools.yaml (default hack/cluster/node-pools.yaml);
    ``apiserver_args``: extra kube-apiserver flags (benchmarks/bench_scale.py adds an audit log).
    ``imex_channels=False`` leaves the ComputeDomain API and its stand-in out (a cluster
    without NVIDIA's DRA driver). ``oracle=True`` also runs the SGLang oracle service from this
    venv (``oracle serve --warm`` ``oracle_warm``) as a process of the run and waits for its
    /readyz: the handle's ``oracle_url`` is what ``run --oracle-url`` takes; when this venv has
    no sglang 0.5.23 it logs why and the cluster comes up without it (``oracle_url`` None).
    ``kueue_queue=True`` also runs Kueue (``start_kueue``: built on first use, after the core
    binaries: 187 s cold on this 2-core machine, docs/dev-cluster.md). On any error,
    or Ctrl-C, everything started so far is stopped before the exception propagates.
    """
    begin = time.monotonic()
    bins = build.ensure_binaries(log=log)
    kueue_bins = build.ensure_kueue(log=log) if kueue_queue else None
    run_dir = run_dir.resolve()
    layout = components.Layout(run_dir=run_dir)
    _claim_run_dir(run_dir, log=log)
    registry = paths.cache_root() / "runs"
    state.register(registry=registry, run_dir=run_dir)
    st = state.save(state.RunState.new(run_dir=run_dir, detached=detach)
                     .with_(bin_dir=str(bins.dir), kubeconfig=str(layout.kubeconfig)))
    die_with_parent = not detach and threading.current_thread() is threading.main_thread()
    holder = _StateHolder(st)
    stop_hook = None
    if not detach:
        stop_hook = _make_atexit_stop(run_dir)
        atexit.register(stop_hook)
    try:
        network = netalloc.lease_pod_network(lease_dir=paths.cache_root() / "pod-networks",
                                             run_dir=run_dir, is_live=_live_other(run_dir))
        holder.update(pod_network=str(network))
        _write_pki(layout)
        started = time.monotonic()
        api = _start_api(layout=layout, bins=bins, holder=holder, log=log,
                         die_with_parent=die_with_parent, extra_args=apiserver_args)
        readyz_s = time.monotonic() - started
        oracle_proc = _spawn_oracle(layout=layout, holder=holder, warm=oracle_warm, log=log,
                                    die_with_parent=die_with_parent) if oracle else None
        cached = "binaries cached" if bins.cached else f"binaries built in {bins.build_seconds:.0f}s"
        log(f"cluster: reached /readyz in {readyz_s:.1f}s ({cached})")
        _start_controllers(layout=layout, bins=bins, holder=holder, network=network,
                           die_with_parent=die_with_parent)
        crd_names = _install_lws_api(api=api, bins=bins) if lws else []
        count = _create_nodes(api=api, network=network, node_pools=node_pools)
        _wait_settled(api=api, holder=holder, node_count=count)
        settled_s = time.monotonic() - started
        if lws:
            _start_lws(layout=layout, bins=bins, holder=holder, api=api, crd_names=crd_names,
                       die_with_parent=die_with_parent)
        if imex_channels:
            _start_imex(layout=layout, holder=holder, api=api, node_pools=node_pools,
                        die_with_parent=die_with_parent)
        if kueue_bins is not None:
            _start_kueue(layout=layout, bins=kueue_bins, holder=holder, api=api, die_with_parent=die_with_parent)
        if oracle_proc is not None:
            _wait_oracle(proc=oracle_proc, holder=holder, layout=layout, log=log)
        ready_s = time.monotonic() - started
        holder.update(phase="ready")
    except BaseException:
        log(f"cluster: start failed; stopping what was started (logs in {layout.logs})")
        teardown.stop_run(run_dir, log=log, quiet=True)
        if stop_hook:
            atexit.unregister(stop_hook)
        raise
    timings = {"readyz": round(readyz_s, 2), "nodes": round(settled_s, 2), "ready": round(ready_s, 2),
               "total": round(time.monotonic() - begin, 2)}
    if bins.build_seconds is not None:
        timings["build"] = round(bins.build_seconds, 1)
    serving = (f", the LeaderWorkerSet controller serving its webhooks {ready_s:.1f}s after start"
               if lws else " (no LeaderWorkerSet: lws=False)")
    serving += (", ComputeDomains served with the IMEX STAND-IN controller (imex.py)" if imex_channels
                else " (no ComputeDomain API: imex_channels=False)")
    serving += ", Kueue admitting LeaderWorkerSets" if kueue_bins is not None else ""
    log(f"cluster: {count} fake GPU nodes Ready {settled_s:.1f}s after start{serving} "
        f"(pod network {network})")
    log(f"cluster: kubeconfig {layout.kubeconfig}")
    log(f"cluster: run dir    {run_dir} (logs in {layout.logs})")
    return Cluster(run_dir=run_dir, kubeconfig=layout.kubeconfig, bin_dir=bins.dir,
                   server=holder.state.server, pod_network=str(network), timings=timings,
                   oracle_url=oracle_url(holder.state))


# --- steps -----------------------------------------------------------------------------


class _StateHolder:
    """The current RunState; every change is saved at once (thread-safe)."""

    def __init__(self, st: state.RunState) -> None:
        self.state = st
        self._lock = threading.Lock()

    def update(self, **changes) -> None:
        with self._lock:
            self.state = state.save(self.state.with_(**changes))

    def add(self, record: procs.ProcessRecord) -> None:
        with self._lock:
            self.state = state.save(self.state.with_process(record))


def _make_atexit_stop(run_dir: Path) -> Callable[[], None]:
    me = os.getpid()

    def stop_at_exit() -> None:
        st = state.load(run_dir)
        if st is not None and st.owner_pid == me and st.phase != "stopped":
            teardown.stop_run(run_dir, quiet=True)

    return stop_at_exit


def _live_other(run_dir: Path) -> Callable[[Path], bool]:
    def is_live(other: Path) -> bool:
        return other != run_dir and state.is_live_dir(other)
    return is_live


def _claim_run_dir(run_dir: Path, *, log: Log) -> None:
    """Make ``run_dir`` an empty directory owned by this harness, or raise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    old = state.load(run_dir)
    if old is not None:
        reason = state.why_not_live(old)
        if reason is None:
            raise ClusterAlreadyRunning(
                f"a cluster is already running in {run_dir} (owner pid {old.owner_pid}, "
                f"{'detached' if old.detached else 'attached'}); stop it with `dev cluster "
                f"down --run-dir {run_dir}` or use another --run-dir")
        if old.phase != "stopped":
            teardown.clean_stale(old, reason=reason, log=log)
    elif any(run_dir.iterdir()) and not (run_dir / state.MARKER_FILE).exists():
        raise ClusterError(f"{run_dir} is not empty and was not made by this harness; "
                           f"refusing to use it (pick another --run-dir)")
    for child in run_dir.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    (run_dir / state.MARKER_FILE).write_text("made by sglang_pd_operator_dev.cluster\n")


def _write_pki(layout: components.Layout) -> None:
    pki.write_pki(layout.pki.dir, service_ip=components.service_ip())


def admin_api(layout: components.Layout, server: str) -> rest.Api:
    """A ``rest.Api`` for the run in ``layout`` as its admin user."""
    p = layout.pki
    return rest.Api(server=server, ca_cert=p.ca_cert, client_cert=p.client_cert("admin"),
                    client_key=p.client_key("admin"))


def _write_kubeconfigs(layout: components.Layout, server: str) -> None:
    p = layout.pki
    kubeconfig.write_kubeconfig(layout.kubeconfig, server=server, ca_cert=p.ca_cert,
                                client_cert=p.client_cert("admin"),
                                client_key=p.client_key("admin"))
    for name in ("controller-manager", "scheduler", "kwok", LWS_COMPONENT, KUEUE_COMPONENT):
        kubeconfig.write_kubeconfig(layout.component_kubeconfig(name), server=server,
                                    ca_cert=p.ca_cert, client_cert=p.client_cert(name),
                                    client_key=p.client_key(name), user=name)


def _spawn(*, name: str, argv: list[str], layout: components.Layout, holder: _StateHolder,
           die_with_parent: bool, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc, record = procs.spawn(name=name, argv=argv, log_path=layout.log(name), env=env,
                               cwd=layout.run_dir, die_with_parent=die_with_parent)
    holder.add(record)
    return proc


def _check_alive(running: dict[str, subprocess.Popen], holder: _StateHolder) -> None:
    for name, proc in running.items():
        code = proc.poll()
        if code is not None:
            raise ComponentFailed(component=name, problem=f"exited early with code {code}",
                                  st=holder.state)


def _start_api(*, layout: components.Layout, bins: build.Binaries, holder: _StateHolder,
               log: Log, die_with_parent: bool, extra_args: Sequence[str] = ()) -> rest.Api:
    """Start etcd and kube-apiserver and wait for /readyz; retry on a port collision."""
    for attempt in range(1, _PORT_RETRIES + 1):
        etcd_client, etcd_peer, api_port = netalloc.free_ports(3)
        server = f"https://127.0.0.1:{api_port}"
        holder.update(server=server, ports={"etcd-client": etcd_client, "etcd-peer": etcd_peer,
                                            "kube-apiserver": api_port})
        _write_kubeconfigs(layout, server)
        running = {
            "etcd": _spawn(name="etcd", layout=layout, holder=holder,
                           die_with_parent=die_with_parent,
                           argv=components.etcd_argv(binary=bins.path("etcd"), layout=layout,
                                                     client_port=etcd_client,
                                                     peer_port=etcd_peer)),
            "kube-apiserver": _spawn(name="kube-apiserver", layout=layout, holder=holder,
                                     die_with_parent=die_with_parent,
                                     argv=components.apiserver_argv(
                                         binary=bins.path("kube-apiserver"), layout=layout,
                                         port=api_port, etcd_port=etcd_client,
                                         extra=extra_args)),
        }
        api = admin_api(layout, server)
        try:
            _wait_readyz(api=api, running=running, holder=holder)
            return api
        except ComponentFailed as err:
            if not err.port_in_use or attempt == _PORT_RETRIES:
                raise
            log(f"cluster: {err.component} found its port taken; retrying on new ports")
            procs.stop([holder.state.processes[-1], holder.state.processes[-2]], grace_s=1)
            holder.update(processes=holder.state.processes[:-2])
            shutil.rmtree(layout.etcd_data, ignore_errors=True)
    raise AssertionError("unreachable")


def _wait_readyz(*, api: rest.Api, running: dict[str, subprocess.Popen],
                 holder: _StateHolder) -> None:
    deadline = time.monotonic() + READYZ_TIMEOUT_S
    reason = ""
    while time.monotonic() < deadline:
        _check_alive(running, holder)
        ready, reason = api.readyz()
        if ready:
            return
        time.sleep(0.2)
    raise ComponentFailed(component="kube-apiserver",
                          problem=f"did not pass /readyz within {READYZ_TIMEOUT_S:.0f}s "
                                  f"(last answer: {reason[-200:]})", st=holder.state)


def _start_controllers(*, layout: components.Layout, bins: build.Binaries,
                       holder: _StateHolder, network, die_with_parent: bool) -> None:
    layout.kwok_home.mkdir(parents=True, exist_ok=True)
    stage_files = sorted(paths.kwok_stage_dir().glob("*.yaml"))
    specs = [
        ("kube-controller-manager", components.controller_manager_argv(
            binary=bins.path("kube-controller-manager"), layout=layout), None),
        ("kube-scheduler", components.scheduler_argv(
            binary=bins.path("kube-scheduler"), layout=layout), None),
        ("kwok", components.kwok_argv(binary=bins.path("kwok"), layout=layout,
                                      stage_files=stage_files, pod_network=network),
         {**os.environ, "HOME": str(layout.kwok_home)}),
    ]
    for name, argv, env in specs:
        _spawn(name=name, argv=argv, layout=layout, holder=holder,
               die_with_parent=die_with_parent, env=env)


def _create_nodes(*, api: rest.Api, network, node_pools: Path | None) -> int:
    pools = nodes.load_pools(node_pools or paths.node_pools_file())
    objects = nodes.node_objects(pools, pod_network=network)
    for node in objects:
        api.create("/api/v1/nodes", node)
    return len(objects)


def node_ready(node: dict) -> bool:
    """True when a Node (API JSON) is Ready and no longer tainted not-ready."""
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)


def _wait_settled(*, api: rest.Api, holder: _StateHolder, node_count: int) -> None:
    """Wait for all kwok nodes Ready (not-ready taint removed) and the default SA."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    names = {"kube-controller-manager", "kube-scheduler", "kwok", "etcd", "kube-apiserver"}
    missing = "nodes"
    while time.monotonic() < deadline:
        for record in holder.state.processes:
            if record.name in names and not procs.is_ours(record):
                raise ComponentFailed(component=record.name, problem="exited early",
                                      st=holder.state)
        items = (api.get_json("/api/v1/nodes?labelSelector=type%3Dkwok") or {}).get("items", [])
        ready = sum(node_ready(n) for n in items)
        sa = api.get_json("/api/v1/namespaces/default/serviceaccounts/default")
        if ready == node_count and sa is not None:
            return
        missing = (f"{ready}/{node_count} nodes Ready" if ready < node_count
                   else "the default ServiceAccount")
        time.sleep(0.25)
    component = "kwok" if missing.endswith("Ready") else "kube-controller-manager"
    raise ComponentFailed(component=component,
                          problem=f"did not settle within {SETTLE_TIMEOUT_S:.0f}s "
                                  f"(waiting for {missing})", st=holder.state)


# --- the LeaderWorkerSet controller (steps 6 and 9, and a stop/start for tests) ---------


def _install_lws_api(*, api: rest.Api, bins: build.Binaries) -> list[str]:
    """Create LWS's CRDs and its ClusterRole + binding (``lws``); returns the CRD names.

    Only created here: the controller starts once they are served (``_start_lws``)."""
    crds = lws.crds(bins.lws_config)
    for crd in crds:
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    user = pki.CLIENTS[LWS_COMPONENT][0]
    role, binding = lws.rbac(bins.lws_config, user=user)
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    api.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    return [c["metadata"]["name"] for c in crds]


def _crd_served(api: rest.Api, name: str) -> bool:
    crd = api.get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conditions = (crd.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
        return False
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("served"))
    status, _ = api.request("GET", f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1")
    return status == 200


def _lws_spawn(*, layout: components.Layout, bins: build.Binaries, holder: _StateHolder,
               die_with_parent: bool) -> subprocess.Popen:
    argv = lws.controller_argv(binary=bins.path(LWS_COMPONENT),
                               kubeconfig=layout.component_kubeconfig(LWS_COMPONENT),
                               config_file=layout.lws_config_file)
    return _spawn(name=LWS_COMPONENT, argv=argv, layout=layout, holder=holder,
                  die_with_parent=die_with_parent)


def _wait_lws_serving(*, layout: components.Layout, holder: _StateHolder, proc: subprocess.Popen,
                      paths_: list[str], port: int) -> None:
    """Wait until every webhook path answers (anything but 404: the handler is registered)."""
    deadline = time.monotonic() + LWS_TIMEOUT_S
    pending = list(paths_)
    while pending:
        _check_alive({LWS_COMPONENT: proc}, holder)
        pending = [p for p in pending
                   if rest.https_status(f"https://127.0.0.1:{port}{p}", ca_cert=layout.pki.ca_cert) in (0, 404)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ComponentFailed(component=LWS_COMPONENT,
                                  problem=f"did not serve its webhooks {pending} on 127.0.0.1:{port} "
                                          f"within {LWS_TIMEOUT_S:.0f}s", st=holder.state)
        time.sleep(0.2)


def _start_lws(*, layout: components.Layout, bins: build.Binaries, holder: _StateHolder,
               api: rest.Api, crd_names: list[str], die_with_parent: bool) -> None:
    """Start the LWS controller once its CRDs are served, wait for its webhook server, then
    register its webhook configurations (URLs on 127.0.0.1, the harness CA as caBundle)."""
    deadline = time.monotonic() + LWS_TIMEOUT_S
    while not all(_crd_served(api, name) for name in crd_names):
        if time.monotonic() > deadline:
            raise ClusterError(f"LWS CRDs {crd_names} not served within {LWS_TIMEOUT_S:.0f}s")
        time.sleep(0.2)
    webhook_port, health_port = netalloc.free_ports(2)
    holder.update(ports={**holder.state.ports, "lws-webhook": webhook_port, "lws-health": health_port})
    config_file = layout.lws_config_file
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(lws.controller_config(
        webhook_port=webhook_port, health_port=health_port,
        cert_dir=layout.pki.webhook_cert_dir("lws"))))
    configs = lws.webhook_configurations(bins.lws_config, port=webhook_port,
                                         ca_cert=layout.pki.ca_cert.read_bytes())
    proc = _lws_spawn(layout=layout, bins=bins, holder=holder, die_with_parent=die_with_parent)
    _wait_lws_serving(layout=layout, holder=holder, proc=proc, paths_=lws.webhook_paths(configs),
                      port=webhook_port)
    for config in configs:
        plural = config["kind"].lower() + "s"
        api.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)


def _start_imex(*, layout: components.Layout, holder: _StateHolder, api: rest.Api, node_pools: Path | None,
                die_with_parent: bool) -> None:
    """The ComputeDomain CRD, the channel DeviceClass, a ResourceSlice per clique-labelled node, and the
    stand-in controller process (``imex``: what is real and what stands in). Returns once the CRD is served."""
    pools = nodes.load_pools(node_pools or paths.node_pools_file())
    label = next((p.clique_label for p in pools if p.clique_label), None)
    api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", imex.crd())
    api.create("/apis/resource.k8s.io/v1/deviceclasses", imex.device_class())
    if label is not None:
        live = (api.get_json("/api/v1/nodes?labelSelector=type%3Dkwok") or {}).get("items") or []
        for piece in imex.resource_slices(live, clique_label=label):
            api.create("/apis/resource.k8s.io/v1/resourceslices", piece)
    deadline = time.monotonic() + LWS_TIMEOUT_S
    while not _crd_served(api, imex.CRD_NAME):
        if time.monotonic() > deadline:
            raise ClusterError(f"{imex.CRD_NAME} not served within {LWS_TIMEOUT_S:.0f}s")
        time.sleep(0.2)
    p = layout.pki
    argv = imex.standin_argv(python=sys.executable, server=api.server, ca_cert=p.ca_cert,
                             client_cert=p.client_cert("admin"), client_key=p.client_key("admin"),
                             clique_label=label or "nvidia.com/gpu.clique")
    _spawn(name=imex.COMPONENT, argv=argv, layout=layout, holder=holder, die_with_parent=die_with_parent)


def oracle_argv(*, python: str, port: int, warm: Sequence[str]) -> list[str]:
    """``sglang-pd-operator oracle serve`` on 127.0.0.1:``port`` through ``python -m`` (so the
    process record's argv[0] is the interpreter the kernel shows, never a script's shebang)."""
    return [python, "-P", "-m", "sglang_pd_operator.cli", "oracle", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--warm", ",".join(warm)]


def _spawn_oracle(*, layout: components.Layout, holder: _StateHolder, warm: Sequence[str], log: Log,
                  die_with_parent: bool) -> subprocess.Popen | None:
    """Start the oracle service (recorded, so ``down`` stops it); None, said why, when this venv has no sglang."""
    from sglang_pd_operator.oracle import unavailable

    why = unavailable()
    if why:
        log(f"cluster: no SGLang oracle service: {why}; `sglang-pd-operator run` decides Valid with its own "
            f"rules alone (`sglang-pd-operator sglang install` adds sglang 0.5.23 to this venv)")
        return None
    (port,) = netalloc.free_ports(1)
    holder.update(ports={**holder.state.ports, ORACLE_COMPONENT: port})
    argv = oracle_argv(python=sys.executable, port=port, warm=warm)
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    proc, record = procs.spawn(name=ORACLE_COMPONENT, argv=argv, log_path=layout.log(ORACLE_COMPONENT), env=env,
                               cwd=Path("/"), die_with_parent=die_with_parent)
    holder.add(record)
    return proc


def _wait_oracle(*, proc: subprocess.Popen, holder: _StateHolder, layout: components.Layout, log: Log) -> None:
    """Wait for the oracle service's /readyz; raises ComponentFailed when it exits or is not ready in time."""
    url = oracle_url(holder.state)
    started = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise ComponentFailed(component=ORACLE_COMPONENT, problem=f"exited with code {proc.returncode}",
                                  st=holder.state)
        if rest.http_status(f"{url}/readyz") == 200:
            break
        if time.monotonic() - started > ORACLE_TIMEOUT_S:
            raise ComponentFailed(component=ORACLE_COMPONENT, problem=f"/readyz not 200 within {ORACLE_TIMEOUT_S:.0f}s",
                                  st=holder.state)
        time.sleep(0.3)
    log(f"cluster: SGLang oracle service ready at {url} {time.monotonic() - started:.1f}s after the API "
        f"(`sglang-pd-operator run` reads SGLANG_PD_ORACLE_URL; log {layout.log(ORACLE_COMPONENT)})")


def stop_lws_controller(run_dir: Path) -> bool:
    """Stop the LWS controller of a running run and drop it from the run's state, so the
    run stays live without it (its webhook configurations stay: LWS pods and objects are
    then refused, nothing else). Returns False when it was not running."""
    st = state.load(Path(run_dir).resolve())
    if st is None:
        raise ClusterError(f"no run in {run_dir}")
    records = [r for r in st.processes if r.name == LWS_COMPONENT]
    stopped = procs.stop(records, grace_s=5.0)
    state.save(st.with_(processes=tuple(r for r in st.processes if r.name != LWS_COMPONENT)))
    return bool(stopped)


def start_lws_controller(run_dir: Path) -> None:
    """Start the LWS controller again in a running run (after ``stop_lws_controller``), on
    the same webhook port its configurations name; returns once its webhooks answer.
    Raises ClusterError when the run is not running or the controller already runs."""
    run_dir = Path(run_dir).resolve()
    st = state.load(run_dir)
    if st is None or st.phase != "ready":
        raise ClusterError(f"no running cluster in {run_dir}")
    if any(r.name == LWS_COMPONENT and procs.is_ours(r) for r in st.processes):
        raise ClusterError(f"the LWS controller already runs in {run_dir}")
    layout = components.Layout(run_dir=run_dir)
    bins = build.Binaries(dir=Path(st.bin_dir), cached=True)
    holder = _StateHolder(st)
    die_with_parent = (not st.detached and st.owner_pid == os.getpid()
                       and threading.current_thread() is threading.main_thread())
    proc = _lws_spawn(layout=layout, bins=bins, holder=holder, die_with_parent=die_with_parent)
    configs = lws.webhook_configurations(bins.lws_config, port=st.ports["lws-webhook"],
                                         ca_cert=layout.pki.ca_cert.read_bytes())
    _wait_lws_serving(layout=layout, holder=holder, proc=proc, paths_=lws.webhook_paths(configs),
                      port=st.ports["lws-webhook"])


# --- Kueue (optional: step 11, or started in a running cluster and stopped again) ------------


def _start_kueue(*, layout: components.Layout, bins: build.KueueBinaries, holder: _StateHolder, api: rest.Api,
                 die_with_parent: bool) -> None:
    """Kueue's namespace, CRDs (conversion webhook on loopback), ClusterRole + binding, then the controller;
    once its webhook server answers every path, its (scoped) webhook configurations (``kueue``)."""
    webhook_port, health_port = netalloc.free_ports(2)
    holder.update(ports={**holder.state.ports, "kueue-webhook": webhook_port, "kueue-health": health_port})
    ca = layout.pki.ca_cert.read_bytes()
    cert_dir = layout.pki.webhook_cert_dir("kueue")
    if not (cert_dir / "tls.crt").is_file():
        raise ClusterError(f"{cert_dir} has no serving certificate: this run was started by an older harness; "
                           "start a new cluster to run Kueue")
    config_file = layout.run_dir / "kueue" / "config.yaml"
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(kueue.controller_config(
        webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir)))
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": kueue.NAMESPACE}})
    crds = kueue.crds(bins.config, port=webhook_port, ca_cert=ca)
    for crd in crds:
        if not api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd):  # a second start: new port
            name = crd["metadata"]["name"]
            live = api.get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
            status, text = api.request("PUT", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                                       {**crd, "metadata": {**crd["metadata"], "resourceVersion":
                                                            live.get("metadata", {}).get("resourceVersion")}})
            if status // 100 != 2:
                raise ClusterError(f"could not update CRD {name}: HTTP {status}: {text[:300]}")
    for obj in kueue.rbac(bins.config, user=pki.CLIENTS[KUEUE_COMPONENT][0]):
        plural = obj["kind"].lower() + "s"
        where = f"namespaces/{obj['metadata']['namespace']}/" if "namespace" in obj["metadata"] else ""
        api.create(f"/apis/rbac.authorization.k8s.io/v1/{where}{plural}", obj)
    deadline = time.monotonic() + LWS_TIMEOUT_S
    while not all(_crd_served(api, c["metadata"]["name"]) for c in crds):
        if time.monotonic() > deadline:
            raise ClusterError(f"Kueue's CRDs not served within {LWS_TIMEOUT_S:.0f}s")
        time.sleep(0.2)
    configs = kueue.webhook_configurations(bins.config, port=webhook_port, ca_cert=ca)
    upper, work = kueue.etc_overlay_dirs(config_file.parent)
    certs = upper / kueue.METRICS_CERT_DIR.relative_to("/etc")
    certs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):  # any valid pair: metrics are off, Kueue only loads it
        shutil.copyfile(cert_dir / name, certs / name)
    argv = kueue.controller_argv(binary=bins.path(KUEUE_COMPONENT),
                                 kubeconfig=layout.component_kubeconfig(KUEUE_COMPONENT), config_file=config_file,
                                 etc_upper=upper, etc_work=work, as_root=os.geteuid() == 0)
    proc = _spawn(name=KUEUE_COMPONENT, argv=argv, layout=layout, holder=holder, die_with_parent=die_with_parent)
    pending = kueue.webhook_paths(configs, crds)
    while pending:
        _check_alive({KUEUE_COMPONENT: proc}, holder)
        pending = [p for p in pending if rest.https_status(f"https://127.0.0.1:{webhook_port}{p}",
                                                          ca_cert=layout.pki.ca_cert) in (0, 404)]
        if pending and time.monotonic() > deadline + LWS_TIMEOUT_S:
            raise ComponentFailed(component=KUEUE_COMPONENT, problem=f"did not serve its webhooks {pending} on "
                                  f"127.0.0.1:{webhook_port} within {2 * LWS_TIMEOUT_S:.0f}s", st=holder.state)
        time.sleep(0.2)
    for config in configs:
        plural = config["kind"].lower() + "s"
        api.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)


def start_kueue(run_dir: Path, *, log: Log = print) -> None:
    """Run Kueue in a running cluster (built first when the cache has none); returns once its webhooks are
    registered. Raises ClusterError when the run is not running or Kueue already runs there."""
    run_dir = Path(run_dir).resolve()
    st = state.load(run_dir)
    if st is None or st.phase != "ready":
        raise ClusterError(f"no running cluster in {run_dir}")
    if any(r.name == KUEUE_COMPONENT and procs.is_ours(r) for r in st.processes):
        raise ClusterError(f"Kueue already runs in {run_dir}")
    bins = build.ensure_kueue(log=log)
    layout = components.Layout(run_dir=run_dir)
    holder = _StateHolder(st)
    die_with_parent = (not st.detached and st.owner_pid == os.getpid()
                       and threading.current_thread() is threading.main_thread())
    _start_kueue(layout=layout, bins=bins, holder=holder, api=admin_api(layout, st.server),
                 die_with_parent=die_with_parent)


def stop_kueue(run_dir: Path) -> bool:
    """Stop Kueue in a running run: its webhook configurations are deleted first (so nothing is gated by a
    server that is gone), then its process; its CRDs and objects stay. Returns False when it was not running."""
    run_dir = Path(run_dir).resolve()
    st = state.load(run_dir)
    if st is None:
        raise ClusterError(f"no run in {run_dir}")
    api = admin_api(components.Layout(run_dir=run_dir), st.server)
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        for name in ("mutating-webhook-configuration", "validating-webhook-configuration"):
            api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{kueue.NAME_PREFIX}{name}")
    records = [r for r in st.processes if r.name == KUEUE_COMPONENT]
    stopped = procs.stop(records, grace_s=5.0)
    state.save(st.with_(processes=tuple(r for r in st.processes if r.name != KUEUE_COMPONENT)))
    return bool(stopped)
