"""Stochastic acceptance is lossless: emitted tokens follow the processed target distribution exactly.

A toy target over a 6-token vocabulary whose next-token logits are a fixed function of the context,
and a toy draft that disagrees with it, so trees see both accepts and rejects. Each simulated request
runs speculative steps until it has two tokens; the joint frequency of (x1, x2) over 40,000 draws
must match p(x1) p(x2 | x1) under the request's processed distribution (chi-square, p > 1e-3).
Deliberately broken acceptors must fail the same test; they stay here as mutation checks.
"""

import math

import pytest
import torch
from scipy.stats import chisquare

from sglang_jetspec.core import acceptance
from sglang_jetspec.core.acceptance import accept_batch
from sglang_jetspec.core.prompt_lookup import chain_guesses
from sglang_jetspec.core.sampling import SamplingParams, make_generator, processed_probs
from sglang_jetspec.core.tree import TreeSpec, build_tree, top_k_per_depth
from sglang_jetspec.core.tree_drafting import TreeDraft
from tests.builders import break_target_processing

VOCAB = 6
# enough power: each broken acceptor below already fails at 10,000 draws with p = 0 (measured)
DRAWS = 40_000
ROOT = 0


def target_logits(context: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(context) % (2**31))
    return torch.randn(VOCAB, generator=gen) * 1.5


def draft_tree(context: tuple[int, ...]):
    """Depth-2 top-3 tree from a draft that is a noisy copy of the target at depth 1 and blind at depth 2."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 997)
    depth_logits = torch.stack(
        [target_logits(context) + torch.randn(VOCAB, generator=gen), torch.randn(VOCAB, generator=gen)]
    )
    tokens, logprobs = top_k_per_depth(depth_logits, 3)
    return build_tree(context[-1], tokens, logprobs, TreeSpec(budget=8, max_depth=2, width=3))


def conditioned_draft_tree(context: tuple[int, ...]):
    """The same marginal draft, then one tree-causal round: each node's children re-drafted from a noisy
    copy of the target at the node's own path (as a prefix-reveal head would) and the tree rebuilt."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 997)
    depth_logits = torch.stack(
        [target_logits(context) + torch.randn(VOCAB, generator=gen), torch.randn(VOCAB, generator=gen)]
    )
    draft = TreeDraft(context[-1], *top_k_per_depth(depth_logits, 3), TreeSpec(budget=8, max_depth=2, width=3))
    paths = draft.tree.token_paths()
    draft.learn(torch.stack([target_logits(context + p) + torch.randn(VOCAB, generator=gen) for p in paths]))
    return draft.tree


def hybrid_draft_tree(context: tuple[int, ...]):
    """The same marginal draft with a prompt-lookup-style guess merged in (the hybrid drafter): a fixed
    two-token chain, scored 0.6 per token, that the target often rejects."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 997)
    depth_logits = torch.stack(
        [target_logits(context) + torch.randn(VOCAB, generator=gen), torch.randn(VOCAB, generator=gen)]
    )
    guess = [(context[-1] + 1) % VOCAB, (context[-1] + 3) % VOCAB]
    return TreeDraft(
        context[-1],
        *top_k_per_depth(depth_logits, 3),
        TreeSpec(budget=8, max_depth=2, width=3),
        guesses=chain_guesses(guess, math.log(0.6)),
    ).tree


# A reduced draft vocabulary (core/draft_vocab.py) that leaves out token 1: the draft's logits cover
# only the listed ids, column j meaning token DRAFT_VOCAB[j], so token 1 is never drafted.
DRAFT_VOCAB = torch.tensor([3, 0, 5, 2, 4])


def reduced_vocab_draft_tree(context: tuple[int, ...]):
    """The same noisy draft restricted to DRAFT_VOCAB, mapped back to token ids as the engine does."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 997)
    depth_logits = torch.stack(
        [target_logits(context) + torch.randn(VOCAB, generator=gen), torch.randn(VOCAB, generator=gen)]
    )
    tokens, logprobs = top_k_per_depth(depth_logits[:, DRAFT_VOCAB], 3, DRAFT_VOCAB)
    return build_tree(context[-1], tokens, logprobs, TreeSpec(budget=8, max_depth=2, width=3))


def tree_logits(context, tree) -> torch.Tensor:
    """Target logits at every node: the node's context is the request context plus its path's tokens."""
    paths = [tuple(int(tree.tokens[i]) for i in tree.path_to(n)[1:]) for n in range(tree.size)]
    return torch.stack([target_logits(context + p) for p in paths])


def accept_padded(trees, logits, params: SamplingParams, generators, method: str):
    """accept_batch over trees of different sizes: each request's node logits padded to the largest tree."""
    batch = torch.full((len(trees), max(t.size for t in trees), VOCAB), -1e9)
    for b, rows in enumerate(logits):
        batch[b, : rows.shape[0]] = rows
    return accept_batch(trees, batch, [params] * len(trees), generators, method)


def simulate(params: SamplingParams, method: str, draws: int = DRAWS, drafting=draft_tree) -> torch.Tensor:
    """Counts [V, V] of the first two emitted tokens over `draws` independent requests."""
    contexts = [(ROOT,)] * draws
    emitted: list[list[int]] = [[] for _ in range(draws)]
    generators = [make_generator(seed) for seed in range(draws)]
    pending = list(range(draws))
    cache = {}
    while pending:
        trees, logits = [], []
        for r in pending:
            ctx = contexts[r] + tuple(emitted[r])
            if ctx not in cache:
                tree = drafting(ctx)
                cache[ctx] = (tree, tree_logits(ctx, tree))
            trees.append(cache[ctx][0])
            logits.append(cache[ctx][1])
        results = accept_padded(trees, logits, params, [generators[r] for r in pending], method)
        for r, res in zip(pending, results):
            emitted[r].extend(res.tokens)
        pending = [r for r in pending if len(emitted[r]) < 2]
    counts = torch.zeros(VOCAB, VOCAB)
    for e in emitted:
        counts[e[0], e[1]] += 1
    return counts


def expected_joint(params: SamplingParams) -> torch.Tensor:
    p1 = processed_probs(target_logits((ROOT,)), params).double()
    rows = [p1[a] * processed_probs(target_logits((ROOT, a)), params).double() for a in range(VOCAB)]
    return torch.stack(rows)


def lossless_pvalue(params: SamplingParams, method: str, drafting=draft_tree) -> float:
    counts = simulate(params, method, drafting=drafting).double().flatten()
    probs = expected_joint(params).flatten()
    if counts[probs == 0].sum() > 0:
        return 0.0  # a token the processed distribution forbids was emitted
    support = probs > 0
    return float(chisquare(counts[support], probs[support] / probs[support].sum() * counts.sum()).pvalue)


SETTINGS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=1.3, top_k=3),
    SamplingParams(temperature=1.0, min_p=0.15),
    SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05),
]


def accept_lengths(tree, params, runs: int = 2000) -> set[int]:
    """The accept lengths of `runs` verifies of `tree` after ROOT, one generator seed each."""
    results = accept_batch(
        [tree] * runs,
        tree_logits((ROOT,), tree).expand(runs, -1, -1),
        [params] * runs,
        [make_generator(s) for s in range(runs)],
    )
    return {r.accept_length for r in results}


def test_toy_exercises_accepts_and_rejects():
    assert {1, 2, 3} <= accept_lengths(draft_tree((ROOT,)), SETTINGS[0])


@pytest.mark.parametrize("method", ["match", "residual"])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-p{p.top_p}-k{p.top_k}-m{p.min_p}")
def test_emitted_tokens_follow_processed_target(params, method):
    assert lossless_pvalue(params, method) > 1e-3


# Tree shapes other than the marginal one: both acceptance rules on the richer setting, match on T = 1.
# The residual rule at T = 1 on every shape runs in the slow sweep: test_emitted_tokens_follow_processed_target
# covers it on marginal trees, and the shapes differ only in the trees the rule walks.
TREE_VARIANT_CASES = [
    pytest.param(SETTINGS[0], "match", id="T1-match"),
    pytest.param(SETTINGS[0], "residual", id="T1-residual", marks=pytest.mark.slow),
    pytest.param(SETTINGS[4], "match", id="T0.9-k4-p0.9-m0.05-match"),
    pytest.param(SETTINGS[4], "residual", id="T0.9-k4-p0.9-m0.05-residual"),
]


def test_conditioned_trees_differ_from_marginal_ones_and_exercise_accepts():
    assert any(
        conditioned_draft_tree((ROOT, a)).token_paths() != draft_tree((ROOT, a)).token_paths() for a in range(VOCAB)
    )
    assert {1, 2, 3} <= accept_lengths(conditioned_draft_tree((ROOT,)), SETTINGS[0])


@pytest.mark.parametrize("params, method", TREE_VARIANT_CASES)
def test_conditioned_trees_stay_lossless(params, method):
    # acceptance only sees the tree; a tree-causal round changes which tree, never how it is verified
    assert lossless_pvalue(params, method, conditioned_draft_tree) > 1e-3


def test_hybrid_trees_differ_from_marginal_ones():
    assert any(hybrid_draft_tree((ROOT, a)).token_paths() != draft_tree((ROOT, a)).token_paths() for a in range(VOCAB))


@pytest.mark.parametrize("params, method", TREE_VARIANT_CASES)
def test_hybrid_trees_stay_lossless(params, method):
    # a merged guess changes which tree is verified, never how: the guessed tokens are only proposals
    assert lossless_pvalue(params, method, hybrid_draft_tree) > 1e-3


def test_reduced_vocabulary_trees_never_draft_the_left_out_token():
    trees = [reduced_vocab_draft_tree((ROOT, a)) for a in range(VOCAB)] + [reduced_vocab_draft_tree((ROOT,))]
    assert all(1 not in t.tokens[1:].tolist() for t in trees)
    assert any(t.tokens[1:].tolist() != draft_tree((ROOT, a)).tokens[1:].tolist() for a, t in enumerate(trees[:-1]))


@pytest.mark.parametrize("params, method", TREE_VARIANT_CASES)
def test_reduced_vocabulary_trees_stay_lossless(params, method):
    # the left-out token is still emitted at its target probability: by corrections and bonus draws
    assert lossless_pvalue(params, method, reduced_vocab_draft_tree) > 1e-3


def test_seeded_requests_reproduce():
    params = SamplingParams(temperature=1.0, seed=5)
    tree = draft_tree((ROOT,))
    logits = tree_logits((ROOT,), tree).unsqueeze(0)
    for method in ("match", "residual"):
        a = [accept_batch([tree], logits, [params], [make_generator(5)], method)[0].tokens for _ in range(3)]
        assert a[0] == a[1] == a[2]


# --- mutation checks: each broken acceptor must be caught by the same statistical test ---------


def test_catches_top_p_ignored_on_the_target_side(monkeypatch):
    break_target_processing(monkeypatch, top_p=1.0)
    assert lossless_pvalue(SamplingParams(temperature=0.7, top_p=0.8), "match") < 1e-3
    assert lossless_pvalue(SamplingParams(temperature=0.7, top_p=0.8), "residual") < 1e-3


def test_catches_residual_step_skipped(monkeypatch):
    monkeypatch.setattr(acceptance, "reject_token", lambda probs, rows, tokens: None)
    assert lossless_pvalue(SamplingParams(temperature=1.0), "residual") < 1e-3


def test_catches_accepting_draft_tokens_without_a_check(monkeypatch):
    # an acceptor that trusts the draft: every drafted child matches
    original = acceptance._walk_matching
    monkeypatch.setattr(
        acceptance,
        "_walk_matching",
        lambda padded, choice: original(
            padded, torch.where(padded.child_token[:, :, 0] >= 0, padded.child_token[:, :, 0], choice)
        ),
    )
    assert lossless_pvalue(SamplingParams(temperature=1.0), "match") < 1e-3
