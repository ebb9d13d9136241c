"""The engine's bookkeeping invariants, checked after every step when EngineConfig.check_invariants is set."""

from __future__ import annotations

from .kv_cache import SlotKVCache


class InvariantError(AssertionError):
    pass


def check_invariants(cache: SlotKVCache, lanes: list) -> None:
    """Per running lane: kv_len == tap rows == committed_len - 1, and no slot past kv_len holds state."""
    if cache.lanes != len(lanes):
        raise InvariantError(f"cache has {cache.lanes} lanes for {len(lanes)} running requests")
    for b, lane in enumerate(lanes):
        kv_len, committed = int(cache.lengths[b]), len(lane.committed_ids)
        if kv_len != committed - 1:
            raise InvariantError(f"lane {b}: kv_len {kv_len} != committed_len - 1 = {committed - 1}")
        if lane.tap_rows().shape[0] not in (0, kv_len):
            raise InvariantError(f"lane {b}: {lane.tap_rows().shape[0]} tapped rows for kv_len {kv_len}")
        for layer in cache.layers:
            if layer.keys[b, :, kv_len:].abs().sum() or layer.values[b, :, kv_len:].abs().sum():
                raise InvariantError(f"lane {b}: state left in slots past kv_len {kv_len} (rejected nodes not cleared)")
