"""The memory of the head's context pool beside SGLang's KV pool: sized with it, allocated with it, freed with it.

- Budget (AFTER `pool_configurator._dflash_draft_cell_size`, the bytes per token a DFLASH draft pool
  adds to the target's KV cell): JETSPEC's cell gains the pool's bytes per token, so
  `--mem-fraction-static` sizes both pools together, as SGLang sizes a draft model's KV pool.
- Allocation, once the target's pools exist: one entry per slot of the target's token-to-KV pool; a
  pool that does not fit is a start-up error naming the flags that shrink it.
- Freeing: slots the allocator frees (finished requests, rejected reservations, radix-cache
  evictions) lose their context at once, so a slot is valid only while it holds the token whose
  context was written (core.context_pool).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by registration in every SGLang process: nothing heavy at module level
    import torch

    from sglang_jetspec.core.context_pool import SlotContextPool
    from sglang_jetspec.core.head_config import HeadConfig

log = logging.getLogger(__name__)

CELL_SIZE_TARGET = "sglang.srt.model_executor.pool_configurator._dflash_draft_cell_size"


def after_dflash_draft_cell_size(result, kvc, *args, **kwargs):
    from sglang.srt.runtime_context import get_spec

    from sglang_jetspec.core.context_pool import SlotContextPool
    from sglang_jetspec.core.head_io import read_head_config

    spec = get_spec()
    if kvc.is_draft_worker or spec.speculative_algorithm != "JETSPEC":
        return result
    head = read_head_config(spec.speculative_draft_model_path)
    return result + SlotContextPool.bytes_per_token(head, kvc.model_dtype)


def allocate_context_pool(cfg: HeadConfig, allocator, dtype: torch.dtype, device) -> SlotContextPool:
    import torch

    from sglang_jetspec.core.context_pool import SlotContextPool

    num_slots = allocator.size + allocator.page_size  # as the target's KV buffers: slot 0 is the padding slot
    per_token = SlotContextPool.bytes_per_token(cfg, dtype)
    try:
        pool = SlotContextPool(cfg, num_slots, dtype, device)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        raise RuntimeError(
            f"JETSPEC cannot allocate the head's context pool ({num_slots} slots x {per_token} bytes = "
            f"{num_slots * per_token / 2**20:.1f} MiB beside the target's KV pool): {exc}. Lower "
            "--mem-fraction-static or --max-total-tokens so both pools fit"
        ) from exc
    log.info(
        "JETSPEC context pool: %d slots x %d bytes = %.1f MiB (the target's KV slots)",
        num_slots,
        per_token,
        pool.nbytes() / 2**20,
    )
    free = allocator.free

    def free_with_context(free_index) -> None:
        if free_index.numel():
            pool.invalidate(free_index)
        free(free_index)

    allocator.free = free_with_context  # this instance only: the target's allocator, which the worker shares
    return pool
