"""Prompt-lookup drafting: no model, just the tokens a request has already committed.

Text often repeats itself (code identifiers, quoted prompt text, lists). If the last n committed
tokens occurred earlier in prompt + output, the tokens that followed that occurrence are a cheap
guess for what follows now. The draft is one chain: depth d's logits are 0 at the guessed token and
-inf elsewhere, depths past the guess are all -inf, so the tree builder (tree width 1) makes exactly
the guessed chain, or the root alone when nothing matched.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


class LookupLane(Protocol):
    """What the lookup drafter reads from a running request (the reference engine's Lane provides it)."""

    committed_ids: list[int]


def find_continuation(tokens: list[int], min_ngram: int, max_ngram: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the longest
    suffix n-gram of `tokens` (n from max_ngram down to min_ngram); [] when no suffix recurs."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # Latest start first; an occurrence needs at least one token after it, which also
        # excludes the suffix matching itself.
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + max_tokens]
    return []


class PromptLookupDrafter:
    """The engine's Drafter protocol over `find_continuation`; use it with tree width 1."""

    def __init__(self, vocab_size: int, max_depth: int = 15, min_ngram: int = 2, max_ngram: int = 4) -> None:
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
