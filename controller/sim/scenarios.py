"""Simulated scenarios: load over time, workload acceptance, outages, and which goals each proves."""

from __future__ import annotations

from dataclasses import dataclass

from controller.sim.costs import CHAT, CODE, LOW_ACCEPTANCE, AcceptanceProfile

# Goals a scenario is scored on (see controller/sim/goals.py).
GOODPUT = "goodput"  # per cohort >= 95% of the best static budget in hindsight
NO_FLAP = "no_flap"  # <= 2 budget switches per hour per cohort after warm-up
GATE_OFF = "gate_off"  # off within two dwell periods; loss vs plain decoding <= 2%
OUTAGE = "outage"  # tables kept until TTL then YAML; restart resumes without a burst


@dataclass(frozen=True)
class Phase:
    start_s: float
    load: dict[int, float]  # batch size -> share of each server's busy time
    profile: AcceptanceProfile


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration_s: float
    phases: tuple[Phase, ...]
    goals: frozenset[str]
    policy_file: str = "default.yaml"  # in the policies package directory
    servers: int = 2
    seed: int = 7
    controller_down: tuple[tuple[float, float], ...] = ()  # (killed at, restarted at)
    warmup_s: float = 600.0  # switches while converging from the YAML default don't count

    def phase_at(self, t: float) -> Phase:
        return [p for p in self.phases if p.start_s <= t][-1]


_MIXED = {1: 0.4, 2: 0.15, 4: 0.15, 12: 0.15, 48: 0.15}

SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "stationary",
            "steady multi-cohort code traffic on two replicas",
            3 * 3600.0,
            (Phase(0.0, _MIXED, CODE),),
            frozenset({GOODPUT, NO_FLAP}),
        ),
        Scenario(
            "speculation-hurts",
            "batches of 8-12 (budget 8 by default) with low acceptance: speculation only costs",
            2 * 3600.0,
            (Phase(0.0, {8: 0.5, 12: 0.5}, LOW_ACCEPTANCE),),
            frozenset({GOODPUT, GATE_OFF}),
        ),
        Scenario(
            "load-shift",
            "traffic moves between cohorts every 45 min, then the workload turns to chat",
            3 * 3600.0,
            (
                Phase(0.0, {1: 0.8, 4: 0.2}, CODE),
                Phase(2700.0, {12: 0.5, 48: 0.5}, CODE),
                Phase(5400.0, {2: 0.6, 4: 0.4}, CODE),
                Phase(8100.0, {1: 0.7, 32: 0.3}, CHAT),
            ),
            frozenset({GOODPUT}),
        ),
        Scenario(
            "controller-killed",
            "controller dies twice: 30 s (within TTL) and 10 min (past TTL)",
            2 * 3600.0,
            (Phase(0.0, _MIXED, CODE),),
            frozenset({GOODPUT, OUTAGE}),
            controller_down=((1800.0, 1830.0), (3600.0, 4200.0)),
        ),
    )
}
