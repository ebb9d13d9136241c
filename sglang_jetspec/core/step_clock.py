"""One verify step's clock and what it teaches, shared by every engine (the reference engine and the
SGLang worker).

A step runs the same phases in both engines: draft (the head and the trees: `Drafted`), bind (the
verify's inputs: positions, masks, grammar rows), verify (the target's forward and its logits), accept
and commit. The engine marks each boundary on a `StepClock`; the clock's readings make the step's
StepRecord and feed adaptive sizing's learners (`SizingLearners`): the verify cost by lane count, the
accepted paths of sized trees, and what a tree costs after its verify.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .learned_verify_cost import LearnedVerifyCost
from .step_record import StepRecord
from .tree import DraftTree
from .tree_drafting import DraftTiming
from .tree_sizing import TreeSizer

# every boundary an engine marks, in order; "start" is the clock's creation
PHASE_ENDS = ("drafted", "bound", "verified", "accepted", "committed")


@dataclass(frozen=True)
class Drafted:
    """The draft phase's value: each request's tree, the verify rows per request (the longest tree: a
    batched verify pads every request to it), the head's and the tree builder's seconds, whether
    adaptive sizing drove the step (`adaptive`) and cut these trees (`sized`), and the mask of the
    verify rows' logits where requests are constrained (an object with `apply(logits)`, or None)."""

    trees: list[DraftTree]
    num_nodes: int
    timing: DraftTiming
    adaptive: bool = False
    sized: bool = False
    verify_mask: object | None = None


class StepClock:
    """The readings of one step. With `settle_on` a device, each boundary first waits for it: on a GPU
    an unsettled reading measures kernel launches and bills their work to whichever phase syncs next.
    Without it the step never stalls for a clock (nobody reads the timings closely enough to pay).

    `deferred` (the SGLang worker's clock): on an accelerator each boundary records a timing event on the
    device's stream instead of waiting, so the host goes on queuing work and the step keeps only the
    syncs its own data needs; the readings are the device's, read by `resolve` once its work is done (the
    worker's reporter does it a step later, when a later sync has already passed the events). On a CPU
    every op has run when it returns: the host readings are the device's and nothing is deferred."""

    def __init__(self, settle_on: torch.device | str | None = None, deferred: bool = False) -> None:
        self.settle_on = None if settle_on is None else torch.device(settle_on)
        self.start_ns = time.time_ns()
        self._at = {"start": time.perf_counter()}
        on_accelerator = self.settle_on is not None and self.settle_on.type != "cpu"
        self._events: dict | None = None  # boundary -> its recorded event, until resolved
        if deferred and on_accelerator:
            self._new_event = torch.get_device_module(self.settle_on).Event
            self._events = {"start": self._recorded_event()}
        self._waits = on_accelerator and not deferred

    @property
    def settled(self) -> bool:
        return self.settle_on is not None

    @property
    def pending(self) -> bool:
        """Whether the readings wait on the device's events (`resolve` first)."""
        return self._events is not None

    def _recorded_event(self):
        event = self._new_event(enable_timing=True)
        event.record()
        return event

    def mark(self, phase_end: str) -> None:
        if phase_end not in PHASE_ENDS:
            raise ValueError(f"phase end {phase_end!r}: one of {', '.join(PHASE_ENDS)}")
        if self._events is not None:
            self._events[phase_end] = self._recorded_event()
        elif self._waits:
            torch.get_device_module(self.settle_on).synchronize(self.settle_on)
        self._at[phase_end] = time.perf_counter()

    def resolve(self) -> None:
        """Replace the host's readings by the device's: each boundary at the host's start plus the device's
        seconds from the start event to its own. Waits only if the device has not reached the last one."""
        if self._events is None:
            return
        start, last = self._events["start"], list(self._events.values())[-1]
        if not last.query():
            last.synchronize()
        host_start = self._at["start"]
        for boundary, event in self._events.items():
            self._at[boundary] = host_start + start.elapsed_time(event) / 1e3  # elapsed_time: milliseconds
        self._events = None

    def seconds(self, since: str, until: str) -> float:
        if self._events is not None:
            raise RuntimeError("a deferred clock's readings are the device's: resolve() it first")
        return self._at[until] - self._at[since]

    def at(self, boundary: str) -> float:
        """perf_counter() at `boundary` ("start" or a marked phase end)."""
        if self._events is not None:
            raise RuntimeError("a deferred clock's readings are the device's: resolve() it first")
        return self._at[boundary]

    @property
    def verify_s(self) -> float:
        return self.seconds("bound", "verified")

    @property
    def outside_draft_and_verify_s(self) -> float:
        """Binding the verify's inputs, acceptance and commit: what a step costs besides its draft
        (charged by sizing on its own) and its verify forward."""
        return self.seconds("drafted", "bound") + self.after_verify_s

    @property
    def after_verify_s(self) -> float:
        """Acceptance and commit: what a step costs after its verify forward."""
        return self.seconds("verified", "committed")

    def record(
        self, drafted: Drafted, budget: int, accept_lengths: list[int], committed_tokens: int | None = None, **extra
    ) -> StepRecord:
        """The StepRecord of a step whose every phase end is marked. Tree seconds are every second before
        the verify that the head did not spend (planning, trees, masks, the verify's inputs).
        `committed_tokens` defaults to the accept lengths' sum (the reference engine
        passes fewer when a request finished mid-path); `extra`: StepRecord's optional fields."""
        return StepRecord(
            batch_size=len(drafted.trees),
            budget=budget,
            committed_tokens=sum(accept_lengths) if committed_tokens is None else committed_tokens,
            accept_lengths=accept_lengths,
            draft_s=drafted.timing.draft_s,
            tree_s=self.seconds("start", "bound") - drafted.timing.draft_s,
            verify_s=self.verify_s,
            accept_s=self.after_verify_s,
            commit_s=self.seconds("accepted", "committed"),
            wall_s=self.seconds("start", "committed"),
            draft_round_s=list(drafted.timing.round_s),
            verified_nodes=sum(tree.size for tree in drafted.trees),
            **extra,
        )


# A gap between two steps longer than this share of the later step's own seconds held something else (a
# prefill, an idle wait, native steps in between): not the scheduler's turn every step pays.
GAP_SHARE_MAX = 0.5


@dataclass
class SizingLearners:
    """What adaptive sizing learns from an engine's own steps: the verify cost by lane count (from every
    settled step, so a cohort that turns adaptive later finds a curve) and, through the sizer, the
    accepted paths of the trees it cut, the seconds a tree costs after its verify, and the gap between
    consecutive steps."""

    sizer: TreeSizer
    verify_costs: LearnedVerifyCost
    last_end: float | None = None  # perf_counter() at the previous observed step's commit

    def observe(self, clock: StepClock, drafted: Drafted, results: list) -> None:
        """`results`: each request's acceptance (anything with the accepted `path`, root first)."""
        self.observe_paths(drafted, results)
        self.observe_timings(clock, drafted)

    def observe_paths(self, drafted: Drafted, results: list) -> None:
        """What the step's accepted paths teach, right after the step: the sizer's calibration reads the
        trees it cut for this very step."""
        if drafted.sized:
            self.sizer.observe([result.path for result in results])

    def observe_timings(self, clock: StepClock, drafted: Drafted) -> None:
        """What the step's readings teach (a deferred clock resolved first), in the order the steps ran."""
        if clock.settled:
            self.verify_costs.observe(len(drafted.trees), drafted.num_nodes, clock.verify_s)
        if drafted.adaptive:
            overhead = self.sizer.overhead_at(len(drafted.trees))
            overhead.observe(clock.outside_draft_and_verify_s, verified_tree=drafted.num_nodes > 1)
            if self.last_end is not None:
                gap = clock.at("start") - self.last_end
                if 0.0 <= gap <= GAP_SHARE_MAX * clock.seconds("start", "committed"):
                    overhead.observe_gap(gap)
        self.last_end = clock.at("committed")
