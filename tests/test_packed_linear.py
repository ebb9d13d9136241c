"""oneDNN-packed linears (core/packed_linear.py): the same results as nn.Linear for any row count
(fewer than MIN_ROWS zero-padded), the plain op under autograd, re-packed after a weight update, safe
to copy; a bf16 target runs on them, an fp32 one (the oracle) does not."""

import copy
import pickle

import pytest
import torch
from torch import nn

from sglang_jetspec.core.packed_linear import MIN_ROWS, PackedLinear, PackedWeight, available, linear, pack_linears

needs_onednn = pytest.mark.skipif(not available(torch.zeros(1)), reason="this torch build has no oneDNN packed linear")
# oneDNN packs bf16 only on AVX-512 / AVX-NE-CONVERT CPUs; elsewhere bf16 takes the plain path (tested below)
packs_bf16 = available(torch.zeros(1, dtype=torch.bfloat16))
needs_bf16_packing = pytest.mark.skipif(
    not packs_bf16, reason="this CPU has no oneDNN bf16 packing (needs AVX-512 or AVX-NE-CONVERT)"
)

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _layer(dtype: torch.dtype, bias: bool = True) -> PackedLinear:
    torch.manual_seed(0)
    return PackedLinear(64, 48, bias=bias).to(dtype)


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16_packing)])
@pytest.mark.parametrize("rows", [1, 2, MIN_ROWS, 7, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_equals_plain_linear(dtype, rows, bias):
    layer = _layer(dtype, bias)
    x = torch.randn(1, rows, 64, dtype=dtype)
    with torch.no_grad():
        out = layer(x)
        plain = nn.functional.linear(x, layer.weight, layer.bias)
    assert layer._packed._packed is not None, "without autograd every row count takes the packed path"
    assert out.shape == plain.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), plain.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_bf16_packing)])
@pytest.mark.parametrize("shape", [(64,), (1, 64), (3, 64), (2, 1, 64), (3, 1, 64), (1, 3, 64), (2, 2, 1, 64)])
def test_fewer_rows_than_the_kernel_wants_are_padded_and_each_row_is_computed_alone(dtype, shape):
    """Rows below MIN_ROWS are zero-padded for oneDNN's kernel and cut off after: a row's result is what it
    is among many rows (to the kernel's rounding: another row count may pick another blocking), and the
    output has the input's leading shape."""
    layer = _layer(dtype)
    x = torch.randn(*shape, dtype=dtype)
    with torch.no_grad():
        out = layer(x)
        among_many = layer(torch.cat([x.reshape(-1, 64), torch.randn(MIN_ROWS + 3, 64, dtype=dtype)]))
    assert out.shape == (*shape[:-1], 48)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.reshape(-1, 48), among_many[: x.numel() // 64], atol=tolerance, rtol=tolerance)


@needs_onednn
def test_autograd_takes_the_plain_path():
    layer = _layer(torch.float32)
    x = torch.randn(4, 64, requires_grad=True)
    out = layer(x)  # training: autograd needs the plain op
    out.sum().backward()
    assert layer._packed._packed is None and x.grad is not None and layer.weight.grad is not None
    assert torch.equal(out, nn.functional.linear(x, layer.weight, layer.bias))


@needs_onednn
def test_a_weight_update_is_seen_at_the_next_call():
    layer = _layer(torch.float32)
    x = torch.randn(3, 64)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2.0)  # in place, as a weight load does
        after = layer(x)
        layer.weight = nn.Parameter(torch.zeros_like(layer.weight))  # replaced outright
        replaced = layer(x)
    torch.testing.assert_close(after, 2 * before - layer.bias, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(replaced, layer.bias.expand_as(replaced))


@needs_onednn
def test_a_weight_made_in_inference_mode_is_packed():
    """The drafter's draft-vocabulary rows are gathered under the engine's inference mode: such a tensor
    has no version counter, and packing must not ask it for one."""
    x = torch.randn(3, 64)
    with torch.inference_mode():
        weight = torch.randn(48, 64)
        packed = PackedWeight()
        out = linear(x, weight, None, packed)
    assert weight.is_inference() and packed._packed is not None
    torch.testing.assert_close(out, nn.functional.linear(x, weight), atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("cpu_packs_it", [True, False])
def test_a_dtype_the_cpu_cannot_pack_takes_the_plain_path(monkeypatch, cpu_packs_it):
    """An AVX2-only CPU refuses bf16 packing: such a weight must run on the plain op, not raise."""
    from sglang_jetspec.core import packed_linear

    monkeypatch.setattr(packed_linear, "_packs", lambda dtype: cpu_packs_it)
    layer = _layer(torch.float32)
    x = torch.randn(3, 64)
    with torch.no_grad():
        out = layer(x)
    assert (layer._packed._packed is not None) == cpu_packs_it
    torch.testing.assert_close(out, nn.functional.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)


def test_the_bf16_probe_agrees_with_onednn():
    weight = torch.randn(48, 64, dtype=torch.bfloat16)
    try:
        torch.ops.mkldnn._reorder_linear_weight(weight, 8)
        packs = True
    except (RuntimeError, AttributeError):
        packs = False
    assert available(weight) == (packs and torch.backends.mkldnn.is_available())
    with torch.no_grad():  # either way a bf16 layer runs
        out = PackedLinear(64, 48).to(torch.bfloat16)(torch.randn(2, 64, dtype=torch.bfloat16))
    assert out.shape == (2, 48)


@needs_bf16_packing
def test_copies_and_pickles_pack_their_own_weight():
    layer = _layer(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(x)
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert torch.equal(other(x), want)
    assert set(layer.state_dict()) == {"weight", "bias"}, "published checkpoints load by nn.Linear's names"


def test_pack_linears_shares_parameters_and_keeps_ties():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 10, bias=False))
    model[2].weight = model[0].weight  # tied, as an lm_head to its embedding
    plain_ids = {id(p) for p in model.parameters()}
    assert pack_linears(model) == 2
    assert isinstance(model[1][0], PackedLinear) and isinstance(model[2], PackedLinear)
    assert {id(p) for p in model.parameters()} == plain_ids and model[2].weight is model[0].weight


@pytest.fixture(scope="module")
def bf16_targets(smollm2_dir):
    from sglang_jetspec.reference.target import TargetModel

    return TargetModel(smollm2_dir, torch.bfloat16), TargetModel(smollm2_dir, torch.bfloat16, packed_linears=False)


@needs_bf16_packing
@pytest.mark.parametrize("new_tokens", [1, 3, 8])
def test_a_packed_bf16_target_scores_like_the_plain_one(bf16_targets, new_tokens):
    from sglang_jetspec.reference.target import Segment

    packed, plain = bf16_targets
    assert packed.packed_linears and not plain.packed_linears and isinstance(packed.lm_head, PackedLinear)
    prompt = list(range(1000, 1040))
    outs = []
    for target in (packed, plain):
        cache = target.new_cache(lanes=1, capacity=64)
        target.forward(cache, [Segment.chain(prompt, 0)], (1, 10))
        cache.commit(0, list(range(len(prompt))))
        out = target.forward(cache, [Segment.chain(list(range(2000, 2000 + new_tokens)), len(prompt))], (1, 10))
        assert out.hidden.shape[1] == new_tokens and out.taps.shape[1] == new_tokens, (
            "padding rows never leave the forward"
        )
        cache.commit(0, [0])
        outs.append((target.logits(out.hidden), out.taps))
    (logits, taps), (plain_logits, plain_taps) = outs
    torch.testing.assert_close(taps.float(), plain_taps.float(), atol=0.1, rtol=0.05)
    torch.testing.assert_close(logits, plain_logits, atol=0.25, rtol=0.05)
    assert (logits.argmax(-1) == plain_logits.argmax(-1)).float().mean() >= 0.85


def test_an_fp32_target_keeps_the_plain_kernels(smollm2):
    assert not smollm2.packed_linears and type(smollm2.lm_head) is nn.Linear
