"""An oracle drafter: the target's own logits along a known continuation, as draft.

Given the continuation the target produces greedily, depth d of a draft at committed length c uses
the target's logits at sequence position c-2+d of prompt+continuation (teacher forcing). Its top-1
token is always the target's next greedy token, so trees are accepted as deep as they reach: the
engine's deep-accept, bonus and KV-compaction paths run on every step.
"""

from __future__ import annotations

import torch

from .target import Segment, TargetModel


class OracleDrafter:
    def __init__(self, target: TargetModel, max_depth: int = 15) -> None:
        self.target = target
        self.max_depth = max_depth
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}

    def add_reference(self, prompt_ids: list[int], continuation: list[int]) -> None:
        """Score prompt+continuation once; its logits drive the drafts for requests with this prompt."""
        full = prompt_ids + continuation
        cache = self.target.new_cache(lanes=1, capacity=len(full))
        out = self.target.forward(cache, [Segment.chain(full, 0)])
        self._logits[tuple(prompt_ids)] = self.target.logits(out.hidden[0])

    def propose(self, lanes, depth: int) -> torch.Tensor:
        vocab = self.target.info.vocab_size
        out = torch.zeros(len(lanes), depth, vocab)
        for b, lane in enumerate(lanes):
            table = self._logits.get(tuple(lane.request.prompt_ids))
            if table is None:
                continue
            start = len(lane.committed_ids) - 1  # logits at position c-1 predict depth 1
            rows = table[start : start + depth]
            out[b, : rows.shape[0]] = rows
        return out
