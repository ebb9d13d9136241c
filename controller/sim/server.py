"""A simulated serving replica: the real control endpoint and policy runtime, simulated steps.

It answers the same HTTP requests a server does (`/metrics`, `/set_internal_state`,
`/server_info`) through an in-process transport, keeps its table with the same
`ActivePolicy` the worker uses (TTL expiry back to the YAML default included) and exports the
worker's Prometheus counters, so the controller under test cannot tell it from a real server.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from controller.sim.costs import AcceptanceProfile, CostModel, StepCost
from policies.cohorts import cohort_index_for_batch
from policies.control_api import handle_server_info, handle_set_internal_state
from policies.runtime import ActivePolicy
from policies.schema import Policy

_COUNTERS = (
    "steps",
    "requests",
    "committed_tokens",
    "step_seconds",
    "request_seconds",
    "draft_seconds",
    "tree_seconds",
    "verify_seconds",
    "accept_seconds",
)


@dataclass(frozen=True)
class Noise:
    step_time_sigma: float = 0.02  # per interval and budget: contention, scheduling jitter
    acceptance_sigma: float = 0.03  # per interval, shared by budgets: prompt mix drifts
    per_step_accept_cv: float = 0.6  # sd of one request-step's committed tokens / (mean - 1)


@dataclass(frozen=True)
class PushEvent:
    at: float
    changed_table: bool  # False for a renewal of the table already in force


@dataclass
class CohortTotals:
    """Ground truth for scoring a run: everything a cohort committed and spent."""

    committed_tokens: float = 0.0
    request_seconds: float = 0.0


class FakeServer:
    def __init__(
        self, url: str, policy: Policy, admin_key: str, costs: CostModel, rng: random.Random, noise: Noise = Noise()
    ):
        self.url = url
        self.active = ActivePolicy(policy)
        self._admin_key = admin_key
        self._costs = costs
        self._rng = rng
        self._noise = noise
        self.now = 0.0
        self.pushes: list[PushEvent] = []
        self.totals: dict[str, CohortTotals] = {c.name: CohortTotals() for c in policy.cohorts}
        self._counters: dict[str, dict[tuple[str, int], float]] = {name: {} for name in _COUNTERS}
        self._carry: dict[tuple[str, int], float] = {}

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> tuple[int, bytes]:
        if method == "GET" and path == "/metrics":
            return 200, self.render_metrics().encode()
        if method == "GET" and path == "/server_info":
            return 200, json.dumps(handle_server_info(self.active, self.now)).encode()
        if method == "POST" and path == "/set_internal_state":
            before = self.active.table(self.now)
            status, payload = handle_set_internal_state(
                self.active, body or b"", headers.get("Authorization"), self._admin_key, self.now
            )
            if status == 200:
                self.pushes.append(PushEvent(self.now, self.active.table(self.now) != before))
            return status, json.dumps(payload).encode()
        return 404, b'{"error": "not found"}'

    def run(self, duration_s: float, load: dict[int, float], profile: AcceptanceProfile) -> None:
        """Serve `duration_s` seconds from `self.now`, split between batch sizes by `load` (shares of
        busy time); the table in force at the start holds for the whole interval."""
        table = self.active.table(self.now)
        accept_jitter = math.exp(self._rng.gauss(0.0, self._noise.acceptance_sigma))
        for batch, share in load.items():
            cohort = table.cohorts[cohort_index_for_batch(table.cohorts, batch)]
            probe_share = cohort.probe.share if cohort.probe is not None else 0.0
            budgets = [cohort.budget] + ([cohort.probe.budget] if cohort.probe is not None else [])
            costs = {b: self._costs.step(batch, b) for b in budgets}
            slow = {b: math.exp(self._rng.gauss(0.0, self._noise.step_time_sigma)) for b in budgets}
            mean_step_s = sum(costs[b].total_s * slow[b] * f for b, f in zip(budgets, (1.0 - probe_share, probe_share)))
            # Whole steps; fractions carry over to the next interval, as does the probe credit
            # (the worker's ActivePolicy spreads probe steps the same way). Interleaved batches
            # on a real server share probe steps in proportion, hence one credit per batch size.
            steps = self._whole(("steps", batch), share * duration_s / mean_step_s)
            probe_steps = self._whole(("probe", batch), steps * probe_share)
            for budget, n in zip(budgets, (steps - probe_steps, probe_steps)):
                extra = (profile.committed_per_step(budget) - 1.0) * accept_jitter
                self._record(cohort.name, batch, budget, n, costs[budget], slow[budget], 1.0 + extra)

    def _whole(self, key: tuple[str, int], exact: float) -> int:
        total = exact + self._carry.get(key, 0.0)
        whole = int(total)
        self._carry[key] = total - whole
        return whole

    def _record(
        self, cohort: str, batch: int, budget: int, steps: int, cost: StepCost, slow: float, mean_committed: float
    ) -> None:
        if steps <= 0:
            return
        requests = steps * batch
        # Committed tokens vary per request and step; a mean-preserving log-normal keeps the
        # total positive and unbiased even for a handful of probe steps.
        sigma = self._noise.per_step_accept_cv * (1.0 - 1.0 / mean_committed) / math.sqrt(requests)
        committed = requests * mean_committed * math.exp(self._rng.gauss(-sigma * sigma / 2, sigma))
        step_seconds = steps * cost.total_s * slow
        values = {
            "steps": steps,
            "requests": requests,
            "committed_tokens": committed,
            "step_seconds": step_seconds,
            "request_seconds": step_seconds * batch,
            "draft_seconds": steps * cost.draft_s * slow,
            "tree_seconds": steps * cost.tree_s * slow,
            "verify_seconds": steps * cost.verify_s * slow,
            "accept_seconds": steps * cost.accept_s * slow,
        }
        for name, value in values.items():
            series = self._counters[name]
            series[(cohort, budget)] = series.get((cohort, budget), 0.0) + value
        totals = self.totals[cohort]
        totals.committed_tokens += committed
        totals.request_seconds += step_seconds * batch

    def render_metrics(self) -> str:
        """The worker's counters in Prometheus text format (written directly: the simulator scrapes
        thousands of pages, and prometheus_client's renderer would dominate its run time)."""
        lines = []
        for name, series in self._counters.items():
            lines += [f"# HELP jetspec_{name}_total simulated {name}", f"# TYPE jetspec_{name}_total counter"]
            lines += [
                f'jetspec_{name}_total{{cohort="{cohort}",budget="{budget}"}} {value!r}'
                for (cohort, budget), value in sorted(series.items())
            ]
        return "\n".join(lines) + "\n"


class SimNetwork:
    """In-process transport: routes the controller's HTTP calls to the fake server at that URL."""

    def __init__(self, servers: list[FakeServer]):
        self._servers = {s.url: s for s in servers}

    def __call__(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None, timeout_s: float
    ) -> tuple[int, bytes]:
        for base, server in self._servers.items():
            if url.startswith(base + "/"):
                return server.handle(method, url[len(base) :], headers, body)
        raise ConnectionError(f"{method} {url}: no simulated server there")
