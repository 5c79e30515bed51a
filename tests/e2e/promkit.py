"""A real Prometheus server on loopback, scraping the kwok pods' simulators as the PodMonitor says.

The server is built from hack/promtool/go.mod (Prometheus 3.16, the module promtool comes
from) by hack/promtool/build_prometheus.py; hack/test.sh builds it before pytest runs, so
a test finds it in the cache. Set PROMETHEUS to a prebuilt binary to skip the build.

Targets come from file service discovery: one job per ``podMetricsEndpoints`` entry of
the PodMonitor the operator renders (``monitoring.render_monitoring``), each pod that
declares the endpoint's container port named as a target at its kwok (loopback) IP, with
the Kubernetes service-discovery meta labels Prometheus' ``kubernetes_sd`` would give it
(``__meta_kubernetes_namespace``, ``__meta_kubernetes_pod_name``,
``__meta_kubernetes_pod_label_<label>``). The PodMonitor's own relabelings are handed to
Prometheus as ``relabel_configs`` (the Prometheus Operator's camelCase -> snake_case
rename, after its ``namespace`` and ``pod`` target labels), so Prometheus itself decides
which pods each endpoint keeps and which ``deployment`` / ``role`` / ``compat_key`` labels
the series get: a relabeling the operator stopped rendering would change what the test sees.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from opkit import free_port
from simkit import Processes, answers

ROOT = Path(__file__).resolve().parents[2]

_RELABEL_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label", "action": "action",
                 "regex": "regex", "replacement": "replacement", "separator": "separator"}


def prometheus_binary() -> Path:
    """The Prometheus server (built once per machine from hack/promtool/go.mod; $PROMETHEUS overrides)."""
    if not os.environ.get("PROMETHEUS") and not shutil.which("go"):
        pytest.skip("neither PROMETHEUS nor a Go toolchain is available to build the Prometheus server")
    spec = importlib.util.spec_from_file_location("build_prometheus", ROOT / "hack" / "promtool" / "build_prometheus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ensure_prometheus(log=lambda line: print(line, flush=True))


def _meta_label(key: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def sd_groups(pods: list[dict[str, Any]], port_name: str) -> list[dict[str, Any]]:
    """File-SD target groups: every pod declaring a container port ``port_name`` at ``<pod IP>:<port>``,
    with the kubernetes_sd meta labels of the pod."""
    groups = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or [] if p.get("name") == port_name]
        if not ip or not ports:
            continue
        meta = pod["metadata"]
        labels = {"__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"]}
        labels.update({_meta_label(k): v for k, v in (meta.get("labels") or {}).items()})
        groups.append({"targets": [f"{ip}:{ports[0]['containerPort']}"], "labels": labels})
    return groups


class PrometheusServer:
    """``prometheus`` on 127.0.0.1:<free port> with the scrape jobs of one rendered PodMonitor.

    ``pod_monitor``: the PodMonitor dict; ``rules``: a rule file's content (dict) or None;
    ``scrape_interval``: e.g. ``1s``. :meth:`set_pods` writes the targets (file SD; Prometheus
    re-reads them at once). Started through ``procs`` (stopped with the test's processes).
    """

    def __init__(self, procs: Processes, run_dir: Path, pod_monitor: dict[str, Any], *,
                 rules: dict[str, Any] | None = None, scrape_interval: str = "1s") -> None:
        self.procs = procs
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pod_monitor = pod_monitor
        self.rules = rules
        self.scrape_interval = scrape_interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = "prometheus"

    def _jobs(self) -> list[tuple[str, str, dict[str, Any]]]:
        meta = self.pod_monitor["metadata"]
        out = []
        for i, ep in enumerate(self.pod_monitor["spec"]["podMetricsEndpoints"]):
            relabel = [{"action": "replace", "source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                       {"action": "replace", "source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]
            relabel += [{_RELABEL_KEYS[k]: (v.lower() if k == "action" else v) for k, v in r.items()}
                        for r in ep.get("relabelings") or []]
            job = f"podMonitor/{meta['namespace']}/{meta['name']}/{i}"
            out.append((job, ep["port"], {
                "job_name": job, "metrics_path": ep.get("path", "/metrics"), "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "file_sd_configs": [{"files": [str(self.dir / f"targets-{i}.json")], "refresh_interval": "1s"}],
                "relabel_configs": relabel,
            }))
        return out

    def start(self, *, timeout: float = 60.0) -> "PrometheusServer":
        binary = prometheus_binary()
        config: dict[str, Any] = {"global": {"scrape_interval": self.scrape_interval,
                                             "evaluation_interval": self.scrape_interval},
                                  "scrape_configs": [job for _, _, job in self._jobs()]}
        if self.rules is not None:
            (self.dir / "rules.yaml").write_text(yaml.safe_dump(self.rules, sort_keys=False))
            config["rule_files"] = [str(self.dir / "rules.yaml")]
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.set_pods([])
        self.procs.start(self.name, [str(binary), f"--config.file={self.dir / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={self.dir / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"])
        deadline = time.monotonic() + timeout
        while not answers(self.url + "/-/ready"):
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus not ready after {timeout:.0f}s:\n{self.procs.log(self.name)}")
            time.sleep(0.2)
        return self

    def set_pods(self, pods: list[dict[str, Any]]) -> None:
        """Make ``pods`` the targets of every job (written atomically; file SD picks them up)."""
        for i, (_, port, _) in enumerate(self._jobs()):
            path = self.dir / f"targets-{i}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(sd_groups(pods, port)))
            os.replace(tmp, path)

    def stop(self) -> None:
        self.procs.stop(self.name)

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query now: [(labels, value)]."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def samples(self, selector: str, seconds: int) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """The raw samples of ``selector`` over the last ``seconds``: [(labels, [(unix time, value)])]."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": f"{selector}[{int(seconds)}s]"})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in body["data"]["result"]]

    def target_health(self) -> list[tuple[str, str, str]]:
        """(pod label, health, last scrape error) of every active target."""
        with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=10) as resp:
            body = json.loads(resp.read())
        return sorted((t["labels"].get("pod", t["scrapeUrl"]), t["health"], t.get("lastError", ""))
                      for t in body["data"]["activeTargets"])

    def targets_up(self) -> int:
        """Active targets whose last scrape succeeded."""
        with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=10) as resp:
            body = json.loads(resp.read())
        return sum(t["health"] == "up" for t in body["data"]["activeTargets"])

