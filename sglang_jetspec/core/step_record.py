"""What one verify step did: the telemetry contract's per-step fields, shared by every engine
(the reference engine and the SGLang worker) and read by metrics and traces."""

from __future__ import annotations

from dataclasses import dataclass, field

from .branch_gap import BranchGap


@dataclass
class StepRecord:
    """What one verify step did; the telemetry contract's per-step fields."""

    batch_size: int
    budget: int
    committed_tokens: int
    accept_lengths: list[int]
    draft_s: float
    tree_s: float
    verify_s: float
    accept_s: float
    wall_s: float
    commit_s: float = 0.0  # the part of accept_s spent committing tokens, KV and hidden rows (trace spans)
    draft_round_s: list[float] = field(
        default_factory=list
    )  # draft_s by round: [marginal pass, tree-causal round 1, ...]
    rank1_gaps: list[BranchGap] | None = (
        None  # per lane, with EngineConfig.rank1_gap (the paper's coherence diagnostic)
    )
    verified_nodes: int = (
        0  # tree nodes the verify pass ran, roots included (below batch x budget under adaptive sizing)
    )
