"""How JETSPEC's tensor-parallel ranks agree on every step (`--tp-size` > 1).

Every rank runs its own scheduler and JetSpecWorker over the same batches, and the target forward is
one collective computation: every rank must verify the same tree and keep the same accepted nodes,
or their KV caches part ways silently. The ranks agree this way:
- **Rank 0 drafts alone.** Tree sizing, the draft gate and the runtime policy's expiry read wall-clock
  timings, which differ between processes, so one rank decides: rank 0 runs the head (beside the full
  embedding and lm_head, gathered once from the vocabulary-parallel shards) and sends the step's plan
  (before drafting) and trees (after) to the others, two small broadcasts over the CPU group. The others
  hold no head context and do not gather the target's tap rows.
- **Every rank accepts.** The verify logits are gathered over the vocabulary on every rank, so each
  rank accepts from the same logits and trees; the generator state of each sampled request travels with
  the trees (rank 0's drafting may have drawn from it), so seeded and unseeded requests draw alike.
- **Checked every step.** A checksum of the trees (before the verify forward, so a disagreement is
  refused before it reaches the KV cache) and of the accepted tokens (before they are committed) is
  compared across ranks with one all-reduce each; a mismatch raises RankDesyncError, which stops the
  server loudly. `JETSPEC_DEBUG_PERTURB_RANK=<r>` makes rank r a `PerturbingRanks`, which alters every
  tree it receives (the fault the checks must catch; tests only).
"""

from __future__ import annotations

import os
import zlib

import torch

PERTURB_ENV = "JETSPEC_DEBUG_PERTURB_RANK"


class RankDesyncError(RuntimeError):
    pass


class SingleRank:
    """`--tp-size 1`: this rank drafts, and there is nobody to agree with."""

    size, rank, drafts = 1, 0, True

    def share(self, obj):
        return obj

    def shared_trees(self, trees: list, lanes: list) -> list:
        return trees

    def agree(self, what: str, tensors: list[torch.Tensor]) -> None:
        pass

    def full_vocab_rows(self, weight: torch.Tensor) -> torch.Tensor:
        return weight

    def gather(self, obj) -> list:
        return [obj]


class TensorParallelRanks:
    """SGLang's TP group (its GroupCoordinator): broadcasts and checks over its CPU (gloo) group."""

    def __init__(self, group) -> None:
        self.group = group
        self.size, self.rank = group.world_size, group.rank_in_group
        self.drafts = self.rank == 0

    def share(self, obj):
        """Rank 0's `obj` on every rank (what other ranks pass is ignored)."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=self.group.ranks[0], group=self.group.cpu_group)
        return box[0]

    def shared_trees(self, trees: list, lanes: list) -> list:
        """Rank 0's trees on every rank, with the generator state of each sampled request (rank 0's
        drafting may have drawn from it; acceptance draws next), checked equal before the verify."""
        states = [None if lane.params.greedy else lane.generator.get_state() for lane in lanes]
        trees, states = self.share((trees, states) if self.drafts else None)
        for lane, state in zip(lanes, states):
            if state is not None:
                lane.generator.set_state(state)
        trees = self.received_trees(trees)
        self.agree("trees", [t for tree in trees for t in (tree.tokens, tree.parents)])
        return trees

    def received_trees(self, trees: list) -> list:
        """The trees this rank verifies, as rank 0 shared them."""
        return trees

    def agree(self, what: str, tensors: list[torch.Tensor]) -> None:
        """Raise RankDesyncError unless every rank holds the same `tensors` (by checksum)."""
        checksum = 0
        for t in tensors:
            checksum = zlib.crc32(t.detach().to("cpu", torch.int64).contiguous().numpy().tobytes(), checksum)
        extremes = torch.tensor([checksum, -checksum], dtype=torch.int64)
        torch.distributed.all_reduce(extremes, op=torch.distributed.ReduceOp.MAX, group=self.group.cpu_group)
        if int(extremes[0]) != -int(extremes[1]):
            raise RankDesyncError(
                f"JETSPEC tensor-parallel ranks disagree on this step's {what} (rank {self.rank} "
                f"checksum {checksum}, highest {int(extremes[0])}, lowest {-int(extremes[1])}); "
                "stopping before the KV cache diverges"
            )

    def full_vocab_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """A vocabulary-parallel table's rows from every rank, in vocabulary order (a collective: every
        rank calls it)."""
        return self.group.all_gather(weight.detach().contiguous(), dim=0)

    def gather(self, obj) -> list:
        """Every rank's `obj`, by rank (a collective: every rank calls it, e.g. while the scheduler
        handles a request SGLang broadcast to all ranks)."""
        out = [None] * self.size
        torch.distributed.all_gather_object(out, obj, group=self.group.cpu_group)
        return out


def sglang_ranks() -> SingleRank | TensorParallelRanks:
    """This scheduler process's TP ranks, from SGLang's process groups (set up before the worker)."""
    from sglang.srt.distributed import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return SingleRank()
    perturb = os.environ.get(PERTURB_ENV, "").strip()
    if perturb and int(perturb) == group.rank_in_group:
        return PerturbingRanks(group)
    return TensorParallelRanks(group)


class PerturbingRanks(TensorParallelRanks):
    """A rank that corrupts what it receives (JETSPEC_DEBUG_PERTURB_RANK): every non-root node's token
    moved to the next vocabulary id, so the tree check must refuse the step."""

    def received_trees(self, trees: list) -> list:
        for tree in trees:
            tree.tokens[1:] += 1
        return trees
