"""Tree-causal drafting (issue 9): the ancestor-or-self draft pass, conditioned tree construction,
refinement rounds and the rank-1 branch gap, on tiny random heads (no target model)."""

import itertools
import math
from dataclasses import dataclass, field, replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_jetspec.core.branch_gap import rank1_branch_gap
from sglang_jetspec.core.context_cache import ContextCache
from sglang_jetspec.core.head import block_mask, tree_causal_mask
from sglang_jetspec.core.head_config import HeadConfig, HeadConfigError
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.head_io import init_head
from sglang_jetspec.core.tree import (
    Candidates,
    DraftTree,
    TreeSpec,
    build_tree,
    candidate_lists,
    fanout_caps,
    top_k_per_depth,
)
from sglang_jetspec.core.tree_drafting import TreeDraft, draft_trees
from tests.builders import tiny_head_config

VOCAB, HIDDEN, TAPS = 50, 32, 2
REVEAL = {"scheme": "prefix", "all_mask_share": 0.5}


def tiny_drafter(reveal=REVEAL, seed=0) -> HeadDrafter:
    cfg = tiny_head_config(
        hidden_size=HIDDEN,
        head_dim=8,
        intermediate_size=64,
        vocab_size=VOCAB,
        target_layer_ids=(0, 1),
        draft_reveal=reveal,
    )
    # a large init gives peaked, varied draft distributions, so top-K and trees are not degenerate
    head = init_head(cfg, seed=seed, std=0.3)
    gen = torch.Generator().manual_seed(seed + 1)
    embed = torch.nn.Embedding(VOCAB, HIDDEN)
    lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
        lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=gen))
    return HeadDrafter(head, embed, lm_head)


@dataclass
class FakeLane:
    root_token: int
    rows: torch.Tensor
    draft_cache: ContextCache = field(default_factory=ContextCache)

    def tap_rows(self) -> torch.Tensor:
        return self.rows


def lanes(*specs: tuple[int, int]) -> list[FakeLane]:
    """One lane per (root token, context length), with random tapped rows."""
    gen = torch.Generator().manual_seed(7)
    return [FakeLane(root, torch.randn(length, TAPS * HIDDEN, generator=gen)) for root, length in specs]


def sequential_child_logits(drafter: HeadDrafter, lane: FakeLane, path: tuple[int, ...]) -> torch.Tensor:
    """The reference: one causal block [root, path..., MASK] alone, read at its last (masked) row."""
    lane.draft_cache.sync(drafter.head, lane.tap_rows())
    length = lane.draft_cache.length
    ids = torch.tensor([[lane.root_token, *path, drafter.head.config.mask_token_id]])
    positions = length + torch.arange(ids.shape[1]).unsqueeze(0)
    hidden = drafter.head(
        drafter.embed_tokens(ids),
        positions,
        lane.draft_cache.layers,
        block_mask(torch.ones(1, length, dtype=torch.bool), ids.shape[1], True),
    )
    return drafter.lm_head(hidden[0, -1])


def marginal_tree(drafter: HeadDrafter, lane: FakeLane, spec: TreeSpec) -> DraftTree:
    tokens, logprobs = top_k_per_depth(drafter.propose([lane], spec.max_depth)[0], spec.width)
    return build_tree(lane.root_token, tokens, logprobs, spec)


# --- the mask ---------------------------------------------------------------------------------


def test_tree_causal_mask_matches_the_papers_figure_with_padding():
    # tree of the paper's Figure 3: Root; A, B under Root; C, D under A; E under B -- and a 2-node tree padded to 6
    big = DraftTree(
        torch.arange(6),
        torch.tensor([-1, 0, 0, 1, 1, 2]),
        torch.tensor([0, 1, 1, 2, 2, 2]),
        torch.zeros(6, dtype=torch.long),
        torch.zeros(6),
    )
    small = DraftTree(
        torch.arange(2), torch.tensor([-1, 0]), torch.tensor([0, 1]), torch.zeros(2, dtype=torch.long), torch.zeros(2)
    )
    ancestors = torch.zeros(2, 6, 6, dtype=torch.bool)
    ancestors[0] = big.ancestor_mask()
    ancestors[1, :2, :2] = small.ancestor_mask()
    valid = torch.tensor([[True, True, True], [True, False, False]])
    mask = tree_causal_mask(valid, ancestors)[:, 0]
    assert mask.shape == (2, 12, 3 + 12)
    figure = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask[0, :6, 3:9], figure) and not mask[0, :6, 9:].any()  # node rows see no slot
    assert torch.equal(mask[0, 6:, 3:9], figure)  # slot i sees node i's ancestors-or-self ...
    assert torch.equal(mask[0, 6:, 9:], torch.eye(6, dtype=torch.bool))  # ... and itself only
    assert mask[0, :, :3].all() and torch.equal(mask[1, :, :3], valid[1].expand(12, 3))
    # padding rows of the small tree see only themselves: never an all-False row
    assert torch.equal(mask[1, 2:6, 3:], torch.eye(12, dtype=torch.bool)[2:6])
    assert torch.equal(mask[1, 8:, 3:], torch.eye(12, dtype=torch.bool)[8:])
    assert (mask[:, :, 3:].sum(-1) >= 1).all()


# --- the draft pass ---------------------------------------------------------------------------


def test_propose_children_equals_one_sequential_block_per_node_for_a_padded_batch():
    drafter = tiny_drafter()
    batch = lanes((3, 5), (11, 9))
    trees = [marginal_tree(drafter, batch[0], TreeSpec(12, 4, 3)), marginal_tree(drafter, batch[1], TreeSpec(5, 4, 2))]
    assert trees[0].size == 12 and trees[1].size == 5 and trees[0].max_depth >= 2
    got = drafter.propose_children(batch, trees)
    assert [g.shape for g in got] == [(12, VOCAB), (5, VOCAB)]
    for lane, tree, logits in zip(batch, trees, got):
        for node, path in enumerate(tree.token_paths()):
            torch.testing.assert_close(logits[node], sequential_child_logits(drafter, lane, path), atol=2e-5, rtol=1e-5)


def test_root_slot_is_the_marginal_depth_one_row():
    drafter = tiny_drafter()
    batch = lanes((4, 6))
    tree = marginal_tree(drafter, batch[0], TreeSpec(6, 3, 2))
    torch.testing.assert_close(
        drafter.propose_children(batch, [tree])[0][0], drafter.propose(batch, 1)[0, 0], atol=2e-5, rtol=1e-5
    )


def test_children_depend_on_the_real_path_not_on_other_branches():
    drafter = tiny_drafter()
    batch = lanes((4, 6))
    tree = marginal_tree(drafter, batch[0], TreeSpec(10, 3, 3))
    child_logits = drafter.propose_children(batch, [tree])[0]
    # siblings at depth 1 share the marginal but get different conditioned children
    first_level = [i for i in range(tree.size) if int(tree.depths[i]) == 1]
    assert len(first_level) >= 2
    assert not torch.allclose(child_logits[first_level[0]], child_logits[first_level[1]])


def test_propose_children_refuses_a_marginal_only_head():
    drafter = tiny_drafter(reveal=None)
    batch = lanes((4, 6))
    with pytest.raises(ValueError, match="draft_reveal"):
        drafter.propose_children(batch, [marginal_tree(drafter, batch[0], TreeSpec(4, 3, 2))])


def test_head_config_records_and_checks_the_reveal_scheme():
    cfg = tiny_drafter().head.config
    raw = cfg.to_json_dict()
    assert raw["dflash_config"]["draft_reveal"] == REVEAL
    assert HeadConfig.from_json_dict(raw) == cfg and HeadConfig.from_json_dict(raw).reads_tree_tokens
    assert "draft_reveal" not in replace(cfg, draft_reveal=None).to_json_dict()["dflash_config"]
    with pytest.raises(HeadConfigError, match="draft_reveal"):
        replace(cfg, draft_reveal={"scheme": "random"})
    with pytest.raises(HeadConfigError, match="causal_head"):
        replace(cfg, causal_head=False)


# --- conditioned tree construction ----------------------------------------------------------


def brute_force(root, top_tokens, top_logprobs, spec, conditioned):
    """Every node of the (capped) candidate tree, sorted by (-cum, depth, rank path); the first budget-1,
    as (rank path, token path)."""
    depth_limit = min(spec.max_depth, top_tokens.shape[0])
    caps = fanout_caps(top_logprobs[:depth_limit, : spec.width], spec)
    marginal = [
        Candidates(t[: spec.width], lp[: spec.width], c)
        for t, lp, c in zip(top_tokens.tolist(), top_logprobs.double().tolist(), caps)
    ]
    nodes = []

    def visit(ranks, tokens, cum):
        if len(ranks) >= depth_limit:
            return
        option = conditioned.get(tokens, marginal[len(ranks)])
        for r in range(min(option.cap, len(option.tokens))):
            if option.logprobs[r] == -math.inf:
                continue
            child = (ranks + (r,), tokens + (option.tokens[r],), cum + option.logprobs[r])
            nodes.append((-child[2], len(child[0]), child[0], child[1]))
            visit(*child)

    visit((), (), 0.0)
    nodes.sort()
    return [(n[2], n[3]) for n in nodes[: spec.budget - 1]]


@st.composite
def conditioned_case(draw):
    depth, vocab = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    width = draw(st.integers(1, vocab))
    coarse = st.lists(st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab), min_size=depth, max_size=depth)
    marginal_logits = torch.tensor(draw(coarse), dtype=torch.float32)
    spec = TreeSpec(
        budget=draw(st.integers(1, 40)),
        max_depth=draw(st.integers(0, depth + 1)),
        width=width,
        fanout=draw(st.sampled_from(["uniform", "top2gap"])),
    )
    tokens, logprobs = top_k_per_depth(marginal_logits, width)
    # conditioned candidates for a random subset of the token paths the marginal tree can reach
    paths = [()] + [
        p for d in range(1, depth) for p in itertools.product(*[tokens[i].tolist()[:width] for i in range(d)])
    ]
    chosen = draw(st.lists(st.sampled_from(paths), max_size=6, unique=True))
    rows = torch.tensor(
        draw(
            st.lists(
                st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab), min_size=len(chosen), max_size=len(chosen)
            )
        ),
        dtype=torch.float32,
    )
    conditioned = dict(zip(chosen, candidate_lists(rows.reshape(len(chosen), vocab), spec))) if chosen else {}
    return tokens, logprobs, spec, conditioned


@settings(max_examples=200, deadline=None)
@given(conditioned_case())
def test_conditioned_best_first_equals_brute_force(case):
    tokens, logprobs, spec, conditioned = case
    tree = build_tree(0, tokens, logprobs, spec, conditioned)
    expected = brute_force(0, tokens, logprobs, spec, conditioned)
    ranks, parents = tree.ranks.tolist(), tree.parents.tolist()
    rank_paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):
        assert parents[i] < i  # parents before children
        rank_paths.append(rank_paths[parents[i]] + (ranks[i],))
    assert list(zip(rank_paths[1:], tree.token_paths()[1:])) == expected


def test_conditioned_candidates_replace_the_marginal_only_below_their_own_path():
    # marginal: depth 1 -> {1: 0.6, 2: 0.4}; depth 2 -> {5: 0.9, 6: 0.1}
    tokens = torch.tensor([[1, 2], [5, 6]])
    logprobs = torch.log(torch.tensor([[0.6, 0.4], [0.9, 0.1]]))
    spec = TreeSpec(budget=4, max_depth=2, width=2)
    assert build_tree(0, tokens, logprobs, spec).token_paths() == [(), (1,), (1, 5), (2,)]
    # conditioned on path (1,), token 5 is unlikely (the paper's incoherent branch): the tree goes elsewhere
    conditioned = {(1,): Candidates([7, 5], [math.log(0.5), math.log(0.01)], 2)}
    tree = build_tree(0, tokens, logprobs, replace(spec, budget=5), conditioned)
    # (2,) was not evaluated: its child keeps the marginal score 0.4 * 0.9; (1, 7) scores 0.6 * 0.5
    assert tree.token_paths() == [(), (1,), (2,), (2, 5), (1, 7)]
    assert tree.cum_logprobs.tolist() == pytest.approx(
        [0.0, math.log(0.6), math.log(0.4), math.log(0.36), math.log(0.3)]
    )


# --- rounds -----------------------------------------------------------------------------------


def test_draft_rounds_condition_the_tree_and_keep_the_budget():
    drafter = tiny_drafter()
    batch = lanes((3, 5), (8, 7))
    spec = TreeSpec(budget=16, max_depth=5, width=4)
    marginal, t0 = draft_trees(drafter, batch, spec, rounds=0)
    refined, t1 = draft_trees(drafter, batch, spec, rounds=1)
    twice, t2 = draft_trees(drafter, batch, spec, rounds=2)
    assert len(t0.round_s) == 1 and len(t1.round_s) == 2 and len(t2.round_s) == 3 and t2.draft_s == sum(t2.round_s)
    for lane, m, r, r2 in zip(batch, marginal, refined, twice):
        assert m.size == r.size == r2.size == 16
        assert r.token_paths() != m.token_paths()  # conditioning changed the tree
        # every child of a node evaluated in round 1 carries that node's conditioned log-prob
        child_logits = drafter.propose_children([lane], [m])[0]
        known = dict(zip(m.token_paths(), torch.log_softmax(child_logits.double(), -1)))
        paths, cums, parents = r.token_paths(), r.cum_logprobs.double().tolist(), r.parents.tolist()
        checked = 0
        for i in range(1, r.size):
            if paths[i][:-1] in known:
                assert cums[i] - cums[parents[i]] == pytest.approx(float(known[paths[i][:-1]][paths[i][-1]]), abs=1e-4)
                checked += 1
        assert checked >= 4


def test_tree_draft_learns_each_path_once_across_rounds():
    drafter = tiny_drafter()
    batch = lanes((3, 5))
    spec = TreeSpec(budget=8, max_depth=4, width=3)
    tokens, logprobs = top_k_per_depth(drafter.propose(batch, 4)[0], 3)
    draft = TreeDraft(3, tokens, logprobs, spec)
    first_paths = draft.tree.token_paths()
    draft.learn(drafter.propose_children(batch, [draft.tree])[0])
    assert set(first_paths) <= set(draft.conditioned)
    before = dict(draft.conditioned)
    draft.learn(drafter.propose_children(batch, [draft.tree])[0])
    assert all(draft.conditioned[p] is before[p] for p in before)  # known paths are not overwritten


# --- the gap ----------------------------------------------------------------------------------


def test_rank1_branch_gap_by_hand():
    # root -> 1 (rank 0) -> 5 (rank 0); sibling 2 at depth 1
    tokens = torch.tensor([[1, 2], [5, 6]])
    logprobs = torch.log(torch.tensor([[0.6, 0.4], [0.9, 0.1]]))
    tree = build_tree(0, tokens, logprobs, TreeSpec(budget=4, max_depth=2, width=2))
    assert tree.rank1_branch() == [0, 1, 2] and tree.tokens[[1, 2]].tolist() == [1, 5]
    target = torch.full((4, 8), -math.inf)
    target[0, 1], target[0, 2] = math.log(0.2), math.log(0.8)  # the target prefers the sibling
    target[1, 5], target[1, 6] = math.log(0.5), math.log(0.5)
    target[2:] = 0.0
    gap = rank1_branch_gap(tree, target)
    assert gap.depth == 2
    assert gap.draft_logprob == pytest.approx(math.log(0.6 * 0.9), rel=1e-6)
    assert gap.target_logprob == pytest.approx(math.log(0.2 * 0.5))
    assert gap.gap == pytest.approx(math.log(0.54 / 0.1), rel=1e-6)
    assert rank1_branch_gap(build_tree(0, tokens, logprobs, TreeSpec(1, 2, 2)), target).depth == 0
