"""Drawn children (core/drawn_children.py) stay lossless, and accept more often than top-K children.

The toy of test_acceptance_stat.py: a 6-token target whose logits are a fixed function of the context
and a noisy draft. Here each simulated request draws its own tree's children from the draft with its
own generator, so trees are never shared between requests; the first two emitted tokens must follow
p(x1) p(x2 | x1) exactly (chi-square). Broken variants (a proposal that forgets the siblings drawn
before, a residual that is not max(r - q, 0)) must fail the same test.
"""

import math

import pytest
import torch
from scipy.stats import chisquare
from test_acceptance_stat import ROOT, VOCAB, accept_padded, expected_joint, target_logits, tree_logits

from sglang_jetspec.core import acceptance
from sglang_jetspec.core.drawn_children import draw_children, proposals_from_logits
from sglang_jetspec.core.prompt_lookup import chain_guesses
from sglang_jetspec.core.sampling import SamplingParams, make_generator
from sglang_jetspec.core.tree import DrawnChildren, TreeSpec, top_k_per_depth
from sglang_jetspec.core.tree_drafting import TreeDraft, drawn_trees
from sglang_jetspec.core.tree_sizing import truncate

DRAWS = 10_000
SPEC = TreeSpec(budget=6, max_depth=2, width=3)
DRAFT_VOCAB = torch.tensor([3, 0, 5, 2, 4])  # token 1 is never drafted


def toy_draft(
    context: tuple[int, ...], hybrid: bool = False, vocab: torch.Tensor | None = None
) -> tuple[TreeDraft, torch.Tensor]:
    """The noisy draft's TreeDraft and its depth logits [2, V_d] (hybrid: a looked-up chain merged in)."""
    gen = torch.Generator().manual_seed(1000 + hash(context) % 997)
    depth_logits = torch.stack(
        [target_logits(context) + torch.randn(VOCAB, generator=gen), torch.randn(VOCAB, generator=gen)]
    )
    if vocab is not None:
        depth_logits = depth_logits[:, vocab]
    guesses = chain_guesses([(context[-1] + 1) % VOCAB, (context[-1] + 3) % VOCAB], math.log(0.6)) if hybrid else {}
    return TreeDraft(
        context[-1], *top_k_per_depth(depth_logits, SPEC.width, vocab), SPEC, guesses=guesses, vocab=vocab
    ), depth_logits


def simulate(
    params: SamplingParams,
    method: str = "draw",
    hybrid: bool = False,
    vocab=None,
    size: int | None = None,
    draws: int = DRAWS,
) -> tuple[torch.Tensor, float]:
    """Counts [V, V] of the first two emitted tokens, and the mean accept length of the first step."""
    emitted: list[list[int]] = [[] for _ in range(draws)]
    generators = [make_generator(seed) for seed in range(draws)]
    pending, first_lengths, drafts = list(range(draws)), [], {}
    while pending:
        trees, logits = [], []
        for r in pending:
            ctx = (ROOT,) + tuple(emitted[r])
            if ctx not in drafts:
                drafts[ctx] = toy_draft(ctx, hybrid, vocab)
            draft, depth_logits = drafts[ctx]
            tree = (
                drawn_trees([draft], depth_logits.unsqueeze(0), [(params.temperature, generators[r])])[0]
                if method == "draw"
                else draft.tree
            )
            tree = truncate(tree, size) if size else tree
            trees.append(tree)
            logits.append(tree_logits(ctx, tree))
        results = accept_padded(trees, logits, params, [generators[r] for r in pending], method)
        for r, res in zip(pending, results):
            if not emitted[r]:
                first_lengths.append(res.accept_length)
            emitted[r].extend(res.tokens)
        pending = [r for r in pending if len(emitted[r]) < 2]
    counts = torch.zeros(VOCAB, VOCAB)
    for e in emitted:
        counts[e[0], e[1]] += 1
    return counts, sum(first_lengths) / len(first_lengths)


def pvalue(counts: torch.Tensor, params: SamplingParams) -> float:
    counts, probs = counts.double().flatten(), expected_joint(params).flatten()
    if counts[probs == 0].sum() > 0:
        return 0.0
    support = probs > 0
    return float(chisquare(counts[support], probs[support] / probs[support].sum() * counts.sum()).pvalue)


def test_drawn_children_replace_only_marginal_children_and_record_their_proposals():
    draft, depth_logits = toy_draft((ROOT,), hybrid=True)
    fixed = {path: set(tokens) for path, tokens in draft.guesses.items()}
    tree = draw_children(draft.tree, fixed, proposals_from_logits(depth_logits, 1.0), None, make_generator(3))
    assert (
        tree.drawn is not None
        and tree.parents.equal(draft.tree.parents)
        and tree.cum_logprobs.equal(draft.tree.cum_logprobs)
    )
    guessed = (ROOT + 1) % VOCAB
    for node, kids in enumerate(tree.children()):
        tokens = [int(tree.tokens[c]) for c in kids]
        assert len(set(tokens)) == len(tokens)  # siblings never share a token
        for c in kids:
            if node == 0 and int(draft.tree.tokens[c]) == guessed:
                assert c not in tree.drawn.drawn and int(tree.tokens[c]) == guessed  # looked up: kept, a point mass
            elif c in tree.drawn.drawn:
                column, excluded = tree.drawn.drawn[c]
                assert int(tree.tokens[c]) == column and column not in excluded
    # every drawn child's proposal leaves out its looked-up siblings and the siblings drawn before it
    for c, (column, excluded) in tree.drawn.drawn.items():
        q = tree.drawn.proposal(c, int(tree.depths[c]))
        assert math.isclose(float(q.sum()), 1.0) and all(q[e] == 0 for e in excluded)


def test_drawn_children_depend_on_the_request_stream_only():
    draft, depth_logits = toy_draft((ROOT,))
    first = [
        drawn_trees([draft], depth_logits.unsqueeze(0), [(1.0, make_generator(s))])[0].tokens.tolist()
        for s in range(30)
    ]
    again = [
        drawn_trees([draft], depth_logits.unsqueeze(0), [(1.0, make_generator(s))])[0].tokens.tolist()
        for s in range(30)
    ]
    assert first == again and len({tuple(t) for t in first}) > 5


SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05)]


# Every variant on the richer setting; T = 1 on the head's own trees, the other shapes at T = 1 in the
# slow sweep (the variants differ in the trees drawn from, not in how T = 1 is processed)
LOSSLESS_CASES = [
    pytest.param(
        params, variant, id=f"{variant}-{name}", marks=[pytest.mark.slow] if name == "T1" and variant != "head" else []
    )
    for variant in ("head", "hybrid", "reduced-vocab", "truncated")
    for params, name in zip(SETTINGS, ("T1", "T0.9-k4-p0.9-m0.05"))
]


@pytest.mark.parametrize("params, variant", LOSSLESS_CASES)
def test_drawn_children_stay_lossless(params, variant):
    kwargs = {"hybrid": {"hybrid": True}, "reduced-vocab": {"vocab": DRAFT_VOCAB}, "truncated": {"size": 3}}.get(
        variant, {}
    )
    counts, _ = simulate(params, **kwargs)
    assert pvalue(counts, params) > 1e-3


def test_a_drawn_child_is_accepted_with_probability_sum_of_min_p_q():
    # root and one drawn child: accepted with probability sum(min(p, q)) exactly, where the top-1
    # child would be accepted with probability p(argmax q)
    params = SamplingParams(temperature=1.0)
    draft, depth_logits = toy_draft((ROOT,))
    p = torch.softmax(target_logits((ROOT,)).double(), -1)
    q = torch.softmax(depth_logits[0].double(), -1)
    _, first_accept = simulate(params, "draw", size=2, draws=8000)
    assert abs((first_accept - 1) - float(torch.minimum(p, q).sum())) < 0.02
    _, top_1 = simulate(params, "residual", size=2, draws=8000)
    assert abs((top_1 - 1) - float(p[int(draft.tree.tokens[1])])) < 0.02


# --- mutation checks -------------------------------------------------------------------------


def test_catches_a_proposal_that_forgets_earlier_siblings(monkeypatch):
    def forgetful(self, node, depth):
        q = self.proposals[depth].clone()
        return q / q.sum()

    monkeypatch.setattr(DrawnChildren, "proposal", forgetful)
    counts, _ = simulate(SETTINGS[0])
    assert pvalue(counts, SETTINGS[0]) < 1e-3


def test_catches_a_residual_left_as_it_was(monkeypatch):
    # rejecting a drawn child must take its proposal out of the target's residual
    monkeypatch.setattr(acceptance, "reject_drawn", lambda r, q, vocab: 0.0)
    counts, _ = simulate(SETTINGS[0])
    assert pvalue(counts, SETTINGS[0]) < 1e-3
