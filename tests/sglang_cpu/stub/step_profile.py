"""Scheduler-side step timer for benchmarks on the CPU harness (test-only; bench/sglang_cpu_compare.py).

With ``JETSPEC_TEST_STEP_PROFILE=<file>`` set (and the stand-in switched on), ``sitecustomize`` calls
``install`` once SGLang's scheduler module is imported. Every scheduler iteration that runs a batch is
timed in four parts, summed per forward mode (``decode`` or ``extend``):

* ``pre_s``: receiving requests and building the batch (``ingest_requests`` + ``get_next_batch_to_run``,
  which for decode includes ``prepare_for_decode``'s KV allocation);
* ``run_s``: ``Scheduler.run_batch`` as a whole, of which ``worker_s`` is the model worker's
  ``forward_batch_generation`` (the JETSPEC worker's whole step, or plain SGLang's forward + sample);
* ``post_s``: ``process_batch_result`` (output processing: token bookkeeping, finish checks, streaming).

The sums go to ``<file>`` as JSON when the scheduler goes idle (outside any timed iteration), so a
benchmark reads them between passes and takes differences. Nothing here runs in a normal install.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

PROFILE_ENV = "JETSPEC_TEST_STEP_PROFILE"
FIELDS = ("iterations", "requests", "pre_s", "run_s", "worker_s", "post_s")


class StepProfile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0.0))
        self.iteration_start: float | None = None
        self.pre_end = 0.0
        self.worker_s = 0.0
        self.dirty = False

    def flush(self) -> None:
        if not self.dirty:
            return
        # one temporary file per process: under --tp-size 2 both ranks' schedulers flush (their iterations
        # are the same; the last one written is what a reader gets)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.sums, f)
        os.replace(tmp, self.path)  # a reader never sees a half-written file
        self.dirty = False


def install(scheduler_module) -> None:
    path = os.environ.get(PROFILE_ENV, "").strip()
    if not path:
        return
    profile = StepProfile(path)
    cls = scheduler_module.Scheduler
    ingest, next_batch, run_batch, process = (cls.ingest_requests, cls.get_next_batch_to_run, cls.run_batch,
                                              cls.process_batch_result)
    on_idle = cls.on_idle

    def timed_ingest(self, *args, **kwargs):
        profile.iteration_start = time.perf_counter()
        return ingest(self, *args, **kwargs)

    def timed_next_batch(self, *args, **kwargs):
        plan = next_batch(self, *args, **kwargs)
        profile.pre_end = time.perf_counter()
        return plan

    def timed_run_batch(self, batch, *args, **kwargs):
        worker = self.model_worker
        if not getattr(worker, "_jetspec_step_timed", False):
            forward = worker.forward_batch_generation

            def timed_forward(*a, **kw):
                start = time.perf_counter()
                try:
                    return forward(*a, **kw)
                finally:
                    profile.worker_s += time.perf_counter() - start

            worker.forward_batch_generation = timed_forward
            worker._jetspec_step_timed = True
        profile.worker_s = 0.0
        start = time.perf_counter()
        result = run_batch(self, batch, *args, **kwargs)
        profile.run_s = time.perf_counter() - start
        return result

    def timed_process(self, batch, result):
        start = time.perf_counter()
        out = process(self, batch, result)
        end = time.perf_counter()
        mode = "decode" if batch.forward_mode.is_decode() else "extend" if batch.forward_mode.is_extend() else None
        if mode is not None and profile.iteration_start is not None:
            s = profile.sums[mode]
            s["iterations"] += 1
            s["requests"] += len(batch.reqs)
            s["pre_s"] += profile.pre_end - profile.iteration_start
            s["run_s"] += profile.run_s
            s["worker_s"] += profile.worker_s
            s["post_s"] += end - start
            profile.dirty = True
        return out

    def flushing_on_idle(self, *args, **kwargs):
        profile.flush()
        return on_idle(self, *args, **kwargs)

    cls.ingest_requests, cls.get_next_batch_to_run = timed_ingest, timed_next_batch
    cls.run_batch, cls.process_batch_result, cls.on_idle = timed_run_batch, timed_process, flushing_on_idle
