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
from policies.controlled_plans import ControlledPlans

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
        self._shown_generation = -1
        # the last push refused through SGLang ({"at": unix time, "problems": [...]}; adapter.internal_state)
        self.last_refusal: dict | None = None
        # whether each speculating cohort beats native decoding, measured on this server's own steps;
        # `on_same_allocation` is called with its state whenever it changes
        self.plans = ControlledPlans(self.active, on_same_allocation)

    def step_plan(self, batch_size: int, now: float, seeded: bool = False) -> StepPlan:
        """The plan for the next step (policies/controlled_plans.py: the table's, or native where the
        same-allocation control says); report it with `served`."""
        self.refresh(now)
        return self.plans.step_plan(batch_size, now, seeded)

    def served(self, batch_size: int, tokens: int, now: float, started: float | None = None) -> None:
        self.plans.served(batch_size, tokens, now, started)

    def interrupted(self) -> None:
        self.plans.interrupted()

    def same_allocation_state(self) -> dict | None:
        return self.plans.state()

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
