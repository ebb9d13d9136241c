"""The draft head's oneDNN-packed linears (core/packed_linear.py): same results as nn.Linear, used only
where they are exact and pay, re-packed after a weight update, and safe to copy."""

import copy
import pickle

import pytest
import torch
from torch import nn

from sglang_jetspec.core.packed_linear import DraftLinear, available

needs_onednn = pytest.mark.skipif(not available(torch.zeros(1)), reason="this torch build has no oneDNN packed linear")

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _layer(dtype: torch.dtype, bias: bool = True) -> DraftLinear:
    torch.manual_seed(0)
    return DraftLinear(64, 48, bias=bias).to(dtype)


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 7, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_equals_plain_linear(dtype, rows, bias):
    layer = _layer(dtype, bias)
    x = torch.randn(1, rows, 64, dtype=dtype)
    with torch.no_grad():
        out = layer(x)
        plain = nn.functional.linear(x, layer.weight, layer.bias)
    assert layer._packed._packed is not None, "two or more rows without autograd must take the packed path"
    assert out.shape == plain.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), plain.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@needs_onednn
def test_one_row_and_autograd_take_the_plain_path():
    layer = _layer(torch.float32)
    row = torch.randn(1, 64)
    with torch.no_grad():
        one = layer(row)
    assert layer._packed._packed is None, "a single row must not use oneDNN's packed path (a slow reference kernel)"
    x = torch.randn(4, 64, requires_grad=True)
    out = layer(x)  # training: autograd needs the plain op
    out.sum().backward()
    assert layer._packed._packed is None and x.grad is not None and layer.weight.grad is not None
    assert torch.equal(one, nn.functional.linear(row, layer.weight, layer.bias))


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
def test_copies_and_pickles_pack_their_own_weight():
    layer = _layer(torch.bfloat16)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(x)
        for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert torch.equal(other(x), want)
    assert set(layer.state_dict()) == {"weight", "bias"}, "published checkpoints load by nn.Linear's names"
