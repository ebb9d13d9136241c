"""accept_step: the core's decisions laid out as SGLang's accept_lens / accept_index / tokens."""

from __future__ import annotations

import torch

from sglang_jetspec.adapter.step_outputs import accept_step
from sglang_jetspec.adapter.verify_inputs import build_verify_tensors
from sglang_jetspec.core.sampling import SamplingParams, make_generator
from sglang_jetspec.core.tree import TreeSpec, build_tree, top_k_per_depth


def _tree(seed):
    gen = torch.Generator().manual_seed(seed)
    tokens, logprobs = top_k_per_depth(torch.randn(4, 30, generator=gen) * 3, 3)
    return build_tree(1, tokens, logprobs, TreeSpec(10, 4, 3))


def test_greedy_follows_target_argmax_and_lays_out_kv_rows():
    trees = [_tree(s) for s in range(3)]
    n = 12
    vt = build_verify_tensors(trees, [5, 6, 7], n)
    logits = torch.full((3 * n, 32), -10.0)  # 30, 31: never drafted (draft vocab is 30)
    # target agrees with the path root -> node 1 -> node 1's first child in request 0; nothing else
    first = trees[0]
    child = first.children()[1][0] if first.children()[1] else None
    logits[0, int(first.tokens[1])] = 5.0
    bonus_node = child if child is not None else 1
    if child is not None:
        logits[1, int(first.tokens[child])] = 5.0
    logits[bonus_node, 31] = 5.0
    for b in (1, 2):
        logits[b * n, 30] = 5.0
    got = accept_step(trees, logits, n, [SamplingParams()] * 3, [make_generator(0)] * 3)
    path = [0, 1] + ([child] if child is not None else [])
    assert got.accept_lens.tolist() == [len(path), 1, 1]
    assert got.accept_index[0, : len(path)].tolist() == path
    assert got.accept_index[1].tolist()[:1] == [n] and got.accept_index[2, 0] == 2 * n
    assert got.tokens[0, : len(path)].tolist() == [int(first.tokens[i]) for i in path[1:]] + [31]
    assert got.tokens[1, 0] == 30 and got.stride == max(t.max_depth for t in trees) + 1
    assert vt.draft_token.shape[0] == 3 * n


def test_seeded_sampling_is_reproducible_per_request():
    trees = [_tree(s) for s in range(2)]
    logits = torch.randn(2 * 10, 30)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=3)] * 2
    a = accept_step(trees, logits, 10, params, [make_generator(3), make_generator(4)])
    b = accept_step(trees, logits, 10, params, [make_generator(3), make_generator(4)])
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.accept_lens, b.accept_lens)


def test_greedy_roots_alone_lay_out_what_the_general_walk_does(monkeypatch):
    """A gated-off step (every tree its root, every request greedy) takes a vectorised path; its outputs
    are field for field the general walk's, ties included (the first maximum wins)."""
    from sglang_jetspec.adapter import step_outputs
    from sglang_jetspec.core.tree import root_only_tree

    gen = torch.Generator().manual_seed(7)
    trees = [root_only_tree(t) for t in (3, 9, 4, 11)]
    logits = torch.randn(4, 40, generator=gen)
    logits[2, 5] = logits[2, 17] = logits[2].max() + 1.0  # a tie: token 5 wins
    fast = accept_step(trees, logits, 1, [SamplingParams()] * 4, [make_generator(0)] * 4)
    general = step_outputs.accept_batch(trees, logits.view(4, 1, -1), [SamplingParams()] * 4, [None] * 4)
    # the decision stays on the device: no per-request results on the host, the same tokens as the walk's
    assert fast.results is None
    assert fast.tokens.tolist() == [r.tokens for r in general] == [[t] for t in logits.argmax(-1).tolist()]
    assert fast.tokens[2, 0] == 5 and fast.stride == 1
    assert fast.accept_lens.tolist() == [1] * 4 and fast.accept_index.tolist() == [[0], [1], [2], [3]]
    assert fast.predict.tolist() == logits.argmax(-1).tolist() and fast.row_counts == [1] * 4
    assert fast.bonus_tokens.tolist() == fast.tokens[:, 0].tolist() and fast.row_index.tolist() == [0, 1, 2, 3]
    # a sampled request in the batch keeps the general walk (its draw comes from its own generator)
    sampled = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams(), SamplingParams()]
    calls = []
    monkeypatch.setattr(step_outputs, "_greedy_roots", lambda *a: calls.append(a))
    accept_step(trees, logits, 1, sampled, [make_generator(i) for i in range(4)])
    assert calls == []
