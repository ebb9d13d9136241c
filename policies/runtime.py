"""The table a server is running right now: YAML default, or a pushed table until its TTL expires.

Engine-agnostic so the SGLang worker, the reference engine and the simulator's fake servers apply
pushes, expire them and split probe steps the same way. Thread-safe: pushes arrive on an HTTP
thread while the scheduler asks for budgets between steps.
"""

from __future__ import annotations

import threading
from typing import Any

from policies.cohorts import cohort_index_for_batch
from policies.head import HeadCapacity
from policies.schema import Policy
from policies.table import PolicyState, PolicyTable, StepPlan, default_table, validate_table


class ActivePolicy:
    def __init__(self, policy: Policy, head: HeadCapacity | None = None):
        self.policy = policy
        self.head = head  # the server's draft head: pushed tables stay within its tree width
        self._default = default_table(policy)
        self._lock = threading.Lock()
        self._state = PolicyState(table=self._default, source="yaml", expires_at=None, generation=0)
        # Per-cohort probe credit: adding `share` each step and probing when it reaches 1 runs
        # exactly `share` of the steps at the probe budget, evenly spread, with no randomness.
        self._probe_credit: dict[str, float] = {}

    def apply(self, data: Any, now: float) -> PolicyState:
        """Validate and install a pushed table; raises PolicyError (and keeps the old one) if invalid."""
        table = validate_table(data, self.policy, self.head)
        with self._lock:
            self._state = PolicyState(
                table=table, source="pushed", expires_at=now + table.ttl_s, generation=self._state.generation + 1
            )
            self._probe_credit.clear()
            return self._state

    def state(self, now: float) -> PolicyState:
        """The state in force at `now`; an expired push reverts to the YAML default (a new generation)."""
        with self._lock:
            expires_at = self._state.expires_at
            if expires_at is not None and now >= expires_at:
                self._state = PolicyState(
                    table=self._default, source="yaml", expires_at=None, generation=self._state.generation + 1
                )
                self._probe_credit.clear()
            return self._state

    def table(self, now: float) -> PolicyTable:
        return self.state(now).table

    def step_plan(self, batch_size: int, now: float) -> StepPlan:
        """The plan (cohort, budget, rounds, width, drafter, sizing) of the next step of a batch of
        `batch_size` requests."""
        state = self.state(now)
        table = state.table
        cohort = table.cohorts[cohort_index_for_batch(table.cohorts, batch_size)]
        if cohort.probe is None:
            # a pushed table may re-enable or probe a gated cohort at any time: only the YAML default's
            # off cohorts can drop the draft context
            keep = cohort.budget > 0 or state.source != "yaml"
            return StepPlan(
                cohort.name,
                cohort.budget,
                cohort.draft_rounds,
                cohort.tree_width,
                cohort.drafter,
                cohort.tree_sizing,
                cohort.sampled_children,
                keep,
            )
        with self._lock:
            credit = self._probe_credit.get(cohort.name, 0.0) + cohort.probe.share
            probe_now = credit >= 1.0
            self._probe_credit[cohort.name] = credit - 1.0 if probe_now else credit
        return StepPlan(
            cohort.name,
            cohort.probe.budget if probe_now else cohort.budget,
            cohort.draft_rounds,
            cohort.tree_width,
            cohort.drafter,
            cohort.tree_sizing,
            cohort.sampled_children,
        )
