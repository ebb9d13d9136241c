"""adapter/tensor_parallel.py over two real gloo processes: rank 0's object reaches rank 1, tables gather
in vocabulary order, and a checksum mismatch on one rank raises on both."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_jetspec.adapter.tensor_parallel import PerturbingRanks, RankDesyncError, TensorParallelRanks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    group = SimpleNamespace(
        world_size=2,
        rank_in_group=rank,
        ranks=[0, 1],
        cpu_group=dist.group.WORLD,
        all_gather=lambda t, dim: torch.cat([x for x in _all_gather(t)], dim=dim),
    )
    ranks = TensorParallelRanks(group)
    out = {"drafts": ranks.drafts}
    out["shared"] = ranks.share({"from": rank, "tree": torch.tensor([5, 6, 7])} if rank == 0 else "ignored")
    out["gathered"] = ranks.gather(rank * 10)
    out["table"] = ranks.full_vocab_rows(torch.full((2, 3), float(rank)))
    ranks.agree("equal tensors", [torch.tensor([1, 2, 3])])  # no error
    try:
        ranks.agree("trees", [torch.tensor([1, 2, 3 + rank])])
        out["desync"] = None
    except RankDesyncError as exc:
        out["desync"] = str(exc)
    results[rank] = out
    dist.destroy_process_group()


def _all_gather(t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(2)]
    dist.all_gather(parts, t)
    return parts


def test_two_gloo_ranks_share_gather_and_detect_a_desync():
    results = mp.Manager().dict()
    mp.start_processes(_rank, args=(_free_port(), results), nprocs=2, start_method="fork")
    r0, r1 = results[0], results[1]
    assert (r0["drafts"], r1["drafts"]) == (True, False)
    assert r1["shared"]["from"] == 0 and torch.equal(r1["shared"]["tree"], torch.tensor([5, 6, 7]))
    assert r0["gathered"] == r1["gathered"] == [0, 10]
    assert torch.equal(r1["table"], torch.tensor([[0.0] * 3] * 2 + [[1.0] * 3] * 2))  # rank 0's rows first
    for r in (r0, r1):  # both ranks refuse, not only the odd one out
        assert "ranks disagree on this step's trees" in r["desync"]


def test_the_debug_perturbation_moves_every_non_root_token_and_only_on_the_named_rank(monkeypatch):
    tree = SimpleNamespace(tokens=torch.tensor([9, 4, 4, 7]))
    group = SimpleNamespace(world_size=2, rank_in_group=1)
    assert TensorParallelRanks(group).received_trees([tree])[0].tokens.tolist() == [9, 4, 4, 7]
    PerturbingRanks(group).received_trees([tree])
    assert tree.tokens.tolist() == [9, 5, 5, 8]
    from sglang_jetspec.adapter import tensor_parallel

    monkeypatch.setattr("sglang.srt.distributed.get_tp_group", lambda: group)
    for perturb, kind in (("1", PerturbingRanks), ("0", TensorParallelRanks), ("", TensorParallelRanks)):
        monkeypatch.setenv(tensor_parallel.PERTURB_ENV, perturb)
        assert type(tensor_parallel.sglang_ranks()) is kind
