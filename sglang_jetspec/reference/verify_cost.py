"""The target's verify cost by node count, measured on this machine for adaptive tree sizing.

One forward (and its logits) over n new tokens after a `context`-token prefix, for each n, the best
of `repeats` runs; the prefix's KV stays, every measured write is dropped again. About 15 forwards:
a few seconds on a CPU, once per engine.
"""

from __future__ import annotations

import time
from weakref import WeakKeyDictionary

import torch

from ..core.tree_drafting import settled_clock
from ..core.tree_sizing import VerifyCost, relative_costs
from .target import Segment, TargetModel

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)


@torch.inference_mode()  # as the engine's steps run: the same per-op cost
def measure_verify_cost(
    target: TargetModel,
    taps: tuple[int, ...] = (),
    context: int = 256,
    node_counts: tuple[int, ...] = NODE_COUNTS,
    repeats: int = 2,
) -> VerifyCost:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, target.info.vocab_size, (context + max(node_counts),), generator=generator).tolist()
    cache = target.new_cache(lanes=1, capacity=len(ids) + 1)
    target.forward(cache, [Segment.chain(ids[:context], 0)], taps)
    cache.commit(0, list(range(context)))
    seconds = {}
    for n in node_counts:
        runs = []
        for _ in range(repeats + 1):  # the first run of each size warms allocations up
            start = time.perf_counter()
            out = target.forward(cache, [Segment.chain(ids[context : context + n], context)], taps)
            runs.append(settled_clock(target.logits(out.hidden)) - start)
            cache.commit(0, [])
        seconds[n] = min(runs[1:])
    return relative_costs(seconds)


_MEASURED: WeakKeyDictionary = WeakKeyDictionary()


def verify_cost(target: TargetModel, taps: tuple[int, ...] = ()) -> VerifyCost:
    """The target's measured VerifyCost, measured once per target object (engines and bench cells share it)."""
    if target not in _MEASURED:
        _MEASURED[target] = measure_verify_cost(target, taps)
    return _MEASURED[target]
