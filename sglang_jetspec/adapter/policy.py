"""The worker's runtime policy: YAML file (or the built-in default), per-step budgets and draft rounds, pushed tables.

The file is named by the environment variable JETSPEC_POLICY (a path to a policy YAML, see
policies/README.md); without it the packaged `policies/default.yaml` applies. SGLang has no
per-plugin CLI flags, and an environment variable reaches every scheduler process unchanged.

Pushes arrive as flat numeric keys through SGLang's /set_internal_state (policies/control_api.py
explains why) and are honoured only when the server has an admin API key, so that only the admin
key can change what the server speculates.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path
from typing import Any

from policies import (
    ActivePolicy,
    HeadCapacity,
    Policy,
    PolicyError,
    PolicyState,
    PolicyTable,
    StepPlan,
    load_policy,
    read_head_capacity,
)
from policies.control_api import FLAT_PREFIX, policy_readback, table_from_flat_args
from policies.same_allocation import NATIVE, SameAllocationControl, ServedRounds

log = logging.getLogger(__name__)

POLICY_ENV = "JETSPEC_POLICY"


def policy_path() -> Path:
    configured = os.environ.get(POLICY_ENV, "").strip()
    if configured:
        return Path(configured)
    return Path(str(resources.files("policies").joinpath("default.yaml")))


_loaded: dict[tuple, Policy] = {}


def load_runtime_policy(head_dir: str | Path) -> Policy:
    """The policy in force at startup, checked against the head's capacity; PolicyError if invalid.
    Start-up asks for it three times in one process (argument checks, SGLang's speculative shape, the
    worker): a file is parsed and validated once per content and head, an invalid one every time."""
    path, head = policy_path(), read_head_capacity(head_dir)
    stat = path.stat() if path.is_file() else None
    key = (str(path), stat and (stat.st_mtime_ns, stat.st_size), head)
    if key not in _loaded:
        policy = load_policy(path, head)  # raises for a missing or invalid file: nothing is cached
        _loaded[key] = policy
    return _loaded[key]


def max_budget(policy: Policy) -> int:
    """Widest verify any table of this policy can ask for (>= 1: budget 0 still verifies the root)."""
    return max(1, max(max(c.budgets) for c in policy.cohorts))


def is_policy_key(key: str) -> bool:
    return key.startswith(FLAT_PREFIX)


class PolicyControl:
    """What the worker asks each step, and what /set_internal_state and its readback reach."""

    def __init__(
        self,
        policy: Policy,
        admin_key_configured: bool,
        on_change=None,
        head: HeadCapacity | None = None,
        on_same_allocation=None,
    ):
        self.policy = policy
        self.active = ActivePolicy(policy, head)  # `head`: the server's draft head, bounding pushed tree widths
        self.admin_key_configured = admin_key_configured
        self._on_change = on_change  # called with the new PolicyState (metrics gauges)
        self._on_same_allocation = on_same_allocation  # called with same_allocation_state() when it changes
        self._shown_generation = -1
        # the last push refused through SGLang ({"at": unix time, "problems": [...]}; adapter.internal_state)
        self.last_refusal: dict | None = None
        # whether each speculating cohort beats native decoding, measured on this server's own steps
        same = policy.same_allocation
        self.same_allocation = SameAllocationControl(same, [c.name for c in policy.cohorts]) if same.enabled else None
        self._rounds = ServedRounds()
        self._controlled: str | None = None  # the cohort of the step planned last, if the control chose its mode

    def step_plan(self, batch_size: int, now: float, seeded: bool = False) -> StepPlan:
        """The table's plan for the next step; in a cohort whose plan speculates, the same-allocation
        control may run it native (budget 0, the draft context kept). Report it with `served`. `seeded`:
        the batch holds a seeded sampled request, whose tokens depend on the steps' trees (one uniform per
        node from its generator): its steps run the table's plan, so a seed reproduces as before."""
        self.refresh(now)
        plan = self.active.step_plan(batch_size, now)
        controlled = self.same_allocation is not None and plan.budget > 0 and not seeded
        self._controlled = plan.cohort if controlled else None
        if self._controlled is None:
            return plan
        closed = self.same_allocation.closed_blocks
        mode = self.same_allocation.mode(plan.cohort)
        if self.same_allocation.closed_blocks != closed and self._on_same_allocation is not None:
            self._on_same_allocation(self.same_allocation.state())
        return plan._replace(budget=0) if mode == NATIVE else plan

    def served(self, batch_size: int, tokens: int, now: float) -> None:
        """The step just planned served `tokens` tokens to `batch_size` requests; `now`: a monotonic clock."""
        seconds = self._rounds.served(now)
        if self._controlled is not None:
            self.same_allocation.observe(self._controlled, batch_size, tokens, seconds)

    def interrupted(self) -> None:
        """Something other than a decode step ran (a prefill): the next step's interval is not its own."""
        self._rounds.interrupted()

    def same_allocation_state(self) -> dict | None:
        return None if self.same_allocation is None else self.same_allocation.state()

    def refresh(self, now: float) -> None:
        """Revert an expired push and show the table in force (each step, and while the server idles)."""
        self._notify(self.active.state(now))

    def check(self, flat: dict[str, Any]) -> tuple[PolicyTable | None, list[str]]:
        """Validate a flat pushed table without applying it: (table, []) or (None, problems)."""
        if not self.admin_key_configured:
            return None, ["policy pushes are disabled -- start the server with --admin-api-key"]
        try:
            return table_from_flat_args(flat, self.policy, self.active.head), []
        except PolicyError as exc:
            return None, [str(p) for p in exc.problems]

    def push(self, flat: dict[str, Any], now: float) -> list[str]:
        """Apply a flat table atomically; returns the problems (empty = applied, else nothing changed)."""
        table, problems = self.check(flat)
        if table is not None:
            self._notify(self.active.apply(table, now))
        return problems

    def readback(self, now: float) -> dict[str, Any]:
        return policy_readback(self.active, now)

    def _notify(self, state: PolicyState) -> None:
        if state.generation != self._shown_generation and self._on_change is not None:
            self._on_change(state)
        self._shown_generation = state.generation
