"""Prometheus rules (ops/prometheus/): promtool validates them and runs their unit tests; every alert
has a firing and a not-firing unit test and a runbook entry; every metric they use exists in the code;
the Kubernetes PrometheusRule carries exactly these rules."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from ops_support import OPS, PROMETHEUS_SERIES, REPO, code_series, github_anchors, promql_metric_names

RULES_FILE = OPS / "prometheus" / "jetspec.rules.yml"
RULES = yaml.safe_load(RULES_FILE.read_text())
ALERTS = {r["alert"]: r for g in RULES["groups"] for r in g["rules"] if "alert" in r}
UNIT_TESTS = sorted((OPS / "prometheus" / "tests").glob("*.test.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found -- install Debian's 'prometheus' package (.ci/run does)"
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@needs_promtool
def test_promtool_check_rules():
    result = promtool("check", "rules", str(RULES_FILE.relative_to(REPO)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in RULES['groups'])} rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", *(str(p.relative_to(REPO)) for p in UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS)


def alert_tests() -> list[tuple[str, list]]:
    return [
        (case["alertname"], case["exp_alerts"])
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_has_a_firing_and_a_not_firing_unit_test(alert):
    expectations = [expected for name, expected in alert_tests() if name == alert]
    assert any(expectations), f"{alert}: no promtool test where it fires"
    assert any(e == [] for e in expectations), f"{alert}: no promtool test where it stays silent"


def test_unit_tests_name_only_existing_alerts():
    assert {name for name, _ in alert_tests()} <= set(ALERTS)


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_links_an_existing_runbook_entry(alert):
    annotations, labels = ALERTS[alert]["annotations"], ALERTS[alert]["labels"]
    assert labels["severity"] in {"warning", "critical"} and annotations["summary"] and annotations["description"]
    path, _, anchor = annotations["runbook_url"].partition("#")
    runbook = REPO / path
    assert runbook.is_file(), f"{alert}: runbook_url points at {path}, which does not exist"
    assert anchor == alert.lower() and anchor in github_anchors(runbook.read_text()), (
        f"{alert}: {runbook.name} has no heading '{alert}' (anchor #{anchor})"
    )


@pytest.mark.parametrize("rule", [r.get("alert") or r["record"] for g in RULES["groups"] for r in g["rules"]])
def test_rules_use_only_metrics_the_code_exposes(rule):
    (expr,) = [r["expr"] for g in RULES["groups"] for r in g["rules"] if rule in (r.get("alert"), r.get("record"))]
    unknown = promql_metric_names(expr) - code_series() - PROMETHEUS_SERIES
    assert not unknown, f"{rule} uses {sorted(unknown)}, which no registry or recording rule defines"


def test_the_kubernetes_prometheusrule_carries_exactly_these_rules():
    (rule,) = [
        d
        for d in yaml.safe_load_all((OPS / "k8s" / "prometheusrule.yaml").read_text())
        if d["kind"] == "PrometheusRule"
    ]
    assert rule["spec"]["groups"] == RULES["groups"], (
        "ops/k8s/prometheusrule.yaml differs from ops/prometheus/jetspec.rules.yml -- copy the groups over"
    )
