"""Release to release: v0.1.0 with a deployment Ready, then this operator installed: nothing restarts.

The previous release is this repository's own commit b180e07 (CHANGELOG.md records each
release's commit), taken with ``git archive`` into a temporary folder and run from there
(its source folder linked as ``sglang_pd_operator`` on PYTHONPATH, ahead of this checkout's
editable install; the dependencies are this venv's, which v0.1.0's pins allow). A
dedicated dev cluster (not the session's: the CRDs go from v0.1.0's to this release's).

1. v0.1.0's CRDs, v0.1.0's operator (no leader election, as it shipped), v0.1.0's GB300
   example: Ready.
2. v0.1.0 stopped (what the chart's ``strategy: Recreate`` does: the old pod is gone before
   the new one starts); this release's CRDs (``kubectl apply --server-side -f crds/``, the
   README's way; ``helm upgrade`` applies the same files), then this operator.
3. The new operator holds the group: ``UpgradePending`` says what an opt-in would change;
   sampled every 0.25 s from its start, Ready never leaves True; afterwards every engine pod
   has the UID it had (0 recreated), no pod template changed, no ReplicaSet or group was added.
4. Opt-in (``spec.rollout.operatorChanges: apply``): a paired rollout to the new key,
   Complete, the old group deleted, Ready True at the new generation.

All of it under bounded load (issue 25, item 5; ``loadkit``): from v0.1.0's deployment Ready
until the opt-in's rollout is done, 3 requests per second enter through the gateway Service
(``ServiceProxyStandIn``: kube-proxy cannot route loopback pods here), reach the REAL smg of
each gateway pod (v0.1.0's rendered arguments, then this release's) and an engine simulator
per engine pod (``KubeletStandIn``, which also runs each deleted pod's preStop: v0.1.0's pods
have none, this release's drain). Failed requests must be 0 in both steps: the upgrade, and
the opt-in's paired rollout (v0.1.0's old group gets no new request after the cutover and is
deleted only after ``drainGracePeriod``).

The pod UIDs before and after, the time each step took and the table of requests sent /
failed per step are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from loadkit import ChangeTable, KubeletStandIn, Load, ServiceProxyStandIn, print_table, smg_registered
from opkit import OperatorProcess, condition, kapply, kget, model_store, pods, ready_now, wait_for
from simkit import Prober, probe_policy

from sglang_pd_operator_dev.cluster import cluster as devcluster
from sglang_pd_operator_dev.cluster.demo import install_crds

pytestmark = pytest.mark.e2e

PREVIOUS = "b180e07"  # v0.1.0
NS = "upgrade"
NAME = "dsv41-flash"
LBL = "pd.sglang-operator.io"
SIM = ["--ttft-median", "0.05", "--itl-median", "0.05", "--itl-sigma", "0.05", "--prefill-median", "0.05"]


@pytest.fixture(scope="module")
def upc(tmp_path_factory, cluster_log):
    """A dev cluster for this module only (the CRDs change release)."""
    running = devcluster.start_cluster(run_dir=tmp_path_factory.mktemp("upgrade-cluster"), log=cluster_log)
    try:
        yield running
    finally:
        running.stop(log=cluster_log)


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> dict[str, Path]:
    """v0.1.0's tree (``src``) and a PYTHONPATH folder (``py``) whose ``sglang_pd_operator`` is its source."""
    base = tmp_path_factory.mktemp("v0.1.0")
    src, py = base / "src", base / "py"
    src.mkdir()
    py.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=False)
    assert archive.returncode == 0, (f"git archive {PREVIOUS} failed (the release test needs this repository's "
                                     f"history): {archive.stderr.decode()[-300:]}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    (py / "sglang_pd_operator").symlink_to(src / "operator")
    return {"src": src, "py": py}


def _pdd(upc):
    return kget(upc, "pdd", NAME, "-n", NS)


def _engine_pods(upc) -> dict[str, str]:
    """name -> uid of every prefill and decode pod."""
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in pods(upc, NS, f"{LBL}/deployment={NAME},{LBL}/role in (prefill,decode)")}


def _deployments(upc) -> dict[str, str]:
    """name -> its pod template (JSON) of every Deployment of the PDDeployment. (Not the generation:
    a Deployment's generation also moves when its annotations change, as the adoption's record does.)"""
    got = kget(upc, "deployments", "-n", NS, "-l", f"{LBL}/deployment={NAME}") or {"items": []}
    return {d["metadata"]["name"]: json.dumps(d["spec"]["template"], sort_keys=True) for d in got["items"]}


def _replica_sets(upc) -> set[str]:
    got = kget(upc, "replicasets", "-n", NS, "-l", f"{LBL}/deployment={NAME}") or {"items": []}
    return {r["metadata"]["name"] for r in got["items"]}


def _apply_crd_dir(upc, folder: Path) -> None:
    upc.kubectl("apply", "--server-side", "-f", str(folder))
    for path in sorted(folder.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        upc.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    wait_for(lambda: upc.kubectl("get", "pdd", "-A", check=False).returncode == 0, timeout=60,
             what="PDDeployments listable")


def test_v0_1_0_to_this_release_restarts_no_engine_then_the_opt_in_rolls_out(upc, previous, procs, tmp_path,
                                                                          cluster_log):
    figures: dict[str, object] = {}
    rows: list[dict] = []
    upc.kubectl("create", "namespace", NS)
    kapply(upc, model_store(NS))
    kapply(upc, probe_policy(NS, role=("prefill", "decode", "gateway")))  # Ready once the rendered probes pass
    time.sleep(2)  # the API server's admission chain picks up a new policy within about a second
    doc = yaml.safe_load((previous["src"] / "examples" / "dsv41-flash-gb300-low-latency.yaml").read_text())
    doc["metadata"]["namespace"] = NS
    doc["spec"].setdefault("rollout", {})["drainGracePeriod"] = "5s"
    spec = doc["spec"]
    counts = {"gateways": spec["gateway"]["replicas"], "prefill": spec["prefill"]["replicas"],
              "decode": spec["decode"]["replicas"]}
    new = None
    try:
        with (Prober(upc.api_client(), NS),
              KubeletStandIn(upc, procs, NS, NAME, model=spec["model"], sim_extra=SIM) as kubelet):
            # 1. v0.1.0 as it shipped
            _apply_crd_dir(upc, previous["src"] / "crds")
            old = OperatorProcess(
                kubeconfig=upc.kubeconfig, log_path=tmp_path / "operator-v0.1.0.log",
                command=[sys.executable, "-c", "import sys; sys.argv[0] = 'sglang-pd-operator'; "
                         "from sglang_pd_operator.cli import main; main()"],
                env={"PYTHONPATH": str(previous["py"])}).start()
            try:
                kapply(upc, doc)
                t0 = time.monotonic()
                old_key = wait_for(lambda: ready_now(_pdd(upc)), timeout=180,
                                   what="v0.1.0's deployment Ready")["status"]["compatKey"]
                figures["v0.1.0 Ready after"] = f"{time.monotonic() - t0:.1f}s"
                wait_for(lambda: smg_registered(upc, NS, NAME, old_key, **counts), timeout=90,
                         what="v0.1.0's gateways' smg registered every engine pod")
                version_line = next((line for line in (tmp_path / "operator-v0.1.0.log").read_text().splitlines()), "")
                cluster_log(f"== v0.1.0 operator log starts: {version_line[:160]}")
            except BaseException:
                old.stop()
                raise
            with (ServiceProxyStandIn(upc.api_client(), NS, NAME) as svc,
                  Load(svc.url, spec["model"]["servedModelName"]) as load):
                time.sleep(3)  # a baseline under load
                baseline = list(load.results)
                table = ChangeTable(load, kubelet, rows)
                with table.window("operator upgrade v0.1.0 -> this release (CRDs, then the operator)"):
                    old.stop()  # Recreate: the old operator is gone before the new one starts
                    new = _upgrade(upc, tmp_path, figures, old_key)
                with table.window("opt-in (operatorChanges: apply): paired rollout to the new key"):
                    new_key = _opt_in(upc, figures, old_key)
                    wait_for(lambda: {p for p, _, _ in svc.endpoints} == {
                        p["metadata"]["name"] for p in pods(upc, NS, f"{LBL}/compat-key={new_key},{LBL}/role=gateway")},
                        timeout=60, what="the Service's endpoints are the new group's gateways")
        assert "Traceback" not in (tmp_path / "operator.log").read_text()
    finally:
        if new is not None:
            new.stop()
        for k, v in figures.items():
            cluster_log(f"== release upgrade: {k}: {json.dumps(v) if not isinstance(v, str) else v}")
        print_table(rows, cluster_log, "release upgrade under load")
        out = os.environ.get("SGLANG_PD_UPGRADE_FIGURES")
        if out:
            Path(out).write_text(json.dumps({**figures, "load": rows}, indent=1))
    assert baseline and all(r[2] for r in sorted(baseline)[:5]), "the load did not go through before the upgrade"
    assert len(rows) == 2
    assert not table.failed_outside(), table.failed_outside()  # no failure ended between the rows
    for row in rows:
        assert row["sent"] >= 3 and row["failed"] == 0, row
    upgrade_row, opt_in_row = rows
    assert upgrade_row["drain_s"] == {}, upgrade_row  # the upgrade stopped no pod
    # every pod of v0.1.0's group went away in the opt-in; v0.1.0 rendered no preStop
    assert len(opt_in_row["drain_s"]) == sum(counts.values()), opt_in_row
    assert set(opt_in_row["drain_s"].values()) == {"no preStop"}, opt_in_row


def _upgrade(upc, tmp_path: Path, figures: dict, old_key: str) -> OperatorProcess:
    """Step 2 and 3: this release's CRDs, then its operator; nothing restarts, UpgradePending says why.
    Returns the running operator."""
    before = _engine_pods(upc)
    deployments_before = _deployments(upc)
    replica_sets_before = _replica_sets(upc)
    assert before and all(p.startswith(f"{NAME}-{old_key[:6]}-") for p in before), before

    # 2. this release, the README's way: CRDs, then the operator
    install_crds(upc)
    samples: list[tuple[float, str]] = []
    new = OperatorProcess(kubeconfig=upc.kubeconfig, log_path=tmp_path / "operator.log").start()
    t0 = time.monotonic()

    def held():
        obj = _pdd(upc)
        ready = condition(obj, "Ready")
        samples.append((time.monotonic() - t0, (ready or {}).get("status", "absent")))
        up = condition(obj, "UpgradePending")
        return up if up and up["status"] == "True" else None

    pending = wait_for(held, timeout=120, interval=0.25, what="UpgradePending on the v0.1.0 group")
    figures["UpgradePending after"] = f"{samples[-1][0]:.1f}s"
    # a little longer: the operator's resync (2 s) passes over the held group several times
    end = time.monotonic() + 8
    while time.monotonic() < end:
        held()
        time.sleep(0.25)
    assert {s for _, s in samples} == {"True"}, [s for s in samples if s[1] != "True"][:5]
    after = _engine_pods(upc)
    figures["engine pod UIDs before"] = before
    figures["engine pod UIDs after"] = after
    recreated = {n for n in before if after.get(n) != before[n]} | (set(after) - set(before))
    assert not recreated, f"engine pods recreated by the upgrade: {sorted(recreated)}"
    assert _deployments(upc) == deployments_before  # no template written, no group added
    assert _replica_sets(upc) == replica_sets_before  # no rollout started
    obj = _pdd(upc)
    assert obj["status"]["compatKey"] == old_key and obj["status"]["rollout"]["phase"] == "Complete"
    message = pending["message"]
    assert f"group {old_key[:6]} was rendered by operator unrecorded" in message
    assert "Would change: compat key" in message and "operatorChanges: apply" in message
    assert "readinessProbe /health -> /readiness" in message and "preStop" in message
    figures["UpgradePending"] = message
    return new


def _opt_in(upc, figures: dict, old_key: str) -> str:
    """Step 4: the opt-in rolls it out: a paired rollout to the new key, the old group deleted. Returns the new key."""
    t1 = time.monotonic()
    upc.kubectl("patch", "pdd", NAME, "-n", NS, "--type", "merge",
                "-p", json.dumps({"spec": {"rollout": {"operatorChanges": "apply"}}}))

    def rolled_out():
        o = _pdd(upc)
        if not ready_now(o) or o["status"]["compatKey"] == old_key or condition(o, "UpgradePending"):
            return None
        if o["status"]["rollout"]["phase"] != "Complete":
            return None
        if any(n.startswith(f"{NAME}-{old_key[:6]}-") for n in _deployments(upc)):
            return None
        return o

    done = wait_for(rolled_out, timeout=240, what="the opt-in's paired rollout Complete, the old group gone")
    figures["opt-in rolled out after"] = f"{time.monotonic() - t1:.1f}s"
    new_key = done["status"]["compatKey"]
    wait_for(lambda: not pods(upc, NS, f"{LBL}/compat-key={old_key}"), timeout=60, what="v0.1.0's pods gone")
    rolled = _engine_pods(upc)
    assert rolled and all(n.startswith(f"{NAME}-{new_key[:6]}-") for n in rolled), rolled
    figures["engine pod UIDs after the opt-in"] = rolled
    return new_key
