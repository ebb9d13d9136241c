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

With guesses (`GuessTables`: the hybrid drafter's lookups, a grammar's forced chain, as a padded trie per
lane) the same beam builds `tree_from_candidates`' tree with them merged, node for node (the argument
above in its general form: a child never outscores its parent, so a tree node's parent is among its
depth's best M). A merged score's noisy-or on the device may differ from the host's in its last bit
(another libm), so exactly tied nodes may come in another order there. TODO (issue 56): not yet in any
step. `guess_tables` walks the guesses in Python, which costs about what the heap it replaces does
(`python -m bench.tree_build --guesses`); the lookups must emit the tables from their numpy arrays
directly, and the build must run inside a captured graph (eagerly it is hundreds of small ops).

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

import numpy as np
import torch

from .prompt_lookup import Guesses
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


@dataclass
class GuessTables:
    """Every lane's guesses (the hybrid drafter's lookups, a grammar's forced chain) as a padded trie, on
    the device: trie node 0 is the root's path (), the others every prefix of a guessed path. Per node,
    [B, T, G]: its guessed children's tokens (-1: none) and log-probs (-inf: none); [B, T, W]: the tokens
    of its children in the trie (-1: none) and their node ids. Built on the host (`guess_tables`) and
    shipped in one copy."""

    tokens: torch.Tensor
    logprobs: torch.Tensor  # float64
    child_tokens: torch.Tensor
    child_ids: torch.Tensor


def guess_tables(guesses: list[Guesses], device: torch.device | str = "cpu") -> GuessTables:
    """`GuessTables` of each lane's guesses: only the real entries are written (by index, in one numpy
    assignment), into one float64 array made one host-to-device copy (token ids, node ids and float64
    log-probs are all exact there)."""
    at: list[tuple[int, int, int]] = []  # (lane, trie node, column) of each entry; `values` its value
    values: list[float] = []
    fanout, width, size = 1, 1, 1
    guessed_cells, child_cells = [], []  # (lane, node, rank, token, log-prob) and (lane, parent, rank, token, node)
    for b, lane in enumerate(guesses):
        nodes: dict[tuple[int, ...], int] = {(): 0}  # every prefix of a guessed path, the root's () first
        kids = [0]  # children seen per trie node
        for path in lane:
            for end in range(1, len(path) + 1):
                if path[:end] not in nodes:
                    parent = nodes[path[: end - 1]]
                    nodes[path[:end]] = len(nodes)
                    child_cells.append((b, parent, kids[parent], path[end - 1], nodes[path[:end]]))
                    kids[parent] += 1
                    kids.append(0)
        for path, tokens in lane.items():
            node = nodes[path]
            guessed_cells += [(b, node, rank, t, lp) for rank, (t, lp) in enumerate(tokens.items())]
            fanout = max(fanout, len(tokens))
        width, size = max(width, *kids), max(size, len(nodes))
    for b, node, rank, token, logprob in guessed_cells:
        at += [(b, node, rank), (b, node, fanout + rank)]
        values += [token, logprob]
    for b, parent, rank, token, node in child_cells:
        at += [(b, parent, 2 * fanout + rank), (b, parent, 2 * fanout + width + rank)]
        values += [token, node]
    packed = np.full((len(guesses), size, 2 * fanout + 2 * width), -1.0)
    packed[:, :, fanout : 2 * fanout] = -np.inf
    if at:
        packed[tuple(np.array(at).T)] = values
    tokens, logprobs, child_tokens, child_ids = (
        torch.from_numpy(packed).to(device).split([fanout, fanout, width, width], dim=-1)
    )
    return GuessTables(tokens.long(), logprobs, child_tokens.long(), child_ids.long())


def _noisy_or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """tree.noisy_or, elementwise."""
    return torch.log1p(-(-torch.expm1(a)) * (-torch.expm1(b)))


def _slot_candidates(
    top_tokens: torch.Tensor, logprobs: torch.Tensor, caps: torch.Tensor, trie: torch.Tensor, tables: GuessTables
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each beam slot's candidate children at one depth, as `tree.with_guesses` ranks them: the depth's
    top-K [B, K] (tokens, uncapped log-probs, cap [B]) merged with the guesses of the slot's trie node
    (`trie` [B, M], -1: a path nothing guessed), in [B, M, K + G] tokens, scores (-inf past the cap) and
    the child's trie node (-1: none). A guessed token the head also proposes scores both (noisy-or) in the
    head's column; the others are new columns, each raising the cap by one; one stable sort re-ranks."""
    batch, beam = trie.shape
    node = trie.clamp(min=0)
    lanes = torch.arange(batch, device=trie.device).unsqueeze(1)
    on_path = (trie >= 0).unsqueeze(-1)
    guessed = torch.where(on_path, tables.tokens[lanes, node], -1)  # [B, M, G]
    guessed_lp = torch.where(on_path, tables.logprobs[lanes, node], -torch.inf)
    head = top_tokens.unsqueeze(1).expand(batch, beam, -1)  # [B, M, K]
    same = head.unsqueeze(-1) == guessed.unsqueeze(-2)  # [B, M, K, G]; guessed tokens are distinct
    also_guessed = same.any(-1)
    matched_lp = torch.where(same, guessed_lp.unsqueeze(-2), -torch.inf).amax(-1)
    head_lp = logprobs.unsqueeze(1).expand(batch, beam, -1)
    head_lp = torch.where(also_guessed, _noisy_or(head_lp, matched_lp), head_lp)
    new = (guessed >= 0) & ~same.any(-2)
    tokens = torch.cat([head, guessed], dim=-1)
    scores = torch.cat([head_lp, torch.where(new, guessed_lp, -torch.inf)], dim=-1)
    scores, order = scores.sort(dim=-1, descending=True, stable=True)
    tokens = tokens.gather(-1, order)
    cap = caps.unsqueeze(1) + new.sum(-1)  # [B, M]
    ranks = torch.arange(scores.shape[-1], device=trie.device)
    scores = scores.masked_fill(ranks >= cap.unsqueeze(-1), -torch.inf)
    # the child's trie node: the trie child of the slot's node with the candidate's token
    kids = torch.where(on_path, tables.child_tokens[lanes, node], -1)  # [B, M, W]
    hit = (tokens.unsqueeze(-1) == kids.unsqueeze(-2)) & (kids >= 0).unsqueeze(-2)  # [B, M, C, W]
    ids = torch.where(on_path, tables.child_ids[lanes, node], -1).unsqueeze(-2)
    child = torch.where(hit, ids, -1).amax(-1)
    return tokens, scores, child


def marginal_trees(
    roots: torch.Tensor,
    top_tokens: torch.Tensor,
    top_logprobs: torch.Tensor,
    spec: TreeSpec,
    guesses: GuessTables | None = None,
) -> MarginalTrees:
    """`build_tree(roots[b], top_tokens[b], top_logprobs[b], spec)` for every lane b: roots [B], top-K
    tokens and log-probs [B, D, K] (rank order), on one device. With `guesses` (`guess_tables`), each
    lane's tree is `tree_from_candidates`' with its guesses merged: a beam slot on a guessed path expands
    its merged candidates (`_slot_candidates`), every other slot its depth's top-K. The beam of M =
    budget - 1 per depth still loses nothing: a child never outscores its parent (log-probs <= 0), so the
    tree is the best M nodes with their ancestors, and a tree node's parent is among its depth's best M."""
    device, batch = roots.device, roots.shape[0]
    depth_limit = min(spec.max_depth, top_tokens.shape[1])
    top_tokens, logprobs = top_tokens[:, :depth_limit, : spec.width], top_logprobs[:, :depth_limit, : spec.width]
    k, beam = logprobs.shape[2], spec.budget - 1
    # a rank past its depth's cap, or with no candidate (-inf), is never a node
    ranks = torch.arange(k, device=device)
    caps = depth_caps(logprobs, spec)
    uncapped = logprobs.double()  # what guesses merge with: a noisy-or may lift a rank past the cap into it
    scores = uncapped.masked_fill(ranks >= caps.unsqueeze(-1), -torch.inf)

    # depth 0: the root alone in a beam of M slots, the others empty (-inf); children of an empty slot stay
    # empty. Each depth's beam is in rank-path order.
    per_depth = []  # (cum, parent slot, rank, token) per depth, [B, M] each
    if beam:
        cum = torch.full((batch, beam), -torch.inf, dtype=torch.float64, device=device)
        cum[:, 0] = 0.0
        if guesses is not None:  # each slot's trie node: the root's path () is node 0, empty slots none
            trie = torch.full((batch, beam), -1, dtype=torch.long, device=device)
            trie[:, 0] = 0
    for d in range(depth_limit if beam else 0):
        if guesses is None:  # every slot's candidates are the depth's
            slot_tokens, slot_scores = None, scores[:, d].unsqueeze(1)
        else:
            slot_tokens, slot_scores, child = _slot_candidates(
                top_tokens[:, d], uncapped[:, d], caps[:, d], trie, guesses
            )
        width = slot_scores.shape[-1]
        children = (cum.unsqueeze(-1) + slot_scores).flatten(1)  # [B, M C], rank-path order
        best = children.sort(dim=-1, descending=True, stable=True).indices[:, :beam]
        kept = best.sort(dim=-1).values  # back to rank-path order
        cum = children.gather(1, kept)
        rank = kept % width
        if slot_tokens is None:
            token = top_tokens[:, d].gather(1, rank)
        else:
            token = slot_tokens.flatten(1).gather(1, kept)
            trie = child.flatten(1).gather(1, kept)
        per_depth.append((cum, kept // width, rank, token))

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
