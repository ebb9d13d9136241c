"""core.marginal_trees: the batched marginal tree is tree.build_tree's, lane for lane, node for node, with
no host read and shapes fixed by the batch and the spec."""

from __future__ import annotations

import math

import pytest
import torch

from harness.step_probe import StepProbe
from sglang_jetspec.core.marginal_trees import marginal_trees
from sglang_jetspec.core.tree import TreeSpec, build_tree


def _top_k(generator, batch, depth, k, quantum=None, impossible=0.0):
    """[B, D, K] top-K log-probs in rank order (some -inf at the tail with `impossible`) and tokens.
    With `quantum`, log-probs are multiples of it: exact float64 sums, so equal scores of different
    paths (ties the tree must break as the heap does) are frequent."""
    logprobs = -torch.rand(batch, depth, k, generator=generator, dtype=torch.float64) * 4
    if quantum:
        logprobs = (logprobs / quantum).round() * quantum
    logprobs = logprobs.float().sort(dim=-1, descending=True).values
    if impossible:
        cut = torch.rand(batch, depth, generator=generator) < impossible
        tail = torch.randint(0, k, (batch, depth), generator=generator)
        ranks = torch.arange(k)
        logprobs = logprobs.masked_fill(cut.unsqueeze(-1) & (ranks >= tail.unsqueeze(-1)), -math.inf)
    tokens = torch.randint(0, 1000, (batch, depth, k), generator=generator)
    return tokens, logprobs


CASES = [
    # (budget, max_depth, width, K, D, fanout, quantum, impossible)
    (1, 4, 3, 3, 4, "uniform", None, 0.0),
    (2, 4, 3, 3, 4, "uniform", None, 0.0),
    (8, 7, 4, 4, 7, "uniform", None, 0.0),
    (16, 15, 4, 4, 15, "uniform", None, 0.0),
    (16, 15, 4, 4, 15, "uniform", 0.5, 0.0),
    (32, 15, 8, 8, 15, "uniform", 0.25, 0.3),
    (64, 15, 4, 6, 15, "top2gap", None, 0.0),
    (24, 5, 3, 5, 8, "top2gap", 0.5, 0.2),
    (40, 3, 5, 5, 3, "uniform", 1.0, 0.0),  # fewer nodes than the budget: the tree stops short
    (12, 11, 1, 1, 11, "uniform", None, 0.0),  # width 1: a chain
    (20, 6, 3, 3, 6, "uniform", 0.5, 0.9),  # most candidates impossible
]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}-d{c[1]}-w{c[2]}-{c[5]}-q{c[6]}-x{c[7]}" for c in CASES])
def test_every_lane_is_build_trees_tree_node_for_node(case):
    budget, max_depth, width, k, depth, fanout, quantum, impossible = case
    spec = TreeSpec(budget=budget, max_depth=max_depth, width=width, fanout=fanout)
    generator = torch.Generator().manual_seed(budget * 1000 + k)
    batch = 12
    tokens, logprobs = _top_k(generator, batch, depth, k, quantum, impossible)
    roots = torch.randint(0, 1000, (batch,), generator=generator)
    got = marginal_trees(roots, tokens, logprobs, spec)
    assert got.tokens.shape == (batch, budget)  # fixed by the batch and the budget, whatever the data
    for b, tree in enumerate(got.trees()):
        want = build_tree(int(roots[b]), tokens[b], logprobs[b], spec)
        assert tree.size == want.size, b
        for name in ("tokens", "parents", "depths", "ranks"):
            assert getattr(tree, name).tolist() == getattr(want, name).tolist(), (b, name)
        assert torch.equal(tree.cum_logprobs, want.cum_logprobs), b


def test_ties_break_by_depth_then_rank_path_as_the_heap_does():
    """Every candidate at log-prob 0 or -1: scores tie across depths and paths, and only the tie-break
    decides which nodes make the budget and in which order."""
    spec = TreeSpec(budget=10, max_depth=4, width=3)
    logprobs = torch.tensor([[[0.0, -1.0, -1.0]] * 4])
    tokens = torch.arange(12).view(1, 4, 3)
    got = marginal_trees(torch.tensor([7]), tokens, logprobs, spec).trees()[0]
    want = build_tree(7, tokens[0], logprobs[0], spec)
    assert got.depths.tolist() == want.depths.tolist() == [0, 1, 2, 3, 4, 1, 1, 2, 2, 2]
    assert got.parents.tolist() == want.parents.tolist()
    assert got.ranks.tolist() == want.ranks.tolist()


def test_padding_past_a_short_tree_is_marked():
    spec = TreeSpec(budget=8, max_depth=2, width=2)
    logprobs = torch.tensor([[[-0.1, -math.inf], [-0.2, -math.inf]]])  # one candidate per depth: a 3-node chain
    got = marginal_trees(torch.tensor([5]), torch.tensor([[[1, 2], [3, 4]]]), logprobs, spec)
    assert got.sizes.tolist() == [3]
    assert got.parents[0].tolist() == [-1, 0, 1, -1, -1, -1, -1, -1]
    assert got.tokens[0, :3].tolist() == [5, 1, 3]


def test_the_batched_tree_reads_nothing_back_to_the_host():
    """What a captured drafting graph may hold: no sync, no data-dependent shape (strict probe)."""
    spec = TreeSpec(budget=16, max_depth=15, width=4, fanout="top2gap")
    tokens, logprobs = _top_k(torch.Generator().manual_seed(0), 4, 15, 4, 0.5, 0.2)
    roots = torch.tensor([1, 2, 3, 4])
    with StepProbe(strict=True) as probe:
        marginal_trees(roots, tokens, logprobs, spec)
    assert probe.take().host_syncs == 0
