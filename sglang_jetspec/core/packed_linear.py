"""Linears on a CPU with their weights pre-packed for oneDNN: the draft head's always, a bf16 target's
when the reference engine loads one.

PyTorch's plain CPU linear lays the weight out for its kernel on every call; oneDNN's pre-packed form
does it once (the measured costs: docs/design/reference-engine.md, "Measured costs behind code
choices"). oneDNN's packed kernel is slow for fewer than MIN_ROWS rows, so fewer rows are zero-padded
to MIN_ROWS: rows never mix, so a row's result does not depend on the padding.

Only without autograd (training keeps the plain op) and on CPU tensors. A packed copy is kept per
version of its weight, so a weight update or reload is seen at the next call. fp32 targets keep the
plain kernels: they are the oracle of the identity tests (reference/target.py).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

MIN_ROWS = 4
_PACK_HINT = 8  # the row count oneDNN lays the weight out for; any count works


@functools.cache
def _onednn() -> bool:
    """Whether this torch build has oneDNN and its packed linear (asked once: every linear call checks)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def _packs(dtype: torch.dtype) -> bool:
    """Whether this CPU packs weights of `dtype`: oneDNN's bf16 path needs AVX-512 (BW/VL/DQ) or
    AVX-NE-CONVERT and refuses elsewhere (an AVX2-only AMD EPYC Zen 3, for one), so one tiny pack is
    tried rather than reading CPU flags that torch's own check may outgrow."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(_PACK_HINT, _PACK_HINT, dtype=dtype), _PACK_HINT)
    except RuntimeError:
        return False
    return True


def available(weight: torch.Tensor) -> bool:
    """Whether a packed copy of `weight` can serve this process's calls: a CPU build with oneDNN, on a
    CPU that packs the weight's dtype (elsewhere the plain linear serves, as for any other dtype)."""
    return weight.is_cpu and weight.dtype in (torch.float32, torch.bfloat16) and _onednn() and _packs(weight.dtype)


class PackedWeight:
    """A weight's oneDNN-packed copy, redone when the weight is replaced or changed in place."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        # an inference tensor (made under torch.inference_mode) keeps no version counter
        key = (weight.data_ptr(), None if weight.is_inference() else weight._version, weight.dtype, tuple(weight.shape))
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_HINT)
            self._key = key
        return self._packed

    # A packed tensor has no storage to copy or pickle; a copy packs its own weight on first use.
    def __deepcopy__(self, memo: dict) -> "PackedWeight":
        return PackedWeight()

    def __getstate__(self) -> dict:
        return {"_key": None, "_packed": None}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: PackedWeight) -> torch.Tensor:
    """x @ weight.T + bias: through `packed` where that is possible, else PyTorch's own linear."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not rows or torch.is_grad_enabled() or x.dtype != weight.dtype or not available(weight):
        return nn.functional.linear(x, weight, bias)
    if rows >= MIN_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x, packed.get(weight), bias, "none", [], "")
    # zero rows appended along the row dim, and cut off after: one pad and one slice (a step's context
    # projection of one or two new rows runs this three times a layer)
    if x.dim() == 1:
        return linear(x.unsqueeze(0), weight, bias, packed).squeeze(0)
    length = x.shape[-2]
    extra = -(-MIN_ROWS // (rows // length)) - length  # the rows dim's padding: >= MIN_ROWS rows in all
    padded = nn.functional.pad(x, (0, 0, 0, extra))
    return torch.ops.mkldnn._linear_pointwise(padded, packed.get(weight), bias, "none", [], "")[..., :length, :]


class PackedLinear(nn.Linear):
    """nn.Linear (same parameters and state-dict names) that runs through `linear`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._packed = PackedWeight()

    @classmethod
    def sharing(cls, plain: nn.Linear) -> "PackedLinear":
        """A PackedLinear over `plain`'s own parameters (no copy: tied weights stay tied)."""
        packed = cls(plain.in_features, plain.out_features, bias=plain.bias is not None, device="meta")
        packed.weight, packed.bias = plain.weight, plain.bias
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self._packed)


def pack_linears(module: nn.Module) -> int:
    """Replace every plain nn.Linear under `module` by a PackedLinear over the same parameters; returns
    how many were replaced."""
    replaced = 0
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(module, name, PackedLinear.sharing(child))
            replaced += 1
        else:
            replaced += pack_linears(child)
    return replaced
