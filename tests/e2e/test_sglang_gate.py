"""SGLang's verdict in the cluster (issue 24): the real API server, the real ``oracle serve``, the operator.

- A spec ``check`` accepts and SGLang refuses (LoRA on decode without a rank) is never
  given a pod: ``kubectl get pdd`` shows Valid ``SGLangRefused``, ``describe`` SGLang's
  message and a Warning event; the fixed next generation rolls out to Ready. Time from
  apply to Valid is printed (the first spec on a warm service, then a cached one).
- The oracle killed mid-judgement (a cold accelerator, so a judgement is in flight):
  ``oracle.onUnavailable: wait`` holds with Valid Unknown, then False
  ``SGLangUnavailable`` after ``maxWait``, no pod; ``rulesOnly`` goes on with Valid True
  ``RulesOnly`` and a Warning; a restarted oracle's verdict releases the held one.
- 50 PDDeployments applied at once (5 distinct specs) are judged through the cache and the
  queue; time to Valid p50/p99 and the service's figures are printed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from helpers import load_example, with_fields
from opkit import condition, kapply, kget, operator_process, pods, wait_for

from sglang_pd_operator_dev.cluster.demo import OracleProcess, operator_command, oracle_unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LBL = "pd.sglang-operator.io/deployment"
#: Accepted by the operator's rules, refused by SGLang's lora_hook at startup (tests/contract/test_oracle_service.py).
SGLANG_ONLY_REFUSAL = ["--enable-lora"]
SGLANG_MESSAGE = "--max-lora-rank and --lora-target-modules"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    why = oracle_unavailable()
    if why is not None:
        pytest.fail(f"the SGLang oracle service cannot run here: {why} (hack/setup.sh --contract)")
    proc = OracleProcess(log_path=tmp_path_factory.mktemp("oracle") / "oracle.log", warm=("gb300",)).start()
    proc.ready_s = proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def operator(cluster, crds, oracle, tmp_path_factory):
    yield from operator_process(cluster, tmp_path_factory.mktemp("operator"),
                                extra_args=["--oracle-url", oracle.url, "--oracle-max-wait", "5m"])


def _spec(ns: str, name: str, **changes) -> dict:
    doc = load_example()
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"]["decode"]["replicas"] = 1
    doc["spec"]["gateway"]["replicas"] = 1
    return with_fields(doc, changes)


def _valid(cluster, ns: str, name: str, reason: str | None = None):
    """The Valid condition of the current generation (with ``reason`` when given), else None."""
    obj = kget(cluster, "pddeployment", name, "-n", ns)
    c = condition(obj, "Valid")
    if c is None or c.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return c if reason is None or c.get("reason") == reason else None


def _check(doc: dict, tmp_path: Path) -> int:
    path = tmp_path / f"{doc['metadata']['name']}.yaml"
    path.write_text(json.dumps(doc))
    return subprocess.run([*operator_command(), "check", str(path)], capture_output=True, cwd="/").returncode


def test_refused_by_sglang_before_any_pod_then_the_fixed_generation_rolls_out(cluster, ns, oracle, operator, tmp_path):
    print(f"\noracle ready {oracle.ready_s:.1f}s after start (warm gb300)")
    bad = _spec(ns, "held", **{"decode.extraArgs": SGLANG_ONLY_REFUSAL})
    assert _check(bad, tmp_path) == 0, "the operator's own rules accept the spec (else this proves nothing)"
    t0 = time.monotonic()
    kapply(cluster, bad)
    refused = wait_for(lambda: _valid(cluster, ns, "held", "SGLangRefused"), timeout=120, what="SGLangRefused")
    print(f"apply -> Valid=False SGLangRefused: {time.monotonic() - t0:.2f}s (first spec on the warm service)")
    assert refused["status"] == "False"
    assert "decode role" in refused["message"] and SGLANG_MESSAGE in refused["message"]
    obj = kget(cluster, "pddeployment", "held", "-n", ns)
    assert [p["rule"] for p in obj["status"]["problems"] if p["severity"] == "error"][0].startswith("sglang:")
    assert obj["status"]["sglang"]["verdict"] == "Refused"
    # before any pod exists, and none ever does while it is refused
    assert pods(cluster, ns, f"{LBL}=held") == []
    assert kget(cluster, "deployments", "-n", ns, "-l", f"{LBL}=held")["items"] == []
    table = cluster.kubectl("get", "pdd", "held", "-n", ns).stdout
    assert "SGLangRefused" in table, table
    described = cluster.kubectl("describe", "pdd", "held", "-n", ns).stdout
    assert SGLANG_MESSAGE in described and "SGLangRefused" in described
    events = kget(cluster, "events", "-n", ns, "--field-selector", "involvedObject.name=held")["items"]
    assert any(e["reason"] == "SGLangRefused" and e["type"] == "Warning" for e in events)
    print(table.rstrip())

    # the fixed generation: SGLang accepts, the deployment rolls out
    t0 = time.monotonic()
    kapply(cluster, _spec(ns, "held"))
    accepted = wait_for(lambda: _valid(cluster, ns, "held", "SGLangAccepted"), timeout=120, what="SGLangAccepted")
    print(f"apply -> Valid=True SGLangAccepted: {time.monotonic() - t0:.2f}s (new inputs, warm worker)")
    assert "the PD handshake passes" in accepted["message"]
    wait_for(lambda: (condition(kget(cluster, "pddeployment", "held", "-n", ns), "Ready") or {}).get("status") == "True",
             timeout=180, what="Ready")
    assert pods(cluster, ns, f"{LBL}=held")

    # another deployment with the same spec: the verdict for these inputs is known (the operator's
    # book, else the service's cache); SGLang judges nothing again
    judged = oracle.stats()["judged"]
    t0 = time.monotonic()
    kapply(cluster, _spec(ns, "twin"))
    wait_for(lambda: _valid(cluster, ns, "twin", "SGLangAccepted"), timeout=60, what="twin accepted")
    print(f"apply -> Valid=True SGLangAccepted: {time.monotonic() - t0:.2f}s (same inputs: cached verdict)")
    assert oracle.stats()["judged"] == judged


def test_the_oracle_killed_mid_judgement_gives_the_policys_behaviour(cluster, ns, oracle, operator):
    # h200 is not warm: its judgement starts a worker (seconds), and the oracle dies meanwhile
    waiting = with_fields(load_example(EXAMPLES / "dsv41-flash-h200-flashmla.yaml"),
                          {"oracle": {"onUnavailable": "wait", "maxWait": "20s"}, "decode.replicas": 1})
    waiting["metadata"] = {"name": "waits", "namespace": ns}
    try:
        judged = oracle.stats()["judged"]
        kapply(cluster, waiting)
        wait_for(lambda: _valid(cluster, ns, "waits", "AwaitingSGLangVerdict"), timeout=60, what="awaiting")
        # mid-judgement: the service holds the h200 judgement in flight and has finished none since the apply
        busy = wait_for(lambda: (st := oracle.stats())["inflight"] >= 1 and st, timeout=30, interval=0.1,
                        what="the h200 judgement in flight")
        oracle.kill()
        assert busy["judged"] == judged, busy
        unknown = wait_for(lambda: (c := _valid(cluster, ns, "waits", "AwaitingSGLangVerdict"))
                           and "unreachable" in c["message"] and c, timeout=60, what="unreachable")
        assert unknown["status"] == "Unknown"
        gone = wait_for(lambda: _valid(cluster, ns, "waits", "SGLangUnavailable"), timeout=60, what="SGLangUnavailable")
        assert gone["status"] == "False" and "onUnavailable=wait" in gone["message"]
        assert pods(cluster, ns, f"{LBL}=waits") == []

        lenient = _spec(ns, "lenient", oracle={"onUnavailable": "rulesOnly", "maxWait": "5s"},
                        **{"decode.extraArgs": ["--chunked-prefill-size", "2048"]})
        kapply(cluster, lenient)
        rules = wait_for(lambda: _valid(cluster, ns, "lenient", "RulesOnly"), timeout=60, what="RulesOnly")
        assert rules["status"] == "True" and "rules alone" in rules["message"]
        wait_for(lambda: pods(cluster, ns, f"{LBL}=lenient"), timeout=60, what="lenient pods")
        events = kget(cluster, "events", "-n", ns, "--field-selector", "involvedObject.name=lenient")["items"]
        assert any(e["reason"] == "RulesOnly" and e["type"] == "Warning" for e in events)
        assert pods(cluster, ns, f"{LBL}=waits") == []
    finally:
        # the oracle comes back on the same port: the held generation gets its verdict and rolls out
        oracle.warm = ("gb300", "h200")
        oracle.start()
        oracle.wait_ready()
    wait_for(lambda: _valid(cluster, ns, "waits", "SGLangAccepted"), timeout=120, what="accepted after the restart")
    wait_for(lambda: pods(cluster, ns, f"{LBL}=waits"), timeout=60, what="pods after the verdict")


def test_fifty_deployments_at_once_are_judged_through_the_cache_and_the_queue(cluster, ns, oracle, operator, tmp_path):
    before = oracle.stats()
    docs = []
    for i in range(50):
        doc = _spec(ns, f"many-{i:02d}", **{"decode.extraArgs": ["--chunked-prefill-size", str(4096 * (1 + i % 5))],
                                            "decode.replicas": 0, "prefill.replicas": 0, "gateway.replicas": 0})
        docs.append(doc)
    path = tmp_path / "many.yaml"
    path.write_text("\n---\n".join(json.dumps(d) for d in docs))
    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", str(path))
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(seen) < 50 and time.monotonic() < deadline:
        items = kget(cluster, "pddeployments", "-n", ns)["items"]
        now = time.monotonic() - t0
        for obj in items:
            c = condition(obj, "Valid")
            if (c and c.get("reason") == "SGLangAccepted" and c.get("observedGeneration") == obj["metadata"]["generation"]
                    and obj["metadata"]["name"] not in seen):
                seen[obj["metadata"]["name"]] = now
        time.sleep(0.5)
    assert len(seen) == 50, f"only {len(seen)} of 50 got SGLang's verdict"
    times = sorted(seen.values())
    after = oracle.stats()
    p50 = statistics.median(times)
    p99 = times[min(len(times) - 1, int(round(0.99 * len(times))) - 1)]
    judged = after["judged"] - before["judged"]
    hits = after["cacheHits"] - before["cacheHits"]
    coalesced = after["coalesced"] - before["coalesced"]
    asked = after["requests"] - before["requests"]
    print(f"\n50 PDDeployments (5 distinct specs): apply -> Valid p50 {p50:.1f}s, p99 {p99:.1f}s, last {times[-1]:.1f}s; "
          f"the operator asked {asked} times; oracle judged {judged}, cache hits {hits}, coalesced {coalesced}, "
          f"queue full {after['rejectedQueueFull'] - before['rejectedQueueFull']}")
    assert judged <= 5, "each distinct spec is judged once"
    # the operator's book answers the other 45 from its own cache (one ask per distinct judged key,
    # plus a re-ask of a key whose answer was a failure); every ask was judged, served from the
    # service's cache or coalesced with one in flight
    assert 5 <= asked <= 10, asked
    ends = ("cacheHits", "coalesced", "judged", "oracleErrors", "expiredInQueue", "rejectedQueueFull")
    assert asked == sum(after[k] - before[k] for k in ends), (asked, before, after)
