"""JETSPEC inside the real SGLang server (CPU engine, intel_amx attention, tree mask in the QLEN_ONLY
layout) gives the same greedy tokens as plain SGLang and as HF transformers, one request at a time and
with requests joining and finishing mid-batch; with the tree mask ignored it does not (the negative
control that shows these comparisons can fail)."""

from __future__ import annotations

import pytest
from e2e_client import MAX_NEW, generate_all, outputs_until_eos


@pytest.fixture(scope="module")
def plain_sequential(plain_server, humaneval_ids, tokenizer):
    return outputs_until_eos(generate_all(plain_server.url, humaneval_ids), tokenizer.eos_token_id)


def test_plain_sglang_on_the_standin_equals_hf(plain_sequential, hf_greedy):
    assert plain_sequential == hf_greedy


def test_jetspec_greedy_equals_plain_and_hf_one_at_a_time(
    jetspec_server, humaneval_ids, hf_greedy, plain_sequential, tokenizer
):
    replies = generate_all(jetspec_server.url, humaneval_ids)
    assert outputs_until_eos(replies, tokenizer.eos_token_id) == plain_sequential == hf_greedy
    # speculation really ran: every reply verified trees, and some step kept more than the bonus token
    steps = [r["meta_info"]["spec_verify_ct"] for r in replies]
    tokens = [r["meta_info"]["completion_tokens"] for r in replies]
    assert all(s > 0 for s in steps) and sum(tokens) > sum(steps)


def test_jetspec_greedy_equals_plain_with_requests_joining_and_leaving(
    jetspec_server, plain_server, humaneval_ids, hf_greedy, tokenizer
):
    # four clients over eight prompts of different lengths: requests finish at different steps and the
    # next prompt joins the running batch
    lengths = [MAX_NEW - 4 * (i % 4) for i in range(len(humaneval_ids))]
    eos = tokenizer.eos_token_id
    spec = outputs_until_eos(generate_all(jetspec_server.url, humaneval_ids, concurrency=4, max_new=lengths), eos)
    plain = outputs_until_eos(generate_all(plain_server.url, humaneval_ids, concurrency=4, max_new=lengths), eos)
    assert spec == plain
    assert spec == [ref[:n] for ref, n in zip(hf_greedy, lengths)]


def test_negative_control_ignoring_the_tree_mask_diverges(controls_server, humaneval_ids, hf_greedy, tokenizer):
    """The stand-in's attention told to ignore the tree mask (causal over the flattened tree instead):
    nodes then see siblings and cousins, verify logits change, and greedy output must differ. Four at a
    time: this server's bs1 cohort is gated off (it would verify no tree)."""
    got = outputs_until_eos(generate_all(controls_server.url, humaneval_ids[:4], concurrency=4), tokenizer.eos_token_id)
    assert sum(g != ref for g, ref in zip(got, hf_greedy)) >= 1
