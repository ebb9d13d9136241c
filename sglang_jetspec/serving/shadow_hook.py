"""Glue between the reference server's engine thread and the tee (worker side, not the checker).

The engine worker reports admissions, steps and finished requests; this keeps each running
request's admission time and per-step budgets and, for the sampled share, offers a ShadowRecord.
Every call is O(batch) dictionary work on the engine thread; spooling happens on the tee's thread.
"""

from __future__ import annotations

from ..spool.record import RecordSampling, ShadowRecord, SpecStats
from ..spool.tee import ShadowTee


class EngineTee:
    def __init__(self, tee: ShadowTee, model: str, head: str = ""):
        self.tee = tee
        self._model, self._head = model, head
        self._started: dict[str, float] = {}
        self._budgets: dict[str, list[int]] = {}

    def admitted(self, request, now: float) -> None:
        self._started[request.request_id] = now
        self._budgets[request.request_id] = []

    def stepped(self, requests, budget: int) -> None:
        for request in requests:
            self._budgets[request.request_id].append(budget)

    def finished(self, request, output, now: float) -> None:
        """`request`: the engine's Request; `output`: its RequestOutput."""
        started = self._started.pop(request.request_id, now)
        budgets = self._budgets.pop(request.request_id, [])
        if not self.tee.sampled():
            return
        self.tee.offer(
            ShadowRecord(
                request_id=request.request_id,
                model=self._model,
                head=self._head,
                prompt_ids=list(request.prompt_ids),
                output_ids=list(output.output_ids),
                sampling=RecordSampling.of(request.params),
                finish_reason=output.finish_reason,
                spec=SpecStats(budgets=budgets, accept_lengths=list(output.accept_lengths)),
                started_at=started,
                finished_at=now,
            )
        )

    def clear(self) -> None:
        """The engine failed its batch: forget the requests that will never finish."""
        self._started.clear()
        self._budgets.clear()
