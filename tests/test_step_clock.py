"""core/step_clock.py: the phase clock both engines mark, the StepRecord it makes, and what adaptive
sizing learns from a step (which learner observes what, and when)."""

from __future__ import annotations

import pytest
import torch

from sglang_jetspec.core.acceptance import AcceptResult
from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.step_clock import PHASE_ENDS, Drafted, SizingLearners, StepClock
from sglang_jetspec.core.tree import DraftTree, root_only_tree
from sglang_jetspec.core.tree_drafting import DraftTiming
from sglang_jetspec.core.tree_sizing import TreeSizer
from tests.device_events import fake_device_events


def _clock(readings: dict[str, float], settle_on=None) -> StepClock:
    clock = StepClock(settle_on)
    clock._at = {"start": 0.0, **readings}
    return clock


def _chain(tokens: list[int]) -> DraftTree:
    """A tree that is one path, each node its parent's likeliest child at probability 0.5."""
    n = len(tokens)
    depth = torch.arange(n)
    return DraftTree(torch.tensor(tokens), depth - 1, depth, torch.zeros(n, dtype=torch.long), depth * -0.69)


def _drafted(sizes=(3, 1), **flags) -> Drafted:
    trees = [_chain(list(range(n))) for n in sizes]
    return Drafted(trees, max(sizes), DraftTiming([0.010, 0.002], 0.004), **flags)


READINGS = {"drafted": 0.020, "bound": 0.025, "verified": 0.065, "accepted": 0.070, "committed": 0.072}


def test_a_record_splits_the_step_into_its_phases():
    record = _clock(READINGS).record(_drafted(), budget=8, accept_lengths=[2, 1])
    assert (record.batch_size, record.budget, record.committed_tokens, record.verified_nodes) == (2, 8, 3, 4)
    assert record.draft_s == pytest.approx(0.012) and record.draft_round_s == [0.010, 0.002]
    assert record.tree_s == pytest.approx(0.025 - 0.012)  # all but the head's seconds before the verify
    assert record.verify_s == pytest.approx(0.040) and record.accept_s == pytest.approx(0.007)
    assert record.commit_s == pytest.approx(0.002) and record.wall_s == pytest.approx(0.072)
    assert record.draft_s + record.tree_s + record.verify_s + record.accept_s == pytest.approx(record.wall_s)


def test_a_finished_request_commits_fewer_tokens_than_it_accepted():
    record = _clock(READINGS).record(_drafted(), 8, [3, 1], committed_tokens=2, rank1_gaps=None)
    assert record.accept_lengths == [3, 1] and record.committed_tokens == 2


def test_marks_are_the_named_phase_ends_in_order_and_a_device_name_settles():
    clock = StepClock("cpu")  # SGLang hands the worker its device as a string
    assert clock.settled and clock.settle_on == torch.device("cpu")
    for phase in PHASE_ENDS:
        clock.mark(phase)
    assert clock.seconds("start", "committed") >= clock.seconds("bound", "verified") >= 0
    with pytest.raises(ValueError, match="one of drafted, bound"):
        clock.mark("verify")
    assert not StepClock().settled


@pytest.mark.parametrize(
    "settled, adaptive, sized, expect",
    [
        (False, False, False, (False, False, False)),  # nobody reads the clock: nothing is learned from it
        (True, False, False, (True, False, False)),  # metrics on, fixed sizing: the verify cost still learns
        (True, True, False, (True, False, True)),  # an adaptive probe step: cost and overhead, no calibration
        (True, True, True, (True, True, True)),
    ],
)
def test_learners_observe_what_the_step_can_tell_them(settled, adaptive, sized, expect):
    sizer = TreeSizer()
    tree = _chain([5, 6, 7])
    sizer._kept = [tree]  # as TreeSizer.size leaves it after cutting this step's trees
    learners = SizingLearners(sizer, LearnedVerifyCost())
    drafted = Drafted([tree, root_only_tree(9)], 3, DraftTiming([], 0.0), adaptive=adaptive, sized=sized)
    results = [AcceptResult(path=[0, 1], tokens=[6, 8]), AcceptResult(path=[0], tokens=[3])]
    learners.observe(_clock(READINGS, "cpu" if settled else None), drafted, results)
    calibrated = sizer.calibration.factors != TreeSizer().calibration.factors
    learned = (learners.verify_costs.by_rows.counts == [6], calibrated, bool(sizer.overheads))
    assert learned == expect
    if settled:
        own = learners.verify_costs.by_lanes[2]  # 2 lanes of 3 nodes, the verify's seconds
        assert own.counts == [3] and own.seconds == [pytest.approx(0.040)]
    if adaptive:  # binding the verify's inputs (5 ms) and acceptance and commit (7 ms)
        assert sizer.overheads[2].mean_s == {True: pytest.approx(0.012)}  # the 2 lanes' own


def _clock_at(start: float, readings: dict[str, float]) -> StepClock:
    clock = StepClock("cpu")
    clock._at = {"start": start, **{phase: start + at for phase, at in readings.items()}}
    return clock


def test_learners_time_the_gap_between_steps_but_not_a_prefill_or_a_wait_between_them():
    learners = SizingLearners(TreeSizer(), LearnedVerifyCost())
    adaptive = _drafted(adaptive=True)
    step_s = READINGS["committed"]  # 72 ms a step
    learners.observe(_clock_at(0.0, READINGS), adaptive, [])
    assert learners.sizer.overheads[2].gap_s is None  # the first step has no previous one
    learners.observe(_clock_at(step_s + 0.010, READINGS), adaptive, [])  # 10 ms of scheduler between them
    assert learners.sizer.overheads[2].gap_s == pytest.approx(0.010)
    # 50 ms between them is more than half a step: a prefill or an idle wait, not counted
    learners.observe(_clock_at(2 * step_s + 0.010 + 0.050, READINGS), adaptive, [])
    assert learners.sizer.overheads[2].gap_s == pytest.approx(0.010)
    # a fixed-sizing step teaches no gap, but the next gap is counted from its end
    learners.observe(_clock_at(3 * step_s + 0.070, READINGS), _drafted(), [])
    learners.observe(_clock_at(4 * step_s + 0.070 + 0.020, READINGS), adaptive, [])
    assert learners.sizer.overheads[2].gap_s == pytest.approx(0.8 * 0.010 + 0.2 * 0.020)
    # what every step pays: the steps' outside seconds (5 ms binding + 7 ms acceptance and commit) + the gap
    assert learners.sizer.overheads[2].every_step_s == pytest.approx(0.012 + 0.012)


@pytest.fixture
def device_events(monkeypatch):
    return fake_device_events(monkeypatch)


def _deferred_step(events, device_readings_ms: dict[str, float]) -> StepClock:
    clock = StepClock("cuda:0", deferred=True)
    for phase in PHASE_ENDS:
        events.device_ms = device_readings_ms[phase]
        clock.mark(phase)
    return clock


def test_a_deferred_clock_records_events_without_waiting_and_reads_the_devices_seconds(device_events):
    clock = _deferred_step(device_events, {p: s * 1e3 for p, s in READINGS.items()})
    assert clock.settled and clock.pending and device_events.log == ["record"] * 6
    with pytest.raises(RuntimeError, match="resolve"):
        clock.seconds("bound", "verified")  # the host's readings would time launches, not the device
    clock.resolve()
    assert not clock.pending and device_events.log == ["record"] * 6  # the device had passed every event
    assert clock.verify_s == pytest.approx(0.040) and clock.seconds("start", "committed") == pytest.approx(0.072)
    assert clock.at("committed") - clock.at("start") == pytest.approx(0.072)


def test_resolving_a_clock_the_device_has_not_reached_waits_on_its_last_event_alone(device_events):
    clock = _deferred_step(device_events, {p: s * 1e3 for p, s in READINGS.items()})
    device_events.reached = False
    clock.resolve()
    assert device_events.log[-1] == "wait" and clock.after_verify_s == pytest.approx(0.007)


def test_an_undeferred_clock_on_a_gpu_waits_at_every_boundary_and_a_cpu_clock_never_defers(device_events):
    with pytest.raises(AssertionError, match="waited"):
        StepClock("cuda:0").mark("drafted")  # the reference engine's: settled by waiting
    cpu = StepClock("cpu", deferred=True)
    cpu.mark("drafted")
    assert not cpu.pending and cpu.seconds("start", "drafted") >= 0
