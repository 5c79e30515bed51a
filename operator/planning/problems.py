"""Problems found by planning: what is wrong, on which field, and how to fix it.

Every rule returns a list of :class:`Problem`; a plan collects all of them at once, so
a user sees every problem in one ``check`` run, never just the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One problem with a PDDeployment spec.

    ``field`` is the path of the field to change (``spec.decode.parallelism.tp``),
    ``message`` says what is wrong, ``fix`` what to do, ``rule`` names the rule that
    found it (the function name) and ``severity`` is ``error`` (refused) or ``warning``
    (served, with a Warning condition naming the risk).
    """

    field: str
    message: str
    fix: str
    rule: str
    severity: Severity = "error"

    def line(self) -> str:
        """One line for a person: field path first, the fix last."""
        tag = "" if self.severity == "error" else "warning: "
        return f"{self.field}: {tag}{self.message.rstrip('.')}. Fix: {self.fix}"

    def to_dict(self) -> dict[str, str]:
        """JSON shape used by ``check -o json`` and ``status.problems``."""
        return {
            "field": self.field,
            "message": f"{self.message.rstrip('.')}. Fix: {self.fix}",
            "severity": self.severity,
            "rule": self.rule,
        }


def errors(problems: list[Problem] | tuple[Problem, ...]) -> list[Problem]:
    """The problems that refuse the spec."""
    return [p for p in problems if p.severity == "error"]


def warnings(problems: list[Problem] | tuple[Problem, ...]) -> list[Problem]:
    """The problems that only warn."""
    return [p for p in problems if p.severity == "warning"]
