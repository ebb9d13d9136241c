"""Turn a draft head into per-depth candidates for a batch of requests.

Each request keeps a `ContextCache`: the head's projected context K/V for its tapped target rows.
It is derived state, synced lazily from the rows (the source of truth), so after any number of
non-speculative steps the next draft sees a context rebuilt from fresh rows, never a stale one.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .head import DraftHead, LayerContext, block_mask


class ContextCache:
    """One request's per-layer context K/V ([1, H_kv, L, D]) for its first `length` tapped rows."""

    def __init__(self) -> None:
        self.layers: list[LayerContext] = []
        self.length = 0

    def sync(self, head: DraftHead, tap_rows: torch.Tensor) -> None:
        """Bring the cache up to `tap_rows` [L, taps*H]; rows before `length` must be unchanged."""
        total = tap_rows.shape[0]
        if total < self.length:  # rows were rewritten (not expected); rebuild from scratch
            self.layers, self.length = [], 0
        if total == self.length:
            return
        positions = torch.arange(self.length, total, device=tap_rows.device).unsqueeze(0)
        new = head.project_context(tap_rows[self.length :].unsqueeze(0).to(head.fc.weight.dtype), positions)
        if self.layers:
            new = [
                LayerContext(torch.cat([old.keys, n.keys], dim=2), torch.cat([old.values, n.values], dim=2))
                for old, n in zip(self.layers, new)
            ]
        self.layers, self.length = new, total


class DraftLane(Protocol):
    """What the drafter reads from a running request (the reference engine's Lane provides it)."""

    root_token: int
    draft_cache: ContextCache

    def tap_rows(self) -> torch.Tensor: ...


class HeadDrafter:
    """One head pass over [root, MASK x (B-1)] per request gives logits for depths 1..B-1."""

    def __init__(self, head: DraftHead, embed_tokens: nn.Module, lm_head: nn.Module) -> None:
        self.head = head
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head

    @property
    def max_depth(self) -> int:
        return self.head.config.max_depth

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return self.head.config.target_layer_ids

    @torch.no_grad()
    def propose(self, lanes: list[DraftLane], depth: int) -> torch.Tensor:
        """[B, depth, V] draft logits for depths 1..depth (<= block_size-1); a lane's context is its
        tapped rows (one per committed token but the root). Only the needed rows pay for the lm_head."""
        cfg = self.head.config
        dtype = self.head.fc.weight.dtype
        device = self.head.fc.weight.device
        caches = [lane.draft_cache for lane in lanes]
        for lane in lanes:
            lane.draft_cache.sync(self.head, lane.tap_rows())
        batch, size = len(lanes), cfg.block_size
        ctx_len = max(c.length for c in caches)
        # Right-pad every request's context to the longest one; `valid` hides the padding.
        shape = (batch, cfg.num_key_value_heads, ctx_len, cfg.head_dim)
        context = [LayerContext(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)) for _ in range(cfg.num_hidden_layers)]
        valid = torch.zeros(batch, ctx_len, dtype=torch.bool, device=device)
        for b, cache in enumerate(caches):
            valid[b, : cache.length] = True
            for padded, own in zip(context, cache.layers):
                padded.keys[b, :, : cache.length] = own.keys[0]
                padded.values[b, :, : cache.length] = own.values[0]
        ids = torch.full((batch, size), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = torch.tensor([lane.root_token for lane in lanes], device=device)
        lengths = torch.tensor([c.length for c in caches], device=device)
        positions = lengths.unsqueeze(1) + torch.arange(size, device=device)
        embeds = self.embed_tokens(ids).to(dtype)
        hidden = self.head(embeds, positions, context, block_mask(valid, size, cfg.causal_head))
        return self.lm_head(hidden[:, 1 : depth + 1].to(self.lm_head.weight.dtype)).float()
