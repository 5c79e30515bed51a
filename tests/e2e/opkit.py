"""Helpers for operator e2e tests: run the operator as a process, wait for conditions, read objects.

Imported by the e2e test modules (pytest's pythonpath includes tests/e2e through
conftest). Nothing here fakes the API server: every call goes to the dev cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any, Callable

import yaml

from sglang_pd_operator_dev.cluster.demo import OperatorProcess, free_port, model_store  # noqa: F401 (re-exported)


def wait_for(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.5, what: str = "condition",
             explain: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns a truthy value; raise AssertionError naming ``what`` on timeout.

    ``explain``, when given, is called once on timeout and its text (the state a reader needs
    to see why: conditions, pods, queue objects) is added to the error, so a failure in CI
    says more than ``last: None``.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    detail = ""
    if explain is not None:
        try:
            detail = "\n" + explain()
        except Exception as exc:  # the explanation must not hide the timeout
            detail = f"\n(explain failed: {exc!r})"
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r}){detail}")


#: An API refusal in an operator log line (its one-line form, reconcilers/apierrors.brief, or a client's).
_FORBIDDEN = re.compile(r"Forbidden|forbidden|\(403\)|status=403")


def rbac_denials(log: str) -> list[str]:
    """Lines of an operator ``log`` that show an API refusal a ServiceAccount's RBAC explains.

    A create refused because its namespace is being deleted (403, NamespaceTerminating: a
    test's namespace going while the operator still reconciles in it) is no RBAC problem.
    """
    return [ln for ln in log.splitlines() if _FORBIDDEN.search(ln) and "because it is being terminated" not in ln]


def kget(cluster, *args: str) -> dict[str, Any] | None:
    """``kubectl get ... -o json`` as a dict, or None when it fails (e.g. not found)."""
    res = cluster.kubectl("get", *args, "-o", "json", check=False)
    if res.returncode != 0:
        return None
    return json.loads(res.stdout)


def kapply(cluster, obj: dict[str, Any] | list[dict[str, Any]], *, check: bool = True) -> subprocess.CompletedProcess:
    """``kubectl apply -f -`` of one object or a list (server-side, as GitOps tools do)."""
    docs = obj if isinstance(obj, list) else [obj]
    return cluster.kubectl(
        "apply", "--server-side", "--field-manager=e2e-user", "-f", "-", input=yaml.safe_dump_all(docs), check=check
    )


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The condition of ``type_`` in ``obj.status.conditions``, or None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def ready_now(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    """``obj`` when its Ready condition is True and it and ``status.observedGeneration`` speak
    for ``metadata.generation`` (what a GitOps health check waits for), else None."""
    c = condition(obj, "Ready")
    gen = (obj or {}).get("metadata", {}).get("generation")
    if c and c["status"] == "True" and c.get("observedGeneration") == gen and obj["status"].get("observedGeneration") == gen:
        return obj
    return None


def operator_process(cluster, log_dir, **kw: Any):
    """Generator for a fixture: an operator process (``OperatorProcess`` options in ``kw``)
    logging into ``log_dir``, its log tail printed if it died, stopped afterwards."""
    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=log_dir / "operator.log", **kw).start()
    yield op
    if not op.alive():
        print(op.log_tail())
    op.stop()


def children(cluster, namespace: str, name: str) -> dict[str, list[str]]:
    """Names of the objects the operator made for PDDeployment ``name``, by kind."""
    out: dict[str, list[str]] = {}
    sel = f"pd.sglang-operator.io/deployment={name}"
    for kind in ("deployments", "configmaps", "services", "serviceaccounts", "roles", "rolebindings"):
        got = kget(cluster, kind, "-n", namespace, "-l", sel) or {"items": []}
        out[kind] = sorted(i["metadata"]["name"] for i in got["items"])
    return out


def pods(cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """Pods matching ``selector``."""
    return (kget(cluster, "pods", "-n", namespace, "-l", selector) or {"items": []})["items"]


def cache_pv(namespace: str, claim: str) -> dict[str, Any]:
    """A statically bound ReadWriteMany PV for a KernelBuild's cache PVC (the dev cluster has no provisioner)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"kb-{namespace}-{claim}"[:63]},
        "spec": {
            "capacity": {"storage": "1Ti"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": f"/tmp/kernel-cache/{namespace}/{claim}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def operator_metrics(op) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on the operator process's ``/metrics``: (name, sorted labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def reconciles(op, kind: str, namespace: str, name: str) -> float:
    """How many times the operator process took up one object (its ``sglang_pd_operator_reconciles_total``):
    reconciles a worker finished, and resyncs that found the object's inputs unchanged since its
    last reconcile (which would have computed the same from the same inputs)."""
    ident = (("kind", kind), ("name", name), ("namespace", namespace))
    return sum(v for (metric, labels), v in operator_metrics(op).items()
               if metric == "sglang_pd_operator_reconciles_total" and tuple(lb for lb in labels if lb[0] != "result") == ident)


def looked(op, kind: str, namespace: str, name: str, *, more: int = 2, timeout: float = 60,
           poke: Callable[[], Any] | None = None) -> float:
    """Wait until the operator has finished ``more`` reconciles of the object beyond those done so far; returns the count.

    What every "nothing happened" assertion waits on first: proof from the operator's
    own metrics that it looked at the object again (a stalled operator fails here; a
    fixed sleep would have passed). ``poke``, called once after the count was read, makes
    the operator look when no resync is due (an operator with a long ``--resync``): e.g.
    a label change of the object, a watch event that queues it.
    """
    start = reconciles(op, kind, namespace, name)
    if poke is not None:
        poke()
    return wait_for(lambda: (n := reconciles(op, kind, namespace, name)) >= start + more and n, timeout=timeout,
                    interval=0.2, what=f"{more} more reconciles of {kind} {namespace}/{name} (from {start:.0f})")


#: A test-owned finalizer: a deleted pod stays Terminating, as under a kubelet draining it.
TERMINATING_FINALIZER = "e2e.sglang-pd-operator.io/kubelet-terminating"


def delete_lws_worker(cluster, namespace: str, worker: str, *, timeout: float = 120) -> float:
    """Delete the LeaderWorkerSet worker pod ``worker`` as a kubelet lets it go; return once LWS deleted
    its group's leader (the group restarts), with the deletion's wall time.

    A kubelet keeps a deleted pod Terminating while its preStop drains (docs/drain.md);
    kwok removes it at once. LWS v0.9.0 recreates the group only if its pod controller
    reads the worker while it still has a ``deletionTimestamp`` (pod_controller.go
    ``handleRestartPolicy``: PodDeleted), so a pod gone before that read (a loaded
    machine) restarts nothing. A test finalizer stands in for the kubelet's drain until
    LWS has deleted (or replaced) the leader ``<lws>-<group>`` of ``worker``
    (``<lws>-<group>-<index>``); it is removed on every way out.
    """
    leader = worker.rsplit("-", 1)[0]
    uid = kget(cluster, "pod", leader, "-n", namespace)["metadata"]["uid"]
    unhold = json.dumps({"metadata": {"finalizers": None}})
    cluster.kubectl("patch", "pod", worker, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"metadata": {"finalizers": [TERMINATING_FINALIZER]}}))
    deleted_at = time.time()
    try:
        cluster.kubectl("delete", "pod", worker, "-n", namespace, "--wait=false")

        def leader_going():
            obj = kget(cluster, "pod", leader, "-n", namespace)
            return obj is None or obj["metadata"]["uid"] != uid or bool(obj["metadata"].get("deletionTimestamp"))

        wait_for(leader_going, timeout=timeout, what=f"LWS deleting leader {leader} after its worker {worker} was deleted")
    finally:
        cluster.kubectl("patch", "pod", worker, "-n", namespace, "--type=merge", "-p", unhold, check=False)
    return deleted_at
