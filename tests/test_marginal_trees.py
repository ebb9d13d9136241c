"""core.marginal_trees: the batched marginal tree is tree.build_tree's, lane for lane, node for node, with
no host read and shapes fixed by the batch and the spec."""

from __future__ import annotations

import math

import pytest
import torch

from harness.step_probe import StepProbe
from sglang_jetspec.core.marginal_trees import guess_tables, marginal_trees
from sglang_jetspec.core.tree import TreeSpec, build_tree, marginal_candidates, tree_from_candidates


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


def _random_guesses(generator, tokens, spec, quantum=None) -> list[dict]:
    """Per lane, guessed children along random paths: some the head's own candidates (merged by noisy-or),
    some new tokens (new candidates), from the root or from a guessed node; a few keys whose prefix is
    no key (reached through the head's candidates alone). With `quantum` (frequent exact ties), new
    tokens only: a noisy-or on the device may differ from the host's in its last bit (another libm),
    which reorders exactly tied nodes; without it, ties are measure-zero and merges are compared too."""
    lanes = []
    for b in range(tokens.shape[0]):
        guesses: dict = {}
        for _ in range(int(torch.randint(0, 6, (1,), generator=generator))):
            path: tuple = ()
            for depth in range(int(torch.randint(1, spec.max_depth + 1, (1,), generator=generator))):
                if depth >= tokens.shape[1]:
                    break
                pick = torch.rand(1, generator=generator).item()
                if pick < 0.5 and not quantum:  # one of the head's candidates at this depth
                    token = int(tokens[b, depth, int(torch.randint(0, tokens.shape[2], (1,), generator=generator))])
                else:
                    token = 2000 + int(torch.randint(0, 5, (1,), generator=generator))
                logprob = -float(torch.rand(1, generator=generator, dtype=torch.float64)) * 3 - 0.01
                if quantum:
                    logprob = min(-quantum, round(logprob / quantum) * quantum)
                if pick > 0.1 or depth:  # the rest: no guess at this node, a key further down
                    guesses.setdefault(path, {})[token] = logprob
                path += (token,)
        lanes.append(guesses)
    return lanes


GUESS_CASES = [
    # (budget, max_depth, width, K, D, fanout, quantum, impossible)
    (16, 15, 4, 4, 15, "uniform", None, 0.0),
    (16, 15, 8, 8, 15, "uniform", 0.5, 0.0),
    (32, 15, 8, 8, 15, "uniform", 0.25, 0.3),
    (24, 6, 3, 5, 8, "top2gap", 0.5, 0.2),
    (8, 7, 1, 1, 7, "uniform", None, 0.0),  # width 1: guesses branch off the head's chain
    (40, 3, 5, 5, 3, "uniform", 1.0, 0.5),
]


@pytest.mark.parametrize("case", GUESS_CASES, ids=[f"b{c[0]}-w{c[2]}-{c[5]}-q{c[6]}-x{c[7]}" for c in GUESS_CASES])
def test_guessed_lanes_are_tree_from_candidates_trees_node_for_node(case):
    """With each lane's guesses merged (the hybrid drafter's, a grammar's forced chain), the batched tree
    is the host heap's, ties included."""
    budget, max_depth, width, k, depth, fanout, quantum, impossible = case
    spec = TreeSpec(budget=budget, max_depth=max_depth, width=width, fanout=fanout)
    generator = torch.Generator().manual_seed(budget * 7 + k)
    batch = 24
    _, logprobs = _top_k(generator, batch, depth, k, quantum, impossible)
    # a depth's top-K tokens are distinct (merging guesses keys candidates by token)
    tokens = torch.rand(batch, depth, 1000, generator=generator).argsort(-1)[..., :k]
    roots = torch.randint(0, 1000, (batch,), generator=generator)
    guesses = _random_guesses(generator, tokens, spec, quantum)
    assert sum(map(bool, guesses)) > batch // 2
    head_proposes = [
        token in tokens[b, len(path)].tolist()
        for b, lane in enumerate(guesses)
        for path, kids in lane.items()
        for token in kids
    ]
    assert any(head_proposes) == (quantum is None)  # merges by noisy-or exercised where ties cannot hide them
    got = marginal_trees(roots, tokens, logprobs, spec, guess_tables(guesses)).trees()
    marginal = marginal_candidates(tokens, logprobs, spec)
    for b, tree in enumerate(got):
        want = tree_from_candidates(int(roots[b]), marginal[b], spec, guesses=guesses[b])
        for name in ("tokens", "parents", "depths", "ranks"):
            assert getattr(tree, name).tolist() == getattr(want, name).tolist(), (b, name)
        assert torch.allclose(tree.cum_logprobs, want.cum_logprobs), b


def test_no_guesses_give_the_marginal_tree():
    spec = TreeSpec(budget=16, max_depth=15, width=4)
    tokens, logprobs = _top_k(torch.Generator().manual_seed(3), 4, 15, 4, 0.5)
    roots = torch.tensor([1, 2, 3, 4])
    plain = marginal_trees(roots, tokens, logprobs, spec)
    guessed = marginal_trees(roots, tokens, logprobs, spec, guess_tables([{}] * 4))
    for name in ("tokens", "parents", "depths", "ranks", "cum_logprobs", "sizes"):
        assert torch.equal(getattr(plain, name), getattr(guessed, name)), name


def test_a_guessed_token_the_head_also_proposes_scores_both():
    """The root's guess of the head's second candidate: noisy-or lifts it above the first, so it takes
    rank 0; a new token joins as a third candidate."""
    spec = TreeSpec(budget=4, max_depth=1, width=2)
    tokens, logprobs = torch.tensor([[[10, 11]]]), torch.tensor([[[-0.5, -1.0]]])
    tables = guess_tables([{(): {11: -0.7, 12: -2.0}}])
    tree = marginal_trees(torch.tensor([5]), tokens, logprobs, spec, tables).trees()[0]
    assert tree.tokens.tolist() == [5, 11, 10, 12]
    assert tree.ranks.tolist() == [0, 0, 1, 2]
    assert tree.cum_logprobs[1].item() == pytest.approx(math.log1p(-(1 - math.exp(-1.0)) * (1 - math.exp(-0.7))))


def test_guessed_trees_read_nothing_back_to_the_host():
    spec = TreeSpec(budget=16, max_depth=15, width=4, fanout="top2gap")
    generator = torch.Generator().manual_seed(1)
    tokens, logprobs = _top_k(generator, 4, 15, 4, 0.5, 0.2)
    tables = guess_tables(_random_guesses(generator, tokens, spec))
    with StepProbe(strict=True) as probe:
        marginal_trees(torch.tensor([1, 2, 3, 4]), tokens, logprobs, spec, tables)
    assert probe.take().host_syncs == 0
