"""Spans of the checker: one `jetspec.shadow.check` per re-checked request, tracer `jetspec.shadow`.

Provider set-up is shared with the worker and the controller (sglang_jetspec/observability/tracing.py,
OTEL_* variables).
"""

from __future__ import annotations

from opentelemetry.trace import Tracer

from sglang_jetspec.observability.process import process_tracer  # torch-free

TRACER = "jetspec.shadow"
SPAN = "jetspec.shadow.check"


def make_tracer(otlp_endpoint: str | None = None, console: bool = False) -> Tracer:
    """The checker's tracer (service jetspec-shadow): spans nowhere by default, to stderr with `console`,
    over OTLP when an endpoint is given or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set."""
    return process_tracer("jetspec-shadow", TRACER, otlp_endpoint, console)
