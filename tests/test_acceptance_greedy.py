"""Greedy acceptance on hand-built trees: deepest argmax-matching path plus the bonus token."""

import pytest
import torch

from sglang_jetspec.core.acceptance import accept_batch, target_argmax
from sglang_jetspec.core.sampling import SamplingParams, make_generator
from sglang_jetspec.core.tree import DraftTree

VOCAB = 10


def tree_of(tokens, parents):
    depths = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    n = len(tokens)
    return DraftTree(
        torch.tensor(tokens),
        torch.tensor(parents),
        torch.tensor(depths),
        torch.zeros(n, dtype=torch.long),
        torch.zeros(n),
    )


def logits_with_argmax(argmaxes):
    logits = torch.zeros(len(argmaxes), VOCAB)
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 5.0
    return logits


# root(9) -> a(1) -> c(3) -> e(5)
#         -> b(2) -> d(4)
TREE = tree_of([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 3])


def run(trees, logits_list):
    n = max(t.size for t in trees)
    logits = torch.zeros(len(trees), n, VOCAB)
    for b, request_logits in enumerate(logits_list):
        logits[b, : request_logits.shape[0]] = request_logits
    greedy = SamplingParams()
    return accept_batch(trees, logits, [greedy] * len(trees), [make_generator(0) for _ in trees])


def test_deepest_matching_path_and_bonus():
    # target argmax per node: root->2 (b), b->4 (d), d->7 (bonus); other nodes irrelevant
    [result] = run([TREE], [logits_with_argmax([2, 0, 4, 0, 7, 0])])
    assert result.path == [0, 2, 4]
    assert result.tokens == [2, 4, 7]
    assert result.accept_length == 3


def test_full_depth_accept_takes_bonus_at_leaf():
    [result] = run([TREE], [logits_with_argmax([1, 3, 0, 5, 0, 8])])
    assert result.path == [0, 1, 3, 5]
    assert result.tokens == [1, 3, 5, 8]


def test_no_match_emits_only_the_correction():
    [result] = run([TREE], [logits_with_argmax([6, 0, 0, 0, 0, 0])])
    assert result.path == [0] and result.tokens == [6]


def test_batch_rows_are_independent_and_sizes_may_differ():
    small = tree_of([9, 1], [-1, 0])
    results = run(
        [TREE, small, TREE],
        [logits_with_argmax([2, 0, 4, 0, 7, 0]), logits_with_argmax([1, 8]), logits_with_argmax([6, 0, 0, 0, 0, 0])],
    )
    assert [r.tokens for r in results] == [[2, 4, 7], [1, 8], [6]]


def test_greedy_and_sampled_rows_mix_in_one_batch():
    logits = torch.zeros(2, TREE.size, VOCAB)
    logits[0] = logits_with_argmax([2, 0, 4, 0, 7, 0])
    logits[1, :, :] = -1e9
    logits[1, :, 3] = 0.0  # sampled row: the target puts all mass on token 3 everywhere
    results = accept_batch(
        [TREE, TREE],
        logits,
        [SamplingParams(), SamplingParams(temperature=1.0, seed=1)],
        [make_generator(0), make_generator(1)],
    )
    assert results[0].tokens == [2, 4, 7]
    assert results[1].tokens == [3]  # root's children are 1 and 2, so 3 is the correction


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_target_argmax_is_the_first_maximum_in_every_dtype(dtype):
    """The winner is torch.argmax's in every dtype (target_argmax goes through max), ties to the first."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 4096, generator=gen).to(dtype)
    logits[0, 0, 7] = logits[0, 0, 4000] = 50.0  # a tie: the lower index wins
    logits[1, 2, 4095] = 50.0
    got = target_argmax(logits)
    assert got.dtype == torch.long and got.shape == (3, 5)
    assert got[0, 0] == 7 and got[1, 2] == 4095
    first_max = (logits == logits.amax(-1, keepdim=True)).int().argmax(-1)  # first index holding the maximum
    assert torch.equal(got, first_max)
    many_ties = torch.randint(0, 3, (8, 49152), generator=gen).to(dtype)  # vectorised kernels split rows
    assert torch.equal(target_argmax(many_ties), many_ties.float().argmax(-1))
