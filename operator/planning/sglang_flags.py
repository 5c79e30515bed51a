"""The launch flags of the pinned SGLang release, for validating ``extraArgs`` without SGLang installed.

``data/sglang-0.5.23-flags.json`` is a snapshot of the real argument parser of
sglang==0.5.23 (option strings, whether each takes a value, its choices), written by
``hack/gen_sglang_flags.py`` from ``sglang.srt.server_args``; the contract test
``tests/contract/test_flag_snapshot.py`` fails when it differs from the installed parser.
The operator image does not carry SGLang, so this file is how the operator validates
``extraArgs`` "against the pinned SGLang parser".
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "data" / "sglang-0.5.23-flags.json"


@dataclass(frozen=True)
class FlagInfo:
    """One option of SGLang's parser.

    ``dest``: the ServerArgs field; ``takes_value``: False for switches; ``choices``;
    ``multiple``: nargs + or *; ``config_file``: expressible in a ``--config`` YAML file
    (switches and one-value options; server_args_config_parser.py refuses the rest);
    ``value_type``: the converter argparse applies (``int``, ``float``, ``human_readable_int``, ``loads``) when the
    operator restates it, else None (a value of another type is left to the SGLang oracle).
    """

    dest: str
    takes_value: bool
    choices: tuple[str, ...] | None
    multiple: bool = False
    config_file: bool = True
    value_type: str | None = None


@lru_cache(maxsize=1)
def flag_table() -> dict[str, FlagInfo]:
    """Option string (``--page-size``) -> :class:`FlagInfo`, from the snapshot."""
    data = json.loads(SNAPSHOT.read_text())
    return {
        opt: FlagInfo(
            dest=v["dest"],
            takes_value=v["takes_value"],
            choices=tuple(v["choices"]) if v["choices"] else None,
            multiple=v.get("multiple", False),
            config_file=v.get("config_file", True),
            value_type=v.get("type"),
        )
        for opt, v in data["flags"].items()
    }


def suggest(flag: str) -> list[str]:
    """Up to three known flags closest to ``flag`` (for "did you mean")."""
    return difflib.get_close_matches(flag, list(flag_table()), n=3, cutoff=0.75)


@dataclass(frozen=True)
class ArgError:
    """A problem with one token of an argument list: its index and what is wrong."""

    index: int
    message: str


#: ``human_readable_int`` (sglang/srt/server_args.py): an integer, or a number with an SI suffix
#: (k, M, G, T; decimals allowed) or an IEC suffix (Ki, Mi, Gi, Ti; integers only).
_HUMAN_READABLE_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def _converts(value: str, value_type: str) -> bool:
    """argparse's conversion of ``value`` with the flag's type succeeds: ``int``, ``float``,
    ``human_readable_int`` (``--context-length 128k``) or ``loads`` (json.loads), as the
    snapshot names them; tests/contract/test_flag_snapshot.py holds each to SGLang's own."""
    try:
        if value_type == "human_readable_int":
            match = _HUMAN_READABLE_INT.fullmatch(value.strip())
            if match:
                return not (match.group(2).endswith("i") and "." in match.group(1))
            int(value.strip())
        elif value_type == "loads":
            json.loads(value)
        else:
            (int if value_type == "int" else float)(value)
    except ValueError:
        return False
    return True


#: How a refusal names a value type.
_TYPE_WORDS = {"human_readable_int": "integer (e.g. 131072, 128k or 128Ki)", "loads": "JSON value"}


def validate_args(args: list[str] | tuple[str, ...]) -> list[ArgError]:
    """Check an argument list against SGLang's parser: unknown flags, missing values, bad choices.

    Returns every error (empty when argparse would accept the list). Positional tokens
    are refused: SGLang's launch_server takes none.
    """
    table = flag_table()
    out: list[ArgError] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            out.append(ArgError(i, f"{tok!r} is not a flag (SGLang takes no positional arguments)"))
            i += 1
            continue
        name, eq, inline = tok.partition("=")
        info = table.get(name)
        if info is None:
            hint = suggest(name)
            more = f"; did you mean {' or '.join(hint)}" if hint else ""  # no "?": the line goes on ". Fix: ..."
            out.append(ArgError(i, f"{name} is not a flag of SGLang 0.5.23{more}"))
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                i += 1  # its values: one problem per unknown flag
            continue
        if not info.takes_value:
            if eq:
                out.append(ArgError(i, f"{name} is a switch and takes no value"))
            i += 1
            continue
        if eq:
            value = inline
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            i += 1
        else:
            out.append(ArgError(i, f"{name} needs a value"))
            i += 1
            continue
        if info.choices and value not in info.choices:
            out.append(ArgError(i, f"{name} {value!r} is not one of {', '.join(info.choices)}"))
        elif info.value_type is not None and not _converts(value, info.value_type):
            out.append(ArgError(i, f"{name} {value!r} is not a valid {_TYPE_WORDS.get(info.value_type, info.value_type)}"))
        i += 1
        while info.multiple and not eq and i < len(args) and not args[i].startswith("--"):
            i += 1
    return out
