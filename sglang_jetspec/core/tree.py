"""Draft token trees: best-first construction under a node budget, and the tensors verification needs.

A node's candidate children are its own conditioned top-K when the draft knows them (keyed by the
node's token path from the root, from a tree-causal pass), else its depth's marginal top-K (one
distribution per depth, shared by every node at that depth). The tree keeps the `budget` nodes
(root included) with the highest cumulative draft log-probability, which is the tree that maximises
the expected number of accepted tokens when the draft is right about those probabilities.
Ties break towards shallower nodes, then lower sibling ranks, so parents always precede children.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class TreeSpec:
    """Shape limits of one tree. budget counts the root; width is K, the draft's top-K per depth."""

    budget: int
    max_depth: int
    width: int
    fanout: str = "uniform"  # "uniform" (K at every depth) or "top2gap" (fewer children when confident)
    gap_beta: float = 1.5
    gap_center: float = 1.0

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"budget={self.budget}: must be >= 1 (1 = root only); use 0/off to skip speculation")
        if self.max_depth < 0:
            raise ValueError(f"max_depth={self.max_depth}: must be >= 0")
        if self.width < 1:
            raise ValueError(f"width={self.width}: must be >= 1 (1 = a chain)")
        if self.fanout not in ("uniform", "top2gap"):
            raise ValueError(f"fanout={self.fanout!r}: choose 'uniform' or 'top2gap'")


@dataclass(frozen=True)
class DrawnChildren:
    """How a tree's drawn nodes were proposed (core/drawn_children.py draws them). `proposals` [D+1, V_d]
    float64: row d is q_d over the columns of `vocab` (target ids; None = the whole vocabulary), row 0
    unused. `drawn` maps a drawn node to (its column, the columns left out of its proposal). A prefix of
    the tree (tree_sizing.truncate) keeps node indices, so the same record serves it."""

    proposals: torch.Tensor
    vocab: torch.Tensor | None
    drawn: dict[int, tuple[int, list[int]]]

    def proposal(self, node: int, depth: int) -> torch.Tensor:
        """q_j of a drawn node, [V_d] float64, the exact distribution its token was drawn from."""
        q = self.proposals[depth].clone()
        excluded = self.drawn[node][1]
        if excluded:
            q[excluded] = 0.0
        return q / q.sum()


@dataclass
class DraftTree:
    """Nodes in insertion order; node 0 is the root (the last committed token)."""

    tokens: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long, -1 for the root
    depths: torch.Tensor  # [N] long, root 0
    ranks: torch.Tensor  # [N] long, the token's rank among its parent's candidates (root 0)
    cum_logprobs: torch.Tensor  # [N] float, root 0
    # a sampled request's drawn children (core/drawn_children.py): what acceptance needs to stay lossless
    drawn: DrawnChildren | None = None

    @classmethod
    def from_lists(
        cls, tokens: list[int], parents: list[int], depths: list[int], ranks: list[int], cum_logprobs: list[float]
    ) -> "DraftTree":
        """A tree from host lists, in three tensor calls, its size and depth known without reading them back."""
        fields = torch.tensor([tokens, parents, depths, ranks], dtype=torch.long)  # one tensor, four rows
        tree = cls(*fields.unbind(), cum_logprobs=torch.tensor(cum_logprobs, dtype=torch.float32))
        tree.__dict__.update(size=len(tokens), max_depth=max(depths))  # the cached properties' values
        return tree

    @cached_property  # read many times a step per tree; the fields are never reassigned
    def size(self) -> int:
        return int(self.tokens.numel())

    def positions(self, past_len: int) -> torch.Tensor:
        """Sequence position of every node: the root sits at past_len, a depth-d node at past_len + d."""
        return self.depths + past_len

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: row i is True at every ancestor of node i and at i itself."""
        n = self.size
        mask = torch.zeros(n, n, dtype=torch.bool)
        parents = self.parents.tolist()
        for i in range(n):
            if parents[i] >= 0:
                mask[i] = mask[parents[i]]
            mask[i, i] = True
        return mask

    def children(self) -> list[list[int]]:
        """Child indices of every node, in sibling-rank order."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for child, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                kids[parent].append(child)
        return kids

    @cached_property
    def child_table(self) -> torch.Tensor:
        """[N, K] child indices in sibling-rank order, -1 padded; K = the largest fanout (at least 1)."""
        kids = self.children()
        width = max(1, max(len(k) for k in kids))
        return torch.tensor([ks + [-1] * (width - len(ks)) for ks in kids], dtype=torch.long)  # one tensor, not N

    @cached_property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def token_paths(self) -> list[tuple[int, ...]]:
        """Every node's tokens from the root's first child down to the node (the root's path is ())."""
        paths: list[tuple[int, ...]] = [()]
        tokens, parents = self.tokens.tolist(), self.parents.tolist()
        for i in range(1, self.size):
            paths.append(paths[parents[i]] + (tokens[i],))
        return paths

    def rank1_branch(self) -> list[int]:
        """Node indices of the rank-1 branch: from the root, always the best-scoring (first) child."""
        table, node, path = self.child_table.tolist(), 0, [0]
        while table[node][0] >= 0:
            node = table[node][0]
            path.append(node)
        return path

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        path = []
        parents = self.parents.tolist()
        while node >= 0:
            path.append(node)
            node = parents[node]
        return path[::-1]


def root_only_tree(root_token: int) -> DraftTree:
    """The tree of budget 1: verifying it is one ordinary decoding step."""
    return root_only_trees([root_token])[0]


def root_only_trees(root_tokens: list[int]) -> list[DraftTree]:
    """Each root's tree of budget 1, for a whole batch in a fixed number of tensor calls (a gated-off step
    builds one per request): each tree's token a view of one tensor, and the fields of a lone root, which
    no code changes in place, shared by them all."""
    tokens = torch.tensor(root_tokens, dtype=torch.long).view(-1, 1).unbind()
    no_parent, zero, no_logprob = torch.tensor([-1]), torch.zeros(1, dtype=torch.long), torch.zeros(1)
    trees = []
    for token in tokens:
        tree = DraftTree(token, no_parent, zero, zero, no_logprob)
        tree.__dict__.update(size=1, max_depth=0)  # the cached properties' values, as from_lists sets them
        trees.append(tree)
    return trees


def padded_trees(trees: list[DraftTree], width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's trees' tokens, parents and depths as [B, width] tensors, in a fixed number of ops whatever
    B: padding nodes carry the root's token, no parent and depth 1."""
    sizes = torch.tensor([t.size for t in trees], dtype=torch.long)
    real = torch.arange(width) < sizes[:, None]
    flat_tokens = torch.cat([t.tokens for t in trees])
    tokens = flat_tokens[torch.cumsum(sizes, 0) - sizes][:, None].repeat(1, width)
    tokens[real] = flat_tokens
    parents = torch.full((len(trees), width), -1, dtype=torch.long)
    parents[real] = torch.cat([t.parents for t in trees])
    depths = torch.ones(len(trees), width, dtype=torch.long)
    depths[real] = torch.cat([t.depths for t in trees])
    return tokens, parents, depths


def kept_nodes(tree: DraftTree, keep: list[bool]) -> tuple[DraftTree, torch.Tensor]:
    """The tree of the nodes where `keep` is True, in their order, and their indices in `tree`; the root
    always stays, and a node whose parent goes goes too (every kept node keeps its whole path)."""
    if tree.drawn is not None:  # its acceptance reads each drawn child's siblings by node index
        raise ValueError("a tree with drawn children keeps every node")
    parents = tree.parents.tolist()
    kept = [True] + [False] * (tree.size - 1)
    for i in range(1, tree.size):  # parents precede their children
        kept[i] = bool(keep[i]) and kept[parents[i]]
    index = torch.tensor([i for i, k in enumerate(kept) if k], dtype=torch.long)
    if len(index) == tree.size:
        return tree, index
    renumber = torch.full((tree.size,), -1, dtype=torch.long)
    renumber[index] = torch.arange(len(index))
    new_parents = tree.parents[index].clone()
    new_parents[1:] = renumber[new_parents[1:]]
    return DraftTree(
        tree.tokens[index], new_parents, tree.depths[index], tree.ranks[index], tree.cum_logprobs[index]
    ), index


def top_k_per_depth(
    depth_logits: torch.Tensor, width: int, vocab: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-`width` tokens and their log-probs (over the logits' own vocabulary) for each depth row:
    [D, K] each. `vocab` maps logit columns to token ids (a reduced draft vocabulary, core/draft_vocab.py)."""
    # impossible tokens (logit -inf) stay exactly -inf: log_softmax would give NaN or finfo.min
    logits = depth_logits.float()
    logprobs = torch.log_softmax(logits, dim=-1).masked_fill(logits == -math.inf, -math.inf)
    values, tokens = logprobs.topk(min(width, logprobs.shape[-1]), dim=-1)
    return (tokens if vocab is None else vocab[tokens]), values


def host_top_k(tokens: torch.Tensor, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`top_k_per_depth`'s result on the host in one copy: a GPU syncs at every device-to-host copy, so
    both go packed in one float64 tensor (token ids are exact there below 2**53, float32 log-probs too)."""
    packed = torch.stack([tokens.double(), logprobs.double()]).cpu()
    return packed[0].long(), packed[1].to(logprobs.dtype)


def depth_caps(top_logprobs: torch.Tensor, spec: TreeSpec) -> torch.Tensor:
    """Children allowed per node at each depth 1..D, for top-K log-probs [..., D, K]: a tensor [..., D].

    top2gap: a confident depth (large gap between its top-2 log-probs) gets fewer children,
    cap_d = max(1, round(K * sigmoid(-beta * (gap_d - center)))).
    """
    k = top_logprobs.shape[-1]
    if spec.fanout == "uniform" or k < 2:
        return top_logprobs.new_full(top_logprobs.shape[:-1], k, dtype=torch.long)  # host data stays host data
    # gaps are +inf (or NaN, -inf - -inf) where a depth has fewer than two candidates: one child
    gaps = (top_logprobs[..., 0] - top_logprobs[..., 1]).double().nan_to_num(nan=math.inf)
    shares = torch.sigmoid(-spec.gap_beta * (gaps - spec.gap_center))
    return torch.round(k * shares).long().clamp(min=1)  # half to even, as Python's round


def fanout_caps(top_logprobs: torch.Tensor, spec: TreeSpec) -> list[int]:
    """`depth_caps` of one tree's [D, K] top-K, as a list."""
    return depth_caps(top_logprobs, spec).tolist()


@dataclass(frozen=True)
class Candidates:
    """A node's possible children: tokens and log-probs in rank order, and how many it may keep."""

    tokens: list[int]
    logprobs: list[float]
    cap: int


def candidate_lists(logits: torch.Tensor, spec: TreeSpec, vocab: torch.Tensor | None = None) -> list[Candidates]:
    """Top-`spec.width` candidates of each row of [R, V] draft logits (columns mapped by `vocab`), with
    the row's fanout cap."""
    tokens, logprobs = top_k_per_depth(logits, spec.width, vocab)
    caps = fanout_caps(logprobs, spec)
    return [Candidates(t, lp, cap) for t, lp, cap in zip(tokens.tolist(), logprobs.double().tolist(), caps)]


def noisy_or(a: float, b: float) -> float:
    """log(1 - (1 - e^a)(1 - e^b)): the chance that at least one of two independent guesses is right."""
    return math.log1p(-(-math.expm1(a)) * (-math.expm1(b)))


def with_guesses(base: Candidates, tokens: Mapping[int, float]) -> Candidates:
    """`base` with each guessed token scored at least its log-prob (combined by noisy-or where the head
    proposes it too), re-ranked by score in one sort (ties: the head's candidates in rank order, then new
    tokens in guess order); the cap grows by one per new candidate, so a guess never displaces one."""
    scores = dict(zip(base.tokens, base.logprobs))
    cap = base.cap
    for token, logprob in tokens.items():
        added = token not in scores
        scores[token] = logprob if added else noisy_or(scores[token], logprob)
        cap = min(len(scores), cap + added)
    ranked = sorted(scores.items(), key=lambda item: -item[1])
    return Candidates([t for t, _ in ranked], [lp for _, lp in ranked], cap)


def marginal_candidates(top_tokens: torch.Tensor, top_logprobs: torch.Tensor, spec: TreeSpec) -> list[list[Candidates]]:
    """Every lane's marginal candidates per depth, from [B, D, K] top-K tokens and log-probs: the first
    `spec.width` of each depth down to the tree's depth, with the depth's fanout cap. One cap computation
    and one host read per field for the whole batch, not a few per request."""
    depth_limit = min(spec.max_depth, top_tokens.shape[1])
    logprobs = top_logprobs[:, :depth_limit, : spec.width]
    caps = depth_caps(logprobs, spec).tolist()
    tokens = top_tokens[:, :depth_limit, : spec.width].tolist()
    return [
        [Candidates(t, lp, cap) for t, lp, cap in zip(*lane)] for lane in zip(tokens, logprobs.double().tolist(), caps)
    ]


def build_tree(
    root_token: int,
    top_tokens: torch.Tensor,
    top_logprobs: torch.Tensor,
    spec: TreeSpec,
    conditioned: Mapping[tuple[int, ...], Candidates] | None = None,
    guesses: Mapping[tuple[int, ...], Mapping[int, float]] | None = None,
) -> DraftTree:
    """Best-first tree from per-depth top-K candidates ([D, K] tokens and log-probs, D >= max_depth),
    where `conditioned` (token path from the root -> that node's own candidates) overrides them;
    `guesses` as in `tree_from_candidates`."""
    marginal = marginal_candidates(top_tokens[None], top_logprobs[None], spec)[0]
    return tree_from_candidates(root_token, marginal, spec, conditioned, guesses)


def tree_from_candidates(
    root_token: int,
    marginal: list[Candidates],
    spec: TreeSpec,
    conditioned: Mapping[tuple[int, ...], Candidates] | None = None,
    guesses: Mapping[tuple[int, ...], Mapping[int, float]] | None = None,
) -> DraftTree:
    """`build_tree` from the marginal candidates of each depth the tree may reach (`marginal_candidates`).
    `guesses` (token path -> guessed children and their log-probs: the hybrid drafter's) join the
    candidates of a node on their path that has no conditioned ones of its own (`with_guesses`): merged
    when the build reaches the node, so guesses on paths the budget never reaches cost nothing."""
    depth_limit = len(marginal)
    conditioned = conditioned or {}
    guesses = guesses or {}

    tokens, parents, depths, ranks, cums = [root_token], [-1], [0], [0], [0.0]
    paths: list[tuple[int, ...]] = [()]
    token_paths: list[tuple[int, ...]] = [()]
    options: list[Candidates | None] = []  # each node's candidate children, looked up once

    def candidates_of(node: int) -> Candidates | None:
        if depths[node] >= depth_limit:
            return None
        path = token_paths[node]
        own = conditioned.get(path)
        if own is not None:
            return own
        guessed = guesses.get(path)
        return with_guesses(marginal[depths[node]], guessed) if guessed else marginal[depths[node]]

    # Frontier entry: (-cum, depth, rank path, parent index). Each node keeps at most two entries
    # alive (its next sibling and its first child), so the heap stays O(budget).
    frontier: list[tuple[float, int, tuple[int, ...], int]] = []

    def push_child(parent: int, rank: int) -> None:
        option = options[parent]
        # -inf marks "no candidate" (e.g. a lookup draft that found nothing): never a node
        if option is not None and rank < min(option.cap, len(option.tokens)) and option.logprobs[rank] != -math.inf:
            heapq.heappush(
                frontier, (-(cums[parent] + option.logprobs[rank]), depths[parent] + 1, paths[parent] + (rank,), parent)
            )

    options.append(candidates_of(0))
    push_child(0, 0)
    while frontier and len(tokens) < spec.budget:
        neg_cum, d, path, parent = heapq.heappop(frontier)
        rank = path[-1]
        token = options[parent].tokens[rank]
        tokens.append(token)
        parents.append(parent)
        depths.append(d)
        ranks.append(rank)
        cums.append(-neg_cum)
        paths.append(path)
        token_paths.append(token_paths[parent] + (token,))
        options.append(candidates_of(len(tokens) - 1))
        push_child(parent, rank + 1)
        push_child(len(tokens) - 1, 0)

    return DraftTree.from_lists(tokens, parents, depths, ranks, cums)
