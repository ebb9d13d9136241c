"""The batched lookups (core/batched_lookup.py) against their definition, the per-request functions in
core/suffix_store.py: same paths, same scores, same order (a tree is built from guesses in insertion order,
so a different order would draft a different tree), on random text full of ties and on real text."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.lookup_cost import HEAD_DIR, VOCAB, ordered, per_request_guesses
from sglang_jetspec.core.batched_lookup import (
    PaddedContexts,
    continuation_rows,
    likeliest_paths_batch,
    own_occurrences,
    store_occurrences,
)
from sglang_jetspec.core.prompt_lookup import (
    LookupMerge,
    batch_lookup_guesses,
    lookup_guesses,
)
from sglang_jetspec.core.suffix_store import (
    SuffixStore,
    context_continuations,
    corpus_sequences,
    likeliest_paths,
    load_draft_corpus,
)
from sglang_jetspec.core.tree import TreeSpec


def random_text(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def random_store(rng: random.Random, vocab: int, max_ngram: int, max_occurrences: int) -> SuffixStore:
    store = SuffixStore(max_ngram=max_ngram, max_occurrences=max_occurrences)
    for _ in range(rng.randrange(1, 6)):
        store.add(random_text(rng, vocab, rng.randrange(1, 30)))
    return store


def random_case(seed: int) -> tuple[list[list[int]], TreeSpec, LookupMerge]:
    """A batch of random contexts, tree and merge: a vocabulary of 2-5 tokens, so suffixes recur
    everywhere and many paths tie on count; empty and 1-token contexts, depth 0, a budget of 1 node,
    min_ngram > 1, stores with small occurrence limits, with and without either store."""
    rng = random.Random(seed)
    vocab = rng.randrange(2, 6)
    spec = TreeSpec(budget=rng.choice([1, 2, 3, 5, 8, 16, 16]), max_depth=rng.choice([0, 1, 2, 3, 4, 5, 7]), width=4)
    min_ngram = rng.randrange(1, 4)
    merge = LookupMerge(
        math.log(rng.uniform(0.2, 0.9)),
        min_ngram=min_ngram,
        max_ngram=rng.randrange(min_ngram, 6),
        corpus=random_store(rng, vocab, rng.randrange(1, 5), rng.choice([1, 2, 3, 64])) if seed % 4 else None,
        recent=random_store(rng, vocab, rng.randrange(1, 5), rng.choice([1, 3, 64])) if seed % 3 else None,
    )
    contexts = [random_text(rng, vocab, rng.choice([0, 1, 2, 3, 8, 20, 60])) for _ in range(rng.randrange(1, 9))]
    return contexts, spec, merge


RANDOM_CASES = range(40)


@pytest.mark.parametrize("seed", RANDOM_CASES)
def test_batch_guesses_equal_the_per_request_definition_on_random_text(seed):
    contexts, spec, merge = random_case(seed)
    batched = batch_lookup_guesses(contexts, spec, merge)
    expected = [per_request_guesses(context, spec, merge) for context in contexts]
    assert [ordered(g) for g in batched] == [ordered(g) for g in expected]


def test_most_random_cases_have_tries_to_compare():
    # a comparison of empty guesses proves nothing: most cases guess, many a trie of several nodes
    guessed = tries = 0
    for seed in RANDOM_CASES:
        contexts, spec, merge = random_case(seed)
        nodes = [len(per_request_guesses(c, spec, merge)) for c in contexts]
        guessed += max(nodes) > 0
        tries += max(nodes) > 1
    assert guessed >= len(RANDOM_CASES) * 2 // 3 and tries >= len(RANDOM_CASES) // 3


def test_a_context_recurring_more_often_than_the_occurrence_limit_counts_only_the_most_recent():
    context = [1, 2] * 100 + [1]  # [1] recurs 100 times before the suffix
    padded = PaddedContexts([context, [3, 3]])
    found, n = own_occurrences(padded, 1, 1, max_occurrences=5)
    assert n.tolist() == [1, 1]
    stride = padded.width + 1
    lane0 = found.positions[found.groups == 0] - (padded.width - len(context))
    assert lane0.tolist() == [191, 193, 195, 197, 199]  # the last 5 tokens after a 1
    assert (found.positions[found.groups == 1] - stride).tolist() == [padded.width - 1]
    counts, occurrences, _ = context_continuations(context, 3, 1, 1, max_occurrences=5)
    rows = continuation_rows(found, 3)
    assert likeliest_paths_batch(rows, found.groups, 2, 4)[0] == likeliest_paths(counts, occurrences, 4)


def test_stores_occurrences_and_paths_equal_the_per_request_search():
    rng = random.Random(7)
    store = random_store(rng, 3, max_ngram=3, max_occurrences=2)
    contexts = [random_text(rng, 3, k) for k in (0, 1, 2, 5, 9)]
    padded = PaddedContexts(contexts)
    found = store_occurrences(store, padded)
    kept = likeliest_paths_batch(continuation_rows(found, 4), found.groups, len(contexts), 6)
    for context, paths in zip(contexts, kept):
        counts, occurrences = store.continuations(context, 4)
        assert list(paths.items()) == list(likeliest_paths(counts, occurrences, 6).items())
    assert found.groups[found.groups == 0].size == 0  # an empty context looks nothing up
    assert np.bincount(found.groups, minlength=len(contexts))[1:].max() <= 2  # the store's occurrence limit


def test_an_empty_store_and_an_empty_batch_give_no_guesses():
    merge = LookupMerge(math.log(0.5), corpus=SuffixStore(), recent=SuffixStore())
    spec = TreeSpec(budget=8, max_depth=4, width=4)
    assert batch_lookup_guesses([[5, 6], [9]], spec, merge) == [{}, {}]
    assert batch_lookup_guesses([], spec, merge) == []
    assert batch_lookup_guesses([[5, 6, 5]], spec, None) == [{}]


def test_ranking_ties_follow_the_order_the_occurrences_are_scanned():
    # after [1]: 7, then 8, then 9, each once: the oldest occurrence's path is kept first
    context = [1, 7, 1, 8, 1, 9, 1]
    spec = TreeSpec(budget=3, max_depth=1, width=4)
    merge = LookupMerge(math.log(0.5), min_ngram=1, max_ngram=1)
    guesses = lookup_guesses(context, spec, merge)
    assert list(guesses[()]) == [7, 8]
    assert ordered(guesses) == ordered(per_request_guesses(context, spec, merge))


@pytest.fixture(scope="module")
def real_text():
    """The shipped head's draft corpus (text SmolLM2 wrote) as a store, and contexts cut from it and
    from HumanEval prompts."""
    corpus = load_draft_corpus(HEAD_DIR, VOCAB)
    assert corpus is not None, f"{HEAD_DIR} should ship its draft corpus"
    sequences = corpus_sequences(HEAD_DIR, VOCAB)
    rng = random.Random(0)
    contexts = [seq[: rng.randrange(1, len(seq) + 1)] for seq in rng.sample(sequences, 24)]
    prompts = pytest.importorskip("sglang_jetspec.reference.prompts")
    tokenizer = pytest.importorskip("transformers").AutoTokenizer.from_pretrained(_smollm2_dir())
    contexts += [prompts.encode(p, tokenizer) for p in prompts.humaneval_prompts(range(0, 164, 20))]
    return corpus, contexts


def _smollm2_dir():
    from sglang_jetspec.models.fetch import fetch

    return fetch("smollm2")


def test_batch_guesses_equal_the_per_request_definition_on_real_text(real_text):
    corpus, contexts = real_text
    recent = SuffixStore(max_tokens=4096)
    for context in contexts[::3]:
        recent.add(context)
    merge = LookupMerge(math.log(0.6), corpus=corpus, recent=recent)
    spec = TreeSpec(budget=16, max_depth=6, width=4)
    batched = batch_lookup_guesses(contexts, spec, merge)
    expected = [per_request_guesses(context, spec, merge) for context in contexts]
    assert [ordered(g) for g in batched] == [ordered(g) for g in expected]
    assert sum(len(g) > 1 for g in expected) >= len(contexts) // 2  # real text: most requests get a trie


def test_the_cost_bench_checks_and_reports_both_ways(tmp_path):
    from bench.lookup_cost import main

    out = tmp_path / "cost.md"
    assert main(["--batch-sizes", "1,3", "--repeats", "1", "--context-tokens", "120", "--markdown", str(out)]) == 0
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 1 |") or line.startswith("| 3 |")]
    assert len(rows) == 2 and all(float(row.split("|")[3]) > 0 for row in rows)
