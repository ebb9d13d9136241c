"""The decision logic, driven interval by interval with an injected clock and known goodputs."""

from __future__ import annotations

import random

from controller import decider as reasons
from controller.decider import BudgetDecider, Decision
from controller.estimator import GoodputEstimator
from controller.telemetry import Usage
from policies.loader import parse_policy_text
from policies.table import PolicyTable, validate_table

# Truth for cohorts a test does not set: 16 is best at bs1, off is best at bs2-8.
DEFAULT_TRUTH = {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 14.0}, "bs2-8": {0: 10.0, 4: 8.0, 8: 7.0}}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class World:
    """Servers as the estimator sees them: each interval the incumbent and the current probe of
    every cohort run and report goodput = truth x noise (a shared per-interval factor, as load and
    prompt mix move every budget together, times per-budget jitter)."""

    def __init__(
        self, policy, truth: dict[str, dict[int, float]], noise: float = 0.0, shared: float = 0.0, seed: int = 0
    ):
        self.policy = policy
        self.truth = DEFAULT_TRUTH | truth
        self.clock = Clock()
        self.decider = BudgetDecider(policy, self.clock)
        self.estimator = GoodputEstimator(policy.controller.window_s)
        self._rng = random.Random(seed)
        self._noise, self._shared = noise, shared

    def interval(self) -> dict[str, Decision]:
        self.clock.now += self.policy.controller.interval_s
        usage = {}
        for cohort in self.decider.table().cohorts:
            common = 1 + self._rng.gauss(0, self._shared)
            running = [cohort.budget] + ([cohort.probe.budget] if cohort.probe else [])
            for budget in running:
                goodput = self.truth[cohort.name][budget] * common * (1 + self._rng.gauss(0, self._noise))
                usage[(cohort.name, budget)] = Usage(steps=50, committed_tokens=goodput * 10, request_seconds=10)
        self.estimator.add(self.clock.now, usage)
        return {d.cohort: d for d in self.decider.decide(self.estimator)}

    def run(self, intervals: int, cohort: str = "bs1") -> list[Decision]:
        return [self.interval()[cohort] for _ in range(intervals)]

    def start_off(self, cohort: str) -> None:
        table = self.decider.table().model_dump()
        for c in table["cohorts"]:
            if c["name"] == cohort:
                c["budget"], c["probe"] = 0, None
        self.decider.resume(PolicyTable.model_validate(table))


def switches(decisions: list[Decision]) -> list[tuple[float, int, int, str]]:
    return [(d.at, d.previous, d.budget, d.reason) for d in decisions if d.switched]


def test_picks_the_best_budget_once_its_probe_has_evidence(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 20.0}})
    decisions = world.run(100)
    # Probe turns of 3 sampled intervals: off (t=20..40), then 4 (50..70), then 64 (80..100).
    assert [d.probe.budget for d in decisions[:9]] == [0, 0, 0, 4, 4, 4, 64, 64, 64]
    assert switches(decisions) == [(100.0, 16, 64, reasons.BETTER_BUDGET)]
    assert decisions[9].probe.budget == 0  # new incumbent: its least-measured neighbour first
    assert decisions[-1].budget == 64 and decisions[-1].reason == reasons.HOLD


def test_hysteresis_keeps_a_near_tie_from_flapping(test_policy):
    # 64 is 2% better than 16: inside the 3% hysteresis, under realistic noise, for two hours.
    world = World(test_policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 15.3}}, noise=0.03, shared=0.05, seed=1)
    assert switches(world.run(720)) == []


def test_a_clear_winner_still_wins_under_the_same_noise(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 17.0}}, noise=0.03, shared=0.05, seed=1)
    moves = switches(world.run(360))
    assert [(a, b) for _, a, b, _ in moves] == [(16, 64)]


def test_gates_off_after_gain_stays_below_min_gain_for_dwell(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 10.2, 16: 9.5, 64: 8.0}})
    decisions = world.run(30)
    by_time = {d.at: d for d in decisions}
    assert by_time[40.0].reason == reasons.BELOW_MIN_GAIN  # off has 3 paired samples: gain 0.95 < 1.05
    assert switches(decisions)[:2] == [(70.0, 16, 4, reasons.BETTER_BUDGET), (100.0, 4, 0, reasons.GATE_OFF)]
    assert by_time[100.0].at - 40.0 == test_policy.gate.dwell_s
    assert all(d.budget == 0 for d in decisions if d.at >= 100.0)


def test_no_gate_while_gain_clears_min_gain(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 10.8, 16: 11.0, 64: 10.9}}, noise=0.01, seed=2)
    decisions = world.run(200)
    assert all(d.budget != 0 for d in decisions)
    assert all(d.reason != reasons.BELOW_MIN_GAIN for d in decisions[-100:])


def test_reprobe_re_enables_when_speculation_pays_again(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 13.0, 16: 15.0, 64: 12.0}})
    world.start_off("bs1")
    decisions = world.run(60)
    assert all(d.probe is None for d in decisions if d.at < 60.0)  # first re-probe after dwell_s
    assert decisions[5].at == 60.0 and decisions[5].probe.budget == test_policy.gate.reprobe_budget
    assert switches(decisions)[0] == (90.0, 0, 4, reasons.REENABLE)
    assert decisions[-1].budget == 16  # then climbs to the best


def test_failed_reprobes_back_off_exponentially_up_to_the_cap(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 7.0, 16: 6.0, 64: 5.0}})
    world.start_off("bs1")
    decisions = world.run(400)
    starts = [d.at for prev, d in zip(decisions, decisions[1:]) if prev.probe is None and d.probe is not None]
    fails = [d.at for d in decisions if d.reason == reasons.REPROBE_FAILED]
    pauses = [start - fail for fail, start in zip(fails, starts[1:])]
    assert pauses[:5] == [120.0, 240.0, 480.0, 480.0, 480.0]  # dwell x 2^k, capped at 480
    assert all(d.budget == 0 for d in decisions)
    probing = sum(d.probe is not None for d in decisions) / len(decisions)
    assert probing < 0.1  # intervals with a probe (each on probe_share of steps)


def test_off_reprobe_climbs_when_a_small_tree_breaks_even(test_policy):
    world = World(test_policy, {"bs2-8": {0: 10.0, 4: 10.2, 8: 13.0}})
    world.start_off("bs2-8")
    decisions = world.run(40, cohort="bs2-8")
    reasons_seen = [d.reason for d in decisions]
    assert reasons.REPROBE_CLIMB in reasons_seen
    climb = reasons_seen.index(reasons.REPROBE_CLIMB)
    assert decisions[climb].probe.budget == 8
    assert switches(decisions) == [(decisions[climb].at + 30.0, 0, 8, reasons.REENABLE)]


def test_probes_are_bounded_and_tables_always_valid(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 14.0}}, noise=0.05, shared=0.05, seed=3)
    for _ in range(360):
        for decision in world.interval().values():
            cohort = test_policy.cohort(decision.cohort)
            if decision.probe is None:
                continue
            assert decision.probe.share == test_policy.gate.probe_share
            if decision.budget != 0:
                i = cohort.budgets.index(decision.budget)
                assert decision.probe.budget in {0, *cohort.budgets[max(0, i - 1) : i + 2]} - {decision.budget}
        validate_table(world.decider.table(), test_policy)


def test_resume_reproduces_the_table_and_decisions_use_the_clock(test_policy):
    world = World(test_policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 14.0}})
    table = world.decider.table().model_dump()
    table["cohorts"][0].update(budget=64, probe={"budget": 16, "share": 0.05})
    resumed = PolicyTable.model_validate(table)
    world.decider.resume(resumed)
    assert world.decider.table() == resumed
    world.clock.now = 1234.0
    decisions = world.interval()
    assert {d.at for d in decisions.values()} == {1244.0}


def test_tables_keep_each_cohorts_yaml_draft_rounds(test_policy_yaml):
    from policies import parse_policy_text

    text = test_policy_yaml.replace("default: 16", "default: 16, draft_rounds: 1", 1) + "head: {max_draft_rounds: 1}\n"
    policy = parse_policy_text(text)
    assert [c.draft_rounds for c in policy.cohorts][:2] == [1, 0]
    world = World(policy, {"bs1": {0: 10.0, 4: 12.0, 16: 15.0, 64: 20.0}})
    for _ in range(30):  # budgets move; draft rounds stay the YAML's
        world.interval()
        table = world.decider.table()
        assert [c.draft_rounds for c in table.cohorts] == [c.draft_rounds for c in policy.cohorts]
    assert table.cohorts[0].budget == 64
    validate_table(table.model_dump(), policy)


def test_the_decider_keeps_each_cohorts_yaml_settings_beside_the_budgets_it_chooses(test_policy_yaml):
    """A pushed table must not reset what the controller does not decide: a YAML cohort sized adaptively
    stays adaptive (None would mean the server's own, fixed in SGLang), as do its drafter and width."""
    text = test_policy_yaml.replace("default: 4}", "default: 4, tree_sizing: adaptive, drafter: hybrid}", 1)
    policy = parse_policy_text(text, "adaptive.yaml")
    world = World(policy, {})
    for _ in range(3):
        world.interval()
    cohorts = world.decider.table().cohorts
    assert [(c.tree_sizing, c.drafter) for c in cohorts] == [(c.tree_sizing, c.drafter) for c in policy.cohorts]
    assert "adaptive" in [c.tree_sizing for c in cohorts] and "hybrid" in [c.drafter for c in cohorts]
