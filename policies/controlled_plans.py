"""Each step's plan as an engine runs it: the table's plan, run native where the same-allocation control says.

Both engines ask this each step, SGLang's worker (through adapter.policy.PolicyControl, which adds pushes
and metrics) and the reference engine's worker (serving/engine_worker.py): `step_plan` before the step,
`served` after it, `interrupted` when anything but a decode step ran (a prefill). In a cohort whose plan
speculates, the control (policies/same_allocation.py) may replace it with budget 0: a native step, whose
draft context the engine keeps so speculation can resume. A step whose batch holds a seeded sampled
request runs the table's plan, unmeasured: its tokens depend on the trees (one uniform per node from its
generator), so a native block would change what the seed gives.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.runtime import ActivePolicy, StepPlan
from policies.same_allocation import NATIVE, SameAllocationControl, ServedRounds


class ControlledPlans:
    """`on_state`: called with `state()` whenever a block of the control closes (its state then changes)."""

    def __init__(self, active: ActivePolicy, on_state: Callable[[dict], None] | None = None) -> None:
        self.active = active
        policy = active.policy
        same = policy.same_allocation
        self.control = SameAllocationControl(same, [c.name for c in policy.cohorts]) if same.enabled else None
        self._on_state = on_state
        self._rounds = ServedRounds()
        self._controlled: str | None = None  # the cohort of the step planned last, if the control chose its mode

    def step_plan(self, batch_size: int, now: float, seeded: bool = False) -> StepPlan:
        """The plan for the next step of `batch_size` requests (`now`: the table's clock, for push TTLs)."""
        plan = self.active.step_plan(batch_size, now)
        controlled = self.control is not None and plan.budget > 0 and not seeded
        self._controlled = plan.cohort if controlled else None
        if self._controlled is None:
            return plan
        closed = self.control.closed_blocks
        mode = self.control.mode(plan.cohort)
        if self.control.closed_blocks != closed and self._on_state is not None:
            self._on_state(self.control.state())
        return plan._replace(budget=0) if mode == NATIVE else plan

    def served(self, batch_size: int, tokens: int, now: float, started: float | None = None) -> None:
        """The step just planned served `tokens` tokens to `batch_size` requests; it began at `started` and
        ended at `now` (a monotonic clock)."""
        seconds = self._rounds.served(now, started)
        if self._controlled is not None:
            self.control.observe(self._controlled, batch_size, tokens, seconds)

    def interrupted(self) -> None:
        """Something other than a decode step ran (a prefill): the next step's interval is not its own."""
        self._rounds.interrupted()

    def state(self) -> dict | None:
        """Each cohort's mode and evidence (None with the control switched off)."""
        return None if self.control is None else self.control.state()
