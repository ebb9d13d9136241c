"""The shadow checker: re-score records on a non-speculative reference, test them, decide the alarm.

Alarm (gauge `jetspec_shadow_alarm`) for a window when any of:
- `greedy_error`: a greedy token was not the target argmax by more than the tie margin;
- `impossible_token`: a sampled token lies outside the request's processed support by more than the
  tie margin (at the cutoff within it, a `tie`: checks.py);
- `window_test`: the smallest Holm-adjusted p-value of the window's KS / rank chi-square is < alpha;
- `sequential`: the betting monitor's evidence reached 1/alpha. This one is sticky: it stays until
  the monitor state (`<out>/state.json`) is deleted, by an operator who has fixed the cause.
Per-window false alarms on a correct sampler: at most alpha from the window tests, plus at most
alpha once over the whole life of the monitor (bench/results/shadow_calibration.md measures both).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence

import numpy as np

from sglang_jetspec.spool.record import ShadowRecord
from shadow.checks import DEFAULT_TIE_MARGIN, RANK_EDGES, RequestCheck, greedy_mismatches, sampled_transform
from shadow.constraints import ConstraintMasks
from shadow.metrics import ShadowMetrics
from shadow.regenerate import Regenerator
from shadow.stats import BettingMonitor, window_tests
from shadow.target_logits import Reference, ReferenceError
from shadow.tracing import SPAN
from shadow.window import Counts, MismatchRow, SequentialRow, TestRow, WindowReport

PIT_BINS = 20


class ShadowChecker:
    def __init__(
        self,
        reference: Reference,
        alpha: float,
        metrics: ShadowMetrics,
        tracer,
        monitor: BettingMonitor | None = None,
        tie_margin: float = DEFAULT_TIE_MARGIN,
        seed: int = 0,
        regenerator: Regenerator | None = None,
        constraints: ConstraintMasks | None = None,
    ):
        self.reference = reference
        self.alpha = alpha
        self.metrics = metrics
        self.tracer = tracer
        self.monitor = monitor or BettingMonitor(alpha)
        self.tie_margin = tie_margin
        self.seed = seed
        self.regenerator = regenerator
        self.constraints = constraints  # rebuilds constrained records' grammar masks; None: such records fail

    def _rng(self, record: ShadowRecord) -> np.random.Generator:
        # The PIT's auxiliary uniforms are a function of the record: a re-run reproduces the report.
        return np.random.default_rng([self.seed, zlib.crc32(f"{record.request_id}@{record.started_at}".encode())])

    def check_request(self, record: ShadowRecord) -> tuple[RequestCheck, bool]:
        """The record's checks and whether the reference distribution was complete."""
        mode = "greedy" if record.sampling.greedy else "sampled"
        with self.tracer.start_as_current_span(SPAN) as span:
            span.set_attribute("jetspec.request_id", record.request_id)
            span.set_attribute("jetspec.shadow.mode", mode)
            span.set_attribute("gen_ai.request.model", record.model)
            span.set_attribute("gen_ai.request.temperature", record.sampling.temperature)
            span.set_attribute("gen_ai.request.top_p", record.sampling.top_p)
            span.set_attribute("gen_ai.request.top_k", record.sampling.top_k)
            span.set_attribute("gen_ai.usage.output_tokens", len(record.output_ids))
            scores = self.reference.score(record)
            if record.constraint is not None:
                span.set_attribute("jetspec.shadow.constraint", record.constraint.kind)
                if self.constraints is None:
                    raise ReferenceError(
                        f"request {record.request_id}: decoded under a {record.constraint.kind} "
                        "grammar; give the checker the served model's tokenizer to rebuild it"
                    )
                self.constraints.apply(record, scores.logits)
            check = RequestCheck(record.request_id, mode, len(record.output_ids))
            if record.sampling.greedy:
                check.mismatches = greedy_mismatches(scores.logits, record.output_ids, self.tie_margin)
            else:
                t = sampled_transform(
                    scores.logits, record.output_ids, record.sampling.params(), self._rng(record), self.tie_margin
                )
                check.pit, check.mismatches = t.pit, t.outside_support
                check.rank_observed, check.rank_expected = t.rank_observed, t.rank_expected
            span.set_attribute("jetspec.shadow.mismatches", len(check.mismatches))
            span.set_attribute(
                "jetspec.shadow.first_divergence", -1 if check.first_divergence is None else check.first_divergence
            )
        self.metrics.requests.labels(mode).inc()
        self.metrics.tokens.labels(mode).inc(check.tokens)
        for m in check.mismatches:
            self.metrics.mismatches.labels("tie" if m.kind == "tie" else "error").inc()
        return check, scores.complete

    def check_window(self, index: int, records: Sequence[ShadowRecord]) -> WindowReport:
        checks: list[RequestCheck] = []
        failed: dict[str, str] = {}
        incomplete = 0
        for record in records:
            try:
                check, complete = self.check_request(record)
            except ReferenceError as exc:
                failed[record.request_id] = str(exc)
                continue
            checks.append(check)
            incomplete += check.mode == "sampled" and not complete
        sampled = [c for c in checks if c.mode == "sampled"]
        pit = np.concatenate([c.pit for c in sampled]) if sampled else np.zeros(0)
        rank_obs = sum((c.rank_observed for c in sampled), np.zeros(len(RANK_EDGES)))
        rank_exp = sum((c.rank_expected for c in sampled), np.zeros(len(RANK_EDGES)))
        tests = window_tests(pit, rank_obs, rank_exp)
        self.monitor.update(pit)
        rows = [
            MismatchRow(
                request_id=c.request_id,
                position=m.position,
                emitted=m.emitted,
                expected=m.expected,
                margin=None if m.kind == "impossible" else m.margin,
                kind=m.kind,
            )
            for c in checks
            for m in c.mismatches
        ]
        kinds = {k: sum(r.kind == k for r in rows) for k in ("tie", "error", "impossible")}
        if kinds["impossible"]:
            self.monitor.force_alarm()
        reasons = [
            name
            for name, hit in (
                ("greedy_error", kinds["error"] > 0),
                ("impossible_token", kinds["impossible"] > 0),
                ("window_test", any(t.p_holm < self.alpha for t in tests)),
                ("sequential", self.monitor.crossed),
            )
            if hit
        ]
        stamps = [r.finished_at for r in records]
        report = WindowReport(
            window=index,
            reference=self.reference.name,
            alpha=self.alpha,
            tie_margin=self.tie_margin,
            generated_at=time.time(),
            first_record_at=min(stamps, default=None),
            last_record_at=max(stamps, default=None),
            requests=Counts(greedy=sum(c.mode == "greedy" for c in checks), sampled=len(sampled)),
            tokens=Counts(
                greedy=sum(c.tokens for c in checks if c.mode == "greedy"), sampled=sum(c.tokens for c in sampled)
            ),
            mismatches=kinds,
            first_divergence={c.request_id: c.first_divergence for c in checks if c.first_divergence is not None},
            mismatch_rows=rows,
            tests=[
                TestRow(
                    name=t.name,
                    statistic=t.statistic,
                    p_value=t.p_value,
                    p_holm=t.p_holm,
                    rejected=t.p_holm < self.alpha,
                )
                for t in tests
            ],
            sequential=SequentialRow(
                tokens=int(self.monitor.state.tokens),
                log_evidence=self.monitor.log_evidence,
                threshold=self.monitor.threshold,
                p_value=self.monitor.p_value(),
                crossed_at=self.monitor.crossed_at,
            ),
            pit_histogram=np.histogram(pit, bins=PIT_BINS, range=(0.0, 1.0))[0].tolist(),
            pit_values=pit.tolist(),
            acceptance_by_depth=acceptance_by_depth(records),
            regeneration=self.regenerator.diff(records) if self.regenerator else [],
            incomplete_reference=incomplete,
            failed=failed,
            alarm=bool(reasons),
            alarm_reasons=reasons,
        )
        self._publish(report)
        return report

    def _publish(self, report: WindowReport) -> None:
        for t in report.tests:
            self.metrics.p_value.labels(t.name).set(t.p_holm)
        self.metrics.p_value.labels("sequential").set(report.sequential.p_value)
        self.metrics.alarm.set(1.0 if report.alarm else 0.0)
        if report.alarm:
            self.metrics.alarms.inc()
        self.metrics.last_check.set(report.generated_at)


def acceptance_by_depth(records: Sequence[ShadowRecord]) -> list[float]:
    """Share of speculative steps (budget > 1) that accepted at least d drafted tokens, d = 1, 2, ..."""
    accepted = [
        length - 1 for r in records for budget, length in zip(r.spec.budgets, r.spec.accept_lengths) if budget > 1
    ]
    if not accepted:
        return []
    counts = np.asarray(accepted)
    return [float((counts >= d).mean()) for d in range(1, max(1, int(counts.max())) + 1)]
