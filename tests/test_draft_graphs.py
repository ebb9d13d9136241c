"""The head's drafting pass over static buckets (core.draft_graphs), run eagerly as on a CPU: through the
exact path a CUDA graph replays, padded lanes and contexts give the unpadded logits, a bucket's buffer
stays put from step to step, and the pass reads nothing back to the host. The capture itself needs a GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.step_probe import StepProbe
from sglang_jetspec.core import tree_drafting
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.draft_graphs import DraftGraphs, context_buckets
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.marginal_trees import unpack_drafts
from sglang_jetspec.core.tree import TreeSpec, build_tree, host_top_k, top_k_per_depth, tree_from_candidates
from sglang_jetspec.core.tree_drafting import draft_trees
from tests.test_context_pool import CFG, HIDDEN, SLOTS, VOCAB, _head, _rows, _slot_lanes


def _drafter():
    head = _head()
    torch.manual_seed(0)
    embed, lm_head = nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)
    pool = SlotContextPool(CFG, SLOTS, torch.float32, "cpu")
    pool.write(head, _rows(5, 400), torch.arange(400), torch.arange(1, 401))
    return HeadDrafter(head, embed, lm_head, context=pool), pool


TABLE = torch.full((9, 500), 3, dtype=torch.int32)  # the slot table (SGLang's req_to_token): one for every step


def _lanes(*lengths: int):
    """Lanes over TABLE: lane i (row 1 + i) holds slots 1 + i .. length + i."""
    lanes = _slot_lanes(*[(torch.arange(1 + i, 1 + i + n), 7 + i) for i, n in enumerate(lengths)])
    rows = lanes[0].slot_table
    TABLE[: rows.shape[0]] = 3
    TABLE[: rows.shape[0], : rows.shape[1]] = rows
    for lane in lanes:
        lane.slot_table = TABLE
    return lanes


def test_context_buckets_double_up_to_the_slot_tables_width():
    assert context_buckets(1000) == (256, 512, 1000)
    assert context_buckets(4100, smallest=1024) == (1024, 2048, 4096, 4100)
    assert context_buckets(100) == (100,)


def test_padded_buckets_give_the_unpadded_drafts():
    drafter, pool = _drafter()
    graphs = DraftGraphs(drafter, pool, (1, 2, 4, 8), context_buckets(500, smallest=64), capture=False)
    for lengths in [(20,), (63,), (64,), (65, 3), (200, 5, 390), (9, 9, 9, 9, 9)]:
        lanes = _lanes(*lengths)
        want = drafter.propose(lanes, 3)  # no graphs set on the drafter: the eager pass
        got = graphs.propose(lanes, 3)
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5), lengths
    # the control: a lane whose root differs drafts something else through the same bucket
    other = _lanes(20)
    other[0].root_token = 11
    assert not torch.allclose(graphs.propose(other, 3), drafter.propose(_lanes(20), 3), atol=1e-3)


def test_a_step_no_bucket_holds_is_left_to_the_eager_pass():
    drafter, pool = _drafter()
    graphs = DraftGraphs(drafter, pool, (1, 2), context_buckets(500, smallest=64), capture=False)
    assert graphs.propose(_lanes(5, 5, 5), 3) is None  # more lanes than the largest batch bucket
    narrow = DraftGraphs(drafter, pool, (1, 2), (64, 128), capture=False)
    assert narrow.propose(_lanes(200), 3) is None  # a context longer than every bucket
    want = drafter.propose(_lanes(200), 3)
    drafter.graphs = narrow  # as the worker sets it: the drafter falls back to its eager pass
    assert torch.allclose(drafter.propose(_lanes(200), 3), want)
    drafter.graphs = graphs
    assert torch.allclose(drafter.propose(_lanes(30), 3), graphs.propose(_lanes(30), 3))


def test_a_buckets_buffer_stays_put_and_its_pass_reads_nothing_back():
    drafter, pool = _drafter()
    graphs = DraftGraphs(drafter, pool, (4,), (256,), capture=False)
    graphs.propose(_lanes(10, 20), 3)
    (bucket,) = graphs._buckets.values()
    storage, shape = bucket.inputs.data_ptr(), bucket.inputs.shape
    graphs.propose(_lanes(200, 3, 40), 3)  # other lanes, lengths and roots: the same bucket
    assert len(graphs._buckets) == 1 and next(iter(graphs._buckets.values())) is bucket
    assert (bucket.inputs.data_ptr(), bucket.inputs.shape) == (storage, shape)
    assert bucket.inputs[1].tolist() == [200, 3, 40, 1]  # the padding lane: row 0, length 1
    graphs._pass(bucket)  # the head's weights packed once, outside what is counted
    counts = []
    for lanes in (_lanes(10, 20), _lanes(250, 1, 7)):
        bucket.inputs.copy_(torch.tensor([[1, 2, 0, 0], [len(lanes), 5, 1, 1], [7, 8, 0, 0]]))
        with StepProbe(strict=True) as probe:  # raises at the first host read of device data
            graphs._pass(bucket)
        counts.append(probe.take().device_ops)
    assert counts[0] == counts[1] > 10


def _host_trees(drafter, lanes, spec):
    """The eager path's trees: the pass, the top-K copied to the host, the heap per lane."""
    tokens, logprobs = host_top_k(
        *top_k_per_depth(drafter.propose(lanes, spec.max_depth), spec.width, drafter.draft_vocab)
    )
    return [build_tree(lane.root_token, tokens[b], logprobs[b], spec) for b, lane in enumerate(lanes)]


def _same_tree(a, b) -> bool:
    fields = ("tokens", "parents", "depths", "ranks")
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in fields) and torch.allclose(
        a.cum_logprobs, b.cum_logprobs
    )


@pytest.mark.parametrize("fanout", ["uniform", "top2gap"])
@pytest.mark.parametrize("draft_vocab", [None, torch.arange(3, 50, 2)], ids=["full-vocab", "draft-vocab"])
def test_a_replayed_pass_builds_the_heaps_trees_and_ships_them_in_one_copy(fanout, draft_vocab, monkeypatch):
    """The graph's pass takes the top-K and builds every lane's marginal tree on the device (core.marginal_trees);
    unpacked from its one host copy, the padded bucket's lanes hold the trees the host heap builds from the eager
    pass, and a tree step through draft_trees reads device data once, as the eager step does."""
    drafter, pool = _drafter()
    if draft_vocab is not None:
        drafter = HeadDrafter(drafter.head, drafter.embed_tokens, drafter.lm_head, draft_vocab, context=pool)
    spec = TreeSpec(budget=9, max_depth=3, width=4, fanout=fanout)
    graphs = DraftGraphs(drafter, pool, (1, 4), context_buckets(500, smallest=64), capture=False)
    for lengths in [(20,), (65, 3, 200)]:  # the second pads a lane
        lanes = _lanes(*lengths)
        logits, packed = graphs.propose_drafts(lanes, spec)
        assert packed.device.type == "cpu" and logits.shape[0] == len(lanes)
        tokens, logprobs, trees = unpack_drafts(packed, spec.max_depth, spec.width)
        want = _host_trees(drafter, lanes, spec)
        got = trees.trees()
        assert all(_same_tree(g, w) for g, w in zip(got, want)) and len(got) == len(lanes), lengths
        assert max(t.size for t in got) == spec.budget  # the trees are full: the comparison means something
        assert set(tokens.flatten().tolist()) <= set(range(50) if draft_vocab is None else draft_vocab.tolist())

    lanes = _lanes(30, 90)
    eager, _ = draft_trees(drafter, lanes, spec)
    drafter.graphs = graphs
    bucket = graphs._buckets[next(iter(graphs._buckets))]
    graphs._pass(bucket)  # packing set-up outside what is counted
    with StepProbe(strict=True):  # what a graph captures: the pass, the top-K and the trees read nothing back
        graphs._pass(bucket)
    heaps = _count_heaps(monkeypatch)
    with StepProbe() as probe:
        replayed, _ = draft_trees(drafter, lanes, spec)
    assert probe.take().host_syncs == 1  # the packed copy alone
    assert heaps == []  # no lane went through the host heap
    assert all(_same_tree(g, w) for g, w in zip(replayed, eager))


def _count_heaps(monkeypatch) -> list:
    """The roots of the trees tree_drafting builds on the host from here on."""
    built = []

    def counted(root, *args, **kwargs):
        built.append(root)
        return tree_from_candidates(root, *args, **kwargs)

    monkeypatch.setattr(tree_drafting, "tree_from_candidates", counted)
    return built


def test_a_lane_with_guesses_rebuilds_its_tree_on_the_host_from_the_same_copy(monkeypatch):
    """A lane with a chain to merge (a grammar's forced tokens here, lookups alike) takes the heap over the
    shipped top-K; the lane beside it keeps the device's tree. The control: the forced lane's tree differs."""
    drafter, pool = _drafter()
    spec = TreeSpec(budget=9, max_depth=3, width=4)
    lanes = _lanes(30, 90)
    forced = [[], [41, 42]]
    eager, _ = draft_trees(drafter, lanes, spec, forced=forced)
    drafter.graphs = DraftGraphs(drafter, pool, (2,), (256,), capture=False)
    heaps = _count_heaps(monkeypatch)
    replayed, _ = draft_trees(drafter, lanes, spec, forced=forced)
    assert heaps == [lanes[1].root_token]  # the forced lane alone went through the heap
    assert all(_same_tree(g, w) for g, w in zip(replayed, eager))
    assert 41 in replayed[1].tokens.tolist()
    assert not _same_tree(replayed[1], draft_trees(drafter, lanes, spec)[0][1])
