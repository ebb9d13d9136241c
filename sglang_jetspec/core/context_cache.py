"""The head's context K/V kept per request: what the reference engine's lanes hold.

A `ContextCache` is one request's projected context K/V for its tapped target rows. It is derived
state, synced lazily from the rows (the source of truth), so after any number of non-speculative
steps the next draft sees a context rebuilt from fresh rows, never a stale one. `CachedContexts` is the
drafter's context source over such lanes. (The SGLang worker keeps the same K/V per KV slot
instead: core.context_pool.)
"""

from __future__ import annotations

import torch

from .head import DraftHead, LayerContext
from .head_config import HeadConfig
from .lanes import CachedLane


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def context_bytes_per_token(cfg: HeadConfig, dtype: torch.dtype) -> int:
    """Bytes of projected context K/V one context token costs a request:
    2 (keys and values) x head layers x KV heads x head_dim x dtype bytes."""
    return (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()
    )


class ContextCache:
    """One request's per-layer context K/V ([1, H_kv, L, D]) for its first `length` tapped rows.

    Memory: per layer, one key and one value buffer [1, H_kv, capacity, D]; `layers` are views of
    their first `length` positions. A sync projects only the new rows and writes them in place; the
    buffers grow by doubling (the first allocation is exact), so appending is amortised O(1) per row
    and a step never copies the whole context. Held bytes = capacity x `context_bytes_per_token`
    (2 x head layers x KV heads x head_dim x dtype bytes), with capacity <= 2 x length after growth.
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
    def sync(self, head: DraftHead, tap_rows: torch.Tensor) -> None:
        """Bring the cache up to the rows `tap_rows` [L, taps*H] of positions 0..L-1; rows the cache
        already holds must be unchanged."""
        total = tap_rows.shape[0]
        if total < self.length:  # rows were rewritten (not expected); rebuild from what is there
            self.length = 0
        if total == self.length:
            return
        positions = torch.arange(self.length, total, device=tap_rows.device).unsqueeze(0)
        fresh = tap_rows[self.length :].unsqueeze(0).to(head.fc.weight.dtype)
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


class CachedContexts:
    """The drafter's context source over lanes that each keep a ContextCache (the reference engine)."""

    def __init__(self) -> None:
        self._padded: list[LayerContext] = []  # reusable padded context buffers for batches of several lanes

    def padded(self, head: DraftHead, lanes: list[CachedLane]) -> tuple[list[LayerContext], torch.Tensor, torch.Tensor]:
        """Every lane's context K/V right-padded to the longest ([B, H_kv, L, D] per layer), the valid
        mask [B, L] that hides the padding, and each lane's context length [B].

        One lane: its cache's own views, no copy. Several: copies into the drafter's padded buffers,
        reused across steps (grown by doubling, shrunk below a quarter), with only the padding zeroed."""
        cfg = head.config
        dtype, device = head.fc.weight.dtype, head.fc.weight.device
        caches = [lane.draft_cache for lane in lanes]
        for lane in lanes:
            lane.draft_cache.sync(head, lane.tap_rows())
        lengths = torch.tensor([c.length for c in caches], device=device)
        ctx_len = max(c.length for c in caches)
        valid = torch.arange(ctx_len, device=device) < lengths.unsqueeze(1)
        if len(lanes) == 1 and len(caches[0].layers) == cfg.num_hidden_layers:
            return caches[0].layers, valid, lengths
        context = self._padding_buffers(cfg, len(lanes), ctx_len, dtype, device)
        for b, cache in enumerate(caches):
            own = cache.layers if cache.length else [None] * cfg.num_hidden_layers
            for padded, mine in zip(context, own):
                if mine is not None:
                    padded.keys[b, :, : cache.length] = mine.keys[0]
                    padded.values[b, :, : cache.length] = mine.values[0]
                padded.keys[b, :, cache.length :] = 0
                padded.values[b, :, cache.length :] = 0
        return context, valid, lengths

    def _padding_buffers(
        self, cfg: HeadConfig, batch: int, ctx_len: int, dtype: torch.dtype, device: torch.device
    ) -> list[LayerContext]:
        """Views [batch, H_kv, ctx_len, D] of the reusable padded buffers (contents undefined).

        The context dimension is a power of two (grown by doubling: amortised O(1) as contexts grow),
        the batch one doubles; buffers more than four times larger than needed are replaced by smaller
        ones, so they track the current batch, not its peak."""
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
            self._padded = [
                LayerContext(
                    torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)
                )
                for _ in range(cfg.num_hidden_layers)
            ]
        return [LayerContext(c.keys[:batch, :, :ctx_len], c.values[:batch, :, :ctx_len]) for c in self._padded]
