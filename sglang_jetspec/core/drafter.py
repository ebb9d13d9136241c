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
from .head_config import HeadConfig
from .packed_linear import PackedWeight, linear
from .tree import DraftTree


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def context_bytes_per_token(cfg: HeadConfig, dtype: torch.dtype) -> int:
    """Bytes of projected context K/V one context token costs a request:
    2 (keys and values) x head layers x KV heads x head_dim x dtype bytes."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()


class ContextCache:
    """One request's per-layer context K/V ([1, H_kv, L, D]) for its first `length` tapped rows.

    Memory: per layer, one key and one value buffer [1, H_kv, capacity, D]; `layers` are views of
    their first `length` positions. A sync projects only the new rows and writes them in place; the
    buffers grow by doubling (the first allocation is exact), so appending is amortised O(1) per row
    and a step never copies the whole context. Held bytes = capacity x `context_bytes_per_token`
    (2 x head layers x KV heads x head_dim x dtype bytes), with capacity <= 2 x length after growth
    (<= 4 x length after a truncate, which shrinks back to 2 x length below a quarter).
    """

    def __init__(self) -> None:
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self.length = 0

    @property
    def capacity(self) -> int:
        return self._keys[0].shape[2] if self._keys else 0

    @property
    def layers(self) -> list[LayerContext]:
        """Per layer, views [1, H_kv, length, D] of the keys and values (no copy)."""
        return [LayerContext(k[:, :, : self.length], v[:, :, : self.length]) for k, v in zip(self._keys, self._values)]

    def nbytes(self) -> int:
        """Bytes the buffers hold (capacity, not just length)."""
        return sum(t.untyped_storage().nbytes() for t in self._keys + self._values)

    @torch.no_grad()  # derived state: never part of an autograd graph (in-place appends would chain one)
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
            self.length = 0
        if total == self.length:
            return
        positions = torch.arange(self.length, total, device=tap_rows.device).unsqueeze(0)
        fresh = tap_rows[self.length - first_row :].unsqueeze(0).to(head.fc.weight.dtype)
        new = head.project_context(fresh, positions)
        if total > self.capacity or len(new) != len(self._keys):
            self._resize(max(total, 2 * self.capacity), new)
        for keys, values, n in zip(self._keys, self._values, new):
            keys[:, :, self.length : total] = n.keys
            values[:, :, self.length : total] = n.values
        self.length = total

    def _resize(self, capacity: int, like: list[LayerContext]) -> None:
        """New buffers of `capacity` positions holding the first `length` ones (shaped like `like`)."""
        keep = self.length if len(like) == len(self._keys) else 0
        keys, values = [], []
        for i, n in enumerate(like):
            for old, out, ref in ((self._keys, keys, n.keys), (self._values, values, n.values)):
                t = ref.new_empty(ref.shape[0], ref.shape[1], capacity, ref.shape[3])
                if keep:
                    t[:, :, :keep] = old[i][:, :, :keep]
                out.append(t)
        self._keys, self._values, self.length = keys, values, keep

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on: a position's context K/V depends only on its own tapped
        row and position, so what stays is exact. The buffers shrink when under a quarter is in use."""
        if length < self.length:
            self.length = length
            if length == 0:
                self._keys, self._values = [], []
            elif 4 * length < self.capacity:
                self._resize(2 * length, self.layers)


class DraftLane(Protocol):
    """What the drafter reads from a running request (the reference engine's Lane provides it)."""

    root_token: int
    draft_cache: ContextCache
    first_tap_row: int  # position of tap_rows()[0]: 0 unless the lane frees rows the cache has projected

    def tap_rows(self) -> torch.Tensor: ...

    # Optional: `release_projected()`, called right after the cache has projected the lane's rows,
    # lets a lane free them at once (the SGLang worker's RequestDraftState does).


class HeadDrafter:
    """One head pass over [root, MASK x (B-1)] per request gives logits for depths 1..B-1.

    With a `draft_vocab` (core/draft_vocab.py: target ids, [V_d]) the logits cover only those tokens:
    column j is token draft_vocab[j]; callers map candidates back with it (tree.top_k_per_depth)."""

    def __init__(self, head: DraftHead, embed_tokens: nn.Module, lm_head: nn.Module, draft_vocab: torch.Tensor | None = None) -> None:
        self.head = head
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.draft_vocab = None if draft_vocab is None else draft_vocab.to(device=head.fc.weight.device, dtype=torch.long)
        self._padded: list[LayerContext] = []  # reusable padded context buffers for batches of several lanes
        self._rows: tuple[tuple, torch.Tensor] | None = None  # (key of the lm_head weight it came from, its draft_vocab rows)
        self._packed_rows = PackedWeight()

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
        mask [B, L] that hides the padding, and each lane's context length [B].

        One lane: its cache's own views, no copy. Several: copies into the drafter's padded buffers,
        reused across steps (grown by doubling, shrunk below a quarter), with only the padding zeroed."""
        cfg = self.head.config
        dtype, device = self.head.fc.weight.dtype, self.head.fc.weight.device
        caches = [lane.draft_cache for lane in lanes]
        for lane in lanes:
            lane.draft_cache.sync(self.head, lane.tap_rows(), lane.first_tap_row)
            release = getattr(lane, "release_projected", None)
            if release is not None:
                release()
        lengths = torch.tensor([c.length for c in caches], device=device)
        ctx_len = max(c.length for c in caches)
        valid = torch.arange(ctx_len, device=device) < lengths.unsqueeze(1)
        if len(lanes) == 1 and len(caches[0].layers) == cfg.num_hidden_layers:
            return caches[0].layers, valid, lengths
        context = self._padding_buffers(len(lanes), ctx_len, dtype, device)
        for b, cache in enumerate(caches):
            own = cache.layers if cache.length else [None] * cfg.num_hidden_layers
            for padded, mine in zip(context, own):
                if mine is not None:
                    padded.keys[b, :, : cache.length] = mine.keys[0]
                    padded.values[b, :, : cache.length] = mine.values[0]
                padded.keys[b, :, cache.length :] = 0
                padded.values[b, :, cache.length :] = 0
        return context, valid, lengths

    def _padding_buffers(self, batch: int, ctx_len: int, dtype: torch.dtype, device: torch.device) -> list[LayerContext]:
        """Views [batch, H_kv, ctx_len, D] of the reusable padded buffers (contents undefined).

        The context dimension is a power of two (grown by doubling: amortised O(1) as contexts grow),
        the batch one doubles; buffers more than four times larger than needed are replaced by smaller
        ones, so they track the current batch, not its peak."""
        cfg = self.head.config
        cap_b = cap_l = 0
        if self._padded and self._padded[0].keys.dtype == dtype and self._padded[0].keys.device == device:
            cap_b, _, cap_l, _ = self._padded[0].keys.shape
        if batch > cap_b or ctx_len > cap_l or 4 * batch * ctx_len < cap_b * cap_l:
            if batch > cap_b or ctx_len > cap_l:
                cap_b = max(batch, 2 * cap_b) if batch > cap_b else cap_b
                cap_l = max(_next_power_of_two(ctx_len), cap_l)
            else:
                cap_b, cap_l = batch, _next_power_of_two(ctx_len)
            shape = (cap_b, cfg.num_key_value_heads, cap_l, cfg.head_dim)
            self._padded = [LayerContext(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                            for _ in range(cfg.num_hidden_layers)]
        return [LayerContext(c.keys[:batch, :, :ctx_len], c.values[:batch, :, :ctx_len]) for c in self._padded]

    def _draft_rows(self) -> torch.Tensor:
        """The lm_head rows of the draft vocabulary, gathered once per version of the target's weight
        (a weight update that replaces or rewrites it is seen at the next step)."""
        weight = self.lm_head.weight
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape))
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, weight.index_select(0, self.draft_vocab).contiguous())
        return self._rows[1]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.draft_vocab is None:
            return self.lm_head(hidden.to(self.lm_head.weight.dtype)).float()
        rows = self._draft_rows()
        return linear(hidden.to(rows.dtype), rows, None, self._packed_rows).float()

    @torch.no_grad()
    def propose(self, lanes: list[DraftLane], depth: int) -> torch.Tensor:
        """[B, depth, V] draft logits for depths 1..depth (<= block_size-1); a lane's context is its
        tapped rows (one per committed token but the root). Only the needed rows pay for the lm_head;
        a causal head's rows see only earlier ones, so its block is cut to the depth+1 rows it needs."""
        cfg = self.head.config
        context, valid, lengths = self._padded_context(lanes)
        device = valid.device
        size = min(depth + 1, cfg.block_size) if cfg.causal_head else cfg.block_size
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
