"""The head's drafting pass over static buffers, replayed as a CUDA graph per (batch bucket, context
bucket, depth, tree spec).

On a GPU the pass launches ~150 kernels a step (the CPU probe counts ~190 ops, the same number whatever
the contexts: tests/test_context_pool.py); a graph replays them in one launch, but it needs every shape
fixed and every input in a buffer that stays put. So a step's lanes are padded to a batch-size bucket
(padding lanes read row 0 of the slot table with length 1; their rows are dropped) and their contexts to
a context bucket (the valid mask hides the padding, as it hides a shorter lane's already), and the slot
rows, lengths and roots go into the bucket's static buffer in one copy. The pass itself (the gather from
the context pool, the head, the draft vocabulary's logits) reads only that buffer, the slot table and the
pool, whose storages never move.

`propose_drafts` replays a pass that goes on to the top-K and every lane's marginal tree
(core.marginal_trees) and packs both for the step's one copy to the host: tree_drafting then runs the
host heap only for lanes with guesses to merge.

With `capture=False` (a CPU) the same buffers and the same function run eagerly, so the CPU tests prove
padded passes give the unpadded logits through exactly the path a replay takes.

TODO(GPU, issue 57): never captured on a GPU yet. A graph reads the draft vocabulary's lm_head rows as
they were at capture: a target weight update would need the graphs dropped (SGLang's weight updates are
not wired to the head today).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from .context_pool import SlotContextPool
from .head_drafter import HeadDrafter
from .lanes import SlotLane
from .marginal_trees import marginal_trees, pack_drafts
from .tree import TreeSpec, top_k_per_depth


def context_buckets(table_width: int, smallest: int = 256) -> tuple[int, ...]:
    """Powers of two from `smallest` below the slot table's width, then the width itself."""
    buckets, size = [], smallest
    while size < table_width:
        buckets.append(size)
        size *= 2
    return (*buckets, table_width)


@dataclass
class _Bucket:
    table: torch.Tensor
    inputs: torch.Tensor  # [3, batch]: slot-table rows, context lengths, root tokens
    length: int
    depth: int
    spec: TreeSpec | None = None  # with a spec the pass also builds the lanes' marginal trees
    graph: object | None = None  # torch.cuda.CUDAGraph once captured
    out: tuple[torch.Tensor, ...] | None = None  # the captured pass's outputs (_pass)


class DraftGraphs:
    def __init__(
        self,
        drafter: HeadDrafter,
        pool: SlotContextPool,
        batch_buckets: tuple[int, ...],
        context_buckets: tuple[int, ...],
        capture: bool,
    ) -> None:
        self.drafter, self.pool, self.capture = drafter, pool, capture
        self.batch_buckets, self.context_buckets = tuple(sorted(batch_buckets)), tuple(sorted(context_buckets))
        self._buckets: dict[tuple, _Bucket] = {}
        self._mempool = torch.cuda.graph_pool_handle() if capture else None

    @staticmethod
    def _bucket(sizes: tuple[int, ...], n: int) -> int | None:
        at = bisect.bisect_left(sizes, n)
        return sizes[at] if at < len(sizes) else None

    def propose(self, lanes: list[SlotLane], depth: int) -> torch.Tensor | None:
        """HeadDrafter.propose's logits for `lanes`, from the bucket's graph; None when no bucket holds the
        step (more lanes or a longer context than any bucket: the caller drafts eagerly)."""
        out = self._run(lanes, depth, None)
        return None if out is None else out[0][: len(lanes)]

    def propose_drafts(self, lanes: list[SlotLane], spec: TreeSpec) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The logits [B, max_depth, V] (on the device) and, on the host, the lanes' top-K and marginal
        trees packed by core.marginal_trees.pack_drafts: the pass, the top-K and the trees replay as one
        graph and come back in the step's one copy. None when no bucket holds the step."""
        out = self._run(lanes, spec.max_depth, spec)
        if out is None:
            return None
        logits, packed = out
        return logits[: len(lanes)], packed[: len(lanes)].cpu()

    def _run(self, lanes: list[SlotLane], depth: int, spec: TreeSpec | None) -> tuple[torch.Tensor, ...] | None:
        table = lanes[0].slot_table
        batch = self._bucket(self.batch_buckets, len(lanes))
        length = self._bucket(self.context_buckets, max(lane.kv_len for lane in lanes))
        if batch is None or length is None or length > table.shape[1]:
            return None
        self.pool.flush()  # deferred context writes land before the pass reads them (outside the graph)
        key = (batch, length, depth, spec)
        bucket = self._buckets.get(key)
        if bucket is None or bucket.table is not table:
            bucket = self._buckets[key] = _Bucket(
                table, torch.zeros(3, batch, dtype=torch.long, device=table.device), length, depth, spec
            )
        pad = batch - len(lanes)
        host = torch.tensor(
            [
                [lane.slot_row for lane in lanes] + [0] * pad,
                [lane.kv_len for lane in lanes] + [1] * pad,
                [lane.root_token for lane in lanes] + [0] * pad,
            ],
            dtype=torch.long,
        )
        bucket.inputs.copy_(host, non_blocking=True)
        if not self.capture:
            return self._pass(bucket)
        if bucket.graph is None:
            self._capture(bucket)
        bucket.graph.replay()
        return bucket.out

    def _pass(self, bucket: _Bucket) -> tuple[torch.Tensor, ...]:
        """The whole drafting pass from the bucket's buffer: what a graph captures. (logits,), or with a
        spec (logits, the top-K and marginal trees packed)."""
        rows, lengths, roots = bucket.inputs
        context, valid = self.pool.gather(bucket.table, rows, lengths, bucket.length)
        logits = self.drafter.block_logits(context, valid, lengths, roots, bucket.depth)
        if bucket.spec is None:
            return (logits,)
        tokens, logprobs = top_k_per_depth(logits, bucket.spec.width, self.drafter.draft_vocab)
        return logits, pack_drafts(tokens, logprobs, marginal_trees(roots, tokens, logprobs, bucket.spec))

    @torch.no_grad()
    def _capture(self, bucket: _Bucket) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: lazy packing and library set-up stay out of the graph
            for _ in range(2):
                self._pass(bucket)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            bucket.out = self._pass(bucket)
        bucket.graph = graph
