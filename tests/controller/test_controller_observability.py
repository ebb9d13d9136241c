"""Each decision: Prometheus metrics, one OpenTelemetry span and one JSON log line with its evidence."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controller.decider import BudgetEvidence, Decision
from controller.observability import Observer, decision_log, make_tracer
from policies.table import Probe

DECISION = Decision(
    cohort="bs1",
    at=120.0,
    previous=16,
    budget=64,
    probe=Probe(budget=16, share=0.05),
    reason="better_budget",
    evidence=(
        BudgetEvidence(0, 10.0, 0.2, 6, None, None),
        BudgetEvidence(16, 15.0, float("inf"), 1, 1.5, 0.05),
        BudgetEvidence(64, 20.0, 0.4, 9, 2.0, 0.08),
    ),
)


def test_decision_sets_metrics_span_and_json_log(caplog):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observer = Observer(provider.get_tracer("test"))
    with caplog.at_level(logging.INFO, logger=decision_log.name):
        observer.record_decision(DECISION)

    sample = observer.registry.get_sample_value
    assert sample("jetspec_controller_decisions_total", {"cohort": "bs1", "reason": "better_budget"}) == 1
    assert sample("jetspec_controller_budget_switches_total", {"cohort": "bs1"}) == 1
    assert sample("jetspec_controller_budget", {"cohort": "bs1"}) == 64
    assert sample("jetspec_controller_estimated_gain", {"cohort": "bs1", "budget": "64"}) == 2.0
    assert sample("jetspec_controller_estimated_goodput", {"cohort": "bs1", "budget": "0"}) == 10.0

    (span,) = exporter.get_finished_spans()
    assert span.name == "jetspec.controller.decision"
    assert span.attributes["jetspec.budget"] == 64 and span.attributes["jetspec.previous_budget"] == 16
    assert span.attributes["jetspec.reason"] == "better_budget" and span.attributes["jetspec.probe_budget"] == 16

    (record,) = [json.loads(r.getMessage()) for r in caplog.records if r.name == decision_log.name]
    assert record["cohort"] == "bs1" and record["budget"] == 64 and record["switched"] is True
    assert record["probe"] == {"budget": 16, "share": 0.05}
    assert record["evidence"][1] == {
        "budget": 16,
        "goodput": 15.0,
        "stderr": None,
        "samples": 1,
        "gain": 1.5,
        "gain_stderr": 0.05,
    }


def test_staleness_counts_from_the_last_confirmation():
    observer = Observer(make_tracer(), started_at=100.0)
    observer.update_staleness(["http://a", "http://b"], now=130.0)
    observer.confirmed("http://a", 125.0)
    observer.update_staleness(["http://a", "http://b"], now=140.0)
    assert observer.registry.get_sample_value("jetspec_controller_staleness_seconds", {"server": "http://a"}) == 15
    assert observer.registry.get_sample_value("jetspec_controller_staleness_seconds", {"server": "http://b"}) == 40


# OTLP export of decision spans to a real receiver: tests/ops/test_tracing_otlp.py
