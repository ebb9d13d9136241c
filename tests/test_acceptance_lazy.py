"""Sampled acceptance processes only the nodes its walk visits (the residual rule), or every node once in
bounded chunks (sample-then-match), and never sorts the whole vocabulary where top-k / top-p bound the
candidates, while staying exactly what the full computation gives.

A [B, N, V] distribution is GBs at B=24, N=32, V=152k; these tests count what gets processed
(rows through `processed_probs`, sorts, top-k widths) instead of measuring memory.
"""

from __future__ import annotations

import pytest
import torch

from sglang_jetspec.core import acceptance, sampling
from sglang_jetspec.core.acceptance import accept_batch, sample_from_probs
from sglang_jetspec.core.sampling import SamplingParams, make_generator, processed_probs
from sglang_jetspec.core.tree import TreeSpec, build_tree, top_k_per_depth

VOCAB = 300


def full_sort_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The processing as it was before: sort the whole vocabulary, mask, scatter back, renormalise."""
    logits = logits.float()
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_k == -1 and params.top_p >= 1.0 and params.min_p <= 0.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.top_k > 0:
        keep[..., params.top_k :] = False
    if params.top_p < 1.0:
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        keep &= mass_before <= params.top_p
    if params.min_p > 0.0:
        keep &= sorted_probs >= sorted_probs[..., :1] * params.min_p
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return filtered / filtered.sum(-1, keepdim=True)


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=0.7, top_p=0.999),
    SamplingParams(temperature=1.3, top_k=3),
    SamplingParams(temperature=1.3, top_k=2000),
    SamplingParams(temperature=1.0, min_p=0.15),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.6, top_p=0.95, min_p=0.01),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-p{p.top_p}-k{p.top_k}-m{p.min_p}")
@pytest.mark.parametrize("vocab, scale", [(VOCAB, 2.0), (50_000, 4.0), (50_000, 0.3)], ids=["small", "peaked", "flat"])
def test_processed_probs_equal_the_full_sort(params, vocab, scale):
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab + int(scale * 10))) * scale
    assert torch.equal(processed_probs(logits, params), full_sort_probs(logits, params))


def test_top_k_top_p_min_p_never_sort_the_vocabulary(monkeypatch):
    vocab = 50_000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1)) * 4.0  # top_p 0.9 within ~100 tokens
    want = {p: full_sort_probs(logits, p) for p in PARAMS[1:]}
    widths: list[int] = []
    topk = torch.Tensor.topk

    def recording_topk(self, k, *args, **kwargs):
        widths.append(int(k))
        return topk(self, k, *args, **kwargs)

    def no_sort(*args, **kwargs):
        raise AssertionError("a full vocabulary sort")

    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "argsort", no_sort)
    monkeypatch.setattr(torch, "sort", no_sort)
    monkeypatch.setattr(torch.Tensor, "topk", recording_topk)
    for params in [
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=3),
        SamplingParams(temperature=1.0, min_p=0.15),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05),
    ]:
        widths.clear()
        assert torch.equal(processed_probs(logits, params), want[params])
        assert all(w <= (params.top_k if params.top_k > 0 else sampling.TOP_P_FIRST_CANDIDATES) for w in widths)


def _batch(seed: int, batch: int = 6, width: int = 3, budget: int = 16, depth: int = 5):
    """Random trees over VOCAB tokens, and target logits that favour each node's first child so the
    walks go deep (and sometimes stop early)."""
    gen = torch.Generator().manual_seed(seed)
    trees = []
    for _ in range(batch):
        tokens, logprobs = top_k_per_depth(torch.randn(depth, VOCAB, generator=gen), width)
        trees.append(
            build_tree(
                int(torch.randint(VOCAB, (1,), generator=gen)),
                tokens,
                logprobs,
                TreeSpec(budget=budget, max_depth=depth, width=width),
            )
        )
    n = max(t.size for t in trees)
    logits = torch.randn(batch, n, VOCAB, generator=gen)
    for b, tree in enumerate(trees):
        for node, children in enumerate(tree.children()):
            if children:
                logits[b, node, int(tree.tokens[children[0]])] += 7.0
    return trees, logits


MIXED = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(),  # greedy
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=1.2, top_k=5, min_p=0.02),
    SamplingParams(temperature=0.8, top_p=0.9),
]


def test_residual_walks_process_only_visited_nodes(monkeypatch):
    calls: list[int] = []

    def counting(logits, params):
        calls.append(logits.shape[:-1].numel())
        return processed_probs(logits, params)

    monkeypatch.setattr(acceptance, "processed_probs", counting)
    visited = deepest = 0
    for seed in range(5):
        trees, logits = _batch(seed)
        generators = [make_generator(seed * 10 + b) for b in range(len(trees))]
        results = accept_batch(trees, logits, MIXED, generators, "residual")
        sampled = [r for r, p in zip(results, MIXED) if not p.greedy]
        visited += sum(len(r.path) for r in sampled)  # the walk processes each node of its path once
        deepest = max(deepest, max(len(r.path) for r in sampled))
    assert deepest >= 3  # the walks went below the root
    assert sum(calls) == visited  # not B x N per step
    assert max(calls) <= sum(not p.greedy for p in MIXED)  # never more than one row per request at a time


def test_match_draws_every_node_once_in_bounded_chunks(monkeypatch):
    """Sample-then-match draws at every node of every sampled tree in one pass (one copy to the host a
    step, not one per depth), in chunks of at most SAMPLED_ELEMENTS_PER_CHUNK rows x vocabulary."""
    calls: list[int] = []

    def counting(logits, params, candidates=sampling.TOP_P_FIRST_CANDIDATES):
        calls.append(logits.shape[:-1].numel())
        return sampling.kept_candidates(logits, params, candidates)

    monkeypatch.setattr(acceptance, "kept_candidates", counting)
    monkeypatch.setattr(acceptance, "SAMPLED_ELEMENTS_PER_CHUNK", 4 * VOCAB)  # 4 rows a chunk
    nodes = 0
    for seed in range(5):
        trees, logits = _batch(seed)
        accept_batch(trees, logits, MIXED, [make_generator(seed * 10 + b) for b in range(len(trees))], "match")
        nodes += sum(t.size for t, p in zip(trees, MIXED) if not p.greedy)
    assert sum(calls) == nodes and max(calls) <= 4


def test_top_p_past_the_first_candidates_is_redone_exactly_for_those_rows_alone(monkeypatch):
    """A flat distribution over a large vocabulary puts top-p's mass past the first candidates: those
    rows' draws are discarded and redone from their exact distribution, matching the full sort; rows
    whose mass the candidates held keep their draws (nothing else is redone)."""
    redone: list[int] = []

    def counting(logits, params):
        redone.append(logits.shape[:-1].numel())
        return sampling.processed_probs(logits, params)

    monkeypatch.setattr(acceptance, "processed_probs", counting)
    trees, logits = _batch(1)
    flat = torch.cat([logits, torch.zeros(*logits.shape[:2], 4 * sampling.TOP_P_FIRST_CANDIDATES)], -1)
    flat[1::2, :, :VOCAB] *= 400.0  # odd requests: a peaked distribution, top-p's mass in a few tokens
    params = [SamplingParams(temperature=8.0, top_p=0.99)] * len(trees)
    got = accept_batch(trees, flat, params, [make_generator(b) for b in range(len(trees))], "match")
    assert sum(redone) == sum(tree.size for tree in trees[::2])  # the even requests' nodes, every one
    for b, (tree, p) in enumerate(zip(trees, params)):
        u = torch.rand(tree.size, generator=make_generator(b), dtype=torch.float64)
        draws = sample_from_probs(full_sort_probs(flat[b, : tree.size], p), u)
        assert got[b].tokens[-1] == int(draws[got[b].path[-1]])


@pytest.mark.parametrize("seed", range(4))
def test_lazy_match_walk_draws_what_the_full_one_did(seed):
    """Sample-then-match with one uniform per node: drawing at every node of the tree (as before) and
    drawing only where the walk goes give the same path and tokens."""
    trees, logits = _batch(seed)
    params = [p if not p.greedy else SamplingParams(temperature=0.5) for p in MIXED]
    got = accept_batch(trees, logits, params, [make_generator(b) for b in range(len(trees))], "match")
    for b, (tree, p) in enumerate(zip(trees, params)):
        u = torch.rand(tree.size, generator=make_generator(b), dtype=torch.float64)
        draws = sample_from_probs(full_sort_probs(logits[b, : tree.size], p), u)
        kids = tree.children()
        node, path = 0, [0]
        while True:
            nxt = [c for c in kids[node] if int(tree.tokens[c]) == int(draws[node])]
            if not nxt:
                break
            node = nxt[0]
            path.append(node)
        assert got[b].path == path and got[b].tokens == tree.tokens[path[1:]].tolist() + [int(draws[node])]


def test_a_draw_from_the_kept_candidates_is_the_draw_from_the_whole_distribution():
    """Sample-then-match draws a top-k / top-p row from its candidates alone (their masses in vocabulary
    order): for every uniform it gives the token the renormalised full distribution gives. A draw that
    walked the candidates in rank order, or forgot a mask, would differ."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 5000, generator=gen) * 3.0
    uniforms = torch.rand(400, 8, generator=gen, dtype=torch.float64)
    for params in [
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=7),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05),
        SamplingParams(temperature=1.0, min_p=0.1),  # no truncation: the whole vocabulary is kept
        SamplingParams(temperature=1.0),
    ]:
        kept = sampling.kept_candidates(logits, params, candidates=512)
        assert kept.sufficed is None or bool(kept.sufficed.all())
        assert (kept.ids is None) == (not params.truncates)
        whole = full_sort_probs(logits, params)
        for u in uniforms:
            assert torch.equal(acceptance.sample_kept(kept, u), sample_from_probs(whole, u)), params
