"""Per-cohort budget decisions: pure logic over goodput estimates and an injected clock.

For every cohort, once per interval:
- on: climb to the candidate with the best goodput, switching only when the challenger beats the
  incumbent by the hysteresis margin with `confidence_z` standard errors (no flapping on a
  stationary load); gate off (budget 0) when the best gain over off stays below `min_gain` for
  `dwell_s`; probe the ordered-list neighbours and off, one at a time, on `probe_share` of steps;
- off: re-probe `reprobe_budget` in episodes of `min_samples` intervals; re-enable when its gain
  clears min_gain x (1 + hysteresis) with confidence, else back off (dwell_s, 2x, 4x ... up to
  `reprobe_backoff_max_s`) so a workload where speculation hurts pays little for the re-probes.
The simulator and the live controller drive this same class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from controller.estimator import Estimate, gain_over_off
from controller.telemetry import Key
from policies.schema import CohortPolicy, Policy
from policies.table import CohortBudget, PolicyTable, Probe

# Decision reasons (also the `reason` label of the controller's decision counter).
WARMING_UP = "warming_up"          # incumbent has fewer than min_samples intervals of evidence
HOLD = "hold"
BETTER_BUDGET = "better_budget"
BELOW_MIN_GAIN = "below_min_gain"  # gain under min_gain, dwell timer running
GATE_OFF = "gate_off"
OFF = "off"
REPROBING = "reprobing"
REPROBE_FAILED = "reprobe_failed"
REENABLE = "reenable"


@dataclass(frozen=True)
class BudgetEvidence:
    budget: int
    goodput: float
    stderr: float
    samples: int
    gain: float | None  # over off, when off has an estimate
    gain_stderr: float | None


@dataclass(frozen=True)
class Decision:
    cohort: str
    at: float
    previous: int
    budget: int
    probe: Probe | None
    reason: str
    evidence: tuple[BudgetEvidence, ...]

    @property
    def switched(self) -> bool:
        return self.budget != self.previous


@dataclass
class _CohortState:
    budget: int
    below_since: float | None = None  # start of the current run of gain < min_gain
    probe: int | None = None
    probe_intervals: int = 0          # intervals the current probe target has been scheduled
    reprobe_failures: int = 0
    reprobe_at: float = 0.0           # while off: earliest start of the next re-probe episode


class BudgetDecider:
    def __init__(self, policy: Policy, clock: Callable[[], float]):
        self._policy = policy
        self._gate = policy.gate
        self._min_samples = policy.controller.min_samples
        self._clock = clock
        now = clock()
        self._states = {c.name: self._fresh_state(c.default, now) for c in policy.cohorts}

    def _fresh_state(self, budget: int, now: float, probe: int | None = None) -> _CohortState:
        return _CohortState(budget=budget, probe=probe, reprobe_at=now + self._gate.dwell_s)

    def resume(self, table: PolicyTable) -> None:
        """Continue from a table a server is running (restart): same budgets, same probes."""
        now = self._clock()
        for cohort in table.cohorts:
            probe = cohort.probe.budget if cohort.probe is not None else None
            self._states[cohort.name] = self._fresh_state(cohort.budget, now, probe)

    def table(self) -> PolicyTable:
        cohorts = []
        for c in self._policy.cohorts:
            state = self._states[c.name]
            probe = None if state.probe is None else Probe(budget=state.probe, share=self._gate.probe_share)
            cohorts.append(CohortBudget(name=c.name, min_batch=c.min_batch, max_batch=c.max_batch,
                                        budget=state.budget, probe=probe))
        return PolicyTable(cohorts=cohorts, ttl_s=self._policy.controller.ttl_s)

    def decide(self, estimates: Mapping[Key, Estimate]) -> list[Decision]:
        now = self._clock()
        return [self._decide_cohort(c, estimates, now) for c in self._policy.cohorts]

    def _decide_cohort(self, cohort: CohortPolicy, estimates: Mapping[Key, Estimate], now: float) -> Decision:
        state = self._states[cohort.name]
        own = {b: estimates[(cohort.name, b)] for b in cohort.budgets if (cohort.name, b) in estimates}
        usable = {b: e for b, e in own.items() if e.samples >= self._min_samples}
        previous = state.budget
        if state.budget == 0:
            reason = self._while_off(cohort, state, usable, now)
        else:
            reason = self._while_on(state, usable, now)
            self._schedule_probe(cohort, state, own)
        probe = None if state.probe is None else Probe(budget=state.probe, share=self._gate.probe_share)
        return Decision(cohort.name, now, previous, state.budget, probe, reason, _evidence(own))

    def _switch(self, state: _CohortState, budget: int) -> None:
        state.budget = budget
        state.probe = None
        state.probe_intervals = 0

    def _while_on(self, state: _CohortState, usable: dict[int, Estimate], now: float) -> str:
        on = {b: e for b, e in usable.items() if b != 0}
        if state.budget not in on:
            return WARMING_UP
        off = usable.get(0)
        if off is not None:
            best_gain = max(e.goodput for e in on.values()) / off.goodput
            if best_gain >= self._gate.min_gain:
                state.below_since = None
            elif state.below_since is None:
                state.below_since = now
            elif now - state.below_since >= self._gate.dwell_s:
                self._switch(state, 0)
                state.below_since = None
                state.reprobe_failures = 0
                state.reprobe_at = now + self._gate.dwell_s
                return GATE_OFF
        challenger = max(on, key=lambda b: on[b].goodput)
        if challenger != state.budget and self._confidently_better(on[challenger], on[state.budget]):
            self._switch(state, challenger)
            return BETTER_BUDGET
        return BELOW_MIN_GAIN if state.below_since is not None else HOLD

    def _confidently_better(self, challenger: Estimate, incumbent: Estimate) -> bool:
        margin = 1.0 + self._gate.hysteresis
        lead = challenger.goodput - margin * incumbent.goodput
        noise = math.hypot(challenger.stderr, margin * incumbent.stderr)
        return lead > self._gate.confidence_z * noise

    def _schedule_probe(self, cohort: CohortPolicy, state: _CohortState, own: dict[int, Estimate]) -> None:
        """Probe the incumbent's neighbours and off in turn, the least-measured first."""
        budgets = cohort.budgets
        i = budgets.index(state.budget)
        targets = [b for b in budgets[max(0, i - 1):i + 2] if b != state.budget]
        if 0 in budgets and 0 not in targets:
            targets.insert(0, 0)  # gain over off needs off measured in the same window
        if not targets:
            state.probe = None
            return
        if state.probe in targets and state.probe_intervals < self._min_samples:
            state.probe_intervals += 1
            return
        state.probe = min(targets, key=lambda b: own[b].samples if b in own else 0)
        state.probe_intervals = 1

    def _while_off(self, cohort: CohortPolicy, state: _CohortState, usable: dict[int, Estimate],
                   now: float) -> str:
        reprobe = self._gate.reprobe_budget
        if reprobe not in cohort.budgets:
            state.probe = None
            return OFF
        if reprobe in usable and 0 in usable:
            gain, gain_se = gain_over_off(usable[reprobe], usable[0])
            threshold = self._gate.min_gain * (1.0 + self._gate.hysteresis)
            if gain - self._gate.confidence_z * gain_se > threshold:
                self._switch(state, reprobe)
                state.reprobe_failures = 0
                return REENABLE
        if state.probe == reprobe:
            state.probe_intervals += 1
            if state.probe_intervals < self._min_samples:
                return REPROBING
            state.probe = None
            state.reprobe_failures += 1
            pause = self._gate.dwell_s * 2 ** state.reprobe_failures
            state.reprobe_at = now + min(pause, self._gate.reprobe_backoff_max_s)
            return REPROBE_FAILED
        if now >= state.reprobe_at:
            state.probe = reprobe
            state.probe_intervals = 0
            return REPROBING
        return OFF


def _evidence(own: dict[int, Estimate]) -> tuple[BudgetEvidence, ...]:
    off = own.get(0)
    rows = []
    for budget in sorted(own):
        e = own[budget]
        gain, gain_se = gain_over_off(e, off) if off is not None else (None, None)
        rows.append(BudgetEvidence(budget, e.goodput, e.stderr, e.samples, gain, gain_se))
    return tuple(rows)
