"""The engine thread of the reference server: the only thread that touches the engine.

Continuous batching: between steps it admits queued requests while the running batch has room,
asks the policy for (cohort, budget, draft rounds, tree width, drafter) for the batch about to
step, runs one verify step, records its telemetry and resolves the futures of the requests that
finished, so requests join and leave mid-batch. A failing step fails the requests of that batch
and the thread goes on with a fresh batch: one bad step never hangs the waiting HTTP handlers or
stops the server.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import SpanContext, Tracer

from policies.controlled_plans import ControlledPlans

from ..core.prompt_lookup import LookupMerge
from ..observability.metrics import JetspecMetrics
from ..observability.tracing import STEP_SPAN, WORKER_TRACER, record_step_phases, step_links
from ..reference.engine import ReferenceEngine, Request, RequestOutput, RunningBatch

if TYPE_CHECKING:
    from .shadow_hook import EngineTee

log = logging.getLogger(__name__)


class ServerClosing(RuntimeError):
    """The request was refused or cut off because the server is shutting down."""


class EngineWorker:
    def __init__(
        self,
        engine: ReferenceEngine,
        plans: ControlledPlans,
        metrics: JetspecMetrics,
        clock: Callable[[], float] = time.time,
        idle_poll_s: float = 0.05,
        tracer: Tracer | None = None,
        shadow: EngineTee | None = None,
    ):
        self._engine = engine
        self._shadow = shadow  # tees a sampled share of finished requests to the shadow spool
        self._tracer = tracer if tracer is not None else trace.get_tracer(WORKER_TRACER)
        self._plans = plans  # the table's plans, native where the same-allocation control says
        self._hybrid = LookupMerge.from_policy(plans.active.policy.lookup)  # for cohorts whose drafter is hybrid
        self._metrics = metrics
        self._clock = clock
        self._idle_poll_s = idle_poll_s
        # Each request travels with the span context of the caller (its request span), so the
        # steps that advance it can link to it.
        self._queue: queue.Queue[tuple[Request, Future, SpanContext]] = queue.Queue()
        self._span_contexts: dict[str, SpanContext] = {}
        # Closing and submitting share a lock: once closing is set nothing more is queued, so the
        # thread's final sweep of the queue resolves every future.
        self._submit_lock = threading.Lock()
        self._closing = threading.Event()  # refuse new requests, finish queued and running ones
        self._stop = threading.Event()  # leave now, failing whatever is left
        self._thread = threading.Thread(target=self._run, name="jetspec-engine", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request) -> Future[RequestOutput]:
        """Queue a request; its future resolves to the output or to the exception that failed it."""
        future: Future[RequestOutput] = Future()
        with self._submit_lock:
            if self._closing.is_set():
                raise ServerClosing("the server is shutting down -- send the request to another replica")
            self._queue.put((request, future, trace.get_current_span().get_span_context()))
        return future

    def stop(self, drain_timeout_s: float) -> None:
        """Refuse new requests, let queued and running ones finish for up to `drain_timeout_s`,
        then fail the rest with ServerClosing."""
        with self._submit_lock:
            self._closing.set()
        self._thread.join(drain_timeout_s)
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        batch = self._engine.start_batch()
        running: dict[str, Future[RequestOutput]] = {}
        try:
            while not self._stop.is_set():
                try:
                    self._admit(batch, running)
                    if len(batch):
                        self._step(batch, running)
                    elif self._closing.is_set() and self._queue.empty():
                        return  # drained
                except Exception as exc:  # the batch's state is unknown now: fail it, start afresh
                    log.exception("engine step failed; failing the %d running requests", len(running))
                    self._fail(running.values(), exc)
                    running.clear()
                    self._span_contexts.clear()
                    if self._shadow:
                        self._shadow.clear()
                    batch = self._engine.start_batch()
        finally:
            leftover = ServerClosing("the server shut down before the request finished")
            self._fail(running.values(), leftover)
            while not self._queue.empty():
                self._fail([self._queue.get_nowait()[1]], leftover)
            self._span_contexts.clear()

    def _admit(self, batch: RunningBatch, running: dict[str, Future[RequestOutput]]) -> None:
        while batch.has_room():
            try:
                # Idle: wait briefly for work (and notice stop/close); busy: never delay the next step.
                request, future, span_context = (
                    self._queue.get_nowait() if len(batch) else self._queue.get(timeout=self._idle_poll_s)
                )
            except queue.Empty:
                return
            if self._shadow:
                self._shadow.admitted(request, self._clock())
            self._plans.interrupted()  # the next decode step waited for this prefill
            try:
                finished = batch.admit(request)
            except Exception as exc:  # a failed prefill sinks only its own request
                log.exception("prefill of request %s failed", request.request_id)
                future.set_exception(exc)
                continue
            if finished is None:
                running[request.request_id] = future
                self._span_contexts[request.request_id] = span_context
            else:
                if self._shadow:
                    self._shadow.finished(request, finished, self._clock())
                future.set_result(finished)

    def _step(self, batch: RunningBatch, running: dict[str, Future[RequestOutput]]) -> None:
        # the reference engine keeps every request's draft context whatever the plan (keep_draft_context
        # is for engines whose context memory matters: the SGLang worker)
        started = time.monotonic()
        seeded = any(lane.request.params.seed is not None and not lane.request.params.greedy for lane in batch.lanes)
        plan = self._plans.step_plan(len(batch), self._clock(), seeded)
        cohort, budget = plan.cohort, plan.budget
        links = step_links([self._span_contexts[lane.request.request_id] for lane in batch.lanes])
        if self._shadow:
            self._shadow.stepped([lane.request for lane in batch.lanes], budget)
        with self._tracer.start_as_current_span(STEP_SPAN, links=links) as span:
            record, finished = batch.step(
                budget,
                plan.draft_rounds,
                plan.tree_width or None,
                self._hybrid if plan.drafter == "hybrid" else None,
                plan.tree_sizing,
                "draw" if plan.sampled_children == "drawn" else None,
            )
            record_step_phases(self._tracer, span, cohort, record)
        self._plans.served(record.batch_size, record.committed_tokens, time.monotonic(), started)
        self._metrics.record_step(cohort, record)
        for request, output in finished:
            self._span_contexts.pop(request.request_id)
            if self._shadow:
                self._shadow.finished(request, output, self._clock())
            running.pop(request.request_id).set_result(output)

    @staticmethod
    def _fail(futures, exc: BaseException) -> None:
        for future in futures:
            future.set_exception(exc)
