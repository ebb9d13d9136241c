"""Worker telemetry: the Prometheus metrics of the telemetry contract (../shared/DESIGN.md).

Every verify step adds to counters labelled by `cohort` and `budget` ("0" = speculation off), so
the goodput of any window is a rate ratio: committed_tokens_total / request_seconds_total.
The controller reads exactly these names (controller/telemetry.py). Prefill is not a verify step
and is not counted: it costs the same whatever the budget, so it would only blur comparisons.

The metrics are created on a registry passed in: a plain CollectorRegistry for the reference
server; SGLang's worker will create the same class under prometheus_client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR). Hence only counters, histograms and gauges with an explicit
`multiprocess_mode` (no Summary quantiles, Info or Enum, which multiprocess mode cannot merge).
No SGLang or torch import: this module is shared by both servers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:  # only for annotations: the SGLang worker must not import the reference engine
    from policies.table import PolicyState
    from sglang_jetspec.core.step_record import StepRecord

LABELS = ("cohort", "budget")

# Committed tokens per verify per request, bonus included: 1 (nothing accepted) up to the head's
# block size (16 for our heads; published heads go to 32).
ACCEPT_LENGTH_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)

# Gauges: when several processes export (SGLang's scheduler ranks), a dead process's value drops
# out ("live") and, among the live ones, which all apply the same pushes, the latest write wins.
POLICY_GAUGE_MODE = "livemostrecent"

# Counter name -> (help, what one step adds).
STEP_COUNTERS: dict[str, tuple[str, Callable[[StepRecord], float]]] = {
    "jetspec_steps_total": ("Verify steps", lambda r: 1),
    "jetspec_requests_total": ("Requests in verify steps (sum of batch sizes over steps)", lambda r: r.batch_size),
    "jetspec_committed_tokens_total": ("Tokens committed by verify steps", lambda r: r.committed_tokens),
    "jetspec_step_seconds_total": ("Wall seconds of verify steps", lambda r: r.wall_s),
    "jetspec_request_seconds_total": (
        "Request-seconds of verify steps (batch size x step wall seconds); "
        "goodput = committed_tokens_total / request_seconds_total",
        lambda r: r.batch_size * r.wall_s,
    ),
    "jetspec_verified_nodes_total": (
        "Tree nodes the verify passes ran, roots included (below requests x budget under adaptive tree sizing)",
        lambda r: r.verified_nodes,
    ),
    "jetspec_draft_seconds_total": ("Seconds in the draft head pass", lambda r: r.draft_s),
    "jetspec_tree_seconds_total": ("Seconds building draft trees", lambda r: r.tree_s),
    "jetspec_verify_seconds_total": ("Seconds in the target verify pass", lambda r: r.verify_s),
    "jetspec_accept_seconds_total": ("Seconds in acceptance and KV commit", lambda r: r.accept_s),
    "jetspec_commit_seconds_total": (
        "Of jetspec_accept_seconds_total, seconds committing (KV move, logprobs, draft-context rows)",
        lambda r: r.commit_s,
    ),
}


class JetspecMetrics:
    def __init__(self, registry: CollectorRegistry):
        self._counters = [
            (Counter(name, doc, LABELS, registry=registry), value) for name, (doc, value) in STEP_COUNTERS.items()
        ]
        self.accept_length = Histogram(
            "jetspec_accept_length",
            "Committed tokens per verify per request, bonus included",
            LABELS,
            buckets=ACCEPT_LENGTH_BUCKETS,
            registry=registry,
        )
        self.policy_budget = Gauge(
            "jetspec_policy_budget",
            "Budget of the policy table in force (0 = off)",
            ["cohort"],
            multiprocess_mode=POLICY_GAUGE_MODE,
            registry=registry,
        )
        self.policy_expiry = Gauge(
            "jetspec_policy_expiry_timestamp_seconds",
            "Unix time the pushed table expires (0 = YAML default in force)",
            multiprocess_mode=POLICY_GAUGE_MODE,
            registry=registry,
        )
        self.policy_generation = Gauge(
            "jetspec_policy_generation",
            "Tables applied since start, the YAML fallback after an expiry included",
            multiprocess_mode=POLICY_GAUGE_MODE,
            registry=registry,
        )
        # The server's own decision per cohort (policies/same_allocation.py); the controller reads the
        # same evidence from the step counters, where native steps count under budget 0.
        self.same_allocation_speculating = Gauge(
            "jetspec_same_allocation_speculating",
            "1 while the cohort speculates, 0 while the server's own measurement runs it native",
            ["cohort"],
            multiprocess_mode=POLICY_GAUGE_MODE,
            registry=registry,
        )
        self.same_allocation_gain = Gauge(
            "jetspec_same_allocation_gain",
            "Measured tokens per request per second, speculative over native (0 = not yet measured)",
            ["cohort", "bound"],
            multiprocess_mode=POLICY_GAUGE_MODE,
            registry=registry,
        )
        # Summed over live scheduler processes: per-request draft state held outside the KV pool.
        # It returns to 0 when no request is running; anything else is a leak.
        self.live_draft_states = Gauge(
            "jetspec_live_draft_states",
            "Requests with per-request draft state (head context K/V, tap rows) held",
            multiprocess_mode="livesum",
            registry=registry,
        )

    def record_step(self, cohort: str, record: StepRecord) -> None:
        labels = (cohort, str(record.budget))
        for counter, value in self._counters:
            counter.labels(*labels).inc(value(record))
        histogram = self.accept_length.labels(*labels)
        for length in record.accept_lengths:
            histogram.observe(length)

    def show_same_allocation(self, state: dict) -> None:
        """`state`: SameAllocationControl.state(), by cohort."""
        for cohort, entry in state.items():
            if entry["mode"] is None:  # never controlled: its table does not speculate
                continue
            self.same_allocation_speculating.labels(cohort).set(entry["mode"] == "speculative")
            for bound, key in (("estimate", "gain"), ("low", "gain_low"), ("high", "gain_high")):
                self.same_allocation_gain.labels(cohort, bound).set(entry[key] or 0.0)

    def show_policy(self, state: PolicyState) -> None:
        for cohort in state.table.cohorts:
            self.policy_budget.labels(cohort.name).set(cohort.budget)
        self.policy_expiry.set(state.expires_at or 0.0)
        self.policy_generation.set(state.generation)
