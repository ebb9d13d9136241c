"""What the draft head reads from the SGLang target: its input embedding and lm_head.

With one rank, views, not copies: a weight update that replaces the target's tables
(update_weights_from_disk / _tensor) is what the head sees at its next step, and the head owns no
second copy of either table. Under tensor parallelism both tables are vocabulary-parallel shards;
the drafting rank (adapter.tensor_parallel) gathers them once at start-up.
TODO(TP): a weight update under --tp-size > 1 leaves the head on the gathered start-up tables (accept
length may drop; output stays exact, acceptance reads the target's own logits).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class TargetEmbedding(nn.Module):
    """The target's input embedding table, read through `read` at every call (no copy held here)."""

    def __init__(self, read: Callable[[], torch.Tensor]) -> None:
        super().__init__()
        self._read = read  # a getter, so the target is no submodule

    @property
    def weight(self) -> torch.Tensor:
        return self._read()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class TargetLMHead(nn.Module):
    """The target's lm_head rows for the real vocabulary (SGLang may pad the table), read at every call."""

    def __init__(self, read: Callable[[], torch.Tensor], vocab_size: int) -> None:
        super().__init__()
        self._read = lambda: read()[:vocab_size]

    @property
    def weight(self) -> torch.Tensor:
        return self._read()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight)


def _not_drafting() -> torch.Tensor:
    raise RuntimeError("only tensor-parallel rank 0 drafts: this rank holds no full embedding or lm_head")


def target_tables(model, vocab_size: int, ranks) -> tuple[TargetEmbedding, TargetLMHead]:
    """The head's embedding and lm_head over the target's: live views with one rank; under tensor
    parallelism the full tables on the drafting rank (a collective: every rank calls this at start-up)."""
    if ranks.size == 1:
        return (
            TargetEmbedding(lambda: model.get_input_embeddings().weight),
            TargetLMHead(lambda: model.lm_head.weight, vocab_size),
        )
    embedding = model.get_input_embeddings()
    embed = ranks.full_vocab_rows(embedding.weight)
    head = embed if model.lm_head is embedding else ranks.full_vocab_rows(model.lm_head.weight)  # tied tables
    if not ranks.drafts:
        return TargetEmbedding(_not_drafting), TargetLMHead(_not_drafting, vocab_size)
    return TargetEmbedding(lambda: embed), TargetLMHead(lambda: head, vocab_size)
