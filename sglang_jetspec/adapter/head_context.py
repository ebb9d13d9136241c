"""Every write of the head's context (core.context_pool.SlotContextPool): the tap rows of the tokens a
request commits, projected into the head's K/V at their positions and stored at their KV slots.

Two moments write, through one `write`: a prefill (every computed position of a request whose cached
prefix has its context in the pool) and a verify step's commit (the root and the accepted nodes of
each drafting request, at the first slots of its verify window, where the KV mover put their target KV).
Rejected nodes' slots are left invalid. A native step's commit (budget 0, context kept for speculation
to resume) defers its write: the pool projects a run of them at once (core.context_pool).
"""

from __future__ import annotations

import torch

from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.head import DraftHead


class HeadContext:
    def __init__(self, pool: SlotContextPool, head: DraftHead, device: torch.device) -> None:
        self.pool, self.head, self.device = pool, head, device

    def write(
        self, taps: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, defer: bool = False
    ) -> None:
        """Tap rows `rows` of `taps` at `positions` into KV slots `slots` (host index tensors are moved)."""
        self.pool.write(self.head, taps[rows.to(self.device)], positions.to(self.device), slots, defer)

    def store_prefill(self, batch, taps: torch.Tensor, states: list[RequestDraftState]) -> None:
        """The context of every computed position of each request that drafts (`states`, by request)."""
        keep, positions, offset = [], [], 0
        for state, prefix_len, extend_len in zip(states, batch.prefix_lens, batch.extend_lens):
            if state.drafts:
                keep.append(torch.arange(offset, offset + extend_len))
                positions.append(torch.arange(prefix_len, prefix_len + extend_len))
            offset += extend_len
        if keep:
            rows = torch.cat(keep).to(self.device)
            self.write(taps, rows, torch.cat(positions), batch.out_cache_loc[rows])

    def keep_committed(
        self,
        lanes: list[RequestDraftState],
        taps: torch.Tensor,
        row_index: torch.Tensor,
        row_counts: list[int],
        out_cache_loc: torch.Tensor,
        num_nodes: int,
        defer: bool = False,
    ) -> None:
        """The context of each drafting request's committed tokens: verify rows `row_index` (request-major,
        `row_counts` per request), at positions kv_len + i and the first slots of the request's window;
        `defer`: a native step's (the pool writes it with later ones)."""
        if not any(lane.drafts for lane in lanes):
            return
        counts = torch.tensor(row_counts)
        lane_of_row = torch.repeat_interleave(torch.arange(len(lanes)), counts)
        offset = torch.arange(len(lane_of_row)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        drafting = torch.tensor([lane.drafts for lane in lanes])[lane_of_row]
        positions = (torch.tensor([lane.kv_len for lane in lanes])[lane_of_row] + offset)[drafting]
        window = (lane_of_row * num_nodes + offset)[drafting]
        self.write(taps, row_index[drafting], positions, out_cache_loc[window.to(self.device)], defer)
