"""Acceptance for one verify step in SGLang's result layout (pure PyTorch, no SGLang import).

The decision itself is the core's `accept_batch` (greedy, or lossless sampling with each request's
own parameters and generator). This module only reshapes its per-request results into the tensors
SGLang's spec-V2 contract expects:

- accept_lens [bs] int32: committed tokens per request, bonus included (= accepted path length).
- accept_index [bs, D+1] int64: flat verify-row index b*N + node of every kept node, root first,
  -1 padded; `move_accept_tokens_to_target_kvcache` moves exactly these KV slots to the front.
- tokens [bs, D+1] int64: committed tokens (accepted drafts then the bonus), 0 padded; flattened
  it is `next_token_ids` with output stride D+1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jetspec.core.acceptance import AcceptResult, accept_batch
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.tree import DraftTree


@dataclass
class StepAcceptance:
    results: list[AcceptResult]
    accept_lens: torch.Tensor
    accept_index: torch.Tensor
    tokens: torch.Tensor

    @property
    def stride(self) -> int:
        return int(self.tokens.shape[1])


def accept_step(
    trees: list[DraftTree],
    logits: torch.Tensor,
    num_nodes: int,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    method: str = "match",
) -> StepAcceptance:
    """`logits` are the verify pass's rows, [bs*num_nodes, V] in draft_token order."""
    bs = len(trees)
    if logits.shape[0] != bs * num_nodes:
        raise ValueError(f"logits has {logits.shape[0]} rows, expected bs*num_nodes = {bs}*{num_nodes}")
    results = accept_batch(trees, logits.view(bs, num_nodes, -1), params, generators, method)
    width = max(t.max_depth for t in trees) + 1
    accept_index = torch.full((bs, width), -1, dtype=torch.long)
    tokens = torch.zeros(bs, width, dtype=torch.long)
    for b, result in enumerate(results):
        accept_index[b, : len(result.path)] = torch.tensor(result.path) + b * num_nodes
        tokens[b, : len(result.tokens)] = torch.tensor(result.tokens)
    accept_lens = torch.tensor([r.accept_length for r in results], dtype=torch.int32)
    return StepAcceptance(results, accept_lens, accept_index, tokens)
