"""The checked-in SGLang flag snapshot is the pinned parser's, and the operator validates like it.

``operator/planning/data/sglang-0.5.23-flags.json`` (written by hack/gen_sglang_flags.py)
is how the operator validates ``extraArgs`` without SGLang installed. It must equal what
``snapshot()`` computes from the installed sglang==0.5.23; and the operator's
``validate_args`` must accept and refuse what the real parser accepts and refuses for
unknown flags, missing values and bad choices.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sglang_real as real  # noqa: E402

from sglang_pd_operator.planning.engine_args import MANAGED_FLAGS  # noqa: E402
from sglang_pd_operator.planning.sglang_flags import SNAPSHOT, flag_table, validate_args  # noqa: E402

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]
TABLE = flag_table()
CHOICE_FLAGS = sorted(f for f, i in TABLE.items() if i.choices and i.takes_value and not i.multiple)
SWITCHES = sorted(f for f, i in TABLE.items() if not i.takes_value and f not in ("--help", "--version"))


def _generator():
    spec = importlib.util.spec_from_file_location("gen_sglang_flags", ROOT / "hack" / "gen_sglang_flags.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_snapshot_equals_installed_parser():
    real.parse_engine_args(["--model-path", real.DUMMY_MODEL_PATH])  # skips unless sglang 0.5.23 is importable
    fresh = _generator().snapshot()
    stored = json.loads(SNAPSHOT.read_text())
    assert fresh["version"] == stored["version"] == real.SGLANG_VERSION
    assert sorted(fresh["flags"]) == sorted(stored["flags"]), "option strings differ: rerun hack/gen_sglang_flags.py"
    assert fresh["flags"] == stored["flags"]
    assert SNAPSHOT.name == f"sglang-{real.SGLANG_VERSION}-flags.json"


def test_every_managed_flag_is_an_exact_option_or_an_abbreviation_sglang_accepts():
    """The operator refuses these in extraArgs; each is something SGLang would act on."""
    for flag in MANAGED_FLAGS:
        if flag in TABLE:
            continue
        # argparse prefix matching: SGLang accepts the abbreviation as one unique option.
        matches = [o for o in TABLE if o.startswith(flag)]
        assert matches, f"{flag} is neither an option nor an abbreviation of one"
        sa = real.parse_engine_args(["--model-path", real.DUMMY_MODEL_PATH, flag, "2"])
        dests = {TABLE[o].dest for o in matches}
        assert any(getattr(sa, d) == 2 for d in dests), flag


@settings(max_examples=120, deadline=None)
@given(flag=st.sampled_from(CHOICE_FLAGS), data=st.data())
def test_choices_are_validated_like_sglang(flag, data):
    info = TABLE[flag]
    value = data.draw(st.one_of(st.sampled_from(info.choices), st.sampled_from(["zzz", "AUTO", ""])))
    args = ["--model-path", real.DUMMY_MODEL_PATH, flag, value]
    ours = validate_args(args)
    try:
        real.parse_engine_args(args)
        accepted = True
    except real.EngineArgsError as e:
        accepted = False
        assert "invalid" in str(e) or "expected one argument" in str(e)
    if value == "":
        return  # argparse treats "" as a value; the operator also does: nothing more to compare
    assert (ours == []) == accepted, (args, ours)


@settings(max_examples=80, deadline=None)
@given(flag=st.sampled_from(SWITCHES), suffix=st.sampled_from(["", "-x", "zz"]))
def test_unknown_flags_are_refused_like_sglang(flag, suffix):
    name = flag + suffix
    args = ["--model-path", real.DUMMY_MODEL_PATH, name]
    ours = validate_args(args)
    try:
        real.parse_engine_args(args)
        accepted = True
    except real.EngineArgsError:
        accepted = False
    if name in TABLE:
        assert ours == [] and accepted
    elif not accepted:
        assert ours and "is not a flag of SGLang 0.5.23" in ours[0].message
    else:
        # argparse accepted a non-option by prefix abbreviation; the operator insists on exact names.
        assert ours and any(o.startswith(name) for o in TABLE)


def test_value_flags_without_a_value_are_refused_like_sglang():
    for flag in ("--mem-fraction-static", "--chunked-prefill-size", "--hicache-storage-backend"):
        args = ["--model-path", real.DUMMY_MODEL_PATH, flag]
        assert validate_args(args) and "needs a value" in validate_args(args)[0].message
        with pytest.raises(real.EngineArgsError, match="expected one argument"):
            real.parse_engine_args(args)


TYPED_VALUES = ["131072", "128k", "25.6k", "1Ki", "1.5Ki", "2Mi", " 64k ", "abc", "1e3", "-5", "12kb", "0x10", "",
                "1.0", "3.5", "[1, 2]", '{"a": 1}', "null", "{a: 1}", "true"]


@pytest.mark.parametrize("flag", sorted(f for f, i in TABLE.items() if i.value_type in ("human_readable_int", "loads")))
@pytest.mark.parametrize("value", TYPED_VALUES)
def test_typed_values_are_refused_like_sglang(flag, value):
    """The converters the operator restates (``human_readable_int``, json ``loads``) accept and
    refuse exactly what SGLang's own parser does (a fresh-user report: ``--context-length abc``
    passed ``check``, and only ``check --sglang`` refused it)."""
    ours = validate_args([flag, value])
    try:
        real.parse_engine_args(["--model-path", real.DUMMY_MODEL_PATH, flag, value])
        theirs = None
    except real.EngineArgsError as e:
        theirs = str(e)
    assert (not ours) == (theirs is None), (flag, value, ours, theirs)
