"""Cost and acceptance model behind the simulator's fake servers.

Step time = draft (one head pass over batch x block_size tokens, budget > 0 only) + verify (one
target pass over batch x budget tokens) + tree/accept bookkeeping per node. Target forward costs
are the ones measured for SmolLM2-135M on this CPU, relative to one new token; a batch multiplies
the tokens. Budget 0 is plain decoding: one forward over `batch` tokens, no draft work.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

# (tokens in one forward, cost relative to a 1-token forward)
RELATIVE_FORWARD_COST = ((1, 1.0), (8, 1.65), (16, 1.98), (32, 2.83), (64, 4.54), (256, 14.2))


def forward_cost(tokens: float) -> float:
    """Piecewise-linear through the measured points, extended linearly past the last one."""
    xs = [x for x, _ in RELATIVE_FORWARD_COST]
    ys = [y for _, y in RELATIVE_FORWARD_COST]
    i = min(max(bisect.bisect_left(xs, tokens), 1), len(xs) - 1)
    slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + slope * (tokens - xs[i - 1])


@dataclass(frozen=True)
class AcceptanceProfile:
    """Committed tokens per step (bonus included) saturating with the budget:
    1 + max_extra * (1 - exp(-(budget - 1) / scale)); budget 0 or 1 commits exactly 1."""

    name: str
    max_extra: float
    scale: float

    def committed_per_step(self, budget: int) -> float:
        if budget <= 1:
            return 1.0
        return 1.0 + self.max_extra * (1.0 - math.exp(-(budget - 1) / self.scale))


# Workloads: code completion accepts long runs, chat less, templated/noisy traffic barely any.
CODE = AcceptanceProfile("code", max_extra=8.0, scale=30.0)
CHAT = AcceptanceProfile("chat", max_extra=4.0, scale=30.0)
LOW_ACCEPTANCE = AcceptanceProfile("low-acceptance", max_extra=1.0, scale=20.0)


@dataclass(frozen=True)
class StepCost:
    draft_s: float
    tree_s: float
    verify_s: float
    accept_s: float

    @property
    def total_s(self) -> float:
        return self.draft_s + self.tree_s + self.verify_s + self.accept_s


@dataclass(frozen=True)
class CostModel:
    token_forward_s: float = 0.04  # the order of SmolLM2 fp32 on a 2-core CPU (docs/benchmarks.md)
    draft_relative: float = 0.05  # draft head pass vs a target pass over the same tokens
    block_size: int = 16
    tree_node_s: float = 2e-5  # best-first tree build, per node and request
    accept_node_s: float = 1e-5  # acceptance walk and KV compaction, per node and request

    def step(self, batch: int, budget: int) -> StepCost:
        if budget == 0:
            return StepCost(0.0, 0.0, self.token_forward_s * forward_cost(batch), 0.0)
        draft = self.draft_relative * self.token_forward_s * forward_cost(batch * self.block_size)
        verify = self.token_forward_s * forward_cost(batch * budget)
        return StepCost(draft, self.tree_node_s * batch * budget, verify, self.accept_node_s * batch * budget)

    def goodput(self, batch: int, budget: int, profile: AcceptanceProfile) -> float:
        """Expected committed tokens per second per request."""
        return profile.committed_per_step(budget) / self.step(batch, budget).total_s
