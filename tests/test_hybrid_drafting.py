"""The hybrid drafter: prompt-lookup guesses merged into the head's best-first tree, scored against the
head's candidates, in one tree; greedy output of the reference engine stays the autoregressive one."""

import math
import random
from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.core.prompt_lookup import LookupMerge, chain_guesses
from sglang_jetspec.core.tree import (
    Candidates,
    TreeSpec,
    build_tree,
    marginal_candidates,
    noisy_or,
    top_k_per_depth,
    with_guesses,
)
from sglang_jetspec.core.tree_drafting import TreeDraft, draft_trees
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine

VOCAB = 12
LOG = math.log


def marginal(rows: list[dict[int, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[D, V] draft logits whose softmax puts the given probabilities on the given tokens (rest ~0)."""
    logits = torch.full((len(rows), VOCAB), -30.0)
    for d, row in enumerate(rows):
        for token, p in row.items():
            logits[d, token] = math.log(p)
    return logits


def paths(tree) -> set[tuple[int, ...]]:
    return set(tree.token_paths())


def test_a_guess_new_to_the_head_is_ranked_by_its_score_and_displaces_nothing():
    base = Candidates([3, 4], [LOG(0.7), LOG(0.2)], cap=2)
    merged = with_guesses(base, {9: LOG(0.5)})
    assert merged.tokens == [3, 9, 4] and merged.cap == 3
    assert merged.logprobs == [LOG(0.7), LOG(0.5), LOG(0.2)]


def test_a_guess_the_head_also_proposes_is_combined_as_independent_evidence():
    merged = with_guesses(Candidates([3, 4], [LOG(0.7), LOG(0.2)], cap=2), {4: LOG(0.5)})
    assert merged.tokens == [3, 4] and merged.cap == 2
    assert merged.logprobs[1] == pytest.approx(LOG(1 - 0.8 * 0.5))  # 1 - (1 - 0.2)(1 - 0.5)
    assert with_guesses(Candidates([3, 4], [LOG(0.7), LOG(0.2)], cap=2), {4: LOG(0.9)}).tokens == [4, 3]
    assert noisy_or(LOG(0.5), -math.inf) == pytest.approx(LOG(0.5))


def test_several_guesses_at_one_node_merge_in_one_pass_new_ties_after_the_heads():
    base = Candidates([3, 4, 5], [LOG(0.5), LOG(0.2), LOG(0.1)], cap=2)
    merged = with_guesses(base, {9: LOG(0.2), 5: LOG(0.3), 8: LOG(0.6)})
    assert merged.tokens == [8, 3, 5, 4, 9]  # 9 ties the head's 4 and ranks after it
    assert merged.logprobs[2] == pytest.approx(LOG(1 - 0.9 * 0.7))
    assert merged.cap == 4  # two new candidates: the cap grows by two, never displacing the head's


def children_tokens(tree) -> dict[tuple[int, ...], list[int]]:
    """Each node's token path -> its children's tokens in rank order."""
    token_paths, tokens = tree.token_paths(), tree.tokens.tolist()
    return {token_paths[node]: [tokens[c] for c in kids] for node, kids in enumerate(tree.children())}


def test_the_guess_joins_the_nodes_along_its_own_path_down_to_the_drafts_depth():
    tokens, logprobs = top_k_per_depth(marginal([{1: 0.9}, {2: 0.9}, {3: 0.9}]), 2)
    spec = TreeSpec(budget=16, max_depth=2, width=2)
    tree = TreeDraft(0, tokens, logprobs, spec, guesses=chain_guesses([7, 8, 9, 10], LOG(0.6))).tree
    children = children_tokens(tree)
    assert children[()][:2] == [1, 7] and children[(7,)][:2] == [2, 8]
    assert max(len(path) for path in children) == 2  # depth 2: the guess's third token has nowhere to go


@pytest.mark.parametrize("fanout", ["uniform", "top2gap"])
def test_guesses_merged_as_the_build_reaches_them_give_the_tree_of_merging_them_all_first(fanout):
    # the definition: every guessed path above the draft's depth gets its depth's marginal candidates
    # with the guesses merged in, before the build; the build merges only the paths it reaches
    gen, rng = torch.Generator().manual_seed(3), random.Random(3)
    spec = TreeSpec(budget=12, max_depth=4, width=3, fanout=fanout)
    for _ in range(20):
        tokens, logprobs = top_k_per_depth(torch.randn(5, VOCAB, generator=gen) * 2, 3)
        guesses = {}
        for path in rng.sample(build_tree(0, tokens, logprobs, spec).token_paths(), 6):
            token = rng.randrange(VOCAB)  # a chain of two: the second joins a node the first may create
            guesses[path] = {token: LOG(rng.random())}
            guesses[path + (token,)] = {rng.randrange(VOCAB): LOG(rng.random())}
        marginals = marginal_candidates(tokens[None], logprobs[None], spec)[0]
        merged_first = {
            path: with_guesses(marginals[len(path)], guessed)
            for path, guessed in guesses.items()
            if len(path) < len(marginals)
        }
        lazily = TreeDraft(0, tokens, logprobs, spec, guesses=guesses).tree
        eagerly = build_tree(0, tokens, logprobs, spec, merged_first)
        assert lazily.tokens.tolist() == eagerly.tokens.tolist()
        assert lazily.parents.tolist() == eagerly.parents.tolist()


def test_best_first_trades_the_guess_off_against_the_heads_candidates():
    # the head: 1 (0.625) or 3 (0.375), then 2 or 4 likewise; the guess says 5, 6, 7
    tokens, logprobs = top_k_per_depth(marginal([{1: 0.5, 3: 0.3}, {2: 0.5, 4: 0.3}, {1: 0.9}]), 2)
    guess = [5, 6, 7]
    confident = TreeDraft(
        0, tokens, logprobs, TreeSpec(budget=6, max_depth=3, width=2), guesses=chain_guesses(guess, LOG(0.9))
    ).tree
    assert {(5,), (5, 6), (5, 6, 7)} <= paths(confident)  # 0.9, 0.81, 0.73 beat every head branch but (1,)
    doubtful = TreeDraft(
        0, tokens, logprobs, TreeSpec(budget=6, max_depth=3, width=2), guesses=chain_guesses(guess, LOG(0.02))
    ).tree
    assert not any(p[:1] == (5,) for p in paths(doubtful))  # 0.02 loses to every head candidate
    assert paths(doubtful) == paths(TreeDraft(0, tokens, logprobs, TreeSpec(budget=6, max_depth=3, width=2)).tree)


class FixedDrafter:
    """Per-depth marginals that ignore the lane; the tree-causal pass sees the same rows for every node."""

    max_depth = 4

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def propose(self, lanes, depth):
        return self.logits[:depth].expand(len(lanes), -1, -1)

    def propose_children(self, lanes, trees):
        return [self.logits[tree.depths.clamp(max=self.max_depth - 1)] for tree in trees]


def test_draft_trees_merges_each_lanes_own_lookup_guess():
    drafter = FixedDrafter(marginal([{1: 0.4, 2: 0.3, 3: 0.3}] * 4))  # the head: 0.4 at best
    repeats = SimpleNamespace(committed_ids=[5, 6, 7, 8, 5, 6], root_token=6)  # "5 6" recurs: guess 7, 8, 5, 6
    fresh = SimpleNamespace(committed_ids=[9, 10, 11], root_token=11)
    spec = TreeSpec(budget=12, max_depth=4, width=1)
    merge = LookupMerge(LOG(0.9))
    (hybrid, plain), _ = draft_trees(drafter, [repeats, fresh], spec, lookup=merge)
    assert (7, 8, 5, 6) in paths(hybrid)
    head_only, _ = draft_trees(drafter, [fresh], spec)
    assert paths(plain) == paths(head_only[0])  # nothing recurs: the head's tree alone
    # a tree-causal round keeps the guess on the path its conditioned candidates replace
    (refined, _), _ = draft_trees(drafter, [repeats, fresh], spec, rounds=1, lookup=merge)
    assert (7, 8, 5, 6) in paths(refined)


def test_the_lookups_run_while_the_device_runs_the_head_and_count_as_tree_time(monkeypatch):
    """On a GPU the head's pass is queued, not done, when propose returns: the host looks up the lanes'
    guesses before it waits for the head, and the head's seconds are what the lookups did not hide."""
    from sglang_jetspec.core import tree_drafting

    order, clock = [], iter([0.0, 1.0, 3.0, 4.0])  # perf_counter: start, queued, looked up, end
    looked_up = tree_drafting.lanes_guesses
    monkeypatch.setattr(tree_drafting.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(tree_drafting, "lanes_guesses", lambda *a: order.append("lookups") or looked_up(*a))
    monkeypatch.setattr(tree_drafting, "settled_clock", lambda result: order.append("wait") or 3.5)
    drafter = FixedDrafter(marginal([{1: 0.4, 2: 0.3, 3: 0.3}] * 4))
    lane = SimpleNamespace(committed_ids=[5, 6, 7, 5, 6], root_token=6)
    _, timing = draft_trees(drafter, [lane], TreeSpec(budget=6, max_depth=3, width=1), lookup=LookupMerge(LOG(0.9)))
    assert order == ["lookups", "wait"]
    assert timing.round_s == [1.0 + 0.5]  # queuing the head, then waiting after the 2 s of lookups
    assert timing.tree_s == 2.0 + 0.5  # the lookups and the tree build after the wait


def test_a_lanes_root_children_are_only_the_tokens_it_allows():
    drafter = FixedDrafter(marginal([{1: 0.4, 2: 0.3, 3: 0.2, 4: 0.1}] * 4))
    lanes = [SimpleNamespace(root_token=0), SimpleNamespace(root_token=0)]
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[3, 4]] = True
    spec = TreeSpec(budget=8, max_depth=3, width=3)
    (masked, free), _ = draft_trees(drafter, lanes, spec, root_allowed=[allowed, None])
    assert {p[0] for p in paths(masked) if p} == {3, 4}  # depth 1 within the allowed set; deeper depths untouched
    assert any(len(p) > 1 and p[1] in (1, 2) for p in paths(masked))
    assert {p[0] for p in paths(free) if p} == {1, 2, 3}


def test_bad_merge_settings_are_refused():
    with pytest.raises(ValueError, match="logprob"):
        LookupMerge(0.0)
    with pytest.raises(ValueError, match="min_ngram"):
        LookupMerge(LOG(0.5), min_ngram=3, max_ngram=2)


def test_hybrid_greedy_output_equals_autoregressive(smollm2, untrained_drafter, repetitive_requests):
    requests, autoregressive = repetitive_requests
    config = EngineConfig(tree_width=4, max_batch_size=2, check_invariants=True, lookup=LookupMerge(LOG(0.6)))
    hybrid = ReferenceEngine(smollm2, untrained_drafter, config).generate(requests, budget=16)
    assert [o.output_ids for o in hybrid] == autoregressive
    # an untrained head alone almost never gets a token accepted: deep accepts are the guesses'
    assert max(max(o.accept_lengths) for o in hybrid) >= 4
