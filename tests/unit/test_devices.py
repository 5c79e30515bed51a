"""CUDA's CUDA_VISIBLE_DEVICES semantics as planning/devices.py restates them (the oracle and the rule share it;
tests/contract/test_oracle.py holds the rule to SGLang's own placement under the emulated driver)."""

from __future__ import annotations

import pytest

from sglang_pd_operator.planning.devices import visible_count, visible_gpus


@pytest.mark.parametrize("value, count, seen", [
    ("0,1,2,3", 4, 4),
    ("3,2,1,0", 4, 4),      # order does not hide anything
    ("0,1", 4, 2),
    ("0,2,-1,1", 4, 2),     # CUDA's own example: devices before the first invalid index
    ("0,1,2,3,7", 4, 4),    # past the end: the ones before it
    ("0,0,1", 4, 1),        # a repeat ends the list
    ("", 4, 0),             # empty: none
    ("GPU-8932f937", 4, 0),  # a UUID cannot name a GPU the device plugin picks at scheduling time
    (" 1 , 0 ", 4, 2),
])
def test_visible_count_follows_cudas_rules(value, count, seen):
    assert visible_count(value, count) == seen


def test_each_vendor_reads_its_own_variables():
    env = {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert visible_gpus(4, env, "nvidia") == 2   # HIP's variable means nothing to CUDA
    assert visible_gpus(4, env, "amd") == 1      # HIP narrows to 1, then CUDA_VISIBLE_DEVICES over those
    assert visible_gpus(8, {}, "amd") == 8
