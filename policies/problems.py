"""Validation problems: one record per mistake, rendered as `file:line: problem -- fix`.

Every validator in this package returns `Problem`s instead of raising on the first mistake, so an
operator sees all of them at once; `PolicyError` carries the whole list.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace

Loc = tuple[str | int, ...]


def format_loc(loc: Loc) -> str:
    """('cohorts', 1, 'budgets', 0) -> 'cohorts[1].budgets[0]'."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


@dataclass(frozen=True)
class Problem:
    loc: Loc
    message: str
    fix: str
    file: str | None = None
    line: int | None = None

    def located(self, file: str, line: int | None) -> Problem:
        return replace(self, file=file, line=line)

    def __str__(self) -> str:
        text = f"{self.message} -- {self.fix}"
        if self.file is None:
            return text
        return f"{self.file}:{self.line if self.line is not None else 1}: {text}"


class PolicyError(ValueError):
    """A policy file or a pushed table is invalid; `problems` lists every mistake found."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def report(self, stream=None) -> None:
        """Print every problem, one `file:line: problem -- fix` per line (stderr by default)."""
        for problem in self.problems:
            print(problem, file=stream or sys.stderr)
