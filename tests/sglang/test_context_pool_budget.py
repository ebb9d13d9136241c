"""The head's context pool beside SGLang's KV pool (adapter/context_pool_memory.py): its bytes per token join
the KV cell SGLang divides its memory budget by, it is allocated one entry per target slot, a pool that
cannot be allocated is a start-up error naming the flags, and slots the allocator frees lose their
context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.adapter import context_pool_memory as adapter_pool
from sglang_jetspec.core import context_pool as core_pool
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.head_io import read_head_config


def _kvc(draft=False, dflash=False):
    return SimpleNamespace(
        is_draft_worker=draft,
        model_dtype=torch.bfloat16,
        spec_algorithm=SimpleNamespace(is_dflash_family=lambda: dflash),
        dflash_draft_cell_size_per_token=None,
    )


def test_sglangs_kv_cell_counts_the_context_pool_for_jetspec_only(jetspec_registered, head_dir, monkeypatch):
    from sglang.srt import runtime_context
    from sglang.srt.model_executor import pool_configurator
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()
    per_token = SlotContextPool.bytes_per_token(read_head_config(head_dir), torch.bfloat16)
    assert per_token == 2 * 1 * 3 * 64 * 2 + 1  # K and V, 1 head layer, 3 KV heads, head_dim 64, bf16; + valid
    spec = SimpleNamespace(speculative_algorithm="JETSPEC", speculative_draft_model_path=str(head_dir))
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    assert pool_configurator._dflash_draft_cell_size(_kvc()) == per_token
    assert pool_configurator._dflash_draft_cell_size(_kvc(draft=True)) == 0
    spec.speculative_algorithm = "NGRAM"
    assert pool_configurator._dflash_draft_cell_size(_kvc()) == 0


class _Allocator:
    def __init__(self, size):
        self.size, self.page_size, self.freed = size, 1, []

    def free(self, index):
        self.freed.append(index)


def test_the_pool_has_a_slot_per_target_slot_and_freeing_a_slot_forgets_its_context(head_dir):
    cfg = read_head_config(head_dir)
    allocator = _Allocator(100)
    pool = adapter_pool.allocate_context_pool(cfg, allocator, torch.float32, "cpu")
    assert pool.num_slots == 101  # slot 0 is SGLang's padding slot
    pool.valid[torch.tensor([3, 4, 5])] = True
    allocator.free(torch.tensor([4, 5]))
    assert pool.valid.nonzero().flatten().tolist() == [3]
    assert [t.tolist() for t in allocator.freed] == [[4, 5]]  # and the allocator freed them as before


def test_a_pool_that_cannot_be_allocated_names_the_flags(head_dir, monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(
        core_pool,
        "SlotContextPool",
        type("NoRoom", (), {"__init__": no_memory, "bytes_per_token": staticmethod(lambda *a: 1537)}),
    )
    with pytest.raises(RuntimeError, match="Lower --mem-fraction-static or --max-total-tokens"):
        adapter_pool.allocate_context_pool(read_head_config(head_dir), _Allocator(1000), torch.float32, "cpu")
