"""Helpers shared by the operations tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from controller.http import urllib_transport

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"
ADMIN_KEY = "ops-test-key"
POLICY_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 8], default: 8}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 8], default: 0}
controller: {interval_s: 1, ttl_s: 30, window_s: 10, min_samples: 2}
"""
TIMEOUT_S = 300.0


def post_json(url: str, payload: dict, headers: dict | None = None) -> tuple[int, dict]:
    status, raw = urllib_transport(
        "POST", url, {"Content-Type": "application/json", **(headers or {})}, json.dumps(payload).encode(), TIMEOUT_S
    )
    return status, json.loads(raw)


def push_budget(url: str, bs1: int) -> None:
    """Push a table running cohort bs1 at budget `bs1` (bs2-4 off), in SGLang's flat-key form."""
    table = {"jetspec_policy.ttl_s": 600, "jetspec_policy.bs1.budget": bs1, "jetspec_policy.bs2-4.budget": 0}
    status, reply = post_json(
        f"{url}/set_internal_state", {"server_args": table}, {"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert status == 200, reply


# --- metric names in PromQL, checked against the code's registries ------------------------------

# Series Prometheus itself makes, not the code.
PROMETHEUS_SERIES = {"up"}
# Grafana's interval variables, replaced by a duration before parsing.
GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects, from promql-parser's syntax tree (a syntax error raises)."""
    import promql_parser

    for variable in GRAFANA_INTERVALS:
        expr = expr.replace(variable, "5m")
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.update(
                [node.name] if node.name else [m.value for m in node.matchers.matchers if m.name == "__name__"]
            )
        elif isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                walk(arg)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, promql_parser.AggregateExpr):
            walk(node.expr)
            if node.param is not None:
                walk(node.param)
        elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
            walk(node.expr)

    walk(promql_parser.parse(expr))
    return names


@functools.cache
def code_series() -> frozenset[str]:
    """Every sample name the code's registries expose (counters with _total, histograms with
    _bucket/_sum/_count) plus the recording rules' names."""
    from ops.catalogue import metric_entries, recording_rules

    return frozenset({s for e in metric_entries() for s in e.samples} | {name for name, _ in recording_rules()})


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub gives the headings of a markdown text (lower case, punctuation dropped, spaces to -)."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
