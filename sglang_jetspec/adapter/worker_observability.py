"""The SGLang worker's telemetry and shadow tee (DESIGN.md telemetry and shadow contracts).

- Metrics: `telemetry.JetspecMetrics`, the same `jetspec_*` counters the reference server exports.
  SGLang's scheduler processes inherit PROMETHEUS_MULTIPROC_DIR from its launcher when
  `--enable-metrics` is on, so prometheus_client (imported only then, after the variable is set)
  writes the values to that directory and SGLang's /metrics merges them with its own.
- Traces: with SGLang's `--enable-trace`, each verify step is a `jetspec.step` span with its draft /
  tree / verify / accept / commit children (`tracing.record_step_phases`, the reference server's
  layout), sent through the tracer provider SGLang installed in the scheduler process.
- Shadow: with JETSPEC_SHADOW_SPOOL naming a directory, policy `shadow.sample_rate` of the requests
  that finish naturally are spooled as ShadowRecords (shadow/README.md) for `jetspec shadow run`.
"""

from __future__ import annotations

import os
import time

from sglang_jetspec.adapter.request_sampling import shadow_blind_spot
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.core.step_record import StepRecord

SHADOW_SPOOL_ENV = "JETSPEC_SHADOW_SPOOL"

# SGLang finish-reason classes (managers/schedule_batch.py) -> the shadow record's finish_reason.
# Aborts are absent on purpose: an aborted request says nothing about the target distribution.
FINISH_REASONS = {
    "FINISH_MATCHED_TOKEN": "eos",
    "FINISH_LENGTH": "length",
    "FINISH_MATCHED_STR": "stop",
    "FINISHED_MATCHED_REGEX": "stop",
}


def worker_metrics(enable_metrics: bool):
    """JetspecMetrics on a private registry (values go to the multiprocess directory), or None."""
    if not enable_metrics:
        return None
    from prometheus_client import CollectorRegistry

    from sglang_jetspec.observability.metrics import JetspecMetrics

    return JetspecMetrics(CollectorRegistry())


def step_tracer():
    """The tracer for step spans when SGLang's --enable-trace installed this process's tracer
    provider (process_tracing_init), else None: with tracing off a step costs no span work."""
    from sglang.srt.observability.trace import get_global_tracing_enabled

    if not get_global_tracing_enabled():
        return None
    from opentelemetry import trace

    from sglang_jetspec.observability.tracing import WORKER_TRACER

    return trace.get_tracer(WORKER_TRACER)


def trace_step(tracer, cohort: str, record: StepRecord, start_ns: int, request_ids: list[str]) -> None:
    """One verify step as a `jetspec.step` span (started at `start_ns`, lasting record.wall_s) with its
    phase children. SGLang keeps its request spans in private trace contexts, so the step names the
    requests it advanced instead of linking to them."""
    from sglang_jetspec.observability.tracing import STEP_SPAN, record_step_phases

    span = tracer.start_span(STEP_SPAN, start_time=start_ns, attributes={"jetspec.request_ids": request_ids})
    record_step_phases(tracer, span, cohort, record)
    span.end(end_time=start_ns + round(record.wall_s * 1e9))


class WorkerShadow:
    """Offers finished requests to a ShadowTee; built only when JETSPEC_SHADOW_SPOOL is set. `grammar`: the
    server's xgrammar compile options (`xgrammar_options`), None when its grammar backend is another one."""

    def __init__(self, tee, model: str, head: str, grammar: dict | None = None) -> None:
        self.tee, self.model, self.head, self.grammar = tee, model, head, grammar

    @classmethod
    def from_env(cls, sample_rate: float, model: str, head: str, grammar: dict | None = None) -> "WorkerShadow | None":
        spool = os.environ.get(SHADOW_SPOOL_ENV, "").strip()
        if not spool:
            return None
        from prometheus_client import CollectorRegistry

        from sglang_jetspec.spool.tee import ShadowTee
        from sglang_jetspec.spool.writer import SpoolWriter

        return cls(ShadowTee(SpoolWriter(spool), sample_rate, CollectorRegistry()).start(), model, head, grammar)

    def finished(self, req, state: RequestDraftState) -> bool:
        """Offer the record of a finished SGLang Req if it is sampled; True if one was queued. A request
        whose distribution the checker cannot rebuild (penalties, a grammar it cannot recompile, ...) is
        counted instead: checked without its penalties or mask, its exact output would raise false alarms."""
        reason = FINISH_REASONS.get(type(req.finished_reason).__name__)
        if reason is None:
            return False
        constraint = record_constraint(req, self.grammar)
        blind_spot = shadow_blind_spot(req, grammar_checkable=constraint is not None)
        if blind_spot is not None:
            self.tee.metrics.unchecked.labels(blind_spot).inc()
            return False
        if not self.tee.sampled():
            return False
        return self.tee.offer(shadow_record(req, state, reason, self.model, self.head, constraint))

    def close(self) -> None:
        self.tee.close()


def xgrammar_options(server_args) -> dict | None:
    """How this server's xgrammar backend compiles JSON schemas (sglang's create_grammar_backend reads
    the same flags), or None when it runs another grammar backend: the checker rebuilds xgrammar's only."""
    if server_args.grammar_backend != "xgrammar":
        return None
    return {
        "any_whitespace": not server_args.constrained_json_disable_any_whitespace,
        "max_whitespace_cnt": server_args.constrained_json_max_whitespace_cnt,
    }


def record_constraint(req, options: dict | None):
    """The RecordConstraint of a constrained Req's grammar as SGLang compiled it (its dispatch type, key
    string and the compiled grammar's stop tokens), or None: free text, another backend, or a grammar
    object of another kind (a reasoning wrapper, say) the checker could not rebuild."""
    grammar = getattr(req, "grammar", None)
    ctx = getattr(grammar, "ctx", None)
    kind = getattr(getattr(grammar, "grammar_stats", None), "dispatch_type", None)
    key = getattr(grammar, "key_string", None)
    if options is None or ctx is None or key is None or kind not in ("json", "regex", "ebnf", "structural_tag"):
        return None
    from sglang_jetspec.spool.record import RecordConstraint

    return RecordConstraint(kind=kind, value=key, stop_token_ids=list(ctx.tokenizer_info.stop_token_ids), **options)


def shadow_record(req, state: RequestDraftState, finish_reason: str, model: str, head: str, constraint=None):
    from sglang_jetspec.spool.record import RecordSampling, ShadowRecord, SpecStats

    return ShadowRecord(
        request_id=str(req.rid),
        model=model,
        head=head,
        prompt_ids=list(req.origin_input_ids),
        output_ids=list(req.output_ids),
        sampling=RecordSampling.of(state.params),
        finish_reason=finish_reason,
        spec=SpecStats(budgets=list(state.budgets), accept_lengths=list(state.accept_lengths)),
        started_at=state.started_at,
        finished_at=time.time(),
        constraint=constraint,
    )
