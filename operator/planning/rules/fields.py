"""Where a rule's problem points, and how SGLang reads a boolean variable (shared by the rules).

``flag_field`` names the ``extraArgs`` item that sets a flag (any alias, SGLang's dest),
``env_field`` the ``env`` item of a variable, so a problem's field path takes the user to
the offending token. ``env_true`` reads an ``EnvBool`` the way sglang/srt/environ.py does.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..sglang_flags import flag_table
from ..structs import RolePlan


def flag_field(role: RolePlan, dest: str) -> str:
    """``spec.<role>.extraArgs[i]`` of the last token setting ``dest`` (any alias), else the list."""
    table = flag_table()
    found = None
    for i, tok in enumerate(role.inputs.spec.extraArgs):
        if not tok.startswith("--"):
            continue
        name = tok[2:].partition("=")[0]
        info = table.get("--" + name)
        if (info.dest if info is not None else name.replace("-", "_")) == dest:
            found = i
    where = f"spec.{role.role}.extraArgs"
    return where if found is None else f"{where}[{found}]"


def env_field(role: RolePlan, name: str) -> str:
    """``spec.<role>.env[i]`` of the last entry named ``name``, else the list."""
    found = [i for i, var in enumerate(role.inputs.spec.env) if var.name == name]
    return f"spec.{role.role}.env[{found[-1]}]" if found else f"spec.{role.role}.env"


def env_true(role: RolePlan, name: str) -> bool:
    """``envs.<name>.get()`` of an EnvBool (environ.py): true, 1, yes, y in any case; anything else is false."""
    value = role.command.env_dict().get(name)
    return value is not None and value.lower() in ("true", "1", "yes", "y")


def env_value(role: RolePlan, name: str, parse: Callable[[str], Any], default: Any) -> Any:
    """``envs.<name>.get()`` of an EnvInt / EnvFloat as sglang/srt/environ.py ``EnvField.get``
    reads it: ``default`` when unset, ``parse(value)`` when set, and ``default`` again when
    ``parse`` raises ``ValueError`` (SGLang warns and falls back). ``parse`` is ``int`` or ``float``."""
    value = role.command.env_dict().get(name)
    if value is None:
        return default
    try:
        return parse(value)
    except ValueError:
        return default


def env_bool(role: RolePlan, name: str, default: bool) -> bool:
    """``envs.<name>.get()`` of an EnvBool with its default: true, 1, yes, y / false, 0, no, n in
    any case; any other value falls back to ``default`` (environ.py ``EnvBool.parse`` raises,
    ``EnvField.get`` warns and returns the default)."""
    value = role.command.env_dict().get(name)
    if value is None:
        return default
    low = value.lower()
    if low in ("true", "1", "yes", "y"):
        return True
    if low in ("false", "0", "no", "n"):
        return False
    return default


def field_named_in(role: RolePlan, text: str) -> str | None:
    """The one ``extraArgs`` item or ``env`` entry of ``role`` that ``text`` names, else None.

    ``text`` is SGLang's own message (a refusal from the oracle). An ``extraArgs`` flag is
    named by its option (``--enable-foo``) or SGLang's dest (``enable_foo``, how
    ``server_args.py`` spells it in its asserts), an env entry by its variable name; each
    as a whole word. None when nothing or more than one distinct item is named: the caller
    then points at the whole role (a guess would send the user to the wrong token).
    """
    table = flag_table()
    hits: set[str] = set()

    def said(word: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None

    for tok in role.inputs.spec.extraArgs:
        if not tok.startswith("--"):
            continue
        name = tok[2:].partition("=")[0]
        info = table.get("--" + name)
        dest = info.dest if info is not None else name.replace("-", "_")
        if said("--" + name) or said(dest):
            hits.add(flag_field(role, dest))
    for var in role.inputs.spec.env:
        if said(var.name):
            hits.add(env_field(role, var.name))
    return hits.pop() if len(hits) == 1 else None
