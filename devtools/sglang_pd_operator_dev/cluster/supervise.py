"""Watching a run: ``status`` and the foreground loop of ``up``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from sglang_pd_operator_dev.cluster import cluster, components, procs, rest, state
from sglang_pd_operator_dev.cluster.handle import Cluster, ComponentFailed, oracle_url

Log = Callable[[str], None]


def run_status(run_dir: Path) -> dict:
    """What ``status`` prints: phase, liveness, each process, /readyz, node readiness, the
    LeaderWorkerSet controller (``lws``: version, webhook URL, whether it serves) and the SGLang
    oracle service (``oracle``: URL, whether /readyz answers)."""
    st = state.load(Path(run_dir).resolve())
    if st is None:
        return {"run_dir": str(run_dir), "phase": "absent"}
    result = {
        "run_dir": st.run_dir, "phase": st.phase, "detached": st.detached,
        "stale_because": state.why_not_live(st), "kubeconfig": st.kubeconfig,
        "server": st.server, "pod_network": st.pod_network, "ports": st.ports,
        "processes": [{"name": r.name, "pid": r.pid, "running": procs.is_ours(r), "log": r.log}
                      for r in st.processes],
    }
    if st.server and st.phase != "stopped":
        api = cluster.admin_api(components.Layout(run_dir=Path(st.run_dir)), st.server)
        ready, reason = api.readyz()
        result["readyz"] = "ok" if ready else reason
        if ready:
            items = (api.get_json("/api/v1/nodes?labelSelector=type%3Dkwok") or {}).get("items", [])
            result["nodes"] = {"total": len(items), "ready": sum(cluster.node_ready(n) for n in items)}
        if "lws-webhook" in st.ports:
            result["lws"] = _lws_status(st)
        url = oracle_url(st)
        if url:
            ready = rest.http_status(f"{url}/readyz") == 200
            result["oracle"] = f"{url} ({'ready' if ready else 'NOT ready'}; SGLANG_PD_ORACLE_URL for `run`)"
    return result


def _lws_status(st: state.RunState) -> dict:
    """LWS version (from the binary directory's build manifest), webhook URL, serving."""
    info: dict = {"running": any(r.name == cluster.LWS_COMPONENT and procs.is_ours(r)
                                 for r in st.processes)}
    try:
        info["version"] = json.loads((Path(st.bin_dir) / "build.json").read_text()).get("lws")
    except (OSError, ValueError):
        info["version"] = None
    port = st.ports.get("lws-webhook")
    if port:
        url = f"https://127.0.0.1:{port}"
        ca = components.Layout(run_dir=Path(st.run_dir)).pki.ca_cert
        info["webhook"] = url
        info["serving"] = rest.https_status(f"{url}/mutate--v1-pod", ca_cert=ca) not in (0, 404)
    return info


def wait_until_interrupted(running: Cluster, *, log: Log = print, poll_s: float = 1.0) -> int:
    """Block while the cluster runs (foreground ``up``). Returns 0 after Ctrl-C/SIGTERM
    (the caller stops the cluster), 1 when a component exited by itself (its log tail
    is printed)."""
    try:
        while True:
            st = state.load(running.run_dir)
            if st is None or st.phase == "stopped":
                log("cluster: stopped from elsewhere")
                return 0
            dead = [r for r in st.processes if not procs.is_ours(r)]
            if dead:
                err = ComponentFailed(component=dead[0].name, problem="exited unexpectedly", st=st)
                log(f"cluster: {err}")
                return 1
            time.sleep(poll_s)
    except KeyboardInterrupt:
        log("cluster: interrupted")
        return 0
