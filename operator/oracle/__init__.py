"""The SGLang oracle: SGLang 0.5.23's own code decides whether a planned PDDeployment starts and pairs.

The operator keeps its own rules (``planning/rules``: its image does not carry SGLang);
this package is how those rules are held to the real thing. :class:`~.judge.Oracle`
renders each role's engine command and environment from a plan, runs SGLang's startup
validation on it in a worker process that emulates the role's GPU (one per catalog
accelerator: ``device``, ``emulation``, ``kernel_standins``, ``standin_plugins``), checks
the model-building divisions its HF config decides (``model_checks``), and runs SGLang's
PD handshake between the two resolved roles (``engine_side``). ``sglang-pd-operator
check --sglang`` prints the verdict; the differential test compares it with the
operator's rules over thousands of generated specs.

Layers: ``judge`` and ``pool`` run in the caller's process and never import SGLang;
``worker``, ``engine_side``, ``model_checks``, ``emulation``, ``kernel_standins`` and
``standin_plugins`` run in the workers, where SGLang is imported after the emulation.
"""

from __future__ import annotations

from .judge import Oracle, PairVerdict, Refusal, RoleVerdict, Verdict
from .pool import OracleError, WorkerPool

__all__ = ["Oracle", "OracleError", "PairVerdict", "Refusal", "RoleVerdict", "Verdict", "WorkerPool", "unavailable"]


def unavailable(python: str | None = None, *, thorough: bool = False) -> str | None:
    """Why the oracle cannot run with ``python`` (default: this interpreter), or None when it can.

    The quick check (``check --sglang``; about 0.05 s) reads the installed distribution's
    version from its metadata: sglang must be 0.5.23. ``thorough=True`` (``sglang status``;
    5-8 s) also imports ``sglang.srt.server_args`` there, without touching a GPU, so a
    broken install shows here and not at the first verdict. The message names the
    interpreter and says how to install (README, "SGLang's own verdict"); it never raises.
    """
    import os
    import subprocess
    import sys

    exe = python or sys.executable
    install = "install it with `sglang-pd-operator sglang install` (CPU-only, see README)"
    probe = ("import importlib.metadata as m\n"
             "try:\n    print('sglang=' + m.version('sglang'))\n"
             "except m.PackageNotFoundError:\n    print('sglang=')\n")
    if thorough:
        probe += "import sglang.srt.server_args\n"
    try:
        out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=300,
                             env={"PYTHONSAFEPATH": "1", "PATH": os.environ.get("PATH", "")}, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {exe}: {e}"
    reported = [line for line in out.stdout.splitlines() if line.startswith("sglang=")]
    if not reported:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{exe} is not a Python interpreter that can report installed packages ({last})"
    version = reported[0].removeprefix("sglang=")
    if not version:
        return f"sglang is not installed for {exe}; {install}"
    if version != "0.5.23":
        return f"sglang {version} is installed for {exe}; the oracle is pinned to 0.5.23: {install}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"sglang 0.5.23 is installed for {exe} but does not import ({last}); {install}"
    return None
