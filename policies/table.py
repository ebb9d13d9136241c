"""The runtime budget table (TABLE) that a controller pushes and a server applies.

As read back (`GET /server_info` -> `internal_states[i].jetspec_policy.table`):

    {"cohorts": [{"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": 32, "draft_rounds": 0,
                  "tree_width": 0, "drafter": "head", "tree_sizing": null, "sampled_children": "top_k",
                  "probe": {"budget": 64, "share": 0.05} | null}, ...],
     "ttl_s": 90.0}

A push carries it as flat numeric keys instead (SGLang admits only numbers there):
policies/control_api.py.

The server validates a push with `validate_table(data, policy)` against its own YAML policy, the
same function the controller runs before every push, so both sides agree on what is valid.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError

from policies.head import HeadCapacity
from policies.problems import PolicyError, Problem
from policies.pydantic_errors import problems_from_validation_error
from policies.schema import (
    LABEL_PATTERN,
    MAX_TTL_S,
    Budget,
    CohortPolicy,
    DrafterName,
    Policy,
    SampledChildrenName,
    StrictModel,
    TreeSizingName,
    TreeWidth,
    width_problems,
)


class Probe(StrictModel):
    budget: Budget
    share: float = Field(gt=0, le=0.5, allow_inf_nan=False)


class CohortBudget(StrictModel):
    name: str = Field(min_length=1, pattern=LABEL_PATTERN)
    min_batch: int = Field(ge=1)
    max_batch: int = Field(ge=1)
    budget: Budget
    draft_rounds: int = Field(default=0, ge=0)  # tree-causal rounds; probe steps draft with them too
    tree_width: TreeWidth = 0  # children per node; 0 = the head's own width
    drafter: DrafterName = "head"  # probe steps draft with it too
    tree_sizing: TreeSizingName | None = None  # None: the server's own; probe steps are sized too
    sampled_children: SampledChildrenName = "top_k"  # probe steps draw with it too
    probe: Probe | None = None

    @classmethod
    def of(cls, cohort: CohortPolicy, budget: int, probe: Probe | None = None) -> "CohortBudget":
        """A YAML cohort at `budget`: its range, draft rounds, width, drafter and tree sizing as the YAML
        says (a controller chooses budgets and probes only)."""
        return cls(
            name=cohort.name,
            min_batch=cohort.min_batch,
            max_batch=cohort.max_batch,
            budget=budget,
            draft_rounds=cohort.draft_rounds,
            tree_width=cohort.tree_width,
            drafter=cohort.drafter,
            tree_sizing=cohort.tree_sizing,
            sampled_children=cohort.sampled_children,
            probe=probe,
        )


class StepPlan(NamedTuple):
    """What the next step runs: its cohort, tree budget, tree-causal draft rounds, tree width (0 = the
    head's), drafter (head or hybrid), tree sizing (fixed, adaptive, None = the server's own) and how
    sampled requests' children are chosen (top_k or drawn)."""

    cohort: str
    budget: int
    draft_rounds: int
    tree_width: int
    drafter: str = "head"
    tree_sizing: str | None = None
    sampled_children: str = "top_k"
    # False on a step the YAML default gates off (budget 0, no push in force, so no probe): nothing will
    # draft for these requests in this cohort, so an engine need not keep their draft context
    keep_draft_context: bool = True

    @property
    def sizes_adaptively(self) -> bool:
        """The step cuts its trees to what pays (a tree of one node has nothing to cut)."""
        return self.tree_sizing == "adaptive" and self.budget > 1


class PolicyTable(StrictModel):
    cohorts: list[CohortBudget] = Field(min_length=1)
    ttl_s: float = Field(gt=0, le=MAX_TTL_S, allow_inf_nan=False)

    def budgets(self) -> dict[str, int]:
        return {c.name: c.budget for c in self.cohorts}


class PolicyState(StrictModel):
    """Readback: `GET /server_info` returns it as `internal_states[i].jetspec_policy`."""

    table: PolicyTable
    source: Literal["yaml", "pushed"]
    expires_at: float | None
    generation: int = Field(ge=0)


def default_table(policy: Policy) -> PolicyTable:
    """The table a server runs from its YAML file: each cohort's default budget, draft rounds, width,
    drafter and tree sizing, no probes."""
    return PolicyTable(cohorts=[CohortBudget.of(c, c.default) for c in policy.cohorts], ttl_s=policy.controller.ttl_s)


def _cohort_problems(i: int, pushed: CohortBudget, policy: Policy, head: HeadCapacity | None) -> list[Problem]:
    own = policy.cohorts[i]
    if (pushed.name, pushed.min_batch, pushed.max_batch) != (own.name, own.min_batch, own.max_batch):
        return [
            Problem(
                ("cohorts", i, "name"),
                f"cohorts[{i}] is '{pushed.name}' {pushed.min_batch}..{pushed.max_batch} but the "
                f"server policy has '{own.name}' {own.min_batch}..{own.max_batch}",
                "push the cohorts of the server's policy file, in its order",
            )
        ]
    problems = []
    if pushed.budget not in own.budgets:
        problems.append(
            Problem(
                ("cohorts", i, "budget"),
                f"cohorts[{i}].budget {pushed.budget} is not a candidate of '{own.name}'",
                f"use one of {own.budgets}",
            )
        )
    if pushed.draft_rounds > policy.head.max_draft_rounds:
        problems.append(
            Problem(
                ("cohorts", i, "draft_rounds"),
                f"cohorts[{i}].draft_rounds {pushed.draft_rounds} is above the server policy's "
                f"head.max_draft_rounds {policy.head.max_draft_rounds}",
                f"use 0..{policy.head.max_draft_rounds}",
            )
        )
    problems.extend(width_problems(("cohorts", i, "tree_width"), f"cohorts[{i}].", pushed.tree_width, head))
    probe = pushed.probe
    if probe is not None:
        if probe.budget not in own.budgets or probe.budget == pushed.budget:
            problems.append(
                Problem(
                    ("cohorts", i, "probe", "budget"),
                    f"cohorts[{i}].probe.budget {probe.budget} is not another candidate of '{own.name}'",
                    f"use one of {own.budgets} other than {pushed.budget}",
                )
            )
        if probe.share > policy.gate.probe_share:
            problems.append(
                Problem(
                    ("cohorts", i, "probe", "share"),
                    f"cohorts[{i}].probe.share {probe.share} exceeds gate.probe_share {policy.gate.probe_share}",
                    f"use at most {policy.gate.probe_share}",
                )
            )
    return problems


def table_problems(table: PolicyTable, policy: Policy, head: HeadCapacity | None = None) -> list[Problem]:
    if len(table.cohorts) != len(policy.cohorts):
        return [
            Problem(
                ("cohorts",),
                f"cohorts has {len(table.cohorts)} entries, the server policy has {len(policy.cohorts)}",
                "push one entry per cohort of the server's policy",
            )
        ]
    problems: list[Problem] = []
    for i, cohort in enumerate(table.cohorts):
        problems.extend(_cohort_problems(i, cohort, policy, head))
    return problems


def validate_table(data: Any, policy: Policy, head: HeadCapacity | None = None) -> PolicyTable:
    """Parse and check a pushed table; raises PolicyError naming each bad field and its fix. `head`:
    the server's draft head, whose tree width bounds the table's."""
    try:
        table = data if isinstance(data, PolicyTable) else PolicyTable.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(problems_from_validation_error(PolicyTable, exc)) from None
    problems = table_problems(table, policy, head)
    if problems:
        raise PolicyError(problems)
    return table
