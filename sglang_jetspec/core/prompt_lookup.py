"""Prompt lookup: alone (`PromptLookupDrafter`), and merged into the head's tree (the hybrid drafter).

Text often repeats itself (code identifiers, quoted prompt text, lists). If the last n committed
tokens occurred earlier in prompt + output, the tokens that followed that occurrence are a cheap
guess for what follows now.

The hybrid drafter looks the request's own tokens up as a trie rather than one chain: the
continuations of the most recent occurrences (up to 64) of the longest recurring suffix, down to a
single token, counted per path, so the budget can hold several of them; the draft corpus and the
engine's finished outputs are looked up the same way (core/suffix_store.py). It files these guesses
into the head's draft as conditioned candidates along their own paths: the node reached by a guessed
path's first i tokens gets token i+1 among its children, next to the head's candidates for that depth.
Best-first construction then spends the same node budget on whichever branches score higher, in one
verify pass. A guessed token's score is a calibrated acceptance log-probability (`LookupMerge.logprob`,
measured on tuning prompts), scaled by how it was found (`guess_logprob`) plus the log of its path's
share of the occurrences given its parent; where the head proposes the same token, the two are
combined as independent evidence (noisy-or). Drafts only propose, so none of this can change what the
target accepts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .batched_lookup import PaddedContexts, continuation_rows, likeliest_paths_batch, own_occurrences, store_occurrences
from .lanes import LookupLane
from .suffix_store import MAX_OCCURRENCES, SuffixStore, context_continuations
from .tree import TreeSpec, noisy_or

# Guessed children per tree node: node token path from the root -> {token: log-probability that the
# target accepts it given the node}. Prompt lookup's chain and the suffix stores' tries both take this form.
Guesses = dict[tuple[int, ...], dict[int, float]]


def find_continuation(tokens: list[int], min_ngram: int, max_ngram: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the longest
    suffix n-gram of `tokens` (n from max_ngram down to min_ngram); [] when no suffix recurs."""
    counts, _, _ = context_continuations(tokens, max_tokens, min_ngram, max_ngram, max_occurrences=1)
    return list(max(counts, key=len, default=()))


class PromptLookupDrafter:
    """Prompt lookup alone, as a drafter (the engines' Drafter protocol): the guess is one chain, depth
    d's logits 0 at the guessed token and -inf elsewhere, depths past the guess all -inf, so the tree
    builder (tree width 1) makes exactly the guessed chain, or the root alone when nothing matched."""

    def __init__(self, vocab_size: int, max_depth: int = 15, min_ngram: int = 1, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram={min_ngram}, max_ngram={max_ngram}: need 1 <= min_ngram <= max_ngram")
        if max_depth < 1:
            raise ValueError(f"max_depth={max_depth}: must be >= 1 (the longest chain one draft proposes)")
        self.vocab_size = vocab_size
        self.max_depth = max_depth
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def propose(self, lanes: list[LookupLane], depth: int) -> torch.Tensor:
        """[B, depth, V] logits: 0 at each proposed token, -inf everywhere else."""
        logits = torch.full((len(lanes), depth, self.vocab_size), -math.inf)
        for b, lane in enumerate(lanes):
            guess = find_continuation(lane.committed_ids, self.min_ngram, self.max_ngram, depth)
            logits[b, torch.arange(len(guess)), torch.tensor(guess, dtype=torch.long)] = 0.0
        return logits


@dataclass(frozen=True)
class LookupMerge:
    """How the hybrid drafter finds and scores looked-up tokens. `logprob` is the log-probability that a
    token looked up after a 3-token match in the request's own text is accepted given that its parent
    was (tuned on HumanEval 0-99: docs/design/hybrid-lookup.md); other guesses scale it (guess_logprob).
    The request's own tokens are matched on suffixes of `max_ngram` down to `min_ngram` tokens. Besides
    them, guesses come from `corpus` (the head directory's draft corpus: text the target wrote) and
    `recent` (outputs of requests the engine finished)."""

    logprob: float
    min_ngram: int = 1
    max_ngram: int = 4
    # compared by identity: merges that look up different stores draft different trees
    corpus: SuffixStore | None = None
    recent: SuffixStore | None = None

    @classmethod
    def from_policy(cls, lookup, corpus: SuffixStore | None = None, recent: SuffixStore | None = None) -> LookupMerge:
        """From a policy's `lookup` section (accept, min_ngram, max_ngram: policies.schema.LookupPolicy)."""
        return cls(math.log(lookup.accept), lookup.min_ngram, lookup.max_ngram, corpus, recent)

    def __post_init__(self) -> None:
        if not self.logprob < 0:
            raise ValueError(f"lookup logprob={self.logprob}: must be < 0 (a log-probability below 1)")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"min_ngram={self.min_ngram}, max_ngram={self.max_ngram}: need 1 <= min_ngram <= max_ngram"
            )


def chain_guesses(guess: list[int], logprob: float) -> Guesses:
    """A looked-up chain: each guessed token a child of the node its predecessors reach."""
    return {tuple(guess[:i]): {token: logprob} for i, token in enumerate(guess)}


# How much a looked-up token is trusted relative to LookupMerge.logprob, by where it was found. Tuned by
# replay on HumanEval 0-99 (bench/results/speed/lookup-trie-tune.md): after a match of only the last
# token of the request's own text a guess is right about half as often as after a longer match, and a
# guess from other text (draft corpus, finished outputs) less often than one from the request itself.
OWN_MATCH_FACTOR = {1: 0.55, 2: 0.9, 3: 1.0, 4: 1.05}  # by the matched suffix's length (longer: as 4)
STORE_FACTOR = 0.78
MOST_TRUSTED = math.log(0.99)  # a scaled guess still leaves the target room to disagree


def guess_logprob(logprob: float, factor: float) -> float:
    """`logprob` scaled by `factor`, capped below certainty."""
    return min(logprob + math.log(factor), MOST_TRUSTED)


def path_guesses(kept: dict[tuple[int, ...], float], logprob: float) -> Guesses:
    """Kept continuation paths (`likeliest_paths`: path -> log share given its parent) as guesses, each
    token scored `logprob` plus its share."""
    guesses: Guesses = {}
    for path, share in kept.items():
        guesses.setdefault(path[:-1], {})[path[-1]] = logprob + share
    return guesses


def combine_guesses(into: Guesses, more: Guesses) -> None:
    """Add `more` to `into`; a token both guess at the same node scores as independent evidence (noisy-or)."""
    for path, tokens in more.items():
        node = into.setdefault(path, {})
        for token, logprob in tokens.items():
            node[token] = noisy_or(node[token], logprob) if token in node else logprob


def batch_lookup_guesses(contexts: list[list[int]], spec: TreeSpec, merge: LookupMerge | None) -> list[Guesses]:
    """Every guess for each request's next tokens (`contexts`: their committed tokens), looked up for
    the whole batch at once (core/batched_lookup.py): its own tokens' likeliest continuations, scored by
    the length of the suffix they matched, then each suffix store's, within the tree's depth and node
    budget; {} each without a merge."""
    if merge is None:
        return [{} for _ in contexts]
    padded = PaddedContexts(contexts)
    own, own_n = own_occurrences(padded, merge.min_ngram, merge.max_ngram, MAX_OCCURRENCES)
    sources = [own] + [store_occurrences(store, padded) for store in (merge.corpus, merge.recent) if store is not None]
    batch = len(contexts)
    kept = likeliest_paths_batch(
        np.concatenate([continuation_rows(found, spec.max_depth) for found in sources]),
        np.concatenate([found.groups + i * batch for i, found in enumerate(sources)]),
        batch * len(sources),
        spec.budget - 1,
    )
    stored = guess_logprob(merge.logprob, STORE_FACTOR)
    guesses = []
    for b, n in enumerate(own_n.tolist()):
        lane = path_guesses(kept[b], guess_logprob(merge.logprob, OWN_MATCH_FACTOR[min(n, 4)])) if n else {}
        for source in range(1, len(sources)):
            combine_guesses(lane, path_guesses(kept[source * batch + b], stored))
        guesses.append(lane)
    return guesses


def lookup_guesses(committed_ids: list[int], spec: TreeSpec, merge: LookupMerge | None) -> Guesses:
    """`batch_lookup_guesses` of one request."""
    return batch_lookup_guesses([committed_ids], spec, merge)[0]
