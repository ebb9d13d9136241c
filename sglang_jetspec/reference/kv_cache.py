"""A slot-addressed KV cache for a Hugging Face target, one lane per running request.

HF's DynamicCache only appends. Tree verification needs each request's N tree nodes written after
its own committed prefix, and afterwards the accepted path moved down over the rejected nodes. Here
lane b owns slots [0, lengths[b]); a forward writes its new tokens at `write_slots` (set by the
engine before the call) and attends over the slots the engine's mask allows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class SlotLayer(CacheLayerMixin):
    """One decoder layer's keys and values, [lanes, H_kv, capacity, D]."""

    is_sliding = False

    def __init__(self, owner: "SlotKVCache") -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        lanes, heads, _, dim = key_states.shape
        shape = (lanes, heads, self.owner.capacity, dim)
        self.keys = torch.zeros(shape, dtype=key_states.dtype, device=key_states.device)
        self.values = torch.zeros(shape, dtype=value_states.dtype, device=value_states.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.write_slots
        lanes = torch.arange(slots.shape[0], device=slots.device).unsqueeze(1)
        self.keys[lanes, :, slots] = key_states.transpose(1, 2)
        self.values[lanes, :, slots] = value_states.transpose(1, 2)
        used = self.owner.visible_len
        return self.keys[:, :, :used], self.values[:, :, :used]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.visible_len, 0

    def get_seq_length(self) -> int:
        return int(self.owner.lengths.max()) if self.owner.lanes else 0

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotKVCache(Cache):
    """KV for `lanes` requests; `lengths[b]` slots of lane b hold its committed tokens but the newest."""

    def __init__(self, num_layers: int, lanes: int = 1, capacity: int = 256) -> None:
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])
        self.capacity = capacity
        self.lengths = torch.zeros(lanes, dtype=torch.long)
        self.write_slots = torch.zeros(lanes, 0, dtype=torch.long)
        self.visible_len = 0

    @property
    def lanes(self) -> int:
        return int(self.lengths.numel())

    def prepare_write(self, new_tokens: int) -> torch.Tensor:
        """Reserve `new_tokens` slots after every lane's committed prefix; returns them [lanes, new_tokens]."""
        need = int(self.lengths.max()) + new_tokens if self.lanes else new_tokens
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        self.write_slots = self.lengths.unsqueeze(1) + torch.arange(new_tokens)
        self.visible_len = need
        device = self._device()
        if device is not None:
            self.write_slots = self.write_slots.to(device)
        return self.write_slots

    def commit(self, lane: int, kept: list[int]) -> None:
        """Keep the lane's freshly written tokens at offsets `kept` (in order), drop the rest.

        Offsets are relative to the lane's committed length; kept[i] moves to slot lengths + i.
        Every slot the forward wrote but did not keep is zeroed, so no rejected state survives.
        """
        start = int(self.lengths[lane])
        written = self.write_slots.shape[1]
        if kept and kept != list(range(len(kept))):
            src = torch.tensor(kept, device=self.write_slots.device) + start
            dst = torch.arange(start, start + len(kept), device=src.device)
            for layer in self.layers:
                layer.keys[lane, :, dst] = layer.keys[lane, :, src]
                layer.values[lane, :, dst] = layer.values[lane, :, src]
        if len(kept) < written:  # a step that keeps all it wrote (one unpadded token) has nothing to zero
            for layer in self.layers:
                layer.keys[lane, :, start + len(kept) : start + written] = 0
                layer.values[lane, :, start + len(kept) : start + written] = 0
        self.lengths[lane] = start + len(kept)

    def keep_lanes(self, keep: list[int]) -> None:
        """Drop finished lanes (a copy once per membership change, never per step)."""
        idx = torch.tensor(keep, dtype=torch.long)
        self.lengths = self.lengths[idx]
        for layer in self.layers:
            if layer.is_initialized:
                layer.keys = layer.keys[idx.to(layer.keys.device)].contiguous()
                layer.values = layer.values[idx.to(layer.values.device)].contiguous()

    def add_lane(self, other: "SlotKVCache") -> None:
        """Append the single lane of `other` (a request prefilled on its own) as a new lane."""
        if other.lanes != 1:
            raise ValueError("add_lane takes a one-lane cache")
        length = int(other.lengths[0])
        if length > self.capacity:
            self._grow(max(length, 2 * self.capacity))
        for mine, theirs in zip(self.layers, other.layers):
            if not mine.is_initialized:
                lanes, heads, _, dim = theirs.keys.shape
                empty = torch.zeros(0, heads, self.capacity, dim, dtype=theirs.keys.dtype, device=theirs.keys.device)
                mine.keys, mine.values, mine.is_initialized = empty, empty.clone(), True
            row_k = mine.keys.new_zeros((1,) + mine.keys.shape[1:])
            row_v = mine.values.new_zeros((1,) + mine.values.shape[1:])
            row_k[:, :, :length] = theirs.keys[:, :, :length]
            row_v[:, :, :length] = theirs.values[:, :, :length]
            mine.keys = torch.cat([mine.keys, row_k])
            mine.values = torch.cat([mine.values, row_v])
        self.lengths = torch.cat([self.lengths, other.lengths])

    def lane_kv(self, lane: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed keys/values of one lane and layer: [H_kv, length, D] each."""
        length = int(self.lengths[lane])
        entry = self.layers[layer]
        return entry.keys[lane, :, :length], entry.values[lane, :, :length]

    def _device(self) -> torch.device | None:
        first = self.layers[0]
        return first.keys.device if first.is_initialized else None

    def _grow(self, capacity: int) -> None:
        for layer in self.layers:
            if layer.is_initialized:
                pad = capacity - layer.keys.shape[2]
                layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, 0, pad))
                layer.values = torch.nn.functional.pad(layer.values, (0, 0, 0, pad))
        self.capacity = capacity
