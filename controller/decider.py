"""Per-cohort budget decisions: pure logic over goodput estimates and an injected clock.

For every cohort, once per interval (comparisons are paired over the intervals where both
budgets ran, see controller/estimator.py):
- on: climb to the candidate with the best goodput, switching only when the challenger beats the
  incumbent by the hysteresis margin with `confidence_z` standard errors (no flapping on a
  stationary load); gate off (budget 0) when the best gain over off stays below `min_gain` for
  `dwell_s`; probe the ordered-list neighbours and off, one at a time, on `probe_share` of steps;
- off: re-probe `reprobe_budget` in episodes of min_samples..2 x min_samples samples; re-enable
  when the probe's gain clears min_gain x (1 + hysteresis) with confidence, climb to the next
  candidate while the probe breaks even, else back off (dwell_s, 2x, 4x ... up to
  `reprobe_backoff_max_s`) so a workload where speculation hurts pays little for the re-probes.
The simulator and the live controller drive this same class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from controller.estimator import Comparison, Estimate, GoodputEstimator
from policies.schema import CohortPolicy, Policy
from policies.table import CohortBudget, PolicyTable, Probe

# Decision reasons (also the `reason` label of the controller's decision counter).
WARMING_UP = "warming_up"  # incumbent has fewer than min_samples intervals of evidence
HOLD = "hold"
BETTER_BUDGET = "better_budget"
BELOW_MIN_GAIN = "below_min_gain"  # gain under min_gain, dwell timer running
GATE_OFF = "gate_off"
OFF = "off"
REPROBING = "reprobing"
REPROBE_CLIMB = "reprobe_climb"  # off, the probed budget breaks even: probe the next larger one
REPROBE_FAILED = "reprobe_failed"
REENABLE = "reenable"

# A probe turn waits at most this many times its sample target in busy intervals (thin traffic).
IDLE_TURN_FACTOR = 4


@dataclass(frozen=True)
class BudgetEvidence:
    budget: int
    goodput: float
    stderr: float
    samples: int
    gain: float | None  # over off, paired or chained through the incumbent; None if unmeasured
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
    probe_intervals: int = 0  # intervals with traffic in the cohort during this probe turn
    probe_samples: int = 0  # ...and how many of them produced a sample of the probe
    reprobe_failures: int = 0
    reprobe_at: float = 0.0  # while off: earliest start of the next re-probe episode


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
            cohorts.append(CohortBudget.of(c, state.budget, probe))
        return PolicyTable(cohorts=cohorts, ttl_s=self._policy.controller.ttl_s)

    def decide(self, evidence: GoodputEstimator) -> list[Decision]:
        now = self._clock()
        estimates = evidence.estimates()
        return [self._decide_cohort(c, _CohortEvidence(c.name, estimates, evidence), now) for c in self._policy.cohorts]

    def _decide_cohort(self, cohort: CohortPolicy, evidence: _CohortEvidence, now: float) -> Decision:
        state = self._states[cohort.name]
        own = {b: e for b in cohort.budgets if (e := evidence.estimate(b)) is not None}
        previous = state.budget
        if state.probe is not None and evidence.is_new(own.get(state.budget)):  # the cohort had traffic
            state.probe_intervals += 1
            state.probe_samples += evidence.is_new(own.get(state.probe))
        if state.budget == 0:
            reason = self._while_off(cohort, state, evidence, now)
        else:
            reason = self._while_on(cohort, state, own, evidence, now)
        if state.budget != 0:  # off schedules its own re-probes
            self._schedule_probe(cohort, state, own)
        probe = None if state.probe is None else Probe(budget=state.probe, share=self._gate.probe_share)
        return Decision(cohort.name, now, previous, state.budget, probe, reason, evidence.rows(own, previous))

    def _enough(self, comparison: Comparison | None) -> bool:
        return comparison is not None and comparison.samples >= self._min_samples

    def _switch(self, state: _CohortState, budget: int) -> None:
        state.budget = budget
        self._start_probe(state, None)

    def _start_probe(self, state: _CohortState, budget: int | None) -> None:
        state.probe = budget
        state.probe_intervals = state.probe_samples = 0

    def _turn_over(self, state: _CohortState, samples_needed: int) -> bool:
        """A probe turn ends after enough sampled intervals, or after IDLE_TURN_FACTOR times as many
        busy intervals when the probe's share is too thin to sample it (rotation never stalls)."""
        return state.probe_samples >= samples_needed or state.probe_intervals >= IDLE_TURN_FACTOR * samples_needed

    def _while_on(
        self, cohort: CohortPolicy, state: _CohortState, own: dict[int, Estimate], evidence: _CohortEvidence, now: float
    ) -> str:
        on = {b: e for b, e in own.items() if b != 0 and e.samples >= self._min_samples}
        if state.budget not in on:
            return WARMING_UP
        gains = (
            [g.ratio for b in on if self._enough(g := evidence.gain(b, state.budget))] if 0 in cohort.budgets else []
        )
        if gains:
            best_gain = max(gains)
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
        if challenger != state.budget:
            lead = evidence.compare(challenger, state.budget)
            if self._enough(lead) and lead.exceeds(1.0 + self._gate.hysteresis, self._gate.confidence_z):
                self._switch(state, challenger)
                return BETTER_BUDGET
        return BELOW_MIN_GAIN if state.below_since is not None else HOLD

    def _schedule_probe(self, cohort: CohortPolicy, state: _CohortState, own: dict[int, Estimate]) -> None:
        """Probe the incumbent's neighbours and off in turn, the least-measured first."""
        budgets = cohort.budgets
        i = budgets.index(state.budget)
        targets = [b for b in budgets[max(0, i - 1) : i + 2] if b != state.budget]
        if 0 in budgets and 0 not in targets:
            targets.insert(0, 0)  # gain over off needs off measured in the same window
        if not targets:
            self._start_probe(state, None)
            return
        if state.probe in targets and not self._turn_over(state, self._min_samples):
            return
        self._start_probe(state, min(targets, key=lambda b: own[b].samples if b in own else 0))

    def _while_off(self, cohort: CohortPolicy, state: _CohortState, evidence: _CohortEvidence, now: float) -> str:
        """Re-probe episodes: start at reprobe_budget; re-enable once a probed budget clears
        min_gain x (1 + hysteresis); climb to the next candidate while the probe at least breaks
        even (a small tree can be marginal where a larger one pays); else back off."""
        if self._gate.reprobe_budget not in cohort.budgets:  # only 0 listed: off for good
            return OFF
        if state.probe is None:
            if now < state.reprobe_at:
                return OFF
            self._start_probe(state, self._gate.reprobe_budget)
            return REPROBING
        z = self._gate.confidence_z
        gain = evidence.compare(state.probe, 0)
        if self._enough(gain) and gain.exceeds(self._gate.min_gain * (1.0 + self._gate.hysteresis), z):
            self._switch(state, state.probe)
            state.reprobe_failures = 0
            return REENABLE
        loss = evidence.compare(0, state.probe)
        hurts = self._enough(loss) and loss.exceeds(1.0 + self._gate.hysteresis, z)
        if not hurts and not self._turn_over(state, 2 * self._min_samples):
            return REPROBING
        larger = [b for b in cohort.budgets if b > state.probe]
        if not hurts and gain is not None and gain.ratio >= 1.0 and larger:
            self._start_probe(state, larger[0])
            return REPROBE_CLIMB
        self._start_probe(state, None)
        state.reprobe_failures += 1
        pause = self._gate.dwell_s * 2**state.reprobe_failures
        state.reprobe_at = now + min(pause, self._gate.reprobe_backoff_max_s)
        return REPROBE_FAILED


class _CohortEvidence:
    """One cohort's slice of the estimator: estimates by budget and paired comparisons."""

    def __init__(self, cohort: str, estimates: dict[tuple[str, int], Estimate], estimator: GoodputEstimator):
        self._cohort = cohort
        self._estimates = estimates
        self._estimator = estimator

    def estimate(self, budget: int) -> Estimate | None:
        return self._estimates.get((self._cohort, budget))

    def is_new(self, estimate: Estimate | None) -> bool:
        """Whether the latest interval added a sample to this estimate."""
        return estimate is not None and estimate.latest == self._estimator.updated_at

    def compare(self, budget: int, against: int) -> Comparison | None:
        return self._estimator.compare((self._cohort, budget), (self._cohort, against))

    def gain(self, budget: int, via: int) -> Comparison | None:
        """Gain of `budget` over off: paired directly when they shared intervals, else chained
        through `via` (the incumbent), since only one probe runs at a time: (b/via) x (via/off)."""
        direct = self.compare(budget, 0)
        if via in (0, budget):
            return direct
        first, second = self.compare(budget, via), self.compare(via, 0)
        if first is None or second is None:
            return direct
        if direct is not None and direct.samples >= min(first.samples, second.samples):
            return direct
        return Comparison(
            first.ratio * second.ratio,
            math.hypot(first.log_stderr, second.log_stderr),
            min(first.samples, second.samples),
        )

    def rows(self, own: dict[int, Estimate], incumbent: int) -> tuple[BudgetEvidence, ...]:
        rows = []
        for budget in sorted(own):
            e = own[budget]
            gain = self.gain(budget, incumbent) if budget != 0 else None
            rows.append(
                BudgetEvidence(
                    budget, e.goodput, e.stderr, e.samples, gain.ratio if gain else None, gain.stderr if gain else None
                )
            )
        return tuple(rows)
