"""The OpenTelemetry Collector config (ops/otel/collector.yaml): OTLP in -> batch -> OTLP and
Prometheus out, every pipeline naming only configured components. The collector binary is not
available here, so `otelcol validate` does not run."""

from __future__ import annotations

import yaml
from ops_support import OPS

CONFIG = yaml.safe_load((OPS / "otel" / "collector.yaml").read_text())
PIPELINES = CONFIG["service"]["pipelines"]


def test_pipelines_name_only_configured_components():
    connectors = set(CONFIG.get("connectors", {}))
    for name, pipeline in PIPELINES.items():
        assert set(pipeline["receivers"]) <= set(CONFIG["receivers"]) | connectors, name
        assert set(pipeline["processors"]) <= set(CONFIG["processors"]), name
        assert set(pipeline["exporters"]) <= set(CONFIG["exporters"]) | connectors, name
    assert set(CONFIG["service"]["extensions"]) <= set(CONFIG["extensions"])


def test_traces_come_in_over_otlp_and_leave_batched_over_otlp_and_as_prometheus_metrics():
    assert set(CONFIG["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert CONFIG["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    traces, metrics = PIPELINES["traces"], PIPELINES["metrics"]
    assert traces["receivers"] == ["otlp"] and traces["processors"][-1] == "batch"
    assert "otlp/traces" in traces["exporters"] and "spanmetrics" in traces["exporters"]
    assert "spanmetrics" in metrics["receivers"] and metrics["exporters"] == ["prometheus"]
    # memory_limiter must run first to shed load before batching.
    assert all(p["processors"][0] == "memory_limiter" for p in PIPELINES.values())


def test_span_metrics_dimensions_are_the_low_cardinality_jetspec_attributes():
    dims = [d["name"] for d in CONFIG["connectors"]["spanmetrics"]["dimensions"]]
    assert dims == ["jetspec.cohort", "jetspec.budget"]
