"""Cohort ranges: shared by the policy file and the pushed table, so both obey the same rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.problems import Problem


class CohortRange(Protocol):
    name: str
    min_batch: int
    max_batch: int


def coverage_problems(cohorts: Sequence[CohortRange], field: str = "cohorts") -> list[Problem]:
    """Cohorts must be listed in order and cover batch sizes 1..max contiguously, names unique."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    expected_min = 1
    for i, cohort in enumerate(cohorts):
        if cohort.name in seen:
            problems.append(
                Problem(
                    (field, i, "name"),
                    f"{field}[{i}].name '{cohort.name}' repeats {field}[{seen[cohort.name]}]",
                    "give every cohort its own name",
                )
            )
        seen.setdefault(cohort.name, i)
        if cohort.max_batch < cohort.min_batch:
            problems.append(
                Problem(
                    (field, i, "max_batch"),
                    f"{field}[{i}] '{cohort.name}' has max_batch {cohort.max_batch} < min_batch {cohort.min_batch}",
                    f"set max_batch >= {cohort.min_batch}",
                )
            )
        if cohort.min_batch > expected_min:
            problems.append(
                Problem(
                    (field, i, "min_batch"),
                    f"{field}[{i}] '{cohort.name}' starts at batch {cohort.min_batch}, leaving batch sizes "
                    f"{expected_min}..{cohort.min_batch - 1} in no cohort (gap)",
                    f"start it at {expected_min} or add a cohort for the gap",
                )
            )
        elif cohort.min_batch < expected_min:
            overlap = (
                "batch 1 is the smallest"
                if i == 0
                else (f"overlaps {field}[{i - 1}] '{cohorts[i - 1].name}' (ends at {expected_min - 1})")
            )
            problems.append(
                Problem(
                    (field, i, "min_batch"),
                    f"{field}[{i}] '{cohort.name}' starts at batch {cohort.min_batch}: {overlap}",
                    f"start it at {expected_min} (cohorts are listed in increasing, non-overlapping order)",
                )
            )
        expected_min = max(expected_min, cohort.max_batch + 1)
    return problems


def cohort_index_for_batch(cohorts: Sequence[CohortRange], batch_size: int) -> int:
    """Index of the cohort holding batch_size; batches beyond the last range use the last cohort."""
    for i, cohort in enumerate(cohorts):
        if cohort.min_batch <= batch_size <= cohort.max_batch:
            return i
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return len(cohorts) - 1
