"""The slot KV cache's storage: one tensor for all layers, layer views that follow every reallocation,
and the single-lane write path equal to the general one."""

import torch

from sglang_jetspec.reference.kv_cache import SlotKVCache

LAYERS, HEADS, DIM = 3, 2, 4


def written(cache: SlotKVCache, rows: int, seed: int) -> list[torch.Tensor]:
    """Write `rows` new random keys (values = -keys) into every layer; returns each layer's keys."""
    cache.prepare_write(rows)
    generator = torch.Generator().manual_seed(seed)
    new = [torch.randn(cache.lanes, HEADS, rows, DIM, generator=generator) for _ in range(LAYERS)]
    for layer, keys in zip(cache.layers, new):
        layer.update(keys, -keys)
    return new


def test_layer_views_share_the_one_tensor_through_grow_keep_and_add():
    cache = SlotKVCache(LAYERS, lanes=1, capacity=4)
    written(cache, 3, 0)
    cache.commit(0, [0, 1, 2])
    cache.prepare_write(6)  # past capacity: grows
    assert cache.capacity >= 9
    other = SlotKVCache(LAYERS, lanes=1, capacity=4)
    keys = written(other, 2, 1)
    other.commit(0, [0, 1])
    cache.add_lane(other)
    cache.keep_lanes([1])
    for i, layer in enumerate(cache.layers):
        assert layer.keys.data_ptr() == cache.all_keys[i].data_ptr()
        k, v = cache.lane_kv(0, i)
        assert torch.equal(k, keys[i][0]) and torch.equal(v, -keys[i][0])


def test_commit_moves_every_layer_and_clears_the_rest():
    cache = SlotKVCache(LAYERS, lanes=1, capacity=16)
    keys = written(cache, 5, 2)
    cache.commit(0, [0, 2, 4])
    for i in range(LAYERS):
        k, v = cache.lane_kv(0, i)
        assert torch.equal(k, keys[i][0][:, [0, 2, 4]]) and torch.equal(v, -keys[i][0][:, [0, 2, 4]])
        assert not cache.all_keys[i, 0, :, 3:].any() and not cache.all_values[i, 0, :, 3:].any()


def test_one_lane_writes_equal_the_indexed_path_of_several_lanes():
    single = SlotKVCache(LAYERS, lanes=1, capacity=8)
    pair = SlotKVCache(LAYERS, lanes=2, capacity=8)
    keys = written(single, 3, 3)
    pair.prepare_write(3)
    for layer, k in zip(pair.layers, keys):
        layer.update(torch.cat([k, 2 * k]), torch.cat([-k, -2 * k]))
    for i in range(LAYERS):
        assert torch.equal(pair.all_keys[i, 0], single.all_keys[i, 0])
        assert torch.equal(pair.all_keys[i, 1, :, :3], 2 * keys[i][0])
