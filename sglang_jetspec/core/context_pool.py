"""The head's context K/V kept per KV slot of the target's pool: what the SGLang worker drafts from.

A position's context K/V depends only on its own tapped target row and its position, and a KV slot
holds one token at one position for as long as it is allocated. So the pool stores, for every slot of
the target's token-to-KV pool, the head's projected keys and values of the token whose target KV is
in that slot, and a request's context is a gather of the slots of its positions 0..L-1 (its row of
SGLang's `req_to_token`). Whatever shares slots shares the head's context with them: a prefix the
radix cache hands to a new request brings the head's context along, and nothing is recomputed.

`valid[slot]` says the slot's context was written for the token now in it. The owner keeps it exact:
it writes the rows a forward commits (prefill positions, a verify's root and accepted nodes, each at
the slot its KV ends up in) and nothing else, and invalidates every slot the allocator frees, so a
slot is valid from the write of its committed token until it is freed. Slots holding KV without a
write (rejected tree nodes, which are rewritten or freed before anything reads them; tokens of
requests that do not draft) stay invalid. A request may draft only if every slot of its context is
valid; one that is not (its prefix was written while speculation was off) is decoded without
speculation.

A write may be deferred (`write(..., defer=True)`: a native step's tokens, kept for speculation to
resume but drafted from by nobody yet): its rows wait, unprojected, and are projected and stored together
with the next write that is not deferred, at the latest after DEFERRED_WRITES_MAX of them, and before
anything reads or frees slots (`flush`: a gather for a draft, `holds`, `invalidate`, the counts). A run of
native steps then costs the projection's launches once, not once a step; what any reader sees is the
same as if every write had happened at once. Gather (what a captured draft pass replays) does not
flush: `padded` (the eager pass) and core.draft_graphs (before a replay) flush before it.
"""

from __future__ import annotations

import torch

from .context_cache import context_bytes_per_token
from .head import DraftHead, LayerContext
from .head_config import HeadConfig
from .lanes import SlotLane

DEFERRED_WRITES_MAX = 16  # deferred writes held at most (a native block is 8 steps by default)


class SlotContextPool:
    """Context K/V per KV slot: keys and values [head layers, slots, H_kv, D] and `valid` [slots].

    Memory: slots x (`context_bytes_per_token` + 1 byte for `valid`), allocated once."""

    def __init__(self, cfg: HeadConfig, num_slots: int, dtype: torch.dtype, device) -> None:
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, cfg.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self._pending: list[tuple[DraftHead, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # deferred writes

    @staticmethod
    def bytes_per_token(cfg: HeadConfig, dtype: torch.dtype) -> int:
        return context_bytes_per_token(cfg, dtype) + 1

    @property
    def num_slots(self) -> int:
        return self.valid.shape[0]

    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.keys, self.values, self.valid))

    def valid_slots(self) -> int:
        self.flush()
        return int(self.valid.sum())

    @torch.no_grad()
    def write(
        self, head: DraftHead, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, defer: bool = False
    ) -> None:
        """Project tapped rows [n, taps*H] at `positions` [n] and store them at `slots` [n]; `defer`: later
        (the module docstring), with the writes held before it."""
        if rows.shape[0] == 0:
            return
        self._pending.append((head, rows, positions, slots))
        if not defer or len(self._pending) >= DEFERRED_WRITES_MAX:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        """Project and store every deferred write, in one pass (a slot is in at most one: a freed slot's
        write is flushed before it is freed)."""
        if not self._pending:
            return
        head = self._pending[0][0]
        columns = zip(*(write[1:] for write in self._pending))
        rows, positions, slots = (parts[0] if len(parts) == 1 else torch.cat(parts) for parts in columns)
        self._pending.clear()
        new = head.project_context(rows.unsqueeze(0).to(self.keys.dtype), positions.unsqueeze(0))
        for layer, n in enumerate(new):
            self.keys[layer, slots] = n.keys[0].transpose(0, 1)
            self.values[layer, slots] = n.values[0].transpose(0, 1)
        self.valid[slots] = True

    @property
    def deferred_rows(self) -> int:
        return sum(len(write[1]) for write in self._pending)

    def invalidate(self, slots: torch.Tensor) -> None:
        self.flush()
        self.valid[slots] = False

    def holds(self, slots: torch.Tensor) -> bool:
        """Whether every slot's context was written for the token now in it (one host sync)."""
        self.flush()
        return slots.numel() == 0 or bool(self.valid[slots].all())

    def clear(self) -> None:
        self._pending.clear()
        self.valid.zero_()

    def padded(self, head: DraftHead, lanes: list[SlotLane]) -> tuple[list[LayerContext], torch.Tensor, torch.Tensor]:
        """Every lane's context gathered from its slots and right-padded to the longest ([B, H_kv, L, D]
        per layer), the valid mask [B, L] hiding the padding, and each lane's context length [B]. One
        gather for the whole batch, whatever its size: the padding reads whatever slots the table holds
        past a lane's length (every pool row is finite: zeros or a written row), which the mask hides."""
        table = lanes[0].slot_table
        if any(lane.slot_table is not table for lane in lanes):
            raise ValueError("lanes of one step must share one slot table (SGLang's req_to_token)")
        self.flush()
        kv_lens = [lane.kv_len for lane in lanes]
        rows = torch.tensor([lane.slot_row for lane in lanes], device=table.device)
        lengths = torch.tensor(kv_lens, device=table.device)
        context, valid = self.gather(table, rows, lengths, max(kv_lens))
        return context, valid, lengths

    def gather(
        self, table: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, length: int
    ) -> tuple[list[LayerContext], torch.Tensor]:
        """The contexts of `table`'s rows `rows` [B] of `lengths` [B], padded to `length` (at least the
        longest): device data in, device data out, the shapes fixed by B and `length` alone (what a
        captured draft pass replays, core.draft_graphs)."""
        slots = table[rows, :length].long()
        valid = torch.arange(length, device=table.device) < lengths.unsqueeze(1)
        context = [
            LayerContext(self.keys[layer][slots].transpose(1, 2), self.values[layer][slots].transpose(1, 2))
            for layer in range(self.keys.shape[0])
        ]
        return context, valid

    def describe(self) -> dict:
        """Slots (the target's), bytes held, and the slots whose context is valid (a live or cached token's)."""
        return {"slots": self.num_slots, "bytes": self.nbytes(), "valid_slots": self.valid_slots()}
