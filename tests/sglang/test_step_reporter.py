"""adapter/step_reporter.py: a GPU step's clock is read without stalling the step (timing events, read a
step later or between steps), what the accepted paths teach is learned at once, and a CPU step's clock
is read as it finishes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from policies import StepPlan
from sglang_jetspec.adapter.step_reporter import StepReporter
from sglang_jetspec.core.step_clock import PHASE_ENDS, Drafted
from sglang_jetspec.core.tree import root_only_tree
from sglang_jetspec.core.tree_drafting import DraftTiming
from tests.device_events import fake_device_events

PLAN = StepPlan("bs1", budget=8, draft_rounds=0, tree_width=0, tree_sizing="adaptive")


class Learners:
    """What the reporter teaches, in order: the drafted step of each path, the verify seconds of each reading."""

    def __init__(self) -> None:
        self.paths, self.verify_s = [], []

    def observe_paths(self, drafted, results) -> None:
        self.paths.append(drafted)

    def observe_timings(self, clock, drafted) -> None:
        self.verify_s.append(round(clock.verify_s, 6))


class Metrics:
    def __init__(self) -> None:
        self.records = []

    def record_step(self, cohort, record) -> None:
        self.records.append((cohort, round(record.verify_s, 6)))


def _step(reporter: StepReporter, events, verify_ms: float) -> Drafted:
    """One step whose verify the device runs in `verify_ms` (its other phases take no device time)."""
    clock = reporter.start(PLAN)
    for phase in PHASE_ENDS:
        if phase == "verified":
            events.device_ms += verify_ms
        clock.mark(phase)
    drafted = Drafted([root_only_tree(3)], 1, DraftTiming([], 0.0), adaptive=True)
    reporter.finish(clock, PLAN, drafted, SimpleNamespace(results=None, row_counts=[1]), [SimpleNamespace(rid="r")])
    return drafted


def test_a_gpu_steps_clock_is_read_after_a_later_sync_and_the_step_never_waits(monkeypatch):
    events = fake_device_events(monkeypatch)  # torch.cuda.synchronize raises: no step may wait for its clock
    learners, metrics = Learners(), Metrics()
    reporter = StepReporter(metrics, traces=False, learners=learners, device="cuda:0")
    first = _step(reporter, events, verify_ms=40.0)
    assert learners.paths == [first] and learners.verify_s == [] and metrics.records == []
    second = _step(reporter, events, verify_ms=30.0)
    assert learners.paths == [first, second]
    assert learners.verify_s == [0.040] and metrics.records == [("bs1", 0.040)]  # the device's seconds
    reporter.flush()  # between steps (the worker's refresh_idle)
    assert learners.verify_s == [0.040, 0.030] and metrics.records[-1] == ("bs1", 0.030)
    reporter.flush()
    assert len(learners.verify_s) == 2  # read once
    assert "wait" not in events.log  # the device had passed every event when it was read


def test_a_cpu_steps_clock_is_read_as_the_step_finishes(monkeypatch):
    events = fake_device_events(monkeypatch)
    learners = Learners()
    reporter = StepReporter(None, traces=False, learners=learners, device="cpu")
    _step(reporter, events, verify_ms=40.0)
    assert len(learners.paths) == 1 and len(learners.verify_s) == 1
    assert learners.verify_s[0] == pytest.approx(0.0, abs=0.01)  # the host's readings: nothing ran
    assert events.log == []  # no events on a CPU
