"""Worker spans of the reference server (sglang_jetspec/observability/tracing.py), caught by the SDK's in-memory
exporter, on the real SmolLM2 target: one GenAI request span per /generate, one `jetspec.step` span
per verify step linked to it, with its phases as children; set-up from the OTEL_* variables."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from ops_support import ADMIN_KEY, post_json, push_budget

from sglang_jetspec.core.step_record import StepRecord
from sglang_jetspec.observability.tracing import (
    WORKER_TRACER,
    TracingConfigError,
    build_provider,
    exporters_from_env,
    record_step_phases,
)
from sglang_jetspec.serving.server import JetspecServer

MODEL = "smollm2-135m-instruct"
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN_ID = 0xB7AD6B7169203331
PHASES = ["jetspec.draft", "jetspec.tree", "jetspec.verify", "jetspec.accept", "jetspec.commit"]


@pytest.fixture(scope="module")
def traced(engine, policy):
    exporter = InMemorySpanExporter()
    provider = build_provider("jetspec-test", [exporter], batch=False)
    with JetspecServer(engine, policy, ADMIN_KEY, tracer=provider.get_tracer(WORKER_TRACER)) as server:
        yield server, exporter


def generate(url: str, max_new_tokens: int, traceparent: str | None = None) -> dict:
    headers = {"traceparent": traceparent} if traceparent else {}
    status, reply = post_json(
        f"{url}/generate",
        {
            "text": "def fibonacci(n):",
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        },
        headers,
    )
    assert status == 200, reply
    return reply


def spans_of_request(exporter: InMemorySpanExporter, request_id: str):
    """The request span with that response id, the step spans linked to it, and their children."""
    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.attributes.get("gen_ai.response.id") == request_id]
    steps = [
        s
        for s in spans
        if s.name == "jetspec.step" and any(link.context.span_id == request.context.span_id for link in s.links)
    ]
    children = {
        step.context.span_id: sorted(
            (s for s in spans if s.parent is not None and s.parent.span_id == step.context.span_id),
            key=lambda s: s.start_time,
        )
        for step in steps
    }
    return request, steps, children


def test_a_request_span_continues_the_callers_trace_with_genai_attributes(traced):
    server, exporter = traced
    push_budget(server.url, 8)
    reply = generate(server.url, 6, f"00-{TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-01")
    meta = reply["meta_info"]
    request, steps, _ = spans_of_request(exporter, meta["id"])

    assert request.name == f"generate {MODEL}" and request.kind == SpanKind.SERVER
    assert request.context.trace_id == TRACE_ID and request.parent.span_id == CALLER_SPAN_ID
    a = request.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"]) == ("generate", "jetspec")
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == MODEL
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (6, 0.0, 1.0)
    assert "gen_ai.request.top_k" not in a  # SGLang's -1: no top-k
    assert a["gen_ai.usage.input_tokens"] == meta["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == meta["completion_tokens"] == 6
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    assert a["jetspec.verify_steps"] == meta["spec_verify_ct"] == len(steps) > 0
    assert a["jetspec.accept_length"] == pytest.approx(meta["spec_accept_length"])
    assert request.status.status_code != StatusCode.ERROR


def test_each_verify_step_is_a_span_with_its_phases_in_order_inside_it(traced):
    server, exporter = traced
    push_budget(server.url, 8)
    meta = generate(server.url, 8)["meta_info"]
    request, steps, children = spans_of_request(exporter, meta["id"])

    # The first token comes from prefill; every other one from a verify step of this request.
    assert sum(s.attributes["jetspec.committed_tokens"] for s in steps) == meta["completion_tokens"] - 1
    for step in steps:
        assert step.attributes["jetspec.budget"] == 8 and step.attributes["jetspec.cohort"] == "bs1"
        assert step.attributes["jetspec.batch_size"] == 1
        assert sum(step.attributes["jetspec.accept_lengths"]) == step.attributes["jetspec.committed_tokens"]
        phases = children[step.context.span_id]
        assert [p.name for p in phases] == PHASES
        assert all(p.attributes["jetspec.budget"] == 8 for p in phases)
        assert step.start_time <= phases[0].start_time and phases[-1].end_time <= step.end_time
        for earlier, later in zip(phases, phases[1:]):
            assert earlier.start_time <= earlier.end_time <= later.start_time
        assert phases[2].end_time - phases[2].start_time > 0  # the verify forward takes time


def test_steps_with_speculation_off_have_no_draft_or_tree_phase(traced):
    server, exporter = traced
    push_budget(server.url, 0)
    meta = generate(server.url, 4)["meta_info"]
    _, steps, children = spans_of_request(exporter, meta["id"])
    assert len(steps) == 3  # 4 tokens, the first from prefill, one per step at budget 0
    for step in steps:
        assert step.attributes["jetspec.budget"] == 0 and step.attributes["jetspec.accept_lengths"] == (1,)
        assert [p.name for p in children[step.context.span_id]] == PHASES[2:]


def test_a_bad_request_span_carries_the_error_type(traced):
    server, exporter = traced
    exporter.clear()
    status, _ = post_json(f"{server.url}/generate", {"text": "hi", "sampling_params": {"temperature": -1}})
    assert status == 400
    (span,) = exporter.get_finished_spans()
    assert span.name == f"generate {MODEL}" and span.attributes["error.type"] == "400"
    assert span.status.status_code == StatusCode.ERROR


RECORD = StepRecord(
    batch_size=2,
    budget=4,
    committed_tokens=5,
    accept_lengths=[3, 2],
    draft_s=0.01,
    tree_s=0.002,
    verify_s=0.05,
    accept_s=0.004,
    wall_s=0.07,
    commit_s=0.001,
)


def record_one_step(provider) -> None:
    tracer = provider.get_tracer(WORKER_TRACER)
    with tracer.start_as_current_span("jetspec.step") as span:
        record_step_phases(tracer, span, "bs2-4", RECORD)


def test_phase_spans_are_laid_out_from_the_step_record():
    exporter = InMemorySpanExporter()
    record_one_step(build_provider("t", [exporter], batch=False))
    *phases, step = exporter.get_finished_spans()
    start, end = step.start_time, step.start_time + 70_000_000
    assert [(p.name, p.start_time - start, p.end_time - start) for p in phases] == [
        ("jetspec.draft", 0, 10_000_000),
        ("jetspec.tree", 10_000_000, 12_000_000),
        ("jetspec.verify", 16_000_000, 66_000_000),
        ("jetspec.accept", 66_000_000, 69_000_000),
        ("jetspec.commit", 69_000_000, 70_000_000),
    ]
    assert phases[-1].end_time == end


def test_the_sampler_and_service_name_come_from_the_environment(monkeypatch):
    exporter = InMemorySpanExporter()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    record_one_step(build_provider("jetspec-worker", [exporter], batch=False))
    assert exporter.get_finished_spans() == ()

    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sglang-pool-a")
    record_one_step(build_provider("jetspec-worker", [exporter], batch=False))
    spans = exporter.get_finished_spans()
    assert len(spans) == 6 and {s.resource.attributes["service.name"] for s in spans} == {"sglang-pool-a"}

    monkeypatch.delenv("OTEL_SERVICE_NAME")
    provider = build_provider("jetspec-worker", [])
    assert provider.resource.attributes["service.name"] == "jetspec-worker"


@pytest.mark.parametrize(
    ("env", "kinds"),
    [
        ({}, [GrpcExporter]),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, [HttpExporter]),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"},
            [GrpcExporter],
        ),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, [GrpcExporter, ConsoleSpanExporter]),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ],
)
def test_exporters_follow_otel_traces_exporter_and_protocol(monkeypatch, env, kinds):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert [type(e) for e in exporters_from_env()] == kinds


@pytest.mark.parametrize(
    ("name", "value"), [("OTEL_TRACES_EXPORTER", "zipkin"), ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]
)
def test_unusable_otel_settings_are_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(TracingConfigError, match=f"{name}={value}"):
        exporters_from_env()
