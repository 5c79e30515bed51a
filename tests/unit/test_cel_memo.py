"""The CEL verdicts of a subtree are remembered by content (api/cel.py), and only by content."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from sglang_pd_operator.api import cel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-paged-experts.yaml"


def _doc(name: str) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": "team-a"}
    return doc


def _fresh(monkeypatch) -> list[tuple]:
    """An empty memo, and a log of every subtree evaluated (a miss) from now on."""
    monkeypatch.setattr(cel, "_subtree_memo", type(cel._subtree_memo)())
    misses: list[tuple] = []
    walk = cel._walk

    def counting_walk(schema, obj, path):
        if path and "." not in path and "[" not in path:  # a top-level subtree's walk: a miss
            misses.append((path, id(obj)))
        return walk(schema, obj, path)

    monkeypatch.setattr(cel, "_walk", counting_walk)
    return misses


def test_the_same_spec_under_another_name_is_judged_once_and_the_name_rules_every_time(monkeypatch):
    misses = _fresh(monkeypatch)
    assert cel.violations(_doc("alpha")) == []
    first = len(misses)
    assert first >= 1  # spec (and metadata) were walked
    long_name = cel.violations(_doc("n" * 41))  # the root rule reads the name: evaluated again, and refuses
    assert [v.field for v in long_name] == ["metadata.name"]
    assert len(misses) == first + 1  # metadata (another name) walked; spec remembered


def test_a_changed_spec_is_judged_again(monkeypatch):
    misses = _fresh(monkeypatch)
    doc = _doc("alpha")
    assert cel.violations(doc) == []
    bad = copy.deepcopy(doc)
    bad["spec"]["slo"]["window"] = "5s"  # below the rule's 10s
    found = cel.violations(bad)
    assert any(v.field == "spec.slo.window" for v in found), found
    assert cel.violations(doc) == []  # the first spec's verdict still holds
    assert cel.violations(bad) == found  # and the second's is remembered as it was


def test_the_memo_keeps_at_most_its_size(monkeypatch):
    _fresh(monkeypatch)
    monkeypatch.setattr(cel, "SUBTREE_MEMO_SIZE", 3)
    for i in range(6):
        doc = _doc("alpha")
        doc["spec"]["model"]["servedModelName"] = f"model-{i}"
        cel.violations(doc)
    assert len(cel._subtree_memo) == 3


def test_a_value_json_cannot_carry_is_judged_without_the_memo(monkeypatch):
    import datetime

    _fresh(monkeypatch)
    doc = _doc("alpha")
    doc["spec"]["model"]["servedModelName"] = datetime.date(2026, 12, 7)  # a YAML date
    cel.violations(doc)
    assert not any(k[1] == "spec" for k in cel._subtree_memo)
