"""SLO-derived histogram buckets (planning/buckets.py) and the percentile error they bound.

The operator renders SGLang's ``--bucket-*`` flags so that every ``spec.slo`` target is a
bucket boundary with a finer grid around it. Shown here, on histograms built from raw
samples with exactly the rendered boundaries and read back by the operator's own
``histogram_quantile``:

- the met/missed verdict equals the verdict on the true order statistic (no flip from
  interpolation), for every draw;
- the error is at most the width of the bucket holding the true value, i.e. at most
  ``relative_grid_bound(x / t) * t``: 10% of the target for ``x`` within (0.9 t, 1.1 t],
  15% within (0.75 t, 1.25 t], 25% within (0.5 t, 1.5 t], 50% up to 2 t;
- with SGLang's default buckets the same draws can be off by a quarter of an 800 ms
  target and flip the verdict.
"""

from __future__ import annotations

import bisect
import copy
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_pd_operator.api.load import parse_pddeployment
from sglang_pd_operator.api.v1alpha1 import SLOSpec
from sglang_pd_operator.catalog import builtin_catalog
from sglang_pd_operator.metrics import exposition as ex
from sglang_pd_operator.metrics.histogram import Histogram, bucket_width_at
from sglang_pd_operator.planning import buckets as B
from sglang_pd_operator.planning.engine_args import MANAGED_FLAGS
from sglang_pd_operator.planning.plan import build_plan
from sglang_pd_operator.planning.sglang_flags import flag_table
from helpers import load_example

CATALOG = builtin_catalog()


def histogram(samples: list[float], bounds) -> Histogram:
    """The cumulative histogram prometheus_client would expose for ``samples`` (le inclusive)."""
    finite = sorted(bounds)
    counts = [0] * (len(finite) + 1)
    for x in samples:
        counts[bisect.bisect_left(finite, x)] += 1
    cumulative, total = [], 0
    for c in counts:
        total += c
        cumulative.append(float(total))
    return Histogram(bounds=(*finite, math.inf), counts=tuple(cumulative), count=float(len(samples)))


def exact_quantile(samples: list[float], q: float) -> float:
    xs = sorted(samples)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def test_defaults_are_sglangs_and_the_exposition_agrees():
    assert B.SGLANG_DEFAULTS[B.TTFT_FLAG] == ex.SGLANG_BUCKETS[ex.TTFT]
    assert B.SGLANG_DEFAULTS[B.ITL_FLAG] == ex.SGLANG_BUCKETS[ex.ITL] == ex.SGLANG_BUCKETS[ex.TPOT]
    assert B.SGLANG_DEFAULTS[B.E2E_FLAG] == ex.SGLANG_BUCKETS[ex.E2E]


def test_every_target_is_a_boundary_with_the_grid_around_it():
    slo = SLOSpec(ttft={"p50": "300ms", "p90": "800ms", "p99": "2s"}, itl={"p90": "15ms"}, e2e={"p99": "45s"},
                  perUserSpeed={"p90": 30})
    got = B.slo_buckets(slo)
    assert set(got) == {B.TTFT_FLAG, B.ITL_FLAG, B.E2E_FLAG}
    for flag, bounds in got.items():
        assert list(bounds) == sorted(set(bounds)) and all(b > 0 for b in bounds)
        assert set(B.SGLANG_DEFAULTS[flag]) <= set(bounds), "SGLang's defaults are kept"
        for t in B.target_boundaries(slo, flag):
            assert t in bounds, (flag, t)
            for g in B.GRID:
                assert any(abs(b - t * g) <= 1e-5 * t * g for b in bounds), (flag, t, g)
    assert 1 / 30 in got[B.ITL_FLAG], "a speed target S is the TPOT boundary 1/S (ITL flag sets TPOT buckets)"
    assert {0.3, 0.8, 2.0} <= set(got[B.TTFT_FLAG]) and 45.0 in got[B.E2E_FLAG]


def test_flags_only_for_targeted_histograms_and_only_on_decode():
    assert B.slo_buckets(None) == {} and B.bucket_args(None, "decode") == []
    only_ttft = SLOSpec(ttft={"p90": "800ms"})
    assert set(B.slo_buckets(only_ttft)) == {B.TTFT_FLAG}
    args = B.bucket_args(only_ttft, "decode")
    assert args[0] == B.TTFT_FLAG and "0.8" in args and "--bucket-inter-token-latency" not in args
    assert [float(v) for v in args[1:]] == list(B.slo_buckets(only_ttft)[B.TTFT_FLAG])
    assert B.bucket_args(only_ttft, "prefill") == []
    assert B.slo_buckets(SLOSpec(window="10m")) == {}, "no target, no flag: SGLang's defaults stay"


def test_flags_exist_in_sglangs_parser_as_float_lists():
    table = flag_table()
    for flag in B.BUCKET_FLAGS:
        info = table[flag]
        assert info.multiple and info.takes_value and info.value_type == "float", flag
        assert not info.config_file, "nargs=+ flags stay on the command line (render.engine.split_config)"


def test_the_gb300_example_renders_its_targets_on_decode_and_keeps_the_key():
    doc = load_example()
    plan = build_plan(parse_pddeployment(copy.deepcopy(doc)), CATALOG)
    assert plan.valid, [p.line() for p in plan.problems]
    dec, pre = list(plan.decode.command.args), list(plan.prefill.command.args)
    assert not any(a.startswith("--bucket-") for a in pre)
    ttft = dec[dec.index(B.TTFT_FLAG) + 1: dec.index(B.ITL_FLAG)]
    assert "0.8" in ttft and "0.72" in ttft and "0.88" in ttft
    other = copy.deepcopy(doc)
    other["spec"]["slo"] = {"ttft": {"p90": "500ms"}, "itl": {"p99": "25ms"}}
    plan2 = build_plan(parse_pddeployment(other), CATALOG)
    assert plan2.decode.command.args != plan.decode.command.args
    assert plan2.compat_key == plan.compat_key, "buckets are not a PD handshake input"
    assert plan2.prefill.command.args == plan.prefill.command.args, "an SLO edit does not restart prefill"


def test_bucket_flags_are_refused_in_extra_args():
    for flag in B.BUCKET_FLAGS:
        assert MANAGED_FLAGS[flag] == "spec.slo"
    doc = load_example()
    doc["spec"]["decode"]["extraArgs"] = ["--bucket-time-to-first-token", "0.5", "1"]
    plan = build_plan(parse_pddeployment(doc), CATALOG)
    problems = [p for p in plan.problems if p.rule == "extra_args_not_managed"]
    assert [p.field for p in problems] == ["spec.decode.extraArgs[0]"]
    assert "spec.slo" in problems[0].fix


def test_grid_bound_table():
    assert B.relative_grid_bound(1.0) == pytest.approx(0.1)       # (0.9, 1.0]
    assert B.relative_grid_bound(1.05) == pytest.approx(0.1)      # (1.0, 1.1]
    assert B.relative_grid_bound(0.8) == pytest.approx(0.15)      # (0.75, 0.9]
    assert B.relative_grid_bound(1.2) == pytest.approx(0.15)      # (1.1, 1.25]
    assert B.relative_grid_bound(0.6) == pytest.approx(0.25)
    assert B.relative_grid_bound(1.75) == pytest.approx(0.5)
    assert B.relative_grid_bound(0.3) is None and B.relative_grid_bound(3.0) is None


@settings(max_examples=200, deadline=None)
@given(target_ms=st.sampled_from([15, 40, 120, 300, 800, 1500, 5000]),
       centre=st.floats(0.55, 1.8), sigma=st.floats(0.05, 0.8), n=st.integers(40, 600),
       q=st.sampled_from([0.5, 0.9, 0.99]), seed=st.integers(0, 2**16))
def test_percentile_error_near_the_target_is_bounded(target_ms, centre, sigma, n, q, seed):
    t = target_ms / 1000
    flag = B.ITL_FLAG if target_ms < 100 else B.TTFT_FLAG
    bounds = B.merge_boundaries(B.SGLANG_DEFAULTS[flag], [t])
    rng = random.Random(seed)
    samples = [rng.lognormvariate(math.log(centre * t), sigma) for _ in range(n)]
    x = exact_quantile(samples, q)
    est = histogram(samples, bounds).quantile(q)
    width = bucket_width_at(x, (*bounds, math.inf))
    assert abs(est - x) <= width + 1e-12
    assert (est <= t) == (x <= t), "the verdict equals the verdict on the true order statistic"
    grid = B.relative_grid_bound(x / t)
    if grid is not None:
        assert width <= grid * t * (1 + 1e-5), (x / t, width / t, grid)
        assert abs(est - x) <= grid * t * (1 + 1e-5)


def test_default_buckets_are_what_the_grid_fixes():
    """TTFT p90 target 800 ms, true p90 ~760 ms: SGLang's (0.6, 0.8] bucket is 25% of the target
    wide; the rendered (0.72, 0.8] bucket 10%."""
    t = 0.8
    rng = random.Random(3)
    samples = [rng.lognormvariate(math.log(0.55), 0.25) for _ in range(2000)]
    x = exact_quantile(samples, 0.9)
    assert 0.72 < x <= 0.8
    default_w = bucket_width_at(x, (*B.SGLANG_DEFAULTS[B.TTFT_FLAG], math.inf))
    rendered = B.merge_boundaries(B.SGLANG_DEFAULTS[B.TTFT_FLAG], [t])
    rendered_w = bucket_width_at(x, (*rendered, math.inf))
    assert default_w == pytest.approx(0.2) and rendered_w == pytest.approx(0.08)
    est = histogram(samples, rendered).quantile(0.9)
    assert abs(est - x) <= 0.08


def test_format_boundary_round_trips():
    for v in (0.1, 0.72, 1 / 30, 2.0, 1200.0, 0.0166667):
        assert float(B.format_boundary(v)) == v
    assert B.format_boundary(2.0) == "2" and B.format_boundary(0.8) == "0.8"


def test_a_millisecond_target_renders_as_the_user_wrote_it():
    # "700ms" was 700 * 0.001 = 0.7000000000000001 and the flag read --bucket-time-to-first-token ... 0.7000000000000001
    args = B.bucket_args(SLOSpec(ttft={"p90": "700ms"}, itl={"p99": "30ms"}), "decode")
    assert "0.7" in args and "0.03" in args
    assert not [a for a in args if not a.startswith("--") and len(a) > 10], args
