"""Tree construction against a brute-force enumeration of every candidate node."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_jetspec.core.tree import (
    DraftTree,
    TreeSpec,
    build_tree,
    fanout_caps,
    kept_nodes,
    root_only_tree,
    top_k_per_depth,
)


def brute_force_paths(top_logprobs: torch.Tensor, spec: TreeSpec) -> list[tuple[int, ...]]:
    """Every node of the capped K-ary tree, sorted by (-cum logprob, depth, rank path); the first budget-1."""
    depth = min(spec.max_depth, top_logprobs.shape[0])
    caps = fanout_caps(top_logprobs[:depth, : spec.width], spec)
    lp = top_logprobs.double().tolist()
    nodes = []
    for d in range(1, depth + 1):
        for path in itertools.product(*[range(caps[i]) for i in range(d)]):
            cum = sum(lp[i][r] for i, r in enumerate(path))
            if cum != -math.inf:
                nodes.append((-cum, d, path))
    nodes.sort()
    return [p for _, _, p in nodes[: spec.budget - 1]]


def tree_paths(tree) -> list[tuple[int, ...]]:
    ranks, parents = tree.ranks.tolist(), tree.parents.tolist()
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):
        paths.append(paths[parents[i]] + (ranks[i],))
    return paths[1:]


@st.composite
def draft_and_spec(draw):
    """A drawn draft's per-depth top-K (tokens, log-probs) under a drawn tree spec, and the spec."""
    depth = draw(st.integers(1, 5))
    vocab = draw(st.integers(2, 9))
    width = draw(st.integers(1, vocab))
    # coarse logits make exact ties in cumulative log-prob likely, which the ordering must handle
    logits = torch.tensor(
        draw(st.lists(st.lists(st.integers(-3, 3), min_size=vocab, max_size=vocab), min_size=depth, max_size=depth)),
        dtype=torch.float32,
    )
    # some candidates impossible (-inf), as a lookup draft without a match produces
    logits = logits.masked_fill(logits == -3, -math.inf)
    logits[:, 0] = logits[:, 0].nan_to_num(neginf=0.0)
    spec = TreeSpec(
        budget=draw(st.integers(1, 60)),
        max_depth=draw(st.integers(0, depth + 1)),
        width=width,
        fanout=draw(st.sampled_from(["uniform", "top2gap"])),
    )
    return *top_k_per_depth(logits, spec.width), spec


@settings(max_examples=300, deadline=None)
@given(draft_and_spec())
def test_best_first_equals_brute_force(case):
    tokens, logprobs, spec = case
    tree = build_tree(7, tokens, logprobs, spec)
    expected = brute_force_paths(logprobs, spec)
    assert tree_paths(tree) == expected
    assert tree.size == 1 + len(expected) <= spec.budget
    assert int(tree.tokens[0]) == 7 and int(tree.parents[0]) == -1


@settings(max_examples=200, deadline=None)
@given(draft_and_spec())
def test_tree_tensors_are_consistent(case):
    tokens, logprobs, spec = case
    tree = build_tree(3, tokens, logprobs, spec)
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    anc = tree.ancestor_mask()
    for i in range(1, tree.size):
        p = parents[i]
        assert 0 <= p < i, "parents precede children"
        assert depths[i] == depths[p] + 1
        assert int(tree.tokens[i]) == int(tokens[depths[i] - 1, tree.ranks[i]])
        assert math.isclose(
            float(tree.cum_logprobs[i]),
            float(tree.cum_logprobs[p] + logprobs[depths[i] - 1, tree.ranks[i]]),
            abs_tol=1e-5,
        )
    for i in range(tree.size):
        path = set(tree.path_to(i))
        assert {j for j in range(tree.size) if anc[i, j]} == path
    siblings = {}
    for i in range(1, tree.size):
        siblings.setdefault(parents[i], []).append(int(tree.tokens[i]))
    assert all(len(v) == len(set(v)) for v in siblings.values()), "sibling tokens are distinct"
    assert tree.positions(10).tolist() == [10 + d for d in depths]


def test_budget_counts_root_and_chain_for_width_one():
    logits = torch.randn(6, 20)
    tokens, logprobs = top_k_per_depth(logits, 1)
    tree = build_tree(5, tokens, logprobs, TreeSpec(budget=4, max_depth=6, width=1))
    assert tree.size == 4
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.tokens[1:].tolist() == tokens[:3, 0].tolist()


def test_root_only_tree():
    tree = root_only_tree(11)
    assert tree.size == 1 and tree.tokens.tolist() == [11] and tree.ancestor_mask().tolist() == [[True]]


def test_top2gap_caps_narrow_confident_depths():
    # depth 1: confident (gap 6) -> 1 child; depth 2: flat (gap 0) -> more than half of K
    logprobs = torch.tensor([[0.0, -6.0, -7.0, -8.0], [-1.0, -1.0, -1.0, -1.0]])
    caps = fanout_caps(logprobs, TreeSpec(budget=10, max_depth=2, width=4, fanout="top2gap"))
    assert caps == [1, 3]
    assert fanout_caps(logprobs, TreeSpec(budget=10, max_depth=2, width=4)) == [4, 4]


@pytest.mark.parametrize("fanout", ["uniform", "top2gap"])
def test_caps_of_host_top_k_read_no_device_data(fanout):
    """The worker builds trees from top-k it copied to the host once; the caps read from that copy must
    not count as another read of device data (a device-made cap tensor did: one sync per request)."""
    from harness.step_probe import StepProbe

    device_top_k = torch.tensor([[0.0, -6.0, -7.0, -8.0], [-1.0, -1.0, -1.0, -1.0]])  # made before: device
    with StepProbe() as probe:
        caps = fanout_caps(device_top_k.cpu(), TreeSpec(budget=10, max_depth=2, width=4, fanout=fanout))
    counts = probe.take()
    assert caps == ([1, 3] if fanout == "top2gap" else [4, 4])
    assert counts.host_syncs == 1, counts.sync_sites  # the copy alone


def test_impossible_candidates_never_become_nodes():
    logits = torch.full((3, 10), -math.inf)
    logits[0, 4] = 0.0  # depth 1 has one candidate, deeper depths none
    tokens, logprobs = top_k_per_depth(logits, 4)
    tree = build_tree(1, tokens, logprobs, TreeSpec(budget=16, max_depth=3, width=4))
    assert tree.tokens.tolist() == [1, 4]


def test_kept_nodes_drop_a_node_with_its_subtree_and_renumber_parents():
    #        0
    #      1   2
    #     3 4   5
    #     6
    tree = DraftTree(
        torch.tensor([10, 11, 12, 13, 14, 15, 16]),
        torch.tensor([-1, 0, 0, 1, 1, 2, 3]),
        torch.tensor([0, 1, 1, 2, 2, 2, 3]),
        torch.tensor([0, 0, 1, 0, 1, 0, 0]),
        torch.tensor([0.0, -0.1, -0.2, -0.3, -0.4, -0.5, -0.6]),
    )
    kept, index = kept_nodes(tree, [False, True, True, False, True, True, True])  # drop 3 (and so 6); the root stays
    assert index.tolist() == [0, 1, 2, 4, 5]
    assert kept.tokens.tolist() == [10, 11, 12, 14, 15]
    assert kept.parents.tolist() == [-1, 0, 0, 1, 2]
    assert kept.depths.tolist() == [0, 1, 1, 2, 2] and kept.ranks.tolist() == [0, 0, 1, 1, 0]
    assert kept.cum_logprobs.tolist() == pytest.approx([0.0, -0.1, -0.2, -0.4, -0.5])
    assert kept.token_paths() == [(), (11,), (12,), (11, 14), (12, 15)]
    same, index = kept_nodes(tree, [True] * 7)
    assert same is tree and index.tolist() == list(range(7))
    with pytest.raises(ValueError, match="drawn children"):
        kept_nodes(
            DraftTree(tree.tokens, tree.parents, tree.depths, tree.ranks, tree.cum_logprobs, drawn=object()), [True] * 7
        )
