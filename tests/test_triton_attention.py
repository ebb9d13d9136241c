"""The Triton masked-attention kernel (reference/triton_attention.py) on this CPU, through Triton's
interpreter: equal to SDPA under tree masks, grouped-query heads and ragged sizes, and inside the
real SmolLM2 target a tree-verify forward gives SDPA's logits. Nothing here compiles for a GPU.

Triton picks interpreter or compiler when its own language functions are decorated, at its first
import, so the kernel checks run in a child pytest with TRITON_INTERPRET=1 set from the start;
in the parent run they are skipped and test_kernel_checks_pass_under_the_interpreter reports them.
"""

from __future__ import annotations

import pytest
import torch

from sglang_jetspec.core.tree import DraftTree
from sglang_jetspec.reference.target import Segment, TargetError, TargetModel
from tests.triton_interpreter import assert_interpreted_child_passes, interpreted_only


def test_kernel_checks_pass_under_the_interpreter():
    assert_interpreted_child_passes(__file__)


@pytest.fixture(scope="module")
def kernels():
    from sglang_jetspec.reference import triton_attention

    assert type(triton_attention._masked_attention_kernel).__name__ == "InterpretedFunction"
    return triton_attention


def sdpa(query, key, value, allowed, scale):
    group = query.shape[1] // key.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(group, 1),
        value.repeat_interleave(group, 1),
        attn_mask=allowed[:, None],
        scale=scale,
    )


def tree_mask(parents: list[int]) -> torch.Tensor:
    """The ancestor-or-self mask of a tree given by its parents (the engine's own construction)."""
    n = len(parents)
    zeros = torch.zeros(n, dtype=torch.long)
    return DraftTree(torch.arange(n), torch.tensor(parents), zeros, zeros, zeros.float()).ancestor_mask()


@interpreted_only
@pytest.mark.parametrize(
    "heads, kv_heads, dim, prefix, parents",
    [
        (9, 3, 64, 37, [-1, 0, 0, 1, 1, 2, 3, 6]),  # SmolLM2's head shape, a small tree
        (4, 4, 24, 5, [-1] + [i // 2 for i in range(19)]),  # head dim not a power of 2; more rows than a block
        (2, 1, 16, 70, [-1, 0, 1, 2, 3]),  # a chain, slots spanning several key blocks
    ],
)
def test_kernel_equals_sdpa_under_tree_masks(kernels, heads, kv_heads, dim, prefix, parents):
    torch.manual_seed(0)
    lanes, nodes = 2, len(parents)
    slots = prefix + nodes + 3  # trailing slots nobody may see
    query = torch.randn(lanes, heads, nodes, dim)
    key, value = torch.randn(lanes, kv_heads, slots, dim), torch.randn(lanes, kv_heads, slots, dim)
    allowed = torch.zeros(lanes, nodes, slots, dtype=torch.bool)
    allowed[:, :, :prefix] = True
    allowed[:, :, prefix : prefix + nodes] = tree_mask(parents)
    allowed[1, :, prefix - 2 : prefix] = False  # lanes differ: the second one's prefix is shorter
    out = kernels.masked_attention(query, key, value, allowed, dim**-0.5)
    expected = sdpa(query, key, value, allowed, dim**-0.5)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5), (out - expected).abs().max()
    # the mask is what makes them agree: attending over everything gives a different answer
    assert not torch.allclose(sdpa(query, key, value, torch.ones_like(allowed), dim**-0.5), out, atol=1e-3)


@interpreted_only
def test_kernel_refuses_shapes_it_cannot_serve(kernels):
    query, key = torch.zeros(1, 3, 2, 16), torch.zeros(1, 2, 4, 16)
    with pytest.raises(ValueError, match="H % H_kv == 0"):
        kernels.masked_attention(query, key, key, torch.ones(1, 2, 4, dtype=torch.bool), 1.0)


@interpreted_only
def test_tree_verify_logits_of_the_target_equal_sdpa(kernels, smollm2_dir, single_thread):
    """One prefill and one tree-verify forward of SmolLM2 with each attention backend."""
    parents = [-1, 0, 0, 1, 2, 2]
    outputs = {}
    for attention in ("sdpa", "triton"):
        target = TargetModel(smollm2_dir, attention=attention)
        prompt = target.tokenizer("def add(a, b):\n    return")["input_ids"]
        cache = target.new_cache()
        target.forward(cache, [Segment.chain(prompt[:-1], 0)])
        cache.commit(0, list(range(len(prompt) - 1)))
        tree = torch.tensor([prompt[-1], 264, 1071, 3135, 30, 216])
        depth = torch.tensor([0, 1, 1, 2, 2, 2])
        out = target.forward(cache, [Segment(tree, len(prompt) - 1 + depth, tree_mask(parents))])
        outputs[attention] = target.logits(out.hidden)[0]
    assert torch.allclose(outputs["triton"], outputs["sdpa"], atol=1e-3), (
        (outputs["triton"] - outputs["sdpa"]).abs().max()
    )
    assert torch.equal(outputs["triton"].argmax(-1), outputs["sdpa"].argmax(-1))


def test_unknown_attention_backend_is_refused(smollm2_dir):
    with pytest.raises(TargetError, match="attention='flash': use one of sdpa, triton"):
        TargetModel(smollm2_dir, attention="flash")
