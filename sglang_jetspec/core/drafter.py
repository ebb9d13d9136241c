"""Turn a draft head into draft distributions for a batch of requests.

Two passes: `propose`, one block [root, MASK x (B-1)] giving per-depth marginals; and
`propose_children`, the tree-causal pass over a drafted tree giving every node the distribution of
its children conditioned on the node's own path (heads trained with revealed tokens only).
Each request keeps a `ContextCache`: the head's projected context K/V for its tapped target rows.
It is derived state, synced lazily from the rows (the source of truth), so after any number of
non-speculative steps the next draft sees a context rebuilt from fresh rows, never a stale one.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .head import DraftHead, LayerContext, block_mask, tree_causal_mask
from .tree import DraftTree


class ContextCache:
    """One request's per-layer context K/V ([1, H_kv, L, D]) for its first `length` tapped rows."""

    def __init__(self) -> None:
        self.layers: list[LayerContext] = []
        self.length = 0

    def sync(self, head: DraftHead, tap_rows: torch.Tensor, first_row: int = 0) -> None:
        """Bring the cache up to the rows `tap_rows` [L, taps*H], whose first is the row at position
        `first_row`; rows the cache already holds must be unchanged. A lane that frees rows once they
        are projected passes only the rest, so `first_row` may not be past `length`."""
        total = first_row + tap_rows.shape[0]
        if first_row > self.length:
            raise ValueError(f"context rows from {first_row} on, but the cache ends at {self.length}: rows "
                             f"{self.length}..{first_row - 1} were freed before the head projected them")
        if total < self.length:  # rows were rewritten (not expected); rebuild from what is there
            if first_row:
                raise ValueError(f"the cache holds {self.length} rows but the lane has only {total}; "
                                 "truncate the cache to the lane's rows first")
            self.layers, self.length = [], 0
        if total == self.length:
            return
        positions = torch.arange(self.length, total, device=tap_rows.device).unsqueeze(0)
        fresh = tap_rows[self.length - first_row :].unsqueeze(0).to(head.fc.weight.dtype)
        new = head.project_context(fresh, positions)
        if self.layers:
            new = [
                LayerContext(torch.cat([old.keys, n.keys], dim=2), torch.cat([old.values, n.values], dim=2))
                for old, n in zip(self.layers, new)
            ]
        self.layers, self.length = new, total

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on: a position's context K/V depends only on its own tapped
        row and position, so what stays is exact."""
        if length < self.length:
            self.layers = [LayerContext(c.keys[:, :, :length], c.values[:, :, :length]) for c in self.layers]
            self.length = length


class DraftLane(Protocol):
    """What the drafter reads from a running request (the reference engine's Lane provides it)."""

    root_token: int
    draft_cache: ContextCache
    first_tap_row: int  # position of tap_rows()[0]: 0 unless the lane frees rows the cache has projected

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

    @property
    def reads_tree_tokens(self) -> bool:
        """Whether `propose_children` means anything: the head was trained with revealed block tokens."""
        return self.head.config.reads_tree_tokens

    def _padded_context(self, lanes: list[DraftLane]) -> tuple[list[LayerContext], torch.Tensor, torch.Tensor]:
        """Every lane's context K/V right-padded to the longest ([B, H_kv, L, D] per layer), the valid
        mask [B, L] that hides the padding, and each lane's context length [B]."""
        cfg = self.head.config
        dtype, device = self.head.fc.weight.dtype, self.head.fc.weight.device
        caches = [lane.draft_cache for lane in lanes]
        for lane in lanes:
            lane.draft_cache.sync(self.head, lane.tap_rows(), lane.first_tap_row)
        ctx_len = max(c.length for c in caches)
        shape = (len(lanes), cfg.num_key_value_heads, ctx_len, cfg.head_dim)
        context = [LayerContext(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)) for _ in range(cfg.num_hidden_layers)]
        valid = torch.zeros(len(lanes), ctx_len, dtype=torch.bool, device=device)
        for b, cache in enumerate(caches):
            valid[b, : cache.length] = True
            for padded, own in zip(context, cache.layers):
                padded.keys[b, :, : cache.length] = own.keys[0]
                padded.values[b, :, : cache.length] = own.values[0]
        return context, valid, torch.tensor([c.length for c in caches], device=device)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()

    @torch.no_grad()
    def propose(self, lanes: list[DraftLane], depth: int) -> torch.Tensor:
        """[B, depth, V] draft logits for depths 1..depth (<= block_size-1); a lane's context is its
        tapped rows (one per committed token but the root). Only the needed rows pay for the lm_head."""
        cfg = self.head.config
        context, valid, lengths = self._padded_context(lanes)
        device, size = valid.device, cfg.block_size
        ids = torch.full((len(lanes), size), cfg.mask_token_id, dtype=torch.long, device=device)
        ids[:, 0] = torch.tensor([lane.root_token for lane in lanes], device=device)
        positions = lengths.unsqueeze(1) + torch.arange(size, device=device)
        embeds = self.embed_tokens(ids).to(self.head.fc.weight.dtype)
        hidden = self.head(embeds, positions, context, block_mask(valid, size, cfg.causal_head))
        return self._logits(hidden[:, 1 : depth + 1])

    @torch.no_grad()
    def propose_children(self, lanes: list[DraftLane], trees: list[DraftTree]) -> list[torch.Tensor]:
        """Per lane, [N_i, V] logits: row j is the distribution of node j's children given node j's path.

        One head pass over 2N rows per tree (N = the batch's largest tree): node rows hold the node
        tokens at position ctx_len + depth under the ancestor-or-self mask; child slot j holds MASK at
        ctx_len + depth_j + 1 and sees node j's ancestors-or-self. This is the block a prefix-reveal
        head was trained on (path tokens revealed, the next row masked). Only slot rows pay for the lm_head.
        """
        if not self.reads_tree_tokens:
            raise ValueError("propose_children needs a head trained with revealed tokens (config.json dflash_config.draft_reveal; "
                             "`jetspec train --reveal prefix`); this head drafts per-depth marginals only")
        cfg = self.head.config
        context, valid, lengths = self._padded_context(lanes)
        device, n = valid.device, max(t.size for t in trees)
        ids = torch.full((len(lanes), 2 * n), cfg.mask_token_id, dtype=torch.long, device=device)
        depths = torch.zeros(len(lanes), n, dtype=torch.long, device=device)
        ancestors = torch.zeros(len(lanes), n, n, dtype=torch.bool, device=device)
        for b, tree in enumerate(trees):
            ids[b, : tree.size] = tree.tokens.to(device)
            depths[b, : tree.size] = tree.depths.to(device)
            ancestors[b, : tree.size, : tree.size] = tree.ancestor_mask().to(device)
        node_positions = lengths.unsqueeze(1) + depths
        positions = torch.cat([node_positions, node_positions + 1], dim=1)
        embeds = self.embed_tokens(ids).to(self.head.fc.weight.dtype)
        hidden = self.head(embeds, positions, context, tree_causal_mask(valid, ancestors))
        slots = torch.cat([hidden[b, n : n + tree.size] for b, tree in enumerate(trees)])
        return list(self._logits(slots).split([tree.size for tree in trees]))
