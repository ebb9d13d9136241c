"""Spans of the checker: one `jetspec.shadow.check` per re-checked request, tracer `jetspec.shadow`.

Provider set-up is shared with the worker and the controller (sglang_jetspec/observability/tracing.py,
OTEL_* variables).
"""

from __future__ import annotations

from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import Tracer

from sglang_jetspec.observability.tracing import build_provider, otlp_endpoint_in_env, otlp_exporter  # torch-free

TRACER = "jetspec.shadow"
SPAN = "jetspec.shadow.check"


def make_tracer(otlp_endpoint: str | None = None, console: bool = False) -> Tracer:
    """Spans go nowhere by default, to stderr with `console`, over OTLP when an endpoint is given or
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set."""
    exporters = [otlp_exporter(otlp_endpoint)] if otlp_endpoint or otlp_endpoint_in_env() else []
    if console:
        exporters.append(ConsoleSpanExporter())
    return build_provider("jetspec-shadow", exporters).get_tracer(TRACER)
