"""The Grafana dashboard (ops/grafana/jetspec-dashboard.json): every panel query parses as PromQL and
selects only metrics the code exposes or the recording rules define, and the dashboard shows what an
operator needs (accept length by cohort and budget, goodput gain, budget over time, gate, shadow)."""

from __future__ import annotations

import json

import pytest
from ops_support import OPS, PROMETHEUS_SERIES, code_series, promql_metric_names

DASHBOARD = json.loads((OPS / "grafana" / "jetspec-dashboard.json").read_text())


def panels(items=DASHBOARD["panels"]):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


QUERIES = [(p["title"], t["expr"]) for p in panels() for t in p.get("targets", [])]


def test_every_non_row_panel_has_a_query_and_unique_id():
    shown = [p for p in panels() if p["type"] != "row"]
    assert shown and all(p.get("targets") for p in shown)
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(("title", "expr"), QUERIES, ids=[f"{t}:{e[:40]}" for t, e in QUERIES])
def test_panel_queries_name_only_existing_metrics(title, expr):
    names = promql_metric_names(expr)
    assert names, f"{title}: {expr} selects no metric"
    unknown = names - code_series() - PROMETHEUS_SERIES
    assert not unknown, f"panel '{title}' queries {sorted(unknown)}, which no registry or recording rule defines"


def test_template_variable_queries_name_existing_metrics():
    (cohort,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "cohort"]
    assert cohort["definition"] == "label_values(jetspec_steps_total, cohort)"
    assert "jetspec_steps_total" in code_series()


def test_the_dashboard_shows_acceptance_gain_budget_gate_and_shadow():
    used = set().union(*(promql_metric_names(e) for _, e in QUERIES))
    assert {
        "cohort_budget:jetspec_accept_length:mean5m",
        "jetspec_accept_length_bucket",  # accept length
        "cohort:jetspec_goodput_gain:ratio5m",
        "jetspec_controller_estimated_gain",  # goodput gain
        "jetspec_policy_budget",
        "jetspec_controller_budget",  # budget, gate
        "jetspec_shadow_p_value",
        "jetspec_shadow_alarm",
    } <= used
    titles = {p["title"] for p in panels()}
    assert "Gate state (speculation on/off per cohort)" in titles and "Shadow p-values (latest window)" in titles


def test_the_name_extraction_sees_through_functions_aggregations_and_subqueries():
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{cohort=~"$cohort"}[$__rate_interval])))'
        ' / on (cohort) group_left max_over_time(b[1h:5m]) - -c offset 1h + {__name__="d"}'
    )
    assert promql_metric_names(expr) == {"a_bucket", "b", "c", "d"}
    with pytest.raises(ValueError):
        promql_metric_names("sum(rate(x[5m])")
