"""Every lane's marginal tree in one batched pass: the best-first tree of `tree.build_tree` without a
Python loop per request, in shapes fixed by the batch and the spec alone.

A marginal tree's candidates are its depth's top-K, shared by every node at that depth, so the nodes of
depth d are rank paths (r_1..r_d) scored by the sum of their ranks' log-probs. `build_tree` pops them
best-first, by (score descending, depth, rank path): this module keeps the same order with a beam per
depth of width M = budget - 1. Why the beam loses nothing: at one depth a node x = (p, r) scores
score(p) + lp_d[r], so every node q at depth d-1 ranked before p has its child (q, r) ranked before x; a
parent outside depth d-1's best M would leave M better nodes at depth d, and x outside the best M of
its own depth, let alone of the tree. Each depth's beam is kept in rank-path order, so a stable sort
on the score alone breaks ties as the heap does (depth first across depths, then path), and the union
of the beams, laid out depth by depth, sorts the same way into the tree's node order.

The one place it may differ from `build_tree`: when float64 rounding makes two different paths score
exactly alike, a beam may keep the other (equally scored) node. Any tree is lossless; only its draft
differs.

Pure tensor work with no host read and no data-dependent shape (tests/test_marginal_trees.py runs it
under the step probe's strict mode): what a captured drafting graph holds on a GPU. core.draft_graphs
runs it inside the drafting pass and packs the trees with the top-K (`pack_drafts`) for the step's one
copy to the host, so a lane with nothing to merge skips the per-request heap. On a host it does not pay:
about 150 small tensor ops cost 1.2-1.7 ms a step at batch 1 against the heap's 0.1-0.2 ms, and lose at
batch 16 too from budget 16 up (`python -m bench.tree_build`, bench/results/sglang_cpu/tree-build-fp32-epyc.md),
so the eager path (no draft graphs: every CPU) keeps build_tree on the host copy of the top-K.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree, TreeSpec, depth_caps


@dataclass
class MarginalTrees:
    """[B, budget] per field, node 0 the root, nodes past a lane's `sizes` [B] padding (parent -1)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    cum_logprobs: torch.Tensor  # float32, as DraftTree keeps them
    sizes: torch.Tensor

    def tree(self, lane: int, size: int) -> DraftTree:
        """Lane `lane`'s tree (`size`: its entry of `sizes`, read by the caller once for the batch)."""
        return DraftTree(
            self.tokens[lane, :size],
            self.parents[lane, :size],
            self.depths[lane, :size],
            self.ranks[lane, :size],
            self.cum_logprobs[lane, :size],
        )

    def trees(self) -> list[DraftTree]:
        return [self.tree(lane, size) for lane, size in enumerate(self.sizes.tolist())]


def marginal_trees(
    roots: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor, spec: TreeSpec
) -> MarginalTrees:
    """`build_tree(roots[b], top_tokens[b], top_logprobs[b], spec)` for every lane b: roots [B], top-K
    tokens and log-probs [B, D, K] (rank order), on one device."""
    device, batch = roots.device, roots.shape[0]
    depth_limit = min(spec.max_depth, top_tokens.shape[1])
    top_tokens, logprobs = top_tokens[:, :depth_limit, : spec.width], top_logprobs[:, :depth_limit, : spec.width]
    k, beam = logprobs.shape[2], spec.budget - 1
    # a rank past its depth's cap, or with no candidate (-inf), is never a node
    ranks = torch.arange(k, device=device)
    scores = logprobs.double().masked_fill(ranks >= depth_caps(logprobs, spec).unsqueeze(-1), -torch.inf)

    # depth 0: the root alone in a beam of M slots, the others empty (-inf); children of an empty slot stay
    # empty. Each depth's beam is in rank-path order.
    per_depth = []  # (cum, parent slot, rank, token) per depth, [B, M] each
    if beam:
        cum = torch.full((batch, beam), -torch.inf, dtype=torch.float64, device=device)
        cum[:, 0] = 0.0
    for d in range(depth_limit if beam else 0):
        children = (cum.unsqueeze(-1) + scores[:, d].unsqueeze(1)).flatten(1)  # [B, M K], rank-path order
        best = children.sort(dim=-1, descending=True, stable=True).indices[:, :beam]
        kept = best.sort(dim=-1).values  # back to rank-path order
        cum = children.gather(1, kept)
        rank = kept % k
        per_depth.append((cum, kept // k, rank, top_tokens[:, d].gather(1, rank)))

    nodes = 1 + beam
    out_tokens = torch.zeros(batch, nodes, dtype=torch.long, device=device)
    out_parents = torch.full((batch, nodes), -1, dtype=torch.long, device=device)
    out_depths = torch.zeros(batch, nodes, dtype=torch.long, device=device)
    out_ranks = torch.zeros(batch, nodes, dtype=torch.long, device=device)
    out_cums = torch.zeros(batch, nodes, dtype=torch.float64, device=device)
    out_tokens[:, 0] = roots
    if not per_depth:
        return MarginalTrees(
            out_tokens, out_parents, out_depths, out_ranks, out_cums.float(), torch.ones_like(roots, dtype=torch.long)
        )

    # the union of the beams, depth by depth: a stable sort on the score gives the heap's order
    all_cum, slots, all_ranks, all_tokens = (torch.cat(field, dim=1) for field in zip(*per_depth))
    levels = len(per_depth)
    depth_of_entry = torch.arange(1, levels + 1, device=device).unsqueeze(1).expand(levels, beam).flatten()
    all_depths = depth_of_entry.expand(batch, -1)
    order = all_cum.sort(dim=-1, descending=True, stable=True).indices[:, :beam]
    # each flat entry's node index in the tree (those not kept point past it; no kept node's parent is one)
    node_of = torch.full((batch, levels * beam), nodes, dtype=torch.long, device=device)
    node_of.scatter_(1, order, torch.arange(1, nodes, device=device).expand(batch, -1))
    parent_entry = (all_depths - 2).clamp(min=0) * beam + slots
    all_parents = torch.where(all_depths == 1, 0, node_of.gather(1, parent_entry))

    sizes = 1 + (all_cum > -torch.inf).sum(dim=1).clamp(max=beam)
    real = torch.arange(1, nodes, device=device) < sizes.unsqueeze(1)
    out_tokens[:, 1:] = torch.where(real, all_tokens.gather(1, order), 0)
    out_parents[:, 1:] = torch.where(real, all_parents.gather(1, order), -1)
    out_depths[:, 1:] = torch.where(real, all_depths.gather(1, order), 0)
    out_ranks[:, 1:] = torch.where(real, all_ranks.gather(1, order), 0)
    out_cums[:, 1:] = torch.where(real, all_cum.gather(1, order), 0.0)
    return MarginalTrees(out_tokens, out_parents, out_depths, out_ranks, out_cums.float(), sizes)


def pack_drafts(top_tokens: torch.Tensor, top_logprobs: torch.Tensor, trees: MarginalTrees) -> torch.Tensor:
    """The top-K [B, D, K] and the trees in one float64 tensor [B, 2 D K + 5 budget + 1], for one copy to
    the host (a GPU syncs at every device-to-host copy). Exact: token ids and node indices are integers
    below 2**53, log-probs float32."""
    fields = (top_tokens, top_logprobs, trees.tokens, trees.parents, trees.depths, trees.ranks, trees.cum_logprobs)
    return torch.cat([f.flatten(1).double() for f in fields] + [trees.sizes.unsqueeze(1).double()], dim=1)


def unpack_drafts(packed: torch.Tensor, depth: int, width: int) -> tuple[torch.Tensor, torch.Tensor, MarginalTrees]:
    """`pack_drafts`' fields back: top-K tokens (long) and log-probs (float32) [B, depth, width], the trees."""
    batch, top = packed.shape[0], depth * width
    budget = (packed.shape[1] - 2 * top - 1) // 5
    tokens, logprobs, rest = packed.split([top, top, 5 * budget + 1], dim=1)
    nodes = rest[:, :-1].view(batch, 5, budget)
    trees = MarginalTrees(*(nodes[:, i].long() for i in range(4)), nodes[:, 4].float(), rest[:, -1].long())
    return tokens.long().view(batch, depth, width), logprobs.float().view(batch, depth, width), trees
