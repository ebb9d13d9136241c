"""What the engines report outward: Prometheus metrics (metrics.py) and OpenTelemetry spans (tracing.py).

Shared by the reference server and the SGLang worker; importing this package loads no torch, so the
controller and the shadow checker use its OTel helpers too.
"""
