"""Everything a decode step reports, in one place, fed by the phases' values: the step's clock (settled
on the device only when someone reads it), its StepRecord to metrics and traces, and what adaptive
sizing learns from it (core.step_clock.SizingLearners).

Metrics and traces come from the drafting rank alone (tensor parallelism: the others would repeat it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from policies import StepPlan
from sglang_jetspec.adapter.step_outputs import StepOutputs
from sglang_jetspec.adapter.worker_observability import step_tracer, trace_step
from sglang_jetspec.core.step_clock import Drafted, SizingLearners, StepClock


@dataclass(frozen=True)
class _Readings:
    """A finished step whose clock the reporter reads once the device has passed it."""

    clock: StepClock
    cohort: str
    budget: int
    drafted: Drafted
    row_counts: list[int]
    rids: list[str]
    tracer: object | None


class StepReporter:
    def __init__(self, metrics, traces: bool, learners: SizingLearners, device: torch.device) -> None:
        """`metrics`: the worker's JetspecMetrics or None; `traces`: this rank may send step spans."""
        self.metrics, self.traces, self.learners, self.device = metrics, traces, learners, device
        self._tracer = None  # the running step's tracer (None: tracing off), looked up once a step
        # steps by verify width, and how many of them carried padding nodes (core.verify_widths): which
        # captured widths a server uses, on /server_info (adapter.internal_state)
        self.steps_by_width: Counter[int] = Counter()
        self.padded_steps = 0
        self._unread: _Readings | None = None  # the last step, while its clock waits on the device

    def start(self, plan: StepPlan) -> StepClock:
        """The clock of a step of `plan`; it times the device when metrics or traces read it, or when the
        step sizes adaptively (sizing learns the verify cost from it). Deferred: on a GPU the step records
        events and never waits for its clock."""
        self._tracer = step_tracer() if self.traces else None
        observed = self.metrics is not None or self._tracer is not None
        return StepClock(self.device if observed or plan.sizes_adaptively else None, deferred=True)

    def finish(self, clock: StepClock, plan: StepPlan, drafted: Drafted, out: StepOutputs, reqs: list) -> None:
        """`reqs`: the step's SGLang requests (a span names them). What the accepted paths teach is learned
        now; what the clock reads, once the device has passed it: now on a CPU, else at the next step's
        finish (after that step's own syncs) or the next idle `flush`."""
        self.learners.observe_paths(drafted, out.results or [])  # None: roots alone, never sized
        self.steps_by_width[drafted.num_nodes] += 1
        self.padded_steps += drafted.num_nodes > max(tree.size for tree in drafted.trees)
        rids = [req.rid for req in reqs] if self._tracer is not None else []
        readings = _Readings(clock, plan.cohort, plan.budget, drafted, out.row_counts, rids, self._tracer)
        self.flush()
        if clock.pending:
            self._unread = readings
        else:
            self._read(readings)

    def flush(self) -> None:
        """Read the last step's clock if it still waits (between steps: its work is done or nearly)."""
        unread, self._unread = self._unread, None
        if unread is not None:
            self._read(unread)

    def _read(self, readings: _Readings) -> None:
        clock = readings.clock
        clock.resolve()
        self.learners.observe_timings(clock, readings.drafted)
        if self.metrics is None and readings.tracer is None:
            return
        record = clock.record(readings.drafted, readings.budget, readings.row_counts)
        if self.metrics is not None:
            self.metrics.record_step(readings.cohort, record)
        if readings.tracer is not None:
            trace_step(readings.tracer, readings.cohort, record, clock.start_ns, readings.rids)

    def verify_widths(self, rungs: tuple[int, ...]) -> dict:
        """The widths a step may verify (`rungs`: none, no padding) and the steps run at each so far."""
        return {
            "rungs": list(rungs),
            "steps_by_width": {str(width): n for width, n in sorted(self.steps_by_width.items())},
            "padded_steps": self.padded_steps,
        }
