"""core/masked_sdpa.py: the same attention as torch's SDPA, computed with cuDNN's backend switched off."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_jetspec.core import masked_sdpa as module
from tests.builders import grouped_attention_inputs


def _inputs():
    return grouped_attention_inputs(keys=11, masked_share=0.3)


def test_equals_torch_sdpa_with_grouped_heads():
    q, k, v, mask = _inputs()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(module.masked_sdpa(q, k, v, mask, scale=0.3), expected, rtol=0, atol=1e-6)


def test_cudnn_backend_is_off_during_the_call_and_restored_after(monkeypatch):
    seen, real = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(module.F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    module.masked_sdpa(*_inputs())
    assert seen == [False]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
