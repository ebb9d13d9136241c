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
    """One decoder layer's keys and values, [lanes, H_kv, capacity, D]: views of the cache's one tensor
    for all layers, so a commit moves or clears every layer's slots in one operation, not one per layer."""

    is_sliding = False

    def __init__(self, owner: "SlotKVCache", index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner.allocate(key_states, value_states)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        start = owner.single_lane_start
        if start is not None:  # one lane writes one contiguous run of slots: a plain copy, no index_put
            rows = key_states.shape[2]
            self.keys[0, :, start : start + rows] = key_states[0]
            self.values[0, :, start : start + rows] = value_states[0]
        else:
            slots = owner.write_slots
            lanes = torch.arange(slots.shape[0], device=slots.device).unsqueeze(1)
            self.keys[lanes, :, slots] = key_states.transpose(1, 2)
            self.values[lanes, :, slots] = value_states.transpose(1, 2)
        used = owner.visible_len
        return self.keys[:, :, :used], self.values[:, :, :used]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.visible_len, 0

    def get_seq_length(self) -> int:
        return int(self.owner.lengths.max()) if self.owner.lanes else 0

    def get_max_length(self) -> int:
        return self.owner.capacity


class SlotKVCache(Cache):
    """KV for `lanes` requests; `lengths[b]` slots of lane b hold its committed tokens but the newest.

    Storage: one keys and one values tensor [layers, lanes, H_kv, capacity, D] (allocated at the first
    forward, when the shapes are known); each layer's `keys` / `values` are views of its slice."""

    def __init__(self, num_layers: int, lanes: int = 1, capacity: int = 256) -> None:
        super().__init__(layers=[SlotLayer(self, i) for i in range(num_layers)])
        self.capacity = capacity
        self.lengths = torch.zeros(lanes, dtype=torch.long)
        self.write_slots = torch.zeros(lanes, 0, dtype=torch.long)
        self.single_lane_start: int | None = None  # the one lane's first write slot, when there is one lane
        self.visible_len = 0
        self.all_keys: torch.Tensor | None = None
        self.all_values: torch.Tensor | None = None

    @property
    def lanes(self) -> int:
        return int(self.lengths.numel())

    def allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Zeroed storage for every layer, shaped after one layer's new keys/values [lanes, H_kv, n, D]."""
        lanes, heads, _, dim = key_states.shape
        shape = (len(self.layers), lanes, heads, self.capacity, dim)
        self._bind(
            torch.zeros(shape, dtype=key_states.dtype, device=key_states.device),
            torch.zeros(shape, dtype=value_states.dtype, device=value_states.device),
        )

    def _bind(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Adopt new storage and point every layer's views at it."""
        self.all_keys, self.all_values = keys, values
        for layer in self.layers:
            layer.keys, layer.values, layer.is_initialized = keys[layer.index], values[layer.index], True

    def prepare_write(self, new_tokens: int) -> torch.Tensor:
        """Reserve `new_tokens` slots after every lane's committed prefix; returns them [lanes, new_tokens]."""
        need = int(self.lengths.max()) + new_tokens if self.lanes else new_tokens
        if need > self.capacity:
            self._grow(max(need, 2 * self.capacity))
        self.write_slots = self.lengths.unsqueeze(1) + torch.arange(new_tokens)
        self.single_lane_start = int(self.lengths[0]) if self.lanes == 1 else None
        self.visible_len = need
        if self.all_keys is not None:
            self.write_slots = self.write_slots.to(self.all_keys.device)
        return self.write_slots

    def commit(self, lane: int, kept: list[int]) -> None:
        """Keep the lane's freshly written tokens at offsets `kept` (in order), drop the rest.

        Offsets are relative to the lane's committed length; kept[i] moves to slot lengths + i.
        Every slot the forward wrote but did not keep is zeroed, so no rejected state survives.
        """
        start = int(self.lengths[lane])
        written = self.write_slots.shape[1]
        if self.all_keys is not None:
            keys, values = self.all_keys[:, lane], self.all_values[:, lane]  # [layers, H_kv, capacity, D] views
            if kept and kept != list(range(len(kept))):
                src = torch.tensor(kept, device=keys.device) + start
                dst = slice(start, start + len(kept))
                keys[:, :, dst] = keys[:, :, src]
                values[:, :, dst] = values[:, :, src]
            if len(kept) < written:  # a step that keeps all it wrote (one unpadded token) has nothing to zero
                keys[:, :, start + len(kept) : start + written] = 0
                values[:, :, start + len(kept) : start + written] = 0
        self.lengths[lane] = start + len(kept)

    def keep_lanes(self, keep: list[int]) -> None:
        """Drop finished lanes (a copy once per membership change, never per step)."""
        idx = torch.tensor(keep, dtype=torch.long)
        self.lengths = self.lengths[idx]
        if self.all_keys is not None:
            idx = idx.to(self.all_keys.device)
            self._bind(self.all_keys[:, idx].contiguous(), self.all_values[:, idx].contiguous())

    def add_lane(self, other: "SlotKVCache") -> None:
        """Append the single lane of `other` (a request prefilled on its own) as a new lane."""
        if other.lanes != 1:
            raise ValueError("add_lane takes a one-lane cache")
        length = int(other.lengths[0])
        if length > self.capacity:
            self._grow(max(length, 2 * self.capacity))
        if other.all_keys is not None:
            theirs = (other.all_keys, other.all_values)
            if self.all_keys is None:
                self._bind(*(t.new_zeros(t.shape[0], 0, t.shape[2], self.capacity, t.shape[4]) for t in theirs))
            rows = []
            for mine, their in zip((self.all_keys, self.all_values), theirs):
                row = mine.new_zeros(mine.shape[0], 1, *mine.shape[2:])
                row[:, :, :, :length] = their[:, :, :, :length]
                rows.append(torch.cat([mine, row], dim=1))
            self._bind(*rows)
        self.lengths = torch.cat([self.lengths, other.lengths])

    def lane_kv(self, lane: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Committed keys/values of one lane and layer: [H_kv, length, D] each."""
        length = int(self.lengths[lane])
        return self.all_keys[layer, lane, :, :length], self.all_values[layer, lane, :, :length]

    def _grow(self, capacity: int) -> None:
        if self.all_keys is not None:
            pad = capacity - self.all_keys.shape[3]
            self._bind(*(torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (self.all_keys, self.all_values)))
        self.capacity = capacity
