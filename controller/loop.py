"""One controller: telemetry -> estimates -> decisions -> a validated table -> pushes and renewals.

`step()` runs one interval; the CLI calls it on a timer, the simulator on a simulated clock.
`resume()` reads back what the servers run so a restarted controller continues from it instead
of pushing a fresh table everywhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.decider import BudgetDecider, Decision
from controller.estimator import GoodputEstimator
from controller.observability import Observer
from controller.server_client import PushRejected, ServerClient, ServerUnavailable
from controller.shadow_alarm import ShadowAlarmSource
from controller.telemetry import TelemetrySource
from policies.problems import PolicyError
from policies.schema import Policy
from policies.table import CohortBudget, PolicyState, PolicyTable, default_table, validate_table

log = logging.getLogger(__name__)

SHADOW_ALARM = "shadow_alarm"  # decision reason: the shadow drift alarm gated speculation off


@dataclass(frozen=True)
class ServerView:
    """What a server runs as far as the controller knows (None = unknown) and when to renew it."""

    table: PolicyTable | None = None
    renew_at: float | None = None  # None: nothing to renew (YAML default, or unknown)


class Controller:
    def __init__(
        self,
        policy: Policy,
        telemetry: TelemetrySource,
        servers: Sequence[ServerClient],
        clock: Callable[[], float],
        observer: Observer,
        dry_run: bool = False,
        shadow_alarm: ShadowAlarmSource | None = None,
    ):
        self._policy = policy
        self._telemetry = telemetry
        self._servers = list(servers)
        self._clock = clock
        self._observer = observer
        self._dry_run = dry_run
        self._decider = BudgetDecider(policy, clock)
        self._estimator = GoodputEstimator(policy.controller.window_s)
        self._table = default_table(policy)  # last known good table: the one servers should run
        self._views = {s.url: ServerView() for s in self._servers}
        self._shadow_alarm = shadow_alarm
        self._gated = False  # the shadow alarm gated speculation off at the last step

    @property
    def table(self) -> PolicyTable:
        return self._table

    def resume(self) -> None:
        """Read back what every server runs; continue from the freshest pushed table (else YAML)."""
        now = self._clock()
        candidates: list[PolicyState] = []
        for server in self._servers:
            try:
                state = server.read_state()
            except (ServerUnavailable, PushRejected) as exc:
                log.warning("resume: cannot read %s: %s", server.url, exc)
                continue
            self._observer.confirmed(server.url, now)
            # Renew at the table's half-life, like our own pushes (assumes NTP-synced clocks).
            renew_at = None if state.expires_at is None else state.expires_at - state.table.ttl_s / 2
            self._views[server.url] = ServerView(state.table, renew_at)
            try:
                validate_table(state.table, self._policy)
            except PolicyError as exc:
                log.warning("resume: %s runs a table this policy does not allow: %s", server.url, exc)
                continue
            candidates.append(state)
        pushed = [s for s in candidates if s.source == "pushed"]
        if pushed:
            self._table = max(pushed, key=lambda s: s.expires_at or 0.0).table
        elif candidates:
            self._table = candidates[0].table
        self._decider.resume(self._table)
        log.info("resume: continuing from %s", json.dumps(self._table.budgets()))

    def step(self) -> list[Decision]:
        now = self._clock()
        reading = self._telemetry.read()
        for source in reading.failed:
            self._observer.telemetry_failures.labels(source).inc()
        decisions: list[Decision] = []
        if reading.usage is not None:  # None: first read, counters have no baseline yet
            self._estimator.add(now, reading.usage)
            decisions = self._decider.decide(self._estimator)
            for decision in decisions:
                self._observer.record_decision(decision)
            self._adopt(self._decider.table())
        gated = self._shadow_gate(now)
        if gated:
            decisions = self._gate_off_everywhere(now)
        elif self._gated:  # the alarm cleared: back to the decider's table
            self._adopt(self._decider.table())
        self._gated = gated
        self._sync(now)
        self._observer.update_staleness([s.url for s in self._servers], now)
        return decisions

    def _shadow_gate(self, now: float) -> bool:
        """Whether the shadow alarm is in force and the policy says to gate speculation off on it."""
        if self._shadow_alarm is None or not self._policy.shadow.gate_on_alarm:
            return False
        try:
            self._shadow_alarm.read()
        except (ConnectionError, OSError, ValueError) as exc:
            self._observer.telemetry_failures.labels(self._shadow_alarm.location).inc()
            log.warning(
                "shadow alarm: cannot read %s, keeping the last value (%s): %s",
                self._shadow_alarm.location,
                self._shadow_alarm.in_force,
                exc,
            )
        return self._shadow_alarm.in_force

    def _gate_off_everywhere(self, now: float) -> list[Decision]:
        """Budget 0 (no probes) in every cohort; the decider keeps its own table for when the alarm clears."""
        previous = self._table.budgets()
        self._table = PolicyTable(
            cohorts=[CohortBudget.of(c, 0) for c in self._policy.cohorts], ttl_s=self._policy.controller.ttl_s
        )
        decisions = [Decision(c.name, now, previous[c.name], 0, None, SHADOW_ALARM, ()) for c in self._policy.cohorts]
        for decision in decisions:
            self._observer.record_decision(decision)
        return decisions

    def _adopt(self, table: PolicyTable) -> None:
        try:
            self._table = validate_table(table, self._policy)
        except PolicyError as exc:
            self._observer.invalid_tables.inc()
            log.error("decided table is invalid, keeping the last good one: %s", exc)

    def _sync(self, now: float) -> None:
        for server in self._servers:
            view = self._views[server.url]
            renewal_due = view.renew_at is not None and now >= view.renew_at
            if view.table == self._table and not renewal_due:
                continue
            if self._dry_run:
                log.info("dry-run: would push to %s: %s", server.url, self._table.model_dump_json())
                continue
            try:
                state = server.push(self._table)
            except (PolicyError, PushRejected, ServerUnavailable) as exc:
                kind = {PolicyError: "invalid", PushRejected: "rejected"}.get(type(exc), "unavailable")
                self._observer.push_failures.labels(server.url, kind).inc()
                self._views[server.url] = ServerView()
                log.warning("push to %s failed (%s): %s", server.url, kind, exc)
                continue
            self._observer.pushes.labels(server.url).inc()
            self._observer.confirmed(server.url, now)
            self._views[server.url] = ServerView(state.table, now + state.table.ttl_s / 2)
