"""The ``Cluster`` handle of a running dev cluster, and the harness's errors.

A ``Cluster`` is what tests and tools hold: paths (kubeconfig, binaries, run directory),
``kubectl``/``helm`` runners bound to the cluster, a ``kubernetes`` ApiClient, ``stop``.
``cluster.start_cluster`` makes one; ``Cluster.from_run_dir`` finds one started
elsewhere (``up --detach``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sglang_pd_operator_dev.cluster import procs, state, teardown

Log = Callable[[str], None]


class ClusterError(RuntimeError):
    """The cluster could not be started or found; the message says why."""


class ClusterAlreadyRunning(ClusterError):
    """The run directory holds a live run (stop it with ``down`` or pick another dir)."""


class ComponentFailed(ClusterError):
    """A component exited early or never got ready. ``component`` names it."""

    def __init__(self, *, component: str, problem: str, st: state.RunState) -> None:
        self.component = component
        self.port_in_use = False
        lines = [f"{component} {problem}.", "component logs:"]
        failing_log = ""
        for record in st.processes:
            lines.append(f"  {record.name:<24} {record.log}")
            if record.name == component:
                failing_log = record.log
        if failing_log:
            tail = procs.log_tail(failing_log, lines=25)
            self.port_in_use = "address already in use" in tail
            lines += [f"last lines of {failing_log}:", tail]
        super().__init__("\n".join(lines))


#: Name of the SGLang oracle service's process record (and log file), and its key in the run state's ports.
ORACLE_COMPONENT = "oracle"


def oracle_url(st: state.RunState) -> str | None:
    """The base URL of a run's SGLang oracle service (None when the run has none)."""
    port = st.ports.get(ORACLE_COMPONENT)
    return f"http://127.0.0.1:{port}" if port else None


@dataclass(frozen=True)
class Cluster:
    """A running dev cluster.

    ``kubeconfig`` is the admin kubeconfig (group system:masters), ``bin_dir`` holds
    kubectl, helm and the components, ``run_dir`` holds logs/, pki/ and state.json.
    ``timings`` (seconds): ``readyz`` from launching etcd to a 200 from /readyz,
    ``nodes`` to nodes Ready, ``ready`` to the LWS controller serving its webhooks too,
    ``total`` for the whole ``start_cluster`` call, ``build`` when this call built the
    binaries. ``oracle_url``: the run's SGLang oracle service (``oracle serve`` from this
    venv, what ``run --oracle-url`` takes), None when the run has none.
    """

    run_dir: Path
    kubeconfig: Path
    bin_dir: Path
    server: str
    pod_network: str
    timings: dict[str, float] = field(default_factory=dict)
    oracle_url: str | None = None

    @classmethod
    def from_run_dir(cls, run_dir: Path) -> Cluster:
        """The handle of a run started elsewhere (e.g. ``up --detach``). Raises
        ClusterError when the directory holds no live run."""
        st = state.load(run_dir)
        if st is None or st.phase != "ready":
            raise ClusterError(f"no running cluster in {run_dir}")
        reason = state.why_not_live(st)
        if reason:
            raise ClusterError(f"the cluster in {run_dir} is not running: {reason}")
        return cls(run_dir=Path(st.run_dir), kubeconfig=Path(st.kubeconfig),
                   bin_dir=Path(st.bin_dir), server=st.server, pod_network=st.pod_network,
                   oracle_url=oracle_url(st))

    def shell_exports(self) -> list[str]:
        """The lines a shell pastes to use this cluster: ``export KUBECONFIG=...``, an
        ``export PATH=<bin_dir>:$PATH`` that puts the built kubectl and helm (the cluster's
        own version) before any other on the PATH, and with an oracle service
        ``export SGLANG_PD_ORACLE_URL=...`` (``sglang-pd-operator run`` then asks SGLang)."""
        lines = [f"export KUBECONFIG={self.kubeconfig}", f"export PATH={self.bin_dir}:$PATH"]
        if self.oracle_url:
            lines.append(f"export SGLANG_PD_ORACLE_URL={self.oracle_url}")
        return lines

    def env(self) -> dict[str, str]:
        """Environment for tools: KUBECONFIG and run-local helm directories."""
        helm = self.run_dir / "helm"
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "HELM_CACHE_HOME": str(helm / "cache"), "HELM_CONFIG_HOME": str(helm / "config"),
                "HELM_DATA_HOME": str(helm / "data")}

    def _tool(self, name: str, args: tuple[str, ...], *, check: bool, input: str | None,
              timeout: float) -> subprocess.CompletedProcess:
        cmd = [str(self.bin_dir / name), *args]
        if name == "kubectl":
            cmd.insert(1, f"--kubeconfig={self.kubeconfig}")
        proc = subprocess.run(cmd, env=self.env(), input=input, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise ToolFailed(proc)
        return proc

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120.0) -> subprocess.CompletedProcess:
        """Run the built kubectl against this cluster; output captured as text.

        Raises ToolFailed (with stderr in its message) on a non-zero exit if ``check``.
        """
        return self._tool("kubectl", args, check=check, input=input, timeout=timeout)

    def helm(self, *args: str, check: bool = True, input: str | None = None,
             timeout: float = 300.0) -> subprocess.CompletedProcess:
        """Run the built helm against this cluster (same contract as ``kubectl``)."""
        return self._tool("helm", args, check=check, input=input, timeout=timeout)

    def api_client(self):
        """A ``kubernetes.client.ApiClient`` for this cluster (admin identity)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def resolve_pod_dns(self, name: str, *, namespace: str) -> str | None:
        """The pod IP a pod in ``namespace`` would get for DNS name ``name`` (e.g. an
        LWS_LEADER_ADDRESS), from the API server's pods and headless Services; None when
        no record exists. There is no cluster DNS here: see ``poddns``."""
        from sglang_pd_operator_dev.cluster import poddns

        return poddns.resolve(self.api_client(), name, namespace=namespace)

    def stop(self, *, log: Log = print) -> None:
        """Stop every process of this run (see ``teardown.stop_run``)."""
        teardown.stop_run(self.run_dir, log=log)


class ToolFailed(subprocess.CalledProcessError):
    """kubectl/helm exited non-zero; ``str()`` includes its stderr."""

    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        super().__init__(proc.returncode, proc.args, proc.stdout, proc.stderr)

    def __str__(self) -> str:
        return (f"{' '.join(map(str, self.cmd))} exited {self.returncode}:\n"
                f"{(self.stderr or '').strip()}")
