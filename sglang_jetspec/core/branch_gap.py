"""The JetSpec paper's coherence diagnostic (its Figure 1 "Gap") for one drafted tree.

The rank-1 branch follows the best-scoring child from the root as deep as the tree goes. Its gap is
the draft's cumulative log-prob of the branch (the score the tree was built on) minus the target's
log-prob of the same tokens, sum over the branch of log p(token | context, branch so far) under the
target's raw distribution (temperature 1). A large positive gap means the draft believed a branch
the target finds unlikely: a per-depth marginal draft whose depths do not fit together. The target
terms are exact only where the target scored every branch node, i.e. from a verify pass over the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass(frozen=True)
class BranchGap:
    depth: int  # drafted tokens on the branch
    draft_logprob: float
    target_logprob: float

    @property
    def gap(self) -> float:
        return self.draft_logprob - self.target_logprob


def rank1_branch_gap(tree: DraftTree, node_logits: torch.Tensor) -> BranchGap:
    """node_logits: the target's logits at every tree node ([>= N, V], row i = after node i's path)."""
    branch = tree.rank1_branch()
    if len(branch) == 1:
        return BranchGap(0, 0.0, 0.0)
    parents, children = torch.tensor(branch[:-1]), torch.tensor(branch[1:])
    logprobs = torch.log_softmax(node_logits.detach()[parents].double(), dim=-1)
    target = float(logprobs.gather(1, tree.tokens[children].unsqueeze(1)).sum())
    return BranchGap(len(branch) - 1, float(tree.cum_logprobs[branch[-1]]), target)
