"""The head's context kept per KV slot (core.context_pool): what the SGLang worker drafts from.

Gathered from scattered slots it equals the context a per-request cache projects from the same rows;
a request that shares a prefix's slots (a radix-cache hit) drafts exactly as one that computed them;
validity follows writes, invalidation and clearing; memory is fixed at slots x bytes per token.
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_jetspec.core.context_cache import ContextCache, context_bytes_per_token
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.head_io import init_head
from tests.builders import tiny_head_config

HIDDEN, VOCAB = 64, 50
CFG = tiny_head_config(hidden_size=HIDDEN, intermediate_size=32, vocab_size=VOCAB, block_size=4)
WIDTH = 3 * HIDDEN
SLOTS = 512


def _rows(seed: int, count: int) -> torch.Tensor:
    return torch.randn(count, WIDTH, generator=torch.Generator().manual_seed(seed))


def _head():
    return init_head(CFG, seed=0, std=0.3)


class _SlotLane:
    def __init__(self, table: torch.Tensor, row: int, kv_len: int, root: int) -> None:
        self.slot_table, self.slot_row, self.kv_len, self.root_token = table, row, kv_len, root


def _slot_lanes(*lanes: tuple[torch.Tensor, int]) -> list[_SlotLane]:
    """Lanes of one step, (context slots, root token) each, sharing one slot table as SGLang's
    req_to_token: row b holds lane b's slots, then stale entries (slot 3) past its length."""
    table = torch.full((len(lanes) + 1, max(len(slots) for slots, _ in lanes) + 4), 3, dtype=torch.int32)
    for row, (slots, _) in enumerate(lanes):
        table[row + 1, : len(slots)] = slots
    return [_SlotLane(table, row + 1, len(slots), root) for row, (slots, root) in enumerate(lanes)]


class _CachedLane:
    def __init__(self, rows: torch.Tensor, root: int = 5) -> None:
        self.draft_cache, self._rows, self.root_token = ContextCache(), rows, root

    def tap_rows(self) -> torch.Tensor:
        return self._rows


def _write_in_chunks(pool, head, rows, slots, cuts):
    """As the worker writes: a prefill, then each verify step's committed rows."""
    for start, end in zip(cuts, cuts[1:]):
        pool.write(head, rows[start:end], torch.arange(start, end), slots[start:end])


def test_memory_is_slots_times_bytes_per_token_and_writes_stay_in_place():
    head = _head()
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    assert SlotContextPool.bytes_per_token(CFG, torch.float32) == context_bytes_per_token(CFG, torch.float32) + 1 == 513
    assert pool.nbytes() == SLOTS * 513 and pool.describe() == {"slots": SLOTS, "bytes": SLOTS * 513, "valid_slots": 0}
    keys = pool.keys.data_ptr()
    pool.write(head, _rows(0, 40), torch.arange(40), torch.arange(100, 140))
    assert pool.keys.data_ptr() == keys and pool.valid_slots() == 40


def test_a_context_gathered_from_scattered_slots_equals_a_per_request_cache():
    head = _head()
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    rows = _rows(1, 60)
    slots = torch.randperm(SLOTS - 1, generator=torch.Generator().manual_seed(2))[:60] + 1  # never the padding slot 0
    _write_in_chunks(pool, head, rows, slots, [0, 37, 40, 41, 44, 60])
    cache = ContextCache()
    cache.sync(head, rows)
    context, valid, lengths = pool.padded(head, _slot_lanes((slots, 5)))
    assert valid.all() and lengths.tolist() == [60]
    for got, want in zip(context, cache.layers):
        assert torch.allclose(got.keys, want.keys, atol=1e-5) and torch.allclose(got.values, want.values, atol=1e-5)


def test_a_request_sharing_a_cached_prefix_drafts_as_one_that_computed_it():
    """B's first 30 positions are A's slots (what a radix-cache hit hands over); B drafts, alone and
    batched with A, exactly as drafting from per-request caches of the same rows."""
    head = _head()
    torch.manual_seed(0)
    embed, lm_head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    rows_a = _rows(3, 50)
    rows_b = torch.cat([rows_a[:30], _rows(4, 15)])
    slots_a = torch.arange(1, 51)
    slots_b = torch.cat([slots_a[:30], torch.arange(300, 315)])
    _write_in_chunks(pool, head, rows_a, slots_a, [0, 48, 50])
    pool.write(head, rows_b[30:], torch.arange(30, 45), slots_b[30:])  # B's prefill: only past the hit
    pooled = HeadDrafter(head, embed, lm_head, context=pool)
    cached = HeadDrafter(head, embed, lm_head)
    got = pooled.propose(_slot_lanes((slots_a, 7), (slots_b, 9)), 3)
    want = cached.propose([_CachedLane(rows_a, 7), _CachedLane(rows_b, 9)], 3)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(pooled.propose(_slot_lanes((slots_b, 9)), 3), want[1:], atol=1e-5)
    # the control: B reading A's slots past the shared prefix (A's tokens there) drafts something else
    wrong = slots_a[:45]
    assert not torch.allclose(pooled.propose(_slot_lanes((wrong, 9)), 3), want[1:], atol=1e-3)


def test_validity_follows_writes_invalidation_and_clearing():
    head = _head()
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    slots = torch.tensor([5, 9, 11, 12])
    assert not pool.holds(slots) and pool.holds(torch.empty(0, dtype=torch.long))
    pool.write(head, _rows(5, 4), torch.arange(4), slots)
    assert pool.holds(slots) and pool.valid_slots() == 4
    pool.invalidate(torch.tensor([11]))  # the allocator freed it
    assert not pool.holds(slots) and pool.holds(slots[:2]) and pool.valid_slots() == 3
    pool.clear()  # a cache flush
    assert pool.valid_slots() == 0


def test_a_draft_pass_dispatches_the_same_ops_whatever_the_contexts_and_reads_nothing_back():
    """What a CUDA graph of the head's drafting pass needs (issue 57): for a batch size, a fixed sequence of
    kernels however long the requests' contexts, and no read of device data by the host (a strict probe
    raises at the first one). The first pass also packs the head's weights once (not counted here), and
    the shapes still follow the longest context: a graph needs the context padded to a static bucket."""
    from harness.step_probe import StepProbe

    head = _head()
    torch.manual_seed(0)
    embed, lm_head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    pool.write(head, _rows(5, 400), torch.arange(400), torch.arange(1, 401))
    drafter = HeadDrafter(head, embed, lm_head, context=pool)

    def ops(*lengths: int) -> int:
        lanes = _slot_lanes(*[(torch.arange(1, 1 + n), 5 + i) for i, n in enumerate(lengths)])
        with StepProbe(strict=True) as probe:
            drafter.propose(lanes, 3)
        return probe.take().device_ops

    ops(8)  # the one-time packing of the head's weights
    assert ops(20) == ops(200) == ops(399) > 10
    assert ops(20, 390, 7) == ops(200, 5, 60) == ops(1, 1, 1)


def test_deferred_writes_land_once_before_anything_reads_or_frees_their_slots(monkeypatch):
    """A run of native steps' writes waits and is projected in one pass: before a draft reads the pool,
    before `holds`, before a slot is freed, or when DEFERRED_WRITES_MAX are held; what is stored then is
    exactly what writing each at once stores (the projection is per row)."""
    from sglang_jetspec.core import context_pool

    head = _head()
    rows, slots = _rows(7, 40), torch.randperm(SLOTS - 1)[:40] + 1
    eager = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    _write_in_chunks(eager, head, rows, slots, [0, 30, *range(31, 41)])  # a prefill, then one row a step
    deferred = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    projections = []
    project = head.project_context
    monkeypatch.setattr(head, "project_context", lambda *a: projections.append(a[0].shape[1]) or project(*a))
    deferred.write(head, rows[:30], torch.arange(30), slots[:30])
    for i in range(30, 40):  # ten native steps: nothing projected yet
        deferred.write(head, rows[i : i + 1], torch.tensor([i]), slots[i : i + 1], defer=True)
    assert projections == [30] and deferred.deferred_rows == 10
    assert not bool(deferred.valid[slots[30:]].any())
    # a draft reads the pool: the ten rows land first, in one projection
    lanes = _slot_lanes((slots, 4))
    drafter = HeadDrafter(head, nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False), context=deferred)
    eager_drafter = HeadDrafter(head, drafter.embed_tokens, drafter.lm_head, context=eager)
    assert torch.equal(drafter.propose(lanes, 3), eager_drafter.propose(lanes, 3))
    assert projections[:2] == [30, 10] and deferred.deferred_rows == 0
    assert torch.equal(deferred.keys, eager.keys) and torch.equal(deferred.valid, eager.valid)
    # a slot freed while its write waits: written, then invalid, as if written at once
    deferred.write(head, _rows(8, 1), torch.tensor([40]), torch.tensor([SLOTS - 1]), defer=True)
    deferred.invalidate(torch.tensor([SLOTS - 1]))
    assert deferred.deferred_rows == 0 and not bool(deferred.valid[SLOTS - 1])
    # held at most DEFERRED_WRITES_MAX writes
    monkeypatch.setattr(context_pool, "DEFERRED_WRITES_MAX", 3)
    for i in range(3):
        deferred.write(head, _rows(9 + i, 1), torch.tensor([41 + i]), torch.tensor([SLOTS - 2 - i]), defer=True)
    assert deferred.deferred_rows == 0 and projections[-1] == 3
    deferred.write(head, _rows(20, 1), torch.tensor([50]), torch.tensor([SLOTS - 9]), defer=True)
    assert deferred.holds(torch.tensor([SLOTS - 9]))  # holds reads what was deferred
