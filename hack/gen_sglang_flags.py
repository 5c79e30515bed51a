"""Write operator/planning/data/sglang-<version>-flags.json from the real SGLang parser.

Run in the contract environment (requirements/contract*.txt):
    python hack/gen_sglang_flags.py
The operator validates extraArgs against this snapshot; tests/contract/test_flag_snapshot.py
fails when the snapshot and the installed sglang disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[1] / "operator" / "planning" / "data"


def snapshot() -> dict:
    """{"version": ..., "flags": {option: {dest, takes_value, choices, multiple, config_file, type}}} of sglang's parser."""
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        takes_value = action.nargs != 0
        multiple = action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1)
        choices = sorted(str(c) for c in action.choices) if action.choices else None
        # Only switches (store_true) and one-value options can go into a --config YAML file
        # (sglang/srt/utils/server_args_config_parser.py); the rest stay on the command line.
        in_config = isinstance(action, argparse._StoreTrueAction) or (
            isinstance(action, argparse._StoreAction) and action.nargs is None
        )
        # the converters operator/planning/sglang_flags.py restates (tests/contract/test_flag_snapshot.py
        # holds each to SGLang's own); values of other types are left to the SGLang oracle
        name = getattr(action.type, "__name__", None)
        value_type = name if name in ("int", "float", "human_readable_int", "loads") else None
        for opt in action.option_strings:
            if opt.startswith("--"):
                flags[opt] = {
                    "dest": action.dest,
                    "takes_value": takes_value,
                    "choices": choices,
                    "multiple": multiple,
                    "config_file": in_config,
                    "type": value_type,
                }
    return {"version": sglang.__version__, "flags": dict(sorted(flags.items()))}


def main() -> int:
    data = snapshot()
    out = OUT_DIR / f"sglang-{data['version']}-flags.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(data['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
