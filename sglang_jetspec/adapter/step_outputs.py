"""What one verify step hands back to SGLang, derived from the acceptance (pure PyTorch).

- next_token_ids [bs*stride]: row b = its committed tokens (accepted drafts, then the bonus),
  zero padded; SGLang's `_resolve_spec_v2_tokens` slices `[b*stride : b*stride + accept_lens[b]]`
  with stride = GenerationBatchResult.speculative_output_stride.
- accept_lens [bs] int32: committed tokens incl. the bonus; accept_index [bs, stride] int32: flat
  verify row b*N + node of each kept node, -1 padded (`move_accept_tokens_to_target_kvcache`).
- predict [bs*N] int32: EAGLE/NGRAM layout, predict[row of node] = the token the target chose
  after that node, so predict[accept_index] are the committed tokens (`compute_spec_logprobs`).
- bonus_tokens [bs]: each request's last committed token (the next step's root).
- row_index / row_counts: the verify rows whose tapped hidden states become draft context
  (root + accepted nodes of each request, request-major), i.e. the valid entries of accept_index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jetspec.adapter.accept import StepAcceptance


@dataclass
class StepOutputs:
    next_token_ids: torch.Tensor
    accept_lens: torch.Tensor
    accept_index: torch.Tensor
    predict: torch.Tensor
    bonus_tokens: torch.Tensor
    row_index: torch.Tensor
    row_counts: list[int]
    stride: int


def step_outputs(acceptance: StepAcceptance, num_nodes: int) -> StepOutputs:
    kept = acceptance.accept_index >= 0  # per row a prefix of length accept_lens[b]
    row_index = acceptance.accept_index[kept]
    predict = torch.zeros(acceptance.accept_index.shape[0] * num_nodes, dtype=torch.int32)
    predict[row_index] = acceptance.tokens[kept].to(torch.int32)
    return StepOutputs(
        next_token_ids=acceptance.tokens.flatten(),
        accept_lens=acceptance.accept_lens,
        accept_index=acceptance.accept_index.to(torch.int32),
        predict=predict,
        bonus_tokens=acceptance.tokens[torch.arange(len(acceptance.results)), acceptance.accept_lens.long() - 1],
        row_index=row_index,
        row_counts=acceptance.accept_lens.tolist(),
        stride=acceptance.stride,
    )
