"""OpenTelemetry tracing for the JetSpec processes: provider set-up from the standard OTEL_* variables,
and the worker's spans (one per request, one per verify step with a child per phase).

Set-up (`build_provider`, `exporters_from_env`): the SDK itself reads the sampler
(OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG), resource attributes (OTEL_RESOURCE_ATTRIBUTES,
OTEL_SERVICE_NAME, which wins over our default name), batching (OTEL_BSP_*) and the OTLP exporters'
endpoint, headers, timeout and compression (OTEL_EXPORTER_OTLP_[TRACES_]*). Only the choice of
exporters is ours: OTEL_TRACES_EXPORTER (otlp | console | none, comma-separated, default otlp) and
OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (grpc | http/protobuf), defaulting to gRPC like SGLang's
`--otlp-traces-endpoint host:4317` and like the Python SDK's own `otlp` exporter entry point.

Worker spans (tracer `jetspec.worker`, names agreed in the shared design):
- `generate {model}`: one per HTTP request, GenAI semantic-convention attributes plus `jetspec.*`;
- `jetspec.step`: one per verify step of the running batch, linked to the request spans of the
  requests it advanced (a step serves many requests, so it is a link, not a child), with children
  `jetspec.draft`, `jetspec.tree` (only when the step drafted), `jetspec.verify`, `jetspec.accept`,
  `jetspec.commit`, laid out from the step's measured phase seconds (StepRecord), so the engine
  itself stays free of tracing calls.
This module imports neither torch nor the engine: the controller and the shadow checker use the set-up.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import Link, Span, SpanContext, Tracer

if TYPE_CHECKING:
    from sglang_jetspec.core.sampling import SamplingParams
    from sglang_jetspec.core.step_record import StepRecord
    from sglang_jetspec.reference.engine import RequestOutput

WORKER_TRACER = "jetspec.worker"
STEP_SPAN = "jetspec.step"
GENAI_OPERATION = "generate"  # SGLang's /generate; the request span is "{operation} {model}" per GenAI semconv
GENAI_PROVIDER = "jetspec"

PROTOCOLS = ("grpc", "http/protobuf")
EXPORTERS = ("otlp", "console", "none")


class TracingConfigError(ValueError):
    """An OTEL_* variable holds a value this process cannot use."""


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def otlp_exporter(endpoint: str | None = None) -> SpanExporter:
    """An OTLP span exporter over the protocol the environment names (default gRPC).
    `endpoint` (the traces endpoint, as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: host:port for gRPC, the
    full URL with /v1/traces for HTTP) overrides the environment; None leaves it to the exporter."""
    variable = next((v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if _env(v)), None)
    protocol = _env(variable) if variable else "grpc"
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        raise TracingConfigError(
            f"{variable}={protocol}: use one of {', '.join(PROTOCOLS)} "
            "(http/json is not supported by the Python exporters)"
        )
    return OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()


def otlp_endpoint_in_env() -> bool:
    """Whether OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT names a collector."""
    return any(_env(v) for v in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))


def exporters_from_env(endpoint: str | None = None) -> list[SpanExporter]:
    """The exporters OTEL_TRACES_EXPORTER names (default otlp)."""
    names = [n.strip() for n in (_env("OTEL_TRACES_EXPORTER") or "otlp").split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER={','.join(names)}: unknown {', '.join(unknown)}; use {', '.join(EXPORTERS)}"
        )
    exporters: list[SpanExporter] = []
    if "otlp" in names:
        exporters.append(otlp_exporter(endpoint))
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
    return exporters


def build_provider(default_service_name: str, exporters: Sequence[SpanExporter], batch: bool = True) -> TracerProvider:
    """A tracer provider with the environment's sampler and resource, sending to `exporters`
    (batched off the caller's thread; `batch=False` exports each span as it ends, for tests)."""
    attributes = {} if _env("OTEL_SERVICE_NAME") else {SERVICE_NAME: default_service_name}
    provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER[_ARG]
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return provider


def request_span_attributes(model: str, params: SamplingParams, prompt_tokens: int) -> dict:
    """GenAI request attributes known when a request arrives."""
    attributes = {
        "gen_ai.operation.name": GENAI_OPERATION,
        "gen_ai.provider.name": GENAI_PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p,
        "gen_ai.request.max_tokens": params.max_new_tokens,
        "gen_ai.usage.input_tokens": prompt_tokens,
    }
    if params.top_k > 0:  # SGLang's -1 means no top-k
        attributes["gen_ai.request.top_k"] = params.top_k
    if params.seed is not None:
        attributes["gen_ai.request.seed"] = params.seed
    return attributes


def finish_request_span(span: Span, model: str, output: RequestOutput) -> None:
    """GenAI response attributes plus JetSpec's: verify steps and mean committed tokens per verify."""
    steps = len(output.accept_lengths)
    span.set_attributes(
        {
            "gen_ai.response.id": output.request_id,
            "gen_ai.response.model": model,
            # SGLang reports EOS as a "stop" finish too; "length" and "stop" (stop string) are kept.
            "gen_ai.response.finish_reasons": ["stop" if output.finish_reason == "eos" else output.finish_reason],
            "gen_ai.usage.output_tokens": len(output.output_ids),
            "jetspec.verify_steps": steps,
            "jetspec.accept_length": sum(output.accept_lengths) / steps if steps else 0.0,
        }
    )


def step_links(contexts: Sequence[SpanContext]) -> list[Link]:
    return [Link(c) for c in contexts if c.is_valid]


def record_step_phases(tracer: Tracer, step: Span, cohort: str, record: StepRecord) -> None:
    """Attributes of a finished step and its phase children, laid end to end from the step's start:
    draft and tree first, verify, accept and commit ending when the engine's step ended."""
    step.set_attributes(
        {
            "jetspec.cohort": cohort,
            "jetspec.budget": record.budget,
            "jetspec.batch_size": record.batch_size,
            "jetspec.committed_tokens": record.committed_tokens,
            "jetspec.accept_lengths": list(record.accept_lengths),
        }
    )
    if not step.is_recording():
        return
    start = step.start_time
    ns = lambda seconds: round(seconds * 1e9)  # noqa: E731
    end = start + ns(record.wall_s)
    phases = []
    if record.budget > 1:  # budget 0 and 1 draft nothing: no draft or tree phase to show
        phases += [
            ("jetspec.draft", start, start + ns(record.draft_s)),
            ("jetspec.tree", start + ns(record.draft_s), start + ns(record.draft_s + record.tree_s)),
        ]
    phases += [
        ("jetspec.verify", end - ns(record.accept_s + record.verify_s), end - ns(record.accept_s)),
        ("jetspec.accept", end - ns(record.accept_s), end - ns(record.commit_s)),
        ("jetspec.commit", end - ns(record.commit_s), end),
    ]
    parent = trace.set_span_in_context(step)
    for name, begin, finish in phases:
        child = tracer.start_span(
            name,
            context=parent,
            start_time=begin,
            attributes={"jetspec.budget": record.budget, "jetspec.cohort": cohort},
        )
        child.end(end_time=finish)
