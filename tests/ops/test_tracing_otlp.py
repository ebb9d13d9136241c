"""Spans over real OTLP to receivers on loopback, decoded with the OTLP protobuf definitions
(opentelemetry-proto): OTLP/HTTP from the reference server in this process, OTLP/gRPC from a
`jetspec serve --enable-trace --otlp-traces-endpoint` subprocess and from the controller."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from ops_support import ADMIN_KEY, POLICY_YAML, REPO, post_json, push_budget

from controller.decider import Decision
from controller.observability import Observer, make_tracer
from sglang_jetspec.observability.tracing import WORKER_TRACER, build_provider, exporters_from_env
from sglang_jetspec.serving.server import JetspecServer
from tests.loopback import QuietHandler, serving

PHASES = {"jetspec.draft", "jetspec.tree", "jetspec.verify", "jetspec.accept", "jetspec.commit"}


class Received:
    """Export requests a receiver decoded: flattened to (service.name, span) pairs."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = threading.Event()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.requests.append(request)
        self.arrived.set()

    def spans(self) -> list[tuple[str, object]]:
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
                )
                out += [(service, span) for scope in resource_spans.scope_spans for span in scope.spans]
        return out


def attributes(span) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


@pytest.fixture()
def http_receiver():
    received = Received()

    class Handler(QuietHandler):
        def do_POST(self):  # noqa: N802
            body = self.body()
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
            received.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.answer(200, reply, "application/x-protobuf")

    with serving(Handler) as url:
        yield f"{url}/v1/traces", received


@pytest.fixture()
def grpc_receiver():
    received = Received()

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 (gRPC's name)
            received.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}", received  # http:// = plaintext gRPC for the exporter
    server.stop(grace=None)


def test_reference_server_spans_reach_an_otlp_http_receiver(monkeypatch, http_receiver, engine, policy):
    endpoint, received = http_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    provider = build_provider("jetspec-worker", exporters_from_env(endpoint))
    with JetspecServer(engine, policy, ADMIN_KEY, tracer=provider.get_tracer(WORKER_TRACER)) as server:
        push_budget(server.url, 4)
        status, reply = post_json(
            f"{server.url}/generate",
            {"text": "import os\n", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}},
        )
        assert status == 200
    assert provider.force_flush(30_000)
    provider.shutdown()

    spans = received.spans()
    assert {service for service, _ in spans} == {"jetspec-worker"}
    (request,) = [s for _, s in spans if s.name.startswith("generate ")]
    a = attributes(request)
    assert a["gen_ai.response.id"] == reply["meta_info"]["id"] and a["gen_ai.usage.output_tokens"] == 3
    steps = [s for _, s in spans if s.name == "jetspec.step"]
    assert len(steps) == reply["meta_info"]["spec_verify_ct"] > 0
    for step in steps:
        assert [link.span_id for link in step.links] == [request.span_id]
        assert attributes(step)["jetspec.budget"] == 4
        assert {s.name for _, s in spans if s.parent_span_id == step.span_id} == PHASES


def test_jetspec_serve_enable_trace_exports_over_otlp_grpc(tmp_path, grpc_receiver, smollm2_dir):
    endpoint, received = grpc_receiver
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_YAML)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OTEL_SERVICE_NAME": "jetspec-serve-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    command = [
        sys.executable,
        "-m",
        "sglang_jetspec.cli",
        "serve",
        "--target",
        str(smollm2_dir),
        "--head",
        "untrained",
        "--policy",
        str(policy),
        "--port",
        "0",
        "--device",
        "cpu",
        "--enable-trace",
        "--otlp-traces-endpoint",
        endpoint,
    ]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), process.stderr.read()
        status, reply = post_json(
            f"{url}/generate",
            {"text": "x = ", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}},
        )
        assert status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0  # stopping flushes the batched spans
    spans = received.spans()
    assert {service for service, _ in spans} == {"jetspec-serve-test"}
    names = sorted(s.name for _, s in spans)
    # Budget 8 at bs1 (the policy's default): every step drafted, so each has all five phases.
    steps = reply["meta_info"]["spec_verify_ct"]
    assert steps > 0 and all(names.count(n) == steps for n in PHASES | {"jetspec.step"})
    assert [n for n in names if n.startswith("generate ")] == [f"generate {smollm2_dir.name}"]


def test_controller_decision_spans_reach_an_otlp_grpc_receiver(monkeypatch, grpc_receiver):
    endpoint, received = grpc_receiver
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export within 50 ms instead of 5 s
    observer = Observer(make_tracer(otlp_endpoint=endpoint))
    observer.record_decision(
        Decision(cohort="bs1", at=1.0, previous=16, budget=0, probe=None, reason="gate_off", evidence=())
    )
    assert received.arrived.wait(30)
    ((service, span),) = received.spans()
    assert (service, span.name) == ("jetspec-controller", "jetspec.controller.decision")
    assert attributes(span)["jetspec.budget"] == 0 and attributes(span)["jetspec.reason"] == "gate_off"
