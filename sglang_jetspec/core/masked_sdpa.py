"""Scaled dot-product attention with an explicit mask, kept off cuDNN's SDPA backend.

On Hopper, torch sends a masked SDPA call to cuDNN first, and cuDNN builds (and caches) an execution
plan per input shape. A drafting or decoding step attends over one more position than the step
before, so every step is a new shape and pays a fresh plan, far more host time than the kernels
themselves take (it was most of the draft phase in bench/results/gpu-sglang/2026-11-27-h200-run3).
The memory-efficient, flash and math backends have no per-shape plan. Off CUDA the choice changes
nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_WITHOUT_CUDNN = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def masked_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """query [B, H, N, D], key/value [B, H_kv, S, D] (grouped-query heads read as they are), mask
    broadcastable to [B, H, N, S] (bool: True where a query may attend, or additive)."""
    with sdpa_kernel(_WITHOUT_CUDNN):
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
        )
