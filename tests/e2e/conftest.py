"""The e2e tests' real control plane: one session-scoped ``cluster`` fixture.

``cluster`` is a ``sglang_pd_operator_dev.cluster.Cluster``: a real etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake GPU nodes from
hack/cluster/node-pools.yaml), started in a fresh temporary run directory per session
and stopped at the end. Attributes tests use: ``kubeconfig`` (path), ``bin_dir``,
``run_dir``, ``kubectl(*args)`` -> CompletedProcess, ``helm(*args)``, ``api_client()``
-> kubernetes.client.ApiClient.

The first session on a machine builds the binaries (tens of minutes, progress printed);
later sessions start in a few seconds. Set SGLANG_PD_E2E_RUN_DIR to the run directory of
a cluster started with ``python -m sglang_pd_operator_dev.cluster up --detach`` to reuse
it instead (it is then left running).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sglang_pd_operator_dev.cluster import cluster as devcluster


@pytest.fixture(scope="session")
def cluster_log(request) -> Callable[[str], None]:
    """Print a line to the terminal even while pytest captures output."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def log(message: str) -> None:
        if reporter is None or capture is None:
            print(message, flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(message)

    return log


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, cluster_log) -> Iterator[devcluster.Cluster]:
    """A running dev cluster for the whole session (see the module docstring)."""
    reuse = os.environ.get("SGLANG_PD_E2E_RUN_DIR")
    if reuse:
        yield devcluster.Cluster.from_run_dir(Path(reuse))
        return
    devcluster.sweep_stale_runs(log=cluster_log)
    run_dir = tmp_path_factory.mktemp("cluster")
    running = devcluster.start_cluster(run_dir=run_dir, log=cluster_log)
    t = running.timings
    cluster_log(f"dev cluster: /readyz {t['readyz']:.1f}s, nodes Ready {t['nodes']:.1f}s, "
                f"LWS serving {t['ready']:.1f}s, whole start {t['total']:.1f}s"
                + (f" (including a {t['build']:.0f}s build)" if "build" in t else
                   " (warm start, binaries cached)"))
    try:
        yield running
    finally:
        running.stop(log=cluster_log)


@pytest.fixture
def operator(cluster, crds, tmp_path):
    """``sglang-pd-operator run`` for one test (default flags), stopped afterwards; a module
    that shares one operator over its tests overrides this with a module-scoped fixture."""
    from opkit import OperatorProcess

    op = OperatorProcess(kubeconfig=cluster.kubeconfig, log_path=tmp_path / "operator.log").start()
    yield op
    op.stop()


@pytest.fixture
def namespace(cluster) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting)."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crds(cluster):
    """The operator's CRDs installed (server-side apply of crds/), Established and served
    (a list answers 200), so an operator started next does not meet a 429."""
    from sglang_pd_operator_dev.cluster.demo import install_crds

    install_crds(cluster)
    return True


@pytest.fixture
def ns(cluster, crds, request) -> Iterator[str]:
    """A fresh namespace with a bound ``model-store`` PVC, for one test's PDDeployments.

    Teardown deletes the PDDeployments and waits until their pods are gone (the fake GPU
    nodes are shared by the whole session), then the namespace and the PV.
    """
    from opkit import kapply, model_store, pods, wait_for

    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")[:12]
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    kapply(cluster, model_store(name))
    yield name
    cluster.kubectl("delete", "pddeployments", "--all", "-n", name, "--wait=true", "--timeout=60s", check=False)
    wait_for(lambda: not pods(cluster, name, "pd.sglang-operator.io/deployment"), timeout=90, what=f"pods of {name} gone")
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "pv", f"model-store-{name}", "--wait=false", check=False)


@pytest.fixture
def procs(tmp_path):
    """Engine simulators and smg started by one test (``simkit.Processes``), all stopped afterwards."""
    from simkit import Processes

    p = Processes(tmp_path)
    yield p
    p.stop_all()
