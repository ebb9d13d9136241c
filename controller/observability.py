"""What the controller tells operators: Prometheus metrics, one span and one JSON log line per decision."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry, Counter, Gauge

from controller.decider import Decision
from sglang_jetspec.observability.process import process_tracer  # torch-free

decision_log = logging.getLogger("jetspec.controller.decisions")


def make_tracer(otlp_endpoint: str | None = None, console: bool = False) -> Tracer:
    """The controller's tracer (service jetspec-controller): spans nowhere by default, to the console
    on request, over OTLP when an endpoint is given or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set."""
    return process_tracer("jetspec-controller", "jetspec.controller", otlp_endpoint, console)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def decision_record(decision: Decision) -> dict[str, Any]:
    return {
        "event": "jetspec_decision",
        "at": decision.at,
        "cohort": decision.cohort,
        "previous_budget": decision.previous,
        "budget": decision.budget,
        "switched": decision.switched,
        "reason": decision.reason,
        "probe": None if decision.probe is None else decision.probe.model_dump(),
        "evidence": [
            {
                "budget": e.budget,
                "goodput": _finite(e.goodput),
                "stderr": _finite(e.stderr),
                "samples": e.samples,
                "gain": _finite(e.gain),
                "gain_stderr": _finite(e.gain_stderr),
            }
            for e in decision.evidence
        ],
    }


class Observer:
    def __init__(self, tracer: Tracer, registry: CollectorRegistry | None = None, started_at: float = 0.0):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._tracer = tracer
        self._started_at = started_at
        self._confirmed_at: dict[str, float] = {}
        r = self.registry
        self.decisions = Counter(
            "jetspec_controller_decisions", "Budget decisions by cohort and reason", ["cohort", "reason"], registry=r
        )
        self.switches = Counter(
            "jetspec_controller_budget_switches", "Decisions that changed a cohort's budget", ["cohort"], registry=r
        )
        self.budget = Gauge(
            "jetspec_controller_budget", "Budget the controller chose (0 = off)", ["cohort"], registry=r
        )
        self.goodput = Gauge(
            "jetspec_controller_estimated_goodput",
            "Estimated goodput, committed tokens per request-second",
            ["cohort", "budget"],
            registry=r,
        )
        self.gain = Gauge(
            "jetspec_controller_estimated_gain",
            "Estimated goodput(budget) / goodput(off)",
            ["cohort", "budget"],
            registry=r,
        )
        self.gain_stderr = Gauge(
            "jetspec_controller_estimated_gain_stderr", "Standard error of the gain", ["cohort", "budget"], registry=r
        )
        self.pushes = Counter("jetspec_controller_pushes", "Tables pushed and confirmed", ["server"], registry=r)
        self.push_failures = Counter(
            "jetspec_controller_push_failures",
            "Pushes that failed (rejected, unavailable, invalid)",
            ["server", "kind"],
            registry=r,
        )
        self.invalid_tables = Counter(
            "jetspec_controller_invalid_tables", "Decided tables that failed validation and were not pushed", registry=r
        )
        self.telemetry_failures = Counter(
            "jetspec_controller_telemetry_failures", "Telemetry reads that failed", ["source"], registry=r
        )
        self.staleness = Gauge(
            "jetspec_controller_staleness_seconds",
            "Seconds since a server last confirmed the controller's table",
            ["server"],
            registry=r,
        )

    def record_decision(self, decision: Decision) -> None:
        record = decision_record(decision)
        self.decisions.labels(decision.cohort, decision.reason).inc()
        if decision.switched:
            self.switches.labels(decision.cohort).inc()
        self.budget.labels(decision.cohort).set(decision.budget)
        for e in decision.evidence:
            self.goodput.labels(decision.cohort, str(e.budget)).set(e.goodput)
            if e.gain is not None:
                self.gain.labels(decision.cohort, str(e.budget)).set(e.gain)
                self.gain_stderr.labels(decision.cohort, str(e.budget)).set(e.gain_stderr)
        with self._tracer.start_as_current_span("jetspec.controller.decision") as span:
            span.set_attribute("jetspec.cohort", decision.cohort)
            span.set_attribute("jetspec.budget", decision.budget)
            span.set_attribute("jetspec.previous_budget", decision.previous)
            span.set_attribute("jetspec.reason", decision.reason)
            span.set_attribute("jetspec.probe_budget", -1 if decision.probe is None else decision.probe.budget)
            span.set_attribute("jetspec.evidence", json.dumps(record["evidence"]))
        decision_log.info(json.dumps(record, sort_keys=True))

    def confirmed(self, server: str, now: float) -> None:
        self._confirmed_at[server] = now

    def update_staleness(self, servers: list[str], now: float) -> None:
        for server in servers:
            self.staleness.labels(server).set(now - self._confirmed_at.get(server, self._started_at))
