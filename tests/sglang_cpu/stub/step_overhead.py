"""Per-decode-step overhead probe in the scheduler process (test-only; bench/step_overhead.py reads it).

With ``JETSPEC_TEST_STEP_OVERHEAD=<file>`` set (and the stand-in switched on), ``sitecustomize`` calls
``install`` once SGLang's scheduler module is imported. Every decode batch's ``Scheduler.run_batch`` then
appends one JSON line to ``<file>``. Odd steps run under ``harness.step_probe.StepProbe`` with the target
model's forward (``ModelRunner.forward``) paused, and record device ops and host syncs outside it (with
the call sites of the syncs and the ops by name), and the milliseconds outside the forward spent inside
those ops and beside them, the latter split into the probe's own cost (its handlers' timed bookkeeping and
torch's mode machinery, ``machinery_seconds`` a handler call, measured here once) and the host's own work,
which a GPU step still pays while its kernels run; JETSPEC's step-clock marks split that work and the ops'
time by phase. Even steps run unprobed and record wall milliseconds: the worker's whole step, the target's
forward, and for JETSPEC its phases as its own step clock read them. A probed step is several times
slower, so wall timings come only from unprobed steps.

Probed steps also count the device ops inside the head's drafting pass (``HeadDrafter.propose``): on a GPU
with decode graphs that pass replays as one graph (core/draft_graphs.py), so the bench can say what the step
launches then.

The batch's ``*_cpu`` tensors and the JETSPEC worker's host-side learners and lookup stores are marked
host data before a probed step. Each call of the sgl-kernel stand-in (stub/sgl_kernel: PyTorch where a GPU
launches one kernel) counts as one device op, its insides as nothing.
Nothing here runs in a normal install.
"""

from __future__ import annotations

import gc
import json
import os
import time

OVERHEAD_ENV = "JETSPEC_TEST_STEP_OVERHEAD"
TOP_OPS = 25


class _Probing:
    def __init__(self, path: str) -> None:
        self.path = path
        self.steps = 0
        self.probe = None  # the running step's StepProbe (probed steps only)
        self.forward_s = 0.0
        self.clock = None  # the JETSPEC step clock's readings, when the worker reports one
        self.draft_pass_ops = 0  # device ops inside HeadDrafter.propose in the running probed step
        self.draft_pass_kernels = 0  # ... and those of them that are not views
        self.machinery_s: float | None = None  # harness.step_probe.machinery_seconds, once measured
        self.started = 0.0  # perf_counter at the running probed step's start
        self.phase_host_s: dict[str, float] = {}  # host work of the running probed step by phase, so far
        self.phase_op_s: dict[str, float] = {}  # ... and its device ops' seconds


def _phases(clock) -> dict[str, float]:
    """Milliseconds of each phase the JETSPEC step clock marked (core.step_clock.PHASE_ENDS, in order)."""
    from sglang_jetspec.core.step_clock import PHASE_ENDS

    order = ["start", *PHASE_ENDS]
    return {f"{b}_ms": clock.seconds(a, b) * 1e3 for a, b in zip(order, order[1:])}


def _host_work_s(state: _Probing) -> float:
    """Seconds of the running probed step so far that were the host's own work: its wall time less the
    target's forward, the device ops' time and the probe's own cost."""
    counts = state.probe.counts
    wall = time.perf_counter() - state.started
    return wall - state.forward_s - counts.device_op_s - counts.probe_cost_s(state.machinery_s)


def _file_phase(state: _Probing, phase: str) -> None:
    """The host work and device-op time since the previous phase's end, filed under `phase`."""
    state.phase_host_s[phase] = _host_work_s(state) - sum(state.phase_host_s.values())
    state.phase_op_s[phase] = state.probe.counts.device_op_s - sum(state.phase_op_s.values())


def _split_host_work_by_phase(state: _Probing) -> None:
    """Each JETSPEC step-clock mark of a probed step files the host work and device-op time since the
    previous mark under its phase (core.step_clock.PHASE_ENDS) in state.phase_host_s and phase_op_s."""
    from sglang_jetspec.core.step_clock import StepClock

    mark = StepClock.mark

    def splitting(self, phase_end: str) -> None:
        if state.probe is not None:
            _file_phase(state, phase_end)
        return mark(self, phase_end)

    StepClock.mark = splitting


def _wrap_standin_kernels(state: _Probing) -> None:
    """Each stand-in kernel, wherever SGLang bound it by name, counted as one device op."""
    import sys

    import sgl_kernel

    for name in sgl_kernel.__all__:
        original = getattr(sgl_kernel, name)

        def counted(*args, __original=original, __name=name, **kwargs):
            if state.probe is None:
                return __original(*args, **kwargs)
            with state.probe.kernel(f"standin:{__name}"):
                return __original(*args, **kwargs)

        for module in [sgl_kernel, *list(sys.modules.values())]:
            if getattr(module, name, None) is original:
                setattr(module, name, counted)


def _count_draft_pass(state: _Probing) -> None:
    """Device ops (and kernel ops) inside each HeadDrafter.propose of a probed step, into
    state.draft_pass_ops (and state.draft_pass_kernels)."""
    from sglang_jetspec.core.head_drafter import HeadDrafter

    propose = HeadDrafter.propose

    def counted(self, *args, **kwargs):
        probe = state.probe
        ops, kernels = (probe.counts.device_ops, probe.counts.kernel_ops) if probe is not None else (0, 0)
        try:
            return propose(self, *args, **kwargs)
        finally:
            if probe is not None:
                state.draft_pass_ops += probe.counts.device_ops - ops
                state.draft_pass_kernels += probe.counts.kernel_ops - kernels

    HeadDrafter.propose = counted


def _host_state(worker) -> list:
    """What the JETSPEC worker keeps on the host between steps (None for other workers)."""
    drafting = getattr(worker, "drafting", None)
    return [] if drafting is None else [worker.learners, drafting.hybrid, drafting.drafter.draft_vocab_host]


def install(scheduler_module) -> None:
    path = os.environ.get(OVERHEAD_ENV, "").strip()
    if not path:
        return
    from sglang.srt.model_executor.model_runner import ModelRunner

    from harness.step_probe import StepProbe, machinery_seconds

    state = _Probing(path)
    forward = ModelRunner.forward

    def paused_forward(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            if state.probe is None:
                return forward(self, *args, **kwargs)
            with state.probe.paused():
                return forward(self, *args, **kwargs)
        finally:
            state.forward_s += time.perf_counter() - start

    ModelRunner.forward = paused_forward
    _wrap_standin_kernels(state)
    _count_draft_pass(state)
    _split_host_work_by_phase(state)
    cls = scheduler_module.Scheduler
    run_batch = cls.run_batch

    def hook_reporter(worker) -> None:
        reporter = getattr(worker, "reporter", None)
        if reporter is None or getattr(reporter, "_overhead_hooked", False):
            return
        finish = reporter.finish

        def reading_finish(clock, *args, **kwargs):
            state.clock = clock
            return finish(clock, *args, **kwargs)

        reporter.finish = reading_finish
        reporter._overhead_hooked = True

    def probed_run_batch(self, batch, *args, **kwargs):
        if not batch.forward_mode.is_decode():
            return run_batch(self, batch, *args, **kwargs)
        hook_reporter(self.model_worker)
        state.steps += 1
        counted = state.steps % 2 == 1
        state.forward_s, state.clock, state.draft_pass_ops, state.draft_pass_kernels = 0.0, None, 0, 0
        record = {"batch_size": len(batch.reqs), "counted": counted}
        if counted:  # the probe's set-up comes before the step's clock starts
            if state.machinery_s is None:
                state.machinery_s = machinery_seconds()
            probe = StepProbe(op_sites=True)
            probe.mark_host([value for name, value in vars(batch).items() if name.endswith("_cpu")])
            for held in _host_state(self.model_worker):
                probe.mark_host_within(held)
        start = state.started = time.perf_counter()
        state.phase_host_s, state.phase_op_s = {}, {}
        if counted:
            state.probe = probe
            gc.disable()  # the probe's many small objects would start collections a bare step does not
            try:
                with probe:
                    result = run_batch(self, batch, *args, **kwargs)
                    if state.phase_host_s:  # the rest after the last mark: the reporter, SGLang's bookkeeping
                        _file_phase(state, "after")
            finally:
                state.probe = None
                gc.enable()
            counts = probe.take()
            outside_ms = (time.perf_counter() - start - state.forward_s) * 1e3
            beyond_ms = outside_ms - counts.device_op_s * 1e3
            probe_ms = counts.probe_cost_s(state.machinery_s) * 1e3
            record["host_work_phases_ms"] = {phase: seconds * 1e3 for phase, seconds in state.phase_host_s.items()}
            record["device_op_phases_ms"] = {phase: seconds * 1e3 for phase, seconds in state.phase_op_s.items()}
            record.update(
                device_op_ms=counts.device_op_s * 1e3,
                host_beyond_ops_ms=beyond_ms,
                probe_ms=probe_ms,
                host_work_ms=beyond_ms - probe_ms,
                ops_outside_forward=counts.device_ops,
                kernels_outside_forward=counts.kernel_ops,
                host_syncs=counts.host_syncs,
                host_calls_outside_forward=counts.host_calls,
                draft_pass_ops=state.draft_pass_ops,
                draft_pass_kernels=state.draft_pass_kernels,
                sync_sites=dict(counts.sync_sites),
                top_ops=dict(counts.op_names.most_common(TOP_OPS)),
                op_sites=dict(counts.op_sites.most_common(TOP_OPS)),
            )
        else:
            result = run_batch(self, batch, *args, **kwargs)
            wall_ms = (time.perf_counter() - start) * 1e3
            record.update(step_ms=wall_ms, forward_ms=state.forward_s * 1e3)
            record["host_ms"] = wall_ms - record["forward_ms"]
            if state.clock is not None:
                record["phases_ms"] = _phases(state.clock)
        with open(state.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        return result

    cls.run_batch = probed_run_batch
