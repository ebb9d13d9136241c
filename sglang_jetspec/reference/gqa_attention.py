"""The reference engine's default target attention: PyTorch SDPA with the engine's mask, grouped-query
heads passed as they are (`enable_gqa`).

transformers' own "sdpa" path copies every layer's whole K/V cache to the query head count
(`repeat_kv`) whenever a mask is given, which the engine always gives (tree and padding masks): with
SmolLM2's 9 query / 3 KV heads that copy was a third of a batch-32 decode step on this CPU and made
one layer's attention 3-4x slower at batch 4 x 16 nodes. SDPA reads the grouped K/V directly and
computes the same attention (equal within float rounding; tests/test_target_families.py), off cuDNN's
per-shape plans (core/masked_sdpa.py).
"""

from __future__ import annotations

import torch

from ..core.masked_sdpa import masked_sdpa

ATTN_IMPLEMENTATION = "jetspec_sdpa_gqa"


def gqa_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [B, H, N, D], key/value [B, H_kv, S, D];
    returns [B, N, H, D] and no weights. Without a mask (not the engine's calls): transformers' own sdpa."""
    if attention_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    out = masked_sdpa(query, key, value, attention_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make ATTN_IMPLEMENTATION known to transformers (idempotent); returns its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTN_IMPLEMENTATION, gqa_sdpa_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)  # the engine passes its own 4D bool mask
    return ATTN_IMPLEMENTATION
