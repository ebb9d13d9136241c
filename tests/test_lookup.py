"""Prompt-lookup drafter: which tokens it proposes, the chain tree they make, and greedy identity on SmolLM2."""

from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.core.prompt_lookup import PromptLookupDrafter, find_continuation
from sglang_jetspec.core.tree import TreeSpec, build_tree, top_k_per_depth
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine

VOCAB = 20


def chain_tree(drafter, committed, budget=16):
    """The tree the engine builds from this draft (width 1)."""
    logits = drafter.propose([SimpleNamespace(committed_ids=committed)], drafter.max_depth)[0]
    tokens, logprobs = top_k_per_depth(logits, 1)
    return build_tree(committed[-1], tokens, logprobs, TreeSpec(budget=budget, max_depth=drafter.max_depth, width=1))


def test_proposes_the_tokens_that_followed_the_suffix():
    assert find_continuation([1, 2, 3, 4, 5, 9, 1, 2], 2, 3, 10) == [3, 4, 5, 9, 1, 2]


def test_longest_match_is_preferred_over_a_later_shorter_one():
    # suffix [7, 1, 2]: the 3-gram occurs at the start, the 2-gram [1, 2] again later
    tokens = [7, 1, 2, 3, 3, 1, 2, 8, 8, 7, 1, 2]
    assert find_continuation(tokens, 1, 3, 2) == [3, 3]
    assert find_continuation(tokens, 1, 2, 2) == [8, 8]


def test_most_recent_occurrence_wins():
    assert find_continuation([1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 1) == [6]


def test_continuation_is_cut_at_max_tokens_and_at_the_end_of_the_sequence():
    assert find_continuation([1, 2, 3, 4, 5, 6, 1, 2], 2, 2, 3) == [3, 4, 5]
    # the latest occurrence of [4, 4] is followed by the suffix only: one token left
    assert find_continuation([4, 4, 4, 4], 2, 2, 5) == [4]


def test_nothing_found_below_min_ngram():
    assert find_continuation([1, 2, 3, 9, 2], 2, 4, 5) == []
    assert find_continuation([1, 2, 3, 9, 2], 1, 4, 5) == [3, 9, 2]
    assert find_continuation([5], 1, 3, 5) == []


def test_draft_is_a_chain_of_exactly_the_found_tokens():
    drafter = PromptLookupDrafter(VOCAB, max_depth=4, min_ngram=2, max_ngram=3)
    committed = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    logits = drafter.propose([SimpleNamespace(committed_ids=committed)], drafter.max_depth)
    assert logits.shape == (1, 4, VOCAB)
    assert [row.argmax().item() for row in logits[0]] == [3, 4, 5, 6]
    assert torch.isfinite(logits).sum() == 4 and logits[torch.isfinite(logits)].eq(0).all()
    tree = chain_tree(drafter, committed)
    assert tree.tokens.tolist() == [2, 3, 4, 5, 6] and tree.parents.tolist() == [-1, 0, 1, 2, 3]


def test_draft_stops_at_the_depth_the_engine_asks_for():
    drafter = PromptLookupDrafter(VOCAB, max_depth=6)
    logits = drafter.propose([SimpleNamespace(committed_ids=[1, 2, 3, 4, 5, 6, 7, 1, 2])], 2)
    assert logits.shape == (1, 2, VOCAB) and [row.argmax().item() for row in logits[0]] == [3, 4]


def test_short_match_leaves_deeper_depths_empty_and_the_tree_short():
    drafter = PromptLookupDrafter(VOCAB, max_depth=6)
    tree = chain_tree(drafter, [8, 1, 2, 9, 1, 2])
    assert tree.tokens.tolist() == [2, 9, 1, 2]


def test_nothing_found_gives_a_root_only_tree():
    drafter = PromptLookupDrafter(VOCAB, max_depth=4)
    assert drafter.propose([SimpleNamespace(committed_ids=[1, 2, 3, 4])], drafter.max_depth).eq(float("-inf")).all()
    assert chain_tree(drafter, [1, 2, 3, 4]).tokens.tolist() == [4]


@pytest.mark.parametrize("kwargs", [{"min_ngram": 0}, {"min_ngram": 3, "max_ngram": 2}, {"max_depth": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        PromptLookupDrafter(VOCAB, **kwargs)


def test_lookup_greedy_output_equals_autoregressive(smollm2, repetitive_requests):
    requests, autoregressive = repetitive_requests
    drafter = PromptLookupDrafter(smollm2.info.vocab_size)
    lookup = ReferenceEngine(
        smollm2, drafter, EngineConfig(tree_width=1, max_batch_size=2, check_invariants=True)
    ).generate(requests, budget=16)
    assert [o.output_ids for o in lookup] == autoregressive
    assert all(len(o.output_ids) == 32 for o in lookup)
    assert max(max(o.accept_lengths) for o in lookup) > 1, "repetitive prompts should get some lookup drafts accepted"
