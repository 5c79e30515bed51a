"""The control loop's watches on a real kube-apiserver (issue 29, item 1, and the first start after the CRDs).

A cluster of its own (module scope): its kube-apiserver serves Deployments without a watch
cache (``--watch-cache-sizes=deployments.apps#0``), so a watch resumed from a version etcd
compacted away is answered 410 Gone by the real server, and its CRDs are created by the
first test, right before the operator starts.

1. **The first start right after the CRDs are created** converges in seconds: the API
   server answers 429 "storage is (re)initializing" to the first lists of a CRD created a
   moment ago; each kind is LISTed once at start (``sglang_pd_operator_watch_lists_total``)
   and a 429 is asked again after its Retry-After, not after kopf's 60 s backoff.
2. **A child deleted while the watch was down** is recreated within seconds of the watch
   coming back: the operator reaches the API server through a proxy (``netkit.py``) that
   freezes its connections; the test deletes the decode Deployment, compacts etcd and cuts
   the frozen connections. The Deployments watch resumes from its last version, which etcd
   no longer has: 410 Gone, a new LIST, and the LIST's diff against the cache reports the
   deletion (client-go's Replace). Without that diff the cache would keep the deleted
   Deployment and nothing would recreate it before a sweep minutes later. The timings are
   printed.
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from helpers import load_example
from netkit import StallingProxy, proxied_kubeconfig
from opkit import OperatorProcess, kapply, kget, model_store, operator_metrics, ready_now, wait_for

from sglang_pd_operator.runtime.cache import WATCHED
from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster import state

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ROLE = "pd.sglang-operator.io/role"
OWNER = "pd.sglang-operator.io/deployment"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, cluster_log):
    """A cluster of this module's own: Deployments watched straight from etcd, no CRDs yet, no LWS."""
    devcluster.sweep_stale_runs(log=cluster_log)
    running = devcluster.start_cluster(run_dir=tmp_path_factory.mktemp("informer-cluster"), log=cluster_log,
                                       lws=False, apiserver_args=["--watch-cache-sizes=deployments.apps#0"])
    try:
        yield running
    finally:
        running.stop(log=cluster_log)


def _namespace(cluster) -> str:
    name = f"informer-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    kapply(cluster, model_store(name))
    return name


def _spec(ns: str) -> dict:
    doc = load_example()
    doc["metadata"]["namespace"] = ns
    doc["spec"]["decode"]["replicas"] = 1
    return doc


def _lists(op, reason: str) -> dict[str, float]:
    return {dict(labels)["kind"]: v for (name, labels), v in operator_metrics(op).items()
            if name == "sglang_pd_operator_watch_lists_total" and dict(labels).get("reason") == reason}


def _etcd(cluster, path: str, body: dict) -> dict:
    port = state.load(Path(cluster.run_dir)).ports["etcd-client"]
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _compact_etcd(cluster) -> int:
    """Compact etcd's history up to its current revision (the API server's own compaction, done now)."""
    revision = int(_etcd(cluster, "/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
                   ["header"]["revision"])
    _etcd(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


def test_the_first_start_right_after_the_crds_are_created_converges_in_seconds(fresh, tmp_path):
    fresh.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    fresh.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    op = OperatorProcess(kubeconfig=fresh.kubeconfig, log_path=tmp_path / "operator.log",
                         extra_args=["--no-leader-elect"]).start()
    started = time.monotonic()
    try:
        ns = _namespace(fresh)
        kapply(fresh, _spec(ns))
        name = _spec(ns)["metadata"]["name"]
        wait_for(lambda: (kget(fresh, "deployments", "-n", ns, "-l", f"{OWNER}={name}") or {}).get("items"),
                 timeout=60, what="the PDDeployment's children")
        children_s = time.monotonic() - started
        wait_for(lambda: ready_now(kget(fresh, "pddeployment", name, "-n", ns)), timeout=120, what="Ready")
        ready_s = time.monotonic() - started
        log = (tmp_path / "operator.log").read_text(errors="replace")
        busy = len(re.findall(r"answered 429", log))
        lists = _lists(op, "start")
        print(f"first start right after the CRDs were created: children {children_s:.1f}s, Ready {ready_s:.1f}s "
              f"after the operator started; {busy} LIST(s) answered 429 and asked again; LISTs at start: {lists}")
        # one LIST per kind at start: every kind, and an optional one only where the cluster serves it
        assert {w.kind for w in WATCHED if not w.optional} <= set(lists) <= {w.kind for w in WATCHED}, lists
        assert set(lists.values()) == {1.0}, lists
        assert children_s < 25, f"the first reconcile took {children_s:.0f}s (kopf's 60 s backoff after a 429?)"
    finally:
        op.stop()


def test_a_child_deleted_while_the_watch_was_down_is_recreated_within_seconds_of_410_gone(fresh, tmp_path):
    if not kget(fresh, "crd", "pddeployments.pd.sglang-operator.io"):
        fresh.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        fresh.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    host, port = re.match(r"https://([\d.]+):(\d+)", fresh.server).groups()
    proxy = StallingProxy((host, int(port)))
    # a long resync: no periodic pass may stand in for the re-list; no Lease to lose while frozen
    op = OperatorProcess(kubeconfig=proxied_kubeconfig(fresh, proxy, tmp_path / "kubeconfig"),
                         log_path=tmp_path / "operator.log", resync=3600, extra_args=["--no-leader-elect"]).start()
    try:
        ns = _namespace(fresh)
        doc = _spec(ns)
        name = doc["metadata"]["name"]
        kapply(fresh, doc)
        wait_for(lambda: ready_now(kget(fresh, "pddeployment", name, "-n", ns)), timeout=150, what="Ready")
        decode = kget(fresh, "deployments", "-n", ns, "-l", f"{OWNER}={name},{ROLE}=decode")["items"][0]
        victim, old_uid = decode["metadata"]["name"], decode["metadata"]["uid"]
        gone_before = _lists(op, "gone").get("Deployment", 0.0)

        proxy.stall()  # every connection of the operator freezes: its watches see nothing from here
        deleted = time.monotonic()
        fresh.kubectl("delete", "deployment", victim, "-n", ns, "--wait=true", "--timeout=30s")
        revision = _compact_etcd(fresh)  # the deletion's event is gone from etcd's history
        proxy.sever()  # the watches break and resume from their last version
        cut = time.monotonic()

        def recreated():
            got = kget(fresh, "deployment", victim, "-n", ns)
            return got if got and got["metadata"]["uid"] != old_uid else None

        wait_for(recreated, timeout=60, interval=0.2, what=f"{victim} recreated")
        back = time.monotonic()
        gone_after = _lists(op, "gone").get("Deployment", 0.0)
        print(f"deletion during a forced 410: {victim} deleted while the watch was frozen, etcd compacted at "
              f"revision {revision}, connections cut {cut - deleted:.1f}s after the deletion; the Deployments watch "
              f"met 410 Gone and LISTed again ({gone_after - gone_before:.0f} re-list(s)); recreated "
              f"{back - cut:.1f}s after the cut ({back - deleted:.1f}s after the deletion)")
        assert gone_after > gone_before, "the recreation did not come from a re-list after 410 Gone"
        assert back - cut < 20
        wait_for(lambda: ready_now(kget(fresh, "pddeployment", name, "-n", ns)), timeout=120, what="Ready again")
    finally:
        op.stop()
        proxy.close()
