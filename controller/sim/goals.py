"""Score a simulated run against the control-plane goals.

- goodput: per cohort, realized goodput >= 95% of the best static budget chosen in hindsight
  (expected goodput of running that one budget through the same load);
- no_flap: <= 2 budget switches per hour per cohort after the warm-up;
- gate_off: where speculation hurts, off within two dwell periods, and the run loses <= 2%
  against plain decoding;
- outage: while the controller is dead each replica keeps its last table until the TTL, then
  runs the YAML default; a restarted controller changes no table in its first interval and no
  replica ever gets more than one push per interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.sim.scenarios import GATE_OFF, GOODPUT, NO_FLAP, OUTAGE
from controller.sim.simulator import SimResult

MIN_GOODPUT_RATIO = 0.95
MAX_SWITCHES_PER_HOUR = 2.0
MAX_LOSS_VS_OFF = 0.02


@dataclass(frozen=True)
class CohortScore:
    cohort: str
    traffic_share: float
    goodput_ratio: float
    best_static_budget: int
    switches_per_hour: float
    time_to_off_s: float | None  # after the cohort's first traffic; if off is best and it started on


@dataclass
class ScenarioScore:
    scenario: str
    cohorts: list[CohortScore]
    loss_vs_off: float | None
    checks: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(self.checks.values())


def _cohort_score(result: SimResult, name: str, total_traffic: float) -> CohortScore | None:
    tokens = sum(s.totals[name].committed_tokens for s in result.servers)
    seconds = sum(s.totals[name].request_seconds for s in result.servers)
    if seconds <= 0:
        return None
    static = {b: t / r for b, (t, r) in result.static_totals[name].items() if r > 0}
    best = max(static, key=static.get)
    rows = result.cohorts[name]
    warmup = result.scenario.warmup_s
    switches = sum(1 for i in range(1, len(rows)) if rows[i].budget != rows[i - 1].budget and result.times[i] >= warmup)
    hours = (result.times[-1] + result.policy.controller.interval_s - warmup) / 3600.0
    time_to_off = None  # from the cohort's first traffic
    if best == 0 and rows[0].budget != 0:
        first = next(t for t, row in zip(result.times, rows) if row.request_seconds > 0)
        time_to_off = next((t for t, row in zip(result.times, rows) if row.budget == 0), float("inf")) - first
    return CohortScore(
        name, seconds / total_traffic, (tokens / seconds) / static[best], best, switches / hours, time_to_off
    )


def _loss_vs_off(result: SimResult) -> float | None:
    names = [c.name for c in result.policy.cohorts if 0 in c.budgets]
    off_tokens = sum(result.static_totals[n][0][0] for n in names)
    if off_tokens <= 0:
        return None
    tokens = sum(s.totals[n].committed_tokens for s in result.servers for n in names)
    return 1.0 - tokens / off_tokens


def _outage_checks(result: SimResult, score: ScenarioScore) -> None:
    ttl = result.policy.controller.ttl_s
    kept, reverted, quiet_restart = True, True, True
    for start, end in result.scenario.controller_down:
        k0 = result.times.index(start)
        for i, server in enumerate(result.servers):
            last_push = max(p.at for p in server.pushes if p.at < start)
            held = result.server_states[k0][i]
            for k, t in enumerate(result.times):
                if not start <= t < end:
                    continue
                state = result.server_states[k][i]
                if t < last_push + ttl:
                    kept &= state.source == "pushed" and state.generation == held.generation
                else:
                    reverted &= state.source == "yaml"
            restart_changes = [p for p in server.pushes if p.at == end and p.changed_table]
            quiet_restart &= not restart_changes
        score.notes.append(
            f"outage {start:.0f}-{end:.0f}s: replicas on "
            f"{result.server_states[result.times.index(end) - 1][0].source!r} table at restart"
        )
    per_interval = max(
        max((sum(1 for p in s.pushes if p.at == t) for t in result.times), default=0) for s in result.servers
    )
    score.checks["outage: last table kept until TTL"] = kept
    score.checks["outage: YAML default after TTL"] = reverted
    score.checks["restart: no table change in first interval"] = quiet_restart
    score.checks["pushes per replica per interval <= 1"] = per_interval <= 1


def score_run(result: SimResult) -> ScenarioScore:
    goals = result.scenario.goals
    total = sum(s.totals[c.name].request_seconds for s in result.servers for c in result.policy.cohorts)
    cohorts = [c for c in (_cohort_score(result, p.name, total) for p in result.policy.cohorts) if c]
    score = ScenarioScore(result.scenario.name, cohorts, _loss_vs_off(result))
    for c in cohorts:
        if GOODPUT in goals:
            score.checks[f"{c.cohort}: goodput >= 95% of best static"] = c.goodput_ratio >= MIN_GOODPUT_RATIO
        if NO_FLAP in goals:
            score.checks[f"{c.cohort}: <= 2 switches/h"] = c.switches_per_hour <= MAX_SWITCHES_PER_HOUR
        if GATE_OFF in goals and c.time_to_off_s is not None:
            limit = 2 * result.policy.gate.dwell_s
            score.checks[f"{c.cohort}: off within 2 dwell ({limit:.0f}s)"] = c.time_to_off_s <= limit
    if GATE_OFF in goals:
        score.checks["loss vs plain decoding <= 2%"] = (
            score.loss_vs_off is not None and score.loss_vs_off <= MAX_LOSS_VS_OFF
        )
    if OUTAGE in goals:
        _outage_checks(result, score)
    return score


def format_scores(scores: list[ScenarioScore]) -> str:
    header = (
        f"{'scenario':<19} {'cohort':<9} {'req-s':>7} {'vs best static':>14} {'best':>5} "
        f"{'switch/h':>8} {'off after':>9} {'loss vs off':>11}"
    )
    lines = [header, "-" * len(header)]
    for s in scores:
        for i, c in enumerate(s.cohorts):
            off = "-" if c.time_to_off_s is None else f"{c.time_to_off_s:.0f}s"
            # The loss is the whole run's (all cohorts), negative when speculation gained.
            loss = "" if i or s.loss_vs_off is None else f"{100 * s.loss_vs_off:+.2f}%"
            lines.append(
                f"{s.scenario:<19} {c.cohort:<9} {100 * c.traffic_share:>6.1f}% "
                f"{100 * c.goodput_ratio:>13.1f}% {c.best_static_budget:>5} "
                f"{c.switches_per_hour:>8.2f} {off:>9} {loss:>11}"
            )
    lines.append("")
    for s in scores:
        for check, ok in s.checks.items():
            lines.append(f"{'PASS' if ok else 'FAIL'}  {s.scenario}: {check}")
        lines.extend(f"      {s.scenario}: {note}" for note in s.notes)
    failed = sum(not ok for s in scores for ok in s.checks.values())
    total = sum(len(s.checks) for s in scores)
    lines.append(f"\n{total - failed} of {total} goal checks passed")
    return "\n".join(lines)
