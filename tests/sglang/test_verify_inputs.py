"""Verify tensors for random trees equal a node-by-node construction written from SGLang's layouts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_jetspec.adapter.attention_backends import MaskLayout, tree_mask_layout
from sglang_jetspec.adapter.verify_inputs import build_verify_tensors
from sglang_jetspec.core.tree import TreeSpec, build_tree, root_only_tree, top_k_per_depth


def _random_tree(seed: int, budget: int, depth: int, width: int):
    gen = torch.Generator().manual_seed(seed)
    tokens, logprobs = top_k_per_depth(torch.randn(depth, 50, generator=gen) * 3, width)
    return build_tree(int(torch.randint(50, (1,), generator=gen)), tokens, logprobs, TreeSpec(budget, depth, width))


def _expected(trees, seq_lens, n):
    """Straightforward per-node loop: walk parents for ancestors, scan indices for links."""
    tokens, positions, full, next_token, next_sibling = [], [], [], [], []
    for b, (tree, length) in enumerate(zip(trees, seq_lens)):
        parents = tree.parents.tolist()
        for i in range(n):
            real = i < tree.size
            tokens.append(int(tree.tokens[i]) if real else int(tree.tokens[0]))
            depth, p = 0, parents[i] if real else 0
            anc = {i, 0}
            if real:
                anc, p = {i}, parents[i]
                while p >= 0:
                    anc.add(p)
                    depth += 1
                    p = parents[p]
            else:
                depth = 1
            positions.append(length + depth)
            full += [True] * length + [c in anc for c in range(n)]
            kids = [c for c in range(tree.size) if parents[c] == i] if real else []
            next_token.append(kids[0] if kids else -1)
            sib = [c for c in range(i + 1, tree.size) if real and i > 0 and parents[c] == parents[i]]
            next_sibling.append(sib[0] if sib else -1)
    return tokens, positions, full, next_token, next_sibling


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(1, 24), st.integers(1, 6), st.integers(1, 4), st.integers(0, 40)),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 5),
)
def test_matches_node_by_node_construction(specs, extra_width):
    trees = [_random_tree(seed, budget, depth, width) for seed, budget, depth, width, _ in specs]
    seq_lens = [length for *_, length in specs]
    n = max(t.size for t in trees) + extra_width
    got = build_verify_tensors(trees, seq_lens, n)
    tokens, positions, full, next_token, next_sibling = _expected(trees, seq_lens, n)
    assert got.draft_token.tolist() == tokens
    assert got.positions.tolist() == positions
    assert got.full_mask(seq_lens).tolist() == full
    assert got.custom_mask(MaskLayout.FULL, seq_lens).tolist() == full
    # QLEN_ONLY (intel_amx): each row without its prefix columns, i.e. the last n entries of the FULL row
    qlen, at = [], 0
    for length in seq_lens:
        for _ in range(n):
            qlen += full[at + length : at + length + n]
            at += length + n
    assert got.custom_mask(MaskLayout.QLEN_ONLY, seq_lens).tolist() == qlen
    assert got.retrieve_next_token.flatten().tolist() == next_token
    assert got.retrieve_next_sibling.flatten().tolist() == next_sibling
    assert got.retrieve_index.flatten().tolist() == list(range(len(trees) * n))
    assert got.full_mask(seq_lens).numel() == sum(n * (length + n) for length in seq_lens)


def test_padding_nodes_are_unreachable_and_root_only_tree_is_one_decode_step():
    tree = root_only_tree(7)
    got = build_verify_tensors([tree], [5], num_nodes=3)
    assert got.retrieve_next_token.tolist() == [[-1, -1, -1]]  # the root has no child: nothing to accept
    assert got.retrieve_next_sibling.tolist() == [[-1, -1, -1]]
    assert got.positions.tolist() == [5, 6, 6]
    assert got.qlen_mask[0].tolist() == [[True, False, False], [True, True, False], [True, False, True]]


def test_a_tree_wider_than_the_step_is_refused():
    tree = _random_tree(0, 8, 3, 2)
    try:
        build_verify_tensors([tree], [3], num_nodes=4)
    except ValueError as exc:
        assert "raise num_nodes to the step's budget" in str(exc)
    else:
        raise AssertionError("a tree with more nodes than num_nodes was accepted")


def test_links_equal_sglang_host_reconstruction_for_full_trees(jetspec_registered):
    """SGLang's own host-side link derivation (ngram_worker._derive_tree_links, the mirror of
    reconstruct_indices_from_tree_mask) agrees wherever there is no padding."""
    try:
        from sglang.srt.speculative.ngram_worker import _derive_tree_links
    except ImportError as exc:  # the module loads sgl_kernel's CUDA ops at import
        pytest.skip(f"sglang ngram_worker does not import here: {str(exc).strip().splitlines()[0]}")

    trees = [_random_tree(seed, 12, 4, 3) for seed in range(6)]
    assert {t.size for t in trees} == {12}
    got = build_verify_tensors(trees, [9] * len(trees))
    next_token, next_sibling = _derive_tree_links(got.qlen_mask.flatten().numpy(), len(trees), 12)
    assert torch.equal(got.retrieve_next_token, next_token)
    assert torch.equal(got.retrieve_next_sibling, next_sibling)


@pytest.mark.parametrize(
    "backend, layout",
    [("flashinfer", MaskLayout.FULL), ("triton", MaskLayout.FULL), ("intel_amx", MaskLayout.QLEN_ONLY)],
)
def test_each_tree_mask_backend_gets_the_layout_it_reads(backend, layout):
    assert tree_mask_layout(backend) == layout


@pytest.mark.parametrize("backend", ["fa3", "torch_native", "trtllm_mha", None])
def test_backends_without_a_tree_mask_have_no_layout(backend):
    with pytest.raises(ValueError, match="cannot verify a token tree"):
        tree_mask_layout(backend)
