"""The policy file schema (YAML), shared by the worker, the reference engine and the controller.

Structure and types are checked by pydantic (strict: "8" is not 8, unknown keys are errors);
rules that relate several fields (cohort coverage, budgets vs limits) by `policy_problems`.
Load files through `policies.loader.load_policy`, which runs both and reports file:line.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from policies.cohorts import coverage_problems
from policies.head import HeadCapacity
from policies.problems import Problem

DEFAULT_MAX_BUDGET = 256
# The hybrid drafter's chance that a looked-up token is accepted given its parent was, for a token
# found after a 3-token match in the request's own text; other guesses scale it (core/prompt_lookup.py).
# Replay on HumanEval 0-99: 0.9 gave the longest accepts at budgets 16 and 32 among 0.3-0.97
# (bench/results/hybrid/replay_tune.md, bench/results/speed/lookup-trie-tune.md).
DEFAULT_LOOKUP_ACCEPT = 0.9
# Cohort names become Prometheus label values and log keys: keep them plain.
LABEL_PATTERN = r"^[A-Za-z0-9_.-]+$"

Budget = Annotated[int, Field(ge=0)]
# Children per tree node a cohort or a pushed table may ask for when the head is not known (a server
# that knows its head holds tables to the head's own tree_width)
MAX_TREE_WIDTH = 64
# Longest a pushed table stays in force without a renewal (a controller renews every interval_s)
MAX_TTL_S = 3600.0
TreeWidth = Annotated[int, Field(ge=0, le=MAX_TREE_WIDTH)]
# head: the draft head's tree; hybrid: the same tree with looked-up continuations merged in (the request's
# own tokens, the draft corpus, finished outputs: core/prompt_lookup.py)
DrafterName = Literal["head", "hybrid"]
DRAFTERS: tuple[str, ...] = ("head", "hybrid")  # a push sends the index (SGLang admits numbers only)
# fixed: verify the whole tree; adaptive: only the nodes that pay for themselves (core/tree_sizing.py)
TreeSizingName = Literal["fixed", "adaptive"]
TREE_SIZINGS: tuple[str, ...] = ("fixed", "adaptive")  # a push sends the index
# How a sampled request's marginal children are chosen: the head's top-K, or drawn from its distribution
# and accepted against it (core/drawn_children.py; greedy requests and tree-causal rounds keep top-K)
SampledChildrenName = Literal["top_k", "drawn"]
SAMPLED_CHILDREN: tuple[str, ...] = ("top_k", "drawn")  # a push sends the index


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class CohortPolicy(StrictModel):
    name: str = Field(min_length=1, pattern=LABEL_PATTERN)
    min_batch: int = Field(ge=1)
    max_batch: int = Field(ge=1)
    budgets: list[Budget] = Field(min_length=1, description="candidate budgets, 0 = off, increasing")
    default: Budget = Field(description="budget used until a controller pushes a table")
    draft_rounds: int = Field(default=0, ge=0, description="tree-causal draft rounds after the marginal tree")
    tree_width: TreeWidth = Field(default=0, description="children per tree node (top-K); 0 = the head's own width")
    drafter: DrafterName = Field(
        default="head", description="head, or hybrid (prompt-lookup guesses merged into the tree)"
    )
    tree_sizing: TreeSizingName | None = Field(
        default=None,
        description="fixed or adaptive (the budget is then a cap); unset: the server's own "
        "(jetspec serve --tree-sizing; fixed in SGLang)",
    )
    sampled_children: SampledChildrenName = Field(
        default="top_k",
        description="sampled requests: the head's top-K children, or children drawn from its "
        "distribution (drawn: more accepted at T = 1 with wide trees; greedy requests are not affected)",
    )


class GatePolicy(StrictModel):
    min_gain: float = Field(default=1.03, gt=0)
    hysteresis: float = Field(default=0.03, ge=0, le=1)
    confidence_z: float = Field(default=2.5, ge=0)
    dwell_s: float = Field(default=60.0, gt=0)
    probe_share: float = Field(default=0.05, gt=0, le=0.5)
    reprobe_budget: int = Field(default=4, ge=1)
    reprobe_backoff_max_s: float = Field(default=1200.0, gt=0)


class SameAllocationPolicy(StrictModel):
    """The server's own speculative-or-native decision per cohort (policies/same_allocation.py)."""

    enabled: bool = True
    block_steps: int = Field(default=8, ge=2, le=1024)
    explore_every: int = Field(default=4, ge=2, le=1024)
    steady_every: int = Field(default=16, ge=2, le=1024)
    steady_every_max: int = Field(default=32, ge=2, le=1024)
    steady_cost: float = Field(default=0.01, gt=0, lt=1)
    min_blocks: int = Field(default=3, ge=2, le=1024)
    window_blocks: int = Field(default=8, ge=2, le=1024)
    # the mode a cohort is in is read as far back as the other mode's window reaches, up to this many blocks
    span_blocks: int = Field(default=32, ge=2, le=4096)
    margin: float = Field(default=0.03, ge=0, lt=1)
    confidence_z: float = Field(default=2.0, ge=0, le=10)
    # a step this many times its block's median seconds is a stall (a tree step may take 5x a cheap one)
    stall_factor: float = Field(default=10.0, gt=1, le=100)


class ControllerPolicy(StrictModel):
    interval_s: float = Field(default=10.0, gt=0)
    ttl_s: float = Field(default=90.0, gt=0, le=MAX_TTL_S, allow_inf_nan=False)
    window_s: float = Field(default=300.0, gt=0)
    min_samples: int = Field(default=3, ge=2)


class ShadowPolicy(StrictModel):
    sample_rate: float = Field(default=0.01, ge=0, le=1)
    alpha: float = Field(default=0.01, gt=0, lt=1)
    # What the controller does while the shadow checker's drift alarm is in force (shadow/README.md).
    gate_on_alarm: bool = Field(default=False, description="gate speculation off in every cohort on alarm")


class HeadLimits(StrictModel):
    max_budget: int = Field(default=DEFAULT_MAX_BUDGET, ge=1)
    # Tree-causal rounds need a head trained with revealed tokens; 0 keeps every table marginal-only.
    max_draft_rounds: int = Field(default=0, ge=0)


class LookupPolicy(StrictModel):
    """Prompt lookup as the hybrid drafter uses it."""

    accept: float = Field(
        default=DEFAULT_LOOKUP_ACCEPT,
        gt=0,
        lt=1,
        description="calibrated chance a looked-up token is accepted given its parent was",
    )
    min_ngram: int = Field(default=1, ge=1)
    max_ngram: int = Field(default=4, ge=1)


class Policy(StrictModel):
    cohorts: list[CohortPolicy] = Field(min_length=1)
    gate: GatePolicy = GatePolicy()
    same_allocation: SameAllocationPolicy = SameAllocationPolicy()
    controller: ControllerPolicy = ControllerPolicy()
    shadow: ShadowPolicy = ShadowPolicy()
    head: HeadLimits = HeadLimits()
    lookup: LookupPolicy = LookupPolicy()

    def cohort(self, name: str) -> CohortPolicy:
        for cohort in self.cohorts:
            if cohort.name == name:
                return cohort
        raise KeyError(f"no cohort named {name!r} in the policy")


def width_problems(loc, prefix: str, width: int, head: HeadCapacity | None) -> list[Problem]:
    """A tree width (of a YAML cohort or a pushed table's) wider than the head's own; none without a head.
    `prefix` names the cohort in the message ("cohorts[0] 'bs1' ", "cohorts[0].")."""
    if head is None or width <= head.tree_width:
        return []
    return [
        Problem(
            loc,
            f"{prefix}tree_width {width} is wider than head {head.source}'s tree_width {head.tree_width}",
            f"use 0 (the head's own) up to {head.tree_width}",
        )
    ]


def _budget_problems(policy: Policy, head: HeadCapacity | None) -> list[Problem]:
    problems = []
    limit = policy.head.max_budget
    for i, cohort in enumerate(policy.cohorts):
        where = f"cohorts[{i}] '{cohort.name}'"
        for j, budget in enumerate(cohort.budgets):
            loc = ("cohorts", i, "budgets", j)
            if budget > limit:
                problems.append(
                    Problem(
                        loc,
                        f"{where} budget {budget} is above head.max_budget {limit}",
                        f"lower it to at most {limit} or raise head.max_budget",
                    )
                )
            elif head is not None and budget > head.nodes_at(width := cohort.tree_width or head.tree_width):
                problems.append(
                    Problem(
                        loc,
                        f"{where} budget {budget} is more nodes than head {head.source} can use "
                        f"(block_size {head.block_size}, tree width {width}: at most {head.nodes_at(width)})",
                        f"lower it to at most {head.nodes_at(width)}",
                    )
                )
        problems.extend(width_problems(("cohorts", i, "tree_width"), f"{where} ", cohort.tree_width, head))
        if len(set(cohort.budgets)) != len(cohort.budgets) or cohort.budgets != sorted(cohort.budgets):
            problems.append(
                Problem(
                    ("cohorts", i, "budgets"),
                    f"{where} budgets {cohort.budgets} are not strictly increasing",
                    f"write {sorted(set(cohort.budgets))}",
                )
            )
        if cohort.default not in cohort.budgets:
            problems.append(
                Problem(
                    ("cohorts", i, "default"),
                    f"{where} default {cohort.default} is not one of its budgets {cohort.budgets}",
                    "pick the default from the budgets list or add it there",
                )
            )
        reprobe = policy.gate.reprobe_budget
        if 0 in cohort.budgets and len(cohort.budgets) > 1 and reprobe not in cohort.budgets:
            problems.append(
                Problem(
                    ("cohorts", i, "budgets"),
                    f"{where} can be gated off but gate.reprobe_budget {reprobe} is not one "
                    f"of its budgets {cohort.budgets}",
                    f"add {reprobe} to its budgets or change gate.reprobe_budget",
                )
            )
    return problems


def _draft_rounds_problems(policy: Policy, head: HeadCapacity | None) -> list[Problem]:
    limit = policy.head.max_draft_rounds
    problems = [
        Problem(
            ("cohorts", i, "draft_rounds"),
            f"cohorts[{i}] '{cohort.name}' draft_rounds {cohort.draft_rounds} is above head.max_draft_rounds {limit}",
            f"lower it to at most {limit} or raise head.max_draft_rounds",
        )
        for i, cohort in enumerate(policy.cohorts)
        if cohort.draft_rounds > limit
    ]
    if head is not None and limit > 0 and not head.reads_tree_tokens:
        problems.append(
            Problem(
                ("head", "max_draft_rounds"),
                f"head.max_draft_rounds is {limit} but head {head.source} was trained without revealed "
                "tokens (no draft_reveal in its config.json): it drafts per-depth marginals only",
                "set head.max_draft_rounds: 0 (and every cohort's draft_rounds to 0) or deploy a head "
                "trained with `jetspec train --reveal prefix`",
            )
        )
    return problems


def _timing_problems(policy: Policy) -> list[Problem]:
    ctl = policy.controller
    problems = []
    if ctl.ttl_s < 3 * ctl.interval_s:
        problems.append(
            Problem(
                ("controller", "ttl_s"),
                f"controller.ttl_s {ctl.ttl_s} is under 3 x interval_s ({ctl.interval_s})",
                f"set ttl_s >= {3 * ctl.interval_s:g} so renewals land before tables expire",
            )
        )
    if ctl.window_s < ctl.min_samples * ctl.interval_s:
        problems.append(
            Problem(
                ("controller", "window_s"),
                f"controller.window_s {ctl.window_s} holds fewer than min_samples "
                f"({ctl.min_samples}) intervals of {ctl.interval_s}s",
                f"set window_s >= {ctl.min_samples * ctl.interval_s:g}",
            )
        )
    same = policy.same_allocation
    if same.window_blocks < same.min_blocks:
        problems.append(
            Problem(
                ("same_allocation", "window_blocks"),
                f"same_allocation.window_blocks {same.window_blocks} holds fewer than min_blocks ({same.min_blocks})",
                f"set window_blocks >= {same.min_blocks}",
            )
        )
    if same.span_blocks < same.window_blocks:
        problems.append(
            Problem(
                ("same_allocation", "span_blocks"),
                f"same_allocation.span_blocks {same.span_blocks} is under window_blocks ({same.window_blocks})",
                f"set span_blocks >= {same.window_blocks}",
            )
        )
    if same.steady_every_max < same.steady_every:
        problems.append(
            Problem(
                ("same_allocation", "steady_every_max"),
                f"same_allocation.steady_every_max {same.steady_every_max} is under steady_every ({same.steady_every})",
                f"set steady_every_max >= {same.steady_every}",
            )
        )
    if policy.gate.reprobe_budget > policy.head.max_budget:
        problems.append(
            Problem(
                ("gate", "reprobe_budget"),
                f"gate.reprobe_budget {policy.gate.reprobe_budget} is above head.max_budget",
                f"use at most {policy.head.max_budget}",
            )
        )
    return problems


def _shadow_problems(policy: Policy) -> list[Problem]:
    if not policy.shadow.gate_on_alarm:
        return []
    return [
        Problem(
            ("cohorts", i, "budgets"),
            f"shadow.gate_on_alarm is true but cohorts[{i}] '{cohort.name}' cannot be gated off "
            f"(budgets {cohort.budgets} lack 0)",
            "add 0 to its budgets or set shadow.gate_on_alarm: false",
        )
        for i, cohort in enumerate(policy.cohorts)
        if 0 not in cohort.budgets
    ]


def policy_problems(policy: Policy, head: HeadCapacity | None = None) -> list[Problem]:
    """Rules across fields; `head` adds the limit of a concrete draft head checkpoint."""
    return (
        coverage_problems(policy.cohorts)
        + _budget_problems(policy, head)
        + _draft_rounds_problems(policy, head)
        + _timing_problems(policy)
        + _shadow_problems(policy)
        + _lookup_problems(policy)
    )


def _lookup_problems(policy: Policy) -> list[Problem]:
    lookup = policy.lookup
    if lookup.min_ngram <= lookup.max_ngram:
        return []
    return [
        Problem(
            ("lookup", "min_ngram"),
            f"lookup.min_ngram {lookup.min_ngram} is above lookup.max_ngram {lookup.max_ngram}",
            "lower min_ngram or raise max_ngram",
        )
    ]
