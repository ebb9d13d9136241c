"""The engine's grouped-query SDPA equals transformers' repeat-then-attend SDPA."""

import torch
from transformers import AutoModelForCausalLM

from sglang_jetspec.reference.gqa_attention import ATTN_IMPLEMENTATION, gqa_sdpa_forward
from sglang_jetspec.reference.target import Segment
from tests.builders import grouped_attention_inputs


class _Layer(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def test_masked_grouped_attention_equals_repeated_heads():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v, mask = grouped_attention_inputs(keys=12, masked_share=0.4)
    ours, _ = gqa_sdpa_forward(_Layer(), q, k, v, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(_Layer(), q, k, v, mask, scaling=0.25)  # repeat_kv, then SDPA
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_target_prefill_logits_equal_transformers_sdpa(smollm2, smollm2_dir):
    assert smollm2.model.config._attn_implementation == ATTN_IMPLEMENTATION
    stock = AutoModelForCausalLM.from_pretrained(
        str(smollm2_dir), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    ids = smollm2.tokenizer("def add(a, b):\n    return")["input_ids"]
    cache = smollm2.new_cache(1, len(ids))
    ours = smollm2.logits(smollm2.forward(cache, [Segment.chain(ids, 0)]).hidden[0])
    with torch.no_grad():
        theirs = stock(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
