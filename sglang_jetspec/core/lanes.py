"""What a lane is, in one place: one running request inside a step, as each part of the core reads it.

Every engine keeps its own lane type (the reference engine's `reference.engine.Lane`, the SGLang
worker's `adapter.request_state.RequestDraftState`, `jetspec replay`'s `evaluation.replay.ReplayLane`);
the core reads them through these views only, each a few attributes:
- `DraftLane`: what the drafter reads (the root token the tree grows from);
- `LookupLane`: what prompt lookup reads (every committed token, prompt included);
- `SlotLane`: the head's context kept per KV slot (core.context_pool: the SGLang worker);
- `CachedLane`: the head's context kept per request (core.context_cache: the reference engine).
Acceptance reads a lane's `params` and `generator` (core.acceptance, core.tree_drafting.sampled_draws).
"""

from __future__ import annotations

from typing import Protocol

import torch


class DraftLane(Protocol):
    root_token: int  # the last committed token: the tree's root, not in the KV cache yet


class LookupLane(Protocol):
    committed_ids: list[int]


class SlotLane(DraftLane, Protocol):
    # its context positions 0..kv_len-1 sit at KV slots slot_table[slot_row, :kv_len]; every lane of a
    # step shares one table (SGLang's req_to_token, on the pool's device), so a step gathers them at once
    slot_table: torch.Tensor
    slot_row: int
    kv_len: int


class CachedLane(DraftLane, Protocol):
    draft_cache: object  # its core.context_cache.ContextCache, kept in step with its tap rows

    def tap_rows(self) -> torch.Tensor: ...
