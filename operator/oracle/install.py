"""Install what the SGLang oracle needs into a Python environment, CPU only (``sglang-pd-operator sglang install``).

Three steps, each timed: (1) ``pip install -r requirements/sglang-cpu.txt`` (pinned pure
Python and CPU wheels, a normal resolve), (2) ``pip install --no-deps -r
requirements/sglang-nodeps.txt`` (torch, triton, torchvision, compressed-tensors and
sglang 0.5.23 themselves, whose declared dependencies are a CUDA stack), (3) the CUDA
stub libraries that let PyPI's CUDA torch import without the nvidia-* wheels
(:mod:`.cuda_stubs`; needs ``cc`` and ``readelf``). The requirement files ship inside the
package, so an installed operator can do this without the repository.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REQUIREMENTS = Path(__file__).resolve().parent / "requirements"
CPU_REQUIREMENTS = REQUIREMENTS / "sglang-cpu.txt"
NODEPS_REQUIREMENTS = REQUIREMENTS / "sglang-nodeps.txt"


def steps(python: str) -> list[tuple[str, list[str]]]:
    """(what, command) of the three install steps for the interpreter ``python``."""
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    return [
        ("SGLang's CPU dependencies", [*pip, "-r", str(CPU_REQUIREMENTS)]),
        ("torch, triton and sglang 0.5.23 without their CUDA dependencies",
         [*pip, "--no-deps", "-r", str(NODEPS_REQUIREMENTS)]),
        ("CUDA stub libraries for PyPI's torch", [python, "-m", "sglang_pd_operator.oracle.cuda_stubs"]),
    ]


def install(python: str | None = None, echo: Callable[[str], None] = print) -> list[tuple[str, float]]:
    """Run the three steps for ``python`` (default: this interpreter); returns (step, seconds).

    Raises ``subprocess.CalledProcessError`` when a step fails (its output is shown).
    """
    python = python or sys.executable
    timings = []
    for what, command in steps(python):
        echo(f"sglang install: {what} ...")
        t0 = time.monotonic()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL if "cuda_stubs" in command[-1] else None)
        timings.append((what, time.monotonic() - t0))
        echo(f"sglang install: {what}: {timings[-1][1]:.0f} s")
    return timings
