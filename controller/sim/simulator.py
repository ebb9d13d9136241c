"""Run a scenario: fake servers + the real controller (decider, estimator, scrape, push client).

Every interval the controller (when alive) scrapes the fake servers' /metrics and pushes tables
through the same ServerClient it uses in production; then each fake server serves the interval
under whatever table it runs (TTL expiry included). The run records, per interval and cohort, the
budget in force, the realized goodput, and the expected gain of every candidate for scoring.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import policies
from controller.loop import Controller
from controller.observability import Observer, make_tracer
from controller.server_client import ServerClient
from controller.sim.costs import AcceptanceProfile, CostModel
from controller.sim.scenarios import Phase, Scenario
from controller.sim.server import FakeServer, SimNetwork
from controller.telemetry import ScrapeSource
from policies.cohorts import cohort_index_for_batch
from policies.loader import load_policy
from policies.schema import CohortPolicy, Policy
from policies.table import PolicyState

ADMIN_KEY = "simulated-admin-key"
POLICIES_DIR = Path(policies.__file__).parent


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class CohortInterval:
    budget: int  # in force on replica 0
    probe_budget: int | None
    source: str  # "yaml" or "pushed"
    request_seconds: float  # traffic in this cohort during the interval (all replicas)
    goodput: float | None  # realized committed tokens per request-second
    gain: float | None  # realized goodput / expected goodput with speculation off
    best_gain: float | None  # expected gain of the best candidate for this interval's load


@dataclass
class SimResult:
    scenario: Scenario
    policy: Policy
    times: list[float] = field(default_factory=list)
    cohorts: dict[str, list[CohortInterval]] = field(default_factory=dict)
    server_states: list[list[PolicyState]] = field(default_factory=list)  # per interval, per replica
    servers: list[FakeServer] = field(default_factory=list)
    # Expected totals had a cohort run one budget all along: cohort -> budget -> (tokens, request-s).
    static_totals: dict[str, dict[int, list[float]]] = field(default_factory=dict)


def expected_tokens(
    policy: Policy,
    cohort: CohortPolicy,
    load: dict[int, float],
    profile: AcceptanceProfile,
    costs: CostModel,
    seconds: float,
) -> tuple[dict[int, float], float]:
    """Expected committed tokens per candidate budget, and request-seconds, for one replica."""
    tokens = {b: 0.0 for b in cohort.budgets}
    request_seconds = 0.0
    for batch, share in load.items():
        if policy.cohorts[cohort_index_for_batch(policy.cohorts, batch)] is cohort:
            busy = share * seconds
            request_seconds += busy * batch
            for b in cohort.budgets:
                tokens[b] += busy * batch * costs.goodput(batch, b, profile)
    return tokens, request_seconds


def _start_controller(policy: Policy, servers: list[FakeServer], network: SimNetwork, clock: SimClock) -> Controller:
    urls = [s.url for s in servers]
    clients = [ServerClient(url, policy, ADMIN_KEY, transport=network, sleep=lambda _s: None) for url in urls]
    controller = Controller(
        policy, ScrapeSource(urls, network), clients, clock, Observer(make_tracer(), started_at=clock())
    )
    controller.resume()
    return controller


def run_scenario(scenario: Scenario, costs: CostModel = CostModel()) -> SimResult:
    policy = load_policy(POLICIES_DIR / scenario.policy_file)
    interval = policy.controller.interval_s
    clock = SimClock()
    seeds = random.Random(scenario.seed)
    servers = [
        FakeServer(f"sim://replica-{i}", policy, ADMIN_KEY, costs, random.Random(seeds.getrandbits(32)))
        for i in range(scenario.servers)
    ]
    network = SimNetwork(servers)
    result = SimResult(
        scenario,
        policy,
        servers=servers,
        cohorts={c.name: [] for c in policy.cohorts},
        static_totals={c.name: {b: [0.0, 0.0] for b in c.budgets} for c in policy.cohorts},
    )
    controller: Controller | None = None
    for k in range(int(scenario.duration_s / interval)):
        clock.now = k * interval
        for server in servers:
            server.now = clock.now
        if any(start <= clock.now < end for start, end in scenario.controller_down):
            controller = None  # killed: its estimates and state are lost
        else:
            controller = controller or _start_controller(policy, servers, network, clock)
            controller.step()
        states = [s.active.state(clock.now) for s in servers]
        before = {
            name: [(s.totals[name].committed_tokens, s.totals[name].request_seconds) for s in servers]
            for name in result.cohorts
        }
        phase = scenario.phase_at(clock.now)
        for server in servers:
            server.run(interval, phase.load, phase.profile)
        result.times.append(clock.now)
        result.server_states.append(states)
        for cohort in policy.cohorts:
            _record_cohort(result, cohort, states[0], before[cohort.name], phase, costs, interval)
    return result


def _record_cohort(
    result: SimResult,
    cohort: CohortPolicy,
    state: PolicyState,
    before: list[tuple[float, float]],
    phase: Phase,
    costs: CostModel,
    interval: float,
) -> None:
    tokens = sum(s.totals[cohort.name].committed_tokens for s in result.servers) - sum(t for t, _ in before)
    seconds = sum(s.totals[cohort.name].request_seconds for s in result.servers) - sum(r for _, r in before)
    expected, request_seconds = expected_tokens(result.policy, cohort, phase.load, phase.profile, costs, interval)
    for budget, value in expected.items():
        total = result.static_totals[cohort.name][budget]
        total[0] += value * len(result.servers)
        total[1] += request_seconds * len(result.servers)
    running = next(c for c in state.table.cohorts if c.name == cohort.name)
    off = expected.get(0, 0.0)
    goodput = tokens / seconds if seconds > 0 else None
    result.cohorts[cohort.name].append(
        CohortInterval(
            budget=running.budget,
            probe_budget=running.probe.budget if running.probe is not None else None,
            source=state.source,
            request_seconds=seconds,
            goodput=goodput,
            gain=goodput / (off / request_seconds) if goodput is not None and off > 0 else None,
            best_gain=max(expected.values()) / off if off > 0 else None,
        )
    )
