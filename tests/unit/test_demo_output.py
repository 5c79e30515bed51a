"""What the demo and ``dev cluster up`` print for a person (pure parts; the demo itself runs in hack/demo.sh)."""

from __future__ import annotations

from pathlib import Path

import signal
from types import SimpleNamespace

import pytest

from sglang_pd_operator_dev.cluster.demo import not_ready_report, operator_exited_lines, running_hints, serve_until_interrupted
from sglang_pd_operator_dev.cluster.handle import Cluster

PDD = {
    "metadata": {"name": "qwen3-30b-paged", "namespace": "inference", "generation": 1},
    "status": {
        "observedGeneration": 1,
        "conditions": [
            {"type": "Valid", "status": "True", "reason": "Valid", "message": ""},
            {"type": "Ready", "status": "False", "reason": "Unschedulable",
             "message": "prefill: 0/12 nodes are available: 12 node(s) didn't match Pod's node affinity/selector."},
            {"type": "Progressing", "status": "True", "reason": "CreatingGroup"},
        ],
    },
}


def _event(time: str, reason: str, message: str, *, count: int = 1, kind: str = "Pod", name: str = "p") -> dict:
    return {"type": "Warning", "reason": reason, "message": message, "count": count, "lastTimestamp": time,
            "involvedObject": {"kind": kind, "name": name}}


def test_not_ready_report_names_each_condition_and_the_recent_warnings_oldest_first():
    events = [_event("2026-11-29T13:25:03Z", "FailedScheduling", "0/12 nodes are available", count=4),
              _event("2026-11-29T13:25:01Z", "InvalidSpec", "refused", kind="PDDeployment", name="qwen3-30b-paged")]
    lines = not_ready_report(PDD, events)
    assert lines[0] == "conditions of inference/qwen3-30b-paged (generation 1, observed 1):"
    assert "  Valid=True Valid" in lines
    assert ("  Ready=False Unschedulable: prefill: 0/12 nodes are available: 12 node(s) didn't match "
            "Pod's node affinity/selector.") in lines
    assert "  Progressing=True CreatingGroup" in lines
    tail = lines[lines.index("recent Warning events (2 of 2):") + 1:]
    assert tail == ["  13:25:01 PDDeployment/qwen3-30b-paged InvalidSpec: refused",
                    "  13:25:03 Pod/p FailedScheduling: 0/12 nodes are available (x4)"]


def test_not_ready_report_keeps_the_last_events_and_says_when_there_is_nothing():
    events = [_event(f"2026-11-29T13:25:{s:02d}Z", "FailedScheduling", f"try {s}") for s in range(15)]
    lines = not_ready_report(PDD, events, limit=3)
    assert "recent Warning events (3 of 15):" in lines and lines[-1].endswith("try 14")
    loopback = _event("2026-11-29T13:26:00Z", "FailedToUpdateEndpointSlices", 'Error updating Endpoint Slices for '
                      'Service inference/d: ... Invalid value: "127.100.8.1": may not be in the loopback range '
                      '(127.0.0.0/8, ::1/128)', kind="Service", name="d")
    lines = not_ready_report(PDD, [*events[:2], loopback, loopback])
    assert "recent Warning events (2 of 2):" in lines and not any("127.100.8.1" in line for line in lines)
    assert "  (2 FailedToUpdateEndpointSlices events about loopback pod IPs left out: harmless on the dev cluster)" in lines
    bare = not_ready_report({"metadata": {"name": "x", "namespace": "n"}}, [])
    assert bare[1:] == ["  (none: the operator has not written status yet)", "no Warning events"]
    assert not_ready_report(None, [])[0] == "the PDDeployment does not exist"


def test_shell_exports_put_the_built_kubectl_first_and_the_demo_prints_them():
    cluster = Cluster(run_dir=Path("/r"), kubeconfig=Path("/r/kubeconfig"), bin_dir=Path("/cache/bin"),
                      server="https://127.0.0.1:1", pod_network="127.100.0.0/16")
    assert cluster.shell_exports() == ["export KUBECONFIG=/r/kubeconfig", "export PATH=/cache/bin:$PATH"]
    hints = "\n".join(running_hints(cluster, namespace="inference", operator_log=Path("/r/operator.log")))
    assert "export KUBECONFIG=/r/kubeconfig" in hints and "export PATH=/cache/bin:$PATH" in hints
    assert "/cache/bin/kubectl" in hints and "namespace inference and its model-store PVC exist" in hints
    assert "qwen3-30b-a3b-paged-experts.yaml" in hints and "/r/operator.log" in hints


class _ExitingOperator:
    """An OperatorProcess whose process exits (SIGTERM) after ``alive_for`` polls."""

    def __init__(self, alive_for: int, returncode: int):
        self.polls, self.alive_for = 0, alive_for
        self.proc = SimpleNamespace(pid=4242, returncode=returncode)
        self.log_path = Path("/r/operator.log")

    def alive(self) -> bool:
        self.polls += 1
        return self.polls <= self.alive_for


def test_the_demo_keeps_its_cluster_up_when_its_operator_exits_and_says_so():
    """README: a second `run` takes over when the leader goes away. Stopping the demo's operator
    (kill -TERM, to try that) must not end the demo and its cluster: the foreground wait says
    which pid exited and how, who holds the Lease, and goes on until Ctrl-C."""
    logged: list[str] = []
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) >= 10:  # the user presses Ctrl-C
            raise KeyboardInterrupt

    op = _ExitingOperator(alive_for=3, returncode=-signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        serve_until_interrupted(op, log=logged.append, lease_holder=lambda: "host-9876", sleep=sleep)
    assert len(sleeps) == 10, "the wait goes on after the operator exited, until Ctrl-C"
    (text,) = logged
    assert "error" not in text and "pid 4242" in text and "SIGTERM" in text, text
    assert "cluster stays up until Ctrl-C" in text and "does not restart" in text
    assert "Lease default/sglang-pd-operator is held by host-9876" in text


def test_operator_exited_lines_name_the_exit_code_and_a_free_lease():
    text = "\n".join(operator_exited_lines(pid=7, returncode=1, holder=None, log_path=Path("/r/operator.log")))
    assert "(pid 7) exited with code 1" in text and "/r/operator.log" in text
    assert "nobody holds the Lease default/sglang-pd-operator" in text
    assert "kubectl get lease sglang-pd-operator -n default" in text
