"""Memory a reference-engine request holds for the head stays proportional to what the head needs.

Per request: the projected context K/V, 2 x head layers x KV heads x head_dim x dtype bytes per
context token (`context_bytes_per_token`), in buffers grown by doubling (<= 2 x the context). A step
appends in place: it never copies the whole context, and one lane drafts straight from its cache's
buffers. (The SGLang worker keeps the same K/V per KV slot: tests/test_context_pool.py.)
"""

from __future__ import annotations

import torch
from torch import nn

from sglang_jetspec.core.context_cache import ContextCache
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.head_io import init_head
from tests.builders import tiny_head_config

HIDDEN, TAPS, VOCAB = 64, 3, 50
WIDTH = TAPS * HIDDEN  # a tap row: 192 floats; a context token: 2 x 1 x 2 x 16 = 64 floats
CFG = tiny_head_config(hidden_size=HIDDEN, num_hidden_layers=1, intermediate_size=32, vocab_size=VOCAB, block_size=4)
PER_TOKEN = 2 * CFG.num_hidden_layers * CFG.num_key_value_heads * CFG.head_dim * 4  # K and V, float32


def test_the_per_token_formula():
    from sglang_jetspec.core.context_cache import context_bytes_per_token

    assert context_bytes_per_token(CFG, torch.float32) == PER_TOKEN == 256
    assert context_bytes_per_token(CFG, torch.bfloat16) == PER_TOKEN // 2


def _drafter(seed: int = 0) -> HeadDrafter:
    torch.manual_seed(seed)
    return HeadDrafter(
        init_head(CFG, seed=seed, std=0.3), nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    )


def _rows(first: int, count: int) -> torch.Tensor:
    return torch.randn(count, WIDTH, generator=torch.Generator().manual_seed(first))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def test_a_step_appends_the_context_in_place():
    head = _drafter().head
    rows = _rows(0, 1200)
    cache = ContextCache()
    cache.sync(head, rows[:500])
    cache.sync(head, rows[:503])  # the first append doubles the buffers: room up to 1000
    keys, values = cache.layers[0].keys.data_ptr(), cache.layers[0].values.data_ptr()
    prefix = cache.layers[0].keys[:, :, :503].clone()
    for end in range(506, 1001, 3):
        cache.sync(head, rows[:end])
        assert cache.layers[0].keys.data_ptr() == keys and cache.layers[0].values.data_ptr() == values
    cache.sync(head, rows[:1000])
    assert torch.equal(cache.layers[0].keys[:, :, :503], prefix)  # old positions untouched
    assert _storage(cache.layers[0].keys) == 1000 * PER_TOKEN // 2  # room for 1000 positions, not more
    cache.sync(head, rows)  # past capacity: one doubling
    assert _storage(cache.layers[0].keys) == 2000 * PER_TOKEN // 2 and cache.layers[0].keys.data_ptr() != keys
    full = head.project_context(rows.unsqueeze(0), torch.arange(1200).unsqueeze(0))
    for mine, ref in zip(cache.layers, full):
        assert torch.allclose(mine.keys, ref.keys, atol=1e-5) and torch.allclose(mine.values, ref.values, atol=1e-5)


class _Lane:
    """A reference-engine-like lane: its own cache synced from its rows."""

    def __init__(self, rows: torch.Tensor, root: int) -> None:
        self.draft_cache, self._rows, self.root_token = ContextCache(), rows, root

    def tap_rows(self) -> torch.Tensor:
        return self._rows


def test_drafting_does_not_copy_a_single_lanes_context_and_reuses_the_batch_padding():
    drafter = _drafter()
    a, b = _Lane(_rows(0, 40), 3), _Lane(_rows(1, 25), 4)
    context, valid, lengths = drafter.context.padded(drafter.head, [a])
    assert context[0].keys.data_ptr() == a.draft_cache.layers[0].keys.data_ptr()  # its own buffer, no copy
    assert valid.all() and lengths.tolist() == [40]

    first, _, _ = drafter.context.padded(drafter.head, [a, b])
    a._rows, b._rows = torch.cat([a._rows, _rows(2, 2)]), torch.cat([b._rows, _rows(3, 3)])
    second, valid, lengths = drafter.context.padded(drafter.head, [a, b])  # the first step's context still alive
    assert second[0].keys.untyped_storage().data_ptr() == first[0].keys.untyped_storage().data_ptr()
    assert lengths.tolist() == [42, 28] and valid.sum(1).tolist() == [42, 28]
    assert torch.equal(second[0].keys[1, :, :28], b.draft_cache.layers[0].keys[0])
    assert not second[0].keys[1, :, 28:].any() and not second[0].values[1, :, 28:].any()  # padding is zero

    batched = drafter.propose([a, b], 3)
    alone = torch.cat([drafter.propose([a], 3), drafter.propose([b], 3)])
    assert torch.allclose(batched, alone, atol=1e-5)
