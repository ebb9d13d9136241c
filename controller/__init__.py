"""JetSpec control plane: measure goodput per cohort x budget on live servers, choose budgets,
gate speculation off and back on, and push the resulting table (see controller/cli.py).

Depends on the `policies` package and on HTTP/Prometheus interfaces only, never on the engine.
"""
