"""What the draft head reads from the SGLang target: its input embedding and lm_head, looked up live.

Views, not copies: a weight update that replaces the target's tables (update_weights_from_disk /
_tensor) is what the head sees at its next step, and the head owns no second copy of either table.
"""

from __future__ import annotations

import torch
from torch import nn


class TargetEmbedding(nn.Module):
    """The target's input embedding table, read from the model at every call (no copy): a weight update
    that replaces the table (update_weights_from_disk / _tensor) is what the head sees next step."""

    def __init__(self, model) -> None:
        super().__init__()
        self._read = lambda: model.get_input_embeddings().weight  # a getter, so the target is no submodule

    @property
    def weight(self) -> torch.Tensor:
        return self._read()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class TargetLMHead(nn.Module):
    """The target's lm_head rows for the real vocabulary (SGLang may pad the table), read at every call."""

    def __init__(self, model, vocab_size: int) -> None:
        super().__init__()
        self._read = lambda: model.lm_head.weight[:vocab_size]

    @property
    def weight(self) -> torch.Tensor:
        return self._read()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight)
