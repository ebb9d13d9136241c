"""What the long-running side processes (the controller, the shadow checker) share to expose themselves:
their own /metrics and span options, and a stop on SIGINT / SIGTERM. Torch-free, like tracing.py."""

from __future__ import annotations

import argparse
import signal
import threading

from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import Tracer

from .tracing import build_provider, otlp_endpoint_in_env, otlp_exporter


def add_telemetry_options(parser: argparse.ArgumentParser, process: str, spans: str, metrics_port: int = 0) -> None:
    """--metrics-port / --metrics-addr (the `process`'s own /metrics) and --otlp-endpoint /
    --trace-console (where its `spans` spans go)."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        help=f"port for the {process}'s own /metrics (default {metrics_port}, 0 = off)",
    )
    parser.add_argument("--metrics-addr", default="0.0.0.0", help=f"address for the {process}'s /metrics")
    parser.add_argument(
        "--otlp-endpoint",
        metavar="ENDPOINT",
        help=f"send {spans} spans to this OTLP traces endpoint (default: "
        "$OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT when set, else no export)",
    )
    parser.add_argument("--trace-console", action="store_true", help=f"print {spans} spans to stderr")


def serve_metrics(args: argparse.Namespace, registry) -> None:
    """Serve `registry` on --metrics-addr:--metrics-port in a background thread (nothing with port 0)."""
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_addr, registry=registry)


def process_tracer(service: str, tracer: str, otlp_endpoint: str | None = None, console: bool = False) -> Tracer:
    """Spans go nowhere by default, to stderr with `console`, over OTLP when an endpoint is given or
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set (protocol, sampler, service name: OTEL_* variables,
    read as by `jetspec serve --enable-trace`, tracing.py)."""
    exporters = [otlp_exporter(otlp_endpoint)] if otlp_endpoint or otlp_endpoint_in_env() else []
    if console:
        exporters.append(ConsoleSpanExporter())
    return build_provider(service, exporters).get_tracer(tracer)


def stop_on_signals() -> threading.Event:
    """An event that SIGINT and SIGTERM set, so a loop waiting on it ends cleanly (main thread only)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop
