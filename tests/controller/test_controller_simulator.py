"""The simulator drives the real controller; the control-plane goals hold in every scenario."""

from __future__ import annotations

import random

import pytest

from controller.sim.costs import CODE, CostModel, forward_cost
from controller.sim.goals import score_run
from controller.sim.scenarios import SCENARIOS
from controller.sim.server import FakeServer, SimNetwork
from controller.sim.simulator import ADMIN_KEY, POLICIES_DIR, run_scenario
from controller.telemetry import ScrapeSource
from policies.loader import load_policy
from policies.table import default_table


@pytest.fixture(scope="module")
def scores():
    return {name: score_run(run_scenario(scenario)) for name, scenario in SCENARIOS.items()}


def test_forward_cost_matches_the_measured_points():
    assert [forward_cost(n) for n in (1, 8, 16, 32, 64, 256)] == [1.0, 1.65, 1.98, 2.83, 4.54, 14.2]
    assert forward_cost(48) == pytest.approx((2.83 + 4.54) / 2)
    assert forward_cost(512) == pytest.approx(14.2 + 256 * (14.2 - 4.54) / 192)


def test_cost_model_budget_zero_is_plain_decoding():
    costs = CostModel()
    off = costs.step(batch=4, budget=0)
    assert (off.draft_s, off.tree_s, off.accept_s) == (0.0, 0.0, 0.0)
    assert off.verify_s == pytest.approx(0.04 * forward_cost(4))
    spec = costs.step(batch=4, budget=16)
    assert spec.verify_s == pytest.approx(0.04 * forward_cost(64))  # batch multiplies the tree's tokens
    assert spec.draft_s == pytest.approx(0.05 * 0.04 * forward_cost(64))
    assert CODE.committed_per_step(0) == CODE.committed_per_step(1) == 1.0
    assert 1.0 < CODE.committed_per_step(16) < CODE.committed_per_step(64) < 9.0


def test_fake_server_speaks_the_worker_contract():
    policy = load_policy(POLICIES_DIR / "default.yaml")
    server = FakeServer("sim://r0", policy, ADMIN_KEY, CostModel(), random.Random(0))
    source = ScrapeSource([server.url], SimNetwork([server]))
    source.read()
    server.run(10.0, {1: 1.0}, CODE)
    usage = source.read().usage
    assert set(usage) == {("bs1", 32)}
    assert 2 < usage[("bs1", 32)].committed_tokens / usage[("bs1", 32)].request_seconds * 0.04 < 3
    table = default_table(policy).model_dump()
    table["ttl_s"] = 30.0
    server.active.apply(table, now=0.0)
    server.now = 30.0
    assert server.active.state(server.now).source == "yaml"  # TTL expired: back to the YAML default


def test_every_scenario_meets_its_goals(scores):
    failed = {name: [check for check, ok in score.checks.items() if not ok] for name, score in scores.items()}
    assert failed == {name: [] for name in SCENARIOS}


def test_goodput_is_within_5_percent_of_the_best_static_budget(scores):
    for score in scores.values():
        for cohort in score.cohorts:
            assert cohort.goodput_ratio >= 0.95, (score.scenario, cohort)


def test_stationary_load_does_not_flap(scores):
    for cohort in scores["stationary"].cohorts:
        assert cohort.switches_per_hour <= 2.0, cohort
    best = {c.cohort: c.best_static_budget for c in scores["stationary"].cohorts}
    assert best == {"bs1": 32, "bs2-6": 16, "bs7-12": 0, "bs25-256": 0}


def test_speculation_that_hurts_is_gated_off_quickly_and_cheaply(scores):
    score = scores["speculation-hurts"]
    (cohort,) = score.cohorts
    dwell = load_policy(POLICIES_DIR / SCENARIOS["speculation-hurts"].policy_file).gate.dwell_s
    assert cohort.best_static_budget == 0
    assert cohort.time_to_off_s <= 2 * dwell
    assert 0.0 <= score.loss_vs_off <= 0.02


def test_controller_outage_falls_back_and_restart_is_quiet(scores):
    checks = scores["controller-killed"].checks
    assert checks["outage: last table kept until TTL"]
    assert checks["outage: YAML default after TTL"]
    assert checks["restart: no table change in first interval"]
    assert checks["pushes per replica per interval <= 1"]
    assert scores["controller-killed"].notes == [
        "outage 1800-1830s: replicas on 'pushed' table at restart",
        "outage 3600-4200s: replicas on 'yaml' table at restart",
    ]
