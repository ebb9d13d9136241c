"""Draft trees for a batch of requests: the marginal tree, then r tree-causal rounds.

Round 0 is one head pass over [root, MASK x (B-1)]: per-depth marginals and the best-first tree
(what the public JetSpec code does). Each further round runs the tree-causal pass over the current
trees, files every node's conditioned top-K under its token path (kept across rounds: a path's
conditioned distribution depends only on the path), and rebuilds each tree best-first within the
same budget, so nodes whose parents were evaluated are scored by their real branch. With a
`LookupMerge` (the hybrid drafter), each request's looked-up guesses (prompt lookup's chain, the
suffix stores' paths) join its tree as conditioned candidates along their paths
(core/prompt_lookup.py). A lane may also bring tokens it knows come next (a constrained request's
grammar forcing them): they join the same way, as a chain trusted at FORCED_LOGPROB. The reference
engine, `jetspec replay` and the SGLang worker all draft through this module.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from .drawn_children import draw_children, proposals_from_logits
from .marginal_trees import unpack_drafts
from .prompt_lookup import (
    Guesses,
    LookupMerge,
    batch_lookup_guesses,
    chain_guesses,
    combine_guesses,
)
from .tree import (
    Candidates,
    DraftTree,
    TreeSpec,
    candidate_lists,
    host_top_k,
    marginal_candidates,
    root_only_tree,
    root_only_trees,
    top_k_per_depth,
    tree_from_candidates,
    with_guesses,
)
from .tree_sizing import TreeSizer, VerifyCost

# A forced token is what the grammar allows there, spelled as the tokenizer spells the forced text: the
# target may still spell it otherwise (another split of the same text), so it is trusted below certainty.
FORCED_LOGPROB = math.log(0.9)


def lanes_guesses(lanes: list, spec: TreeSpec, lookup: LookupMerge | None, forced: list[list[int]]) -> list[Guesses]:
    """Each lane's guesses: its looked-up ones (hybrid drafter; the whole batch's lookups in one pass) and
    the chain of tokens it knows come next (`forced`, per lane, may be empty)."""
    # lanes need committed_ids only when something is looked up
    if lookup is None:
        guesses: list[Guesses] = [{} for _ in lanes]
    else:
        guesses = batch_lookup_guesses([lane.committed_ids for lane in lanes], spec, lookup)
    for lane_guesses, known in zip(guesses, forced):
        if known:
            combine_guesses(lane_guesses, chain_guesses(known[: spec.max_depth], FORCED_LOGPROB))
    return guesses


class TreeDrafter(Protocol):
    max_depth: int
    # Optional: `draft_vocab` ([V_d] target ids, core/draft_vocab.py): the logits' columns are those
    # tokens only. Drafters without it draft over the full vocabulary.

    def propose(self, lanes: list, depth: int) -> torch.Tensor:
        """[B, depth, V] per-depth marginal logits."""

    def propose_children(self, lanes: list, trees: list[DraftTree]) -> list[torch.Tensor]:
        """Per lane [N_i, V]: node j's children's logits given node j's path."""


@dataclass
class TreeDraft:
    """One request's draft under construction: its marginal candidates, what the conditioned passes
    taught so far, and the current tree."""

    root_token: int
    top_tokens: torch.Tensor  # [D, K] marginal top-K per depth
    top_logprobs: torch.Tensor  # [D, K]
    spec: TreeSpec
    guesses: Guesses = field(default_factory=dict)  # looked-up children per node path (hybrid drafter)
    tree: DraftTree | None = None
    vocab: torch.Tensor | None = None  # the drafter's draft_vocab: maps conditioned logits' columns to tokens
    # each depth's marginal candidates (tree.marginal_candidates), when the caller built them for its batch
    marginal: list[Candidates] | None = None

    def __post_init__(self) -> None:
        self.learned: set[tuple[int, ...]] = set()  # paths whose own candidates a tree-causal pass gave
        # path -> candidates a tree-causal pass gave it (guesses on the path merged in)
        self.conditioned: dict[tuple[int, ...], Candidates] = {}
        if self.tree is None:
            self.tree = self.rebuild()

    def rebuild(self) -> DraftTree:
        if self.marginal is None:  # read from the top-K once, when a build first needs them
            self.marginal = marginal_candidates(self.top_tokens[None], self.top_logprobs[None], self.spec)[0]
        return tree_from_candidates(self.root_token, self.marginal, self.spec, self.conditioned, self.guesses)

    def learn(self, child_logits: torch.Tensor) -> None:
        """File the current tree's conditioned candidates ([N, V] from propose_children) and rebuild;
        where guesses were merged, they replace the marginal candidates the guesses joined."""
        for path, candidates in zip(self.tree.token_paths(), candidate_lists(child_logits, self.spec, self.vocab)):
            if path in self.learned:
                continue
            self.learned.add(path)
            guessed = self.guesses.get(path)
            self.conditioned[path] = with_guesses(candidates, guessed) if guessed else candidates
        self.tree = self.rebuild()


def settled_clock(result: torch.Tensor) -> float:
    """perf_counter once the device has finished computing `result`: on a GPU a phase timed without
    this would measure kernel launches and bill its work to whichever phase syncs next."""
    if result.is_cuda:
        torch.cuda.synchronize(result.device)
    return time.perf_counter()


@dataclass
class DraftTiming:
    round_s: list[float]  # head seconds per round: [marginal pass, tree-causal round 1, ...]
    tree_s: float  # seconds spent building trees

    @property
    def draft_s(self) -> float:
        return sum(self.round_s)


def refine(drafter: TreeDrafter, lanes: list, drafts: list[TreeDraft]) -> tuple[float, float]:
    """One tree-causal round over every lane's current tree; returns (head seconds, tree seconds)."""
    t0 = time.perf_counter()
    child_logits = drafter.propose_children(lanes, [d.tree for d in drafts])
    t1 = settled_clock(child_logits[0])
    for draft, logits in zip(drafts, child_logits):
        draft.learn(logits)
    return t1 - t0, time.perf_counter() - t1


def headless_trees(
    lanes: list, spec: TreeSpec, lookup: LookupMerge | None, forced: list[list[int]] | None = None
) -> list[DraftTree]:
    """Each lane's tree on a step the head sits out: the best-first tree of its guesses alone (within the
    budget), or the root alone."""
    no_head = torch.zeros(spec.max_depth, 0)  # no marginal candidates at any depth
    trees = []
    for lane, guesses in zip(lanes, lanes_guesses(lanes, spec, lookup, forced or [[]] * len(lanes))):
        trees.append(
            TreeDraft(lane.root_token, no_head.long(), no_head, spec, guesses=guesses).tree
            if guesses
            else root_only_tree(lane.root_token)
        )
    return trees


Draw = tuple[float, torch.Generator]  # a sampled request's temperature and random stream


def draft_trees(
    drafter: TreeDrafter,
    lanes: list,
    spec: TreeSpec,
    rounds: int = 0,
    lookup: LookupMerge | None = None,
    draws: list[Draw | None] | None = None,
    root_allowed: list[torch.Tensor | None] | None = None,
    forced: list[list[int]] | None = None,
) -> tuple[list[DraftTree], DraftTiming]:
    """Every lane's tree after the marginal pass and `rounds` tree-causal rounds (0 = marginal only),
    with each lane's prompt-lookup guess merged in when `lookup` is given (the hybrid drafter). With
    `draws`, the marginal children of each lane that has one are drawn from the head's distribution at
    its temperature (core/drawn_children.py; marginal trees only: rounds must be 0). `root_allowed`
    ([V] bool over target ids per lane, None = all): the only tokens a lane's root may have as children
    (a constrained request's grammar), so its first-depth candidates are all possible. `forced` (per
    lane, may be empty): tokens the lane knows come next, merged as a chain."""
    if draws is not None and rounds:
        raise ValueError(f"draws with draft rounds {rounds}: drawn children need the marginal tree (rounds 0)")
    t0 = time.perf_counter()
    masked = root_allowed is not None and any(allowed is not None for allowed in root_allowed)
    replayed = None if masked else graphed_drafts(drafter, lanes, spec)
    depth_logits = drafter.propose(lanes, spec.max_depth) if replayed is None else replayed[0]
    queued = time.perf_counter()
    # the host's lookups while a GPU runs the head (on a CPU the head has run: nothing overlaps)
    guesses = lanes_guesses(lanes, spec, lookup, forced or [[]] * len(lanes))
    looked_up = time.perf_counter()
    t1 = settled_clock(depth_logits)
    vocab = getattr(drafter, "draft_vocab", None)
    if masked:
        depth_logits = root_masked(depth_logits, root_allowed, vocab, getattr(drafter, "draft_vocab_host", None))
    # one top-k over the batch and one copy of its result to the host: trees are built there, and a
    # copy per request would stall a GPU once per request. A replayed drafting graph built the marginal
    # trees too (core.draft_graphs): a lane with nothing to merge takes its tree from that same copy.
    marginal = None
    if replayed is None:
        tokens, logprobs = host_top_k(*top_k_per_depth(depth_logits, spec.width, vocab))
    else:
        width = min(spec.width, depth_logits.shape[-1])
        tokens, logprobs, marginal = unpack_drafts(replayed[1], depth_logits.shape[1], width)
        sizes = marginal.sizes.tolist()  # host data: the packed copy is on the host already
    # the marginal candidates of every lane whose tree the host builds, in one pass (a lane with nothing to
    # merge takes a replayed graph's tree as it is)
    builds = [b for b in range(len(lanes)) if marginal is None or guesses[b]]
    candidates = dict(zip(builds, marginal_candidates(tokens[builds], logprobs[builds], spec))) if builds else {}
    lane_tokens, lane_logprobs = tokens.unbind(), logprobs.unbind()
    drafts = [
        TreeDraft(
            lane.root_token,
            lane_tokens[b],
            lane_logprobs[b],
            spec,
            guesses=guesses[b],
            tree=None if b in candidates else marginal.tree(b, sizes[b]),
            vocab=vocab,
            marginal=candidates.get(b),
        )
        for b, lane in enumerate(lanes)
    ]
    # the head's seconds: queuing it, then waiting for what the lookups did not hide; the lookups are tree work
    timing = DraftTiming([queued - t0 + t1 - looked_up], looked_up - queued + time.perf_counter() - t1)
    for _ in range(rounds):
        head_s, tree_s = refine(drafter, lanes, drafts)
        timing.round_s.append(head_s)
        timing.tree_s += tree_s
    trees = [d.tree for d in drafts]
    if draws is not None:
        start = time.perf_counter()
        trees = drawn_trees(drafts, depth_logits, draws)
        timing.tree_s += time.perf_counter() - start
    return trees, timing


def graphed_drafts(drafter: TreeDrafter, lanes: list, spec: TreeSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The drafter's replayed drafting graph for this step (core.draft_graphs.DraftGraphs.propose_drafts:
    the logits and the host copy of the top-K and marginal trees), or None: no graphs (the eager pass, every
    CPU) or no bucket holds the step."""
    graphs = getattr(drafter, "graphs", None)
    return None if graphs is None else graphs.propose_drafts(lanes, spec)


def root_masked(
    depth_logits: torch.Tensor,
    root_allowed: list[torch.Tensor | None],
    vocab: torch.Tensor | None,
    host_vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """`depth_logits` with each lane's first depth masked to what its root may have as children: the lanes'
    host masks stacked (all allowed where None), mapped to the logits' columns (`vocab`, whose host copy
    `host_vocab` saves a device read), shipped in one copy and applied in one op for the whole batch."""
    if vocab is not None and host_vocab is None:
        host_vocab = vocab.cpu()
    columns = depth_logits.shape[-1]
    rows = []
    for allowed in root_allowed:
        if allowed is None:
            rows.append(torch.ones(columns, dtype=torch.bool))
        else:
            rows.append(allowed if host_vocab is None else allowed[host_vocab])
    allowed = torch.stack(rows).to(depth_logits.device)
    depth_logits = depth_logits.clone()  # a drafter's rows may be shared views
    depth_logits[:, 0].masked_fill_(~allowed, -math.inf)
    return depth_logits


def budget_spec(max_depth: int, budget: int, width: int, fanout: str = "uniform") -> TreeSpec:
    """The tree shape for a node budget: a tree of `budget` nodes is at most budget-1 deep, so the head
    never pays for deeper draft rows than the budget can use."""
    return TreeSpec(budget=budget, max_depth=min(max_depth, budget - 1), width=width, fanout=fanout)


def step_trees(
    drafter: TreeDrafter,
    lanes: list,
    spec: TreeSpec,
    *,
    rounds: int = 0,
    lookup: LookupMerge | None = None,
    draw: bool = False,
    sizer: TreeSizer | None = None,
    cost: VerifyCost | None = None,
    drafting: list[int] | None = None,
    root_allowed: list[torch.Tensor | None] | None = None,
    forced: list[list[int]] | None = None,
    prune=None,
) -> tuple[list[DraftTree], DraftTiming]:
    """One step's tree per lane, as both engines plan it. The head drafts the `drafting` lanes (all by
    default; the others keep their root alone), or, when `sizer`'s draft gate finds the head has not
    been paying, their looked-up trees stand alone (headless_trees). `draw`: sampled lanes draw their
    marginal children (sampled_draws). `root_allowed` and `forced` are per drafting lane (draft_trees).
    `prune(i, tree)` then cuts lane i's drafted tree (its grammar),
    and `sizer` cuts every lane's tree to what pays against `cost`. The timing's tree seconds are all
    but the head's."""
    start = time.perf_counter()
    drafting = list(range(len(lanes))) if drafting is None else drafting
    drafting_lanes = [lanes[i] for i in drafting]
    head_runs = sizer is None or sizer.gate.should_draft()
    if head_runs:
        if sizer is not None:  # the head drafts no deeper than sizing has been keeping
            spec = replace(spec, max_depth=sizer.draft_depth.depth(len(lanes), spec.max_depth))
        draws = sampled_draws(drafting_lanes, draw, rounds)
        drafted, timing = draft_trees(
            drafter, drafting_lanes, spec, rounds, lookup, draws, root_allowed=root_allowed, forced=forced
        )
    else:
        drafted, timing = headless_trees(drafting_lanes, spec, lookup, forced), DraftTiming([], 0.0)
    trees: list[DraftTree | None] = [None] * len(lanes)
    for i, tree in zip(drafting, drafted):
        trees[i] = prune(i, tree) if prune is not None else tree
    roots = iter(root_only_trees([lane.root_token for tree, lane in zip(trees, lanes) if tree is None]))
    trees = [tree if tree is not None else next(roots) for tree in trees]
    if sizer is not None:
        # every lane counts, undrafted ones too: a batched verify pads each to the longest tree
        trees = sizer.size(trees, time.perf_counter() - start, drafted=head_runs, cost=cost)
    timing.tree_s = time.perf_counter() - start - timing.draft_s
    return trees, timing


def sampled_draws(lanes: list, draw: bool, rounds: int) -> list[Draw | None] | None:
    """Each sampled lane's temperature and generator (lanes with `params` and `generator`), for drawing
    its children when `draw` is on; None when nothing is drawn: drawing off, a greedy batch, or
    tree-causal rounds (drawn children need the marginal tree)."""
    if not draw or rounds or all(lane.params.greedy for lane in lanes):
        return None
    return [None if lane.params.greedy else (lane.params.temperature, lane.generator) for lane in lanes]


def drawn_trees(drafts: list[TreeDraft], depth_logits: torch.Tensor, draws: list[Draw | None]) -> list[DraftTree]:
    """Each draft's tree, with its marginal children drawn where the lane has a draw (draw_children)."""
    logits = depth_logits.cpu()
    trees = []
    for b, (draft, draw) in enumerate(zip(drafts, draws)):
        if draw is None:
            trees.append(draft.tree)
            continue
        temperature, generator = draw
        fixed = {path: set(tokens) for path, tokens in draft.guesses.items()}
        vocab = None if draft.vocab is None else draft.vocab.cpu()
        trees.append(draw_children(draft.tree, fixed, proposals_from_logits(logits[b], temperature), vocab, generator))
    return trees
