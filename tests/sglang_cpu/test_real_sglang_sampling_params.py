"""Every sampling parameter through JETSPEC gives plain SGLang's tokens (fp32, greedy), and one request
cannot take the server down.

The matrix runs as one batch per server with per-item parameters (two HumanEval prompts x 48 tokens
per penalty setting, short-answer chat prompts for min_new_tokens), so requests of different settings
share verify steps as they would in production. The negative control (penalties advanced once per
verify step, SGLang's relaxed way) lives in tests/sglang/test_worker_forward.py and
tests/sglang/test_tree_penalties.py, where it runs without a second server."""

from __future__ import annotations

import pytest
from e2e_client import generate, generate_batch, jetspec_state, post

PENALTIES = {
    "frequency": dict(frequency_penalty=1.0),
    "presence": dict(presence_penalty=1.0),
    "repetition": dict(repetition_penalty=1.3),
    "combined": dict(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.2),
    "negative-frequency": dict(frequency_penalty=-1.0),
}
MIN_NEW = {
    "min-below-max": dict(min_new_tokens=24, max_new_tokens=40),
    "min-at-max": dict(min_new_tokens=40, max_new_tokens=40),
}
PENALTY_TOKENS = 48
PENALTY_PROMPTS = 2  # HumanEval prompts per penalty setting
# answered in a few tokens, so EOS comes early unless min_new_tokens holds it back
SHORT_QUESTIONS = [
    "What is 2 + 2? Answer with the number only.",
    "Name one primary colour, in one word.",
    "Is water wet? Answer yes or no.",
]


@pytest.fixture(scope="module")
def short_chat_ids(tokenizer) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in SHORT_QUESTIONS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def _matrix(humaneval_ids, short_chat_ids) -> list[tuple[str, list[int], dict]]:
    items = [
        (name, ids, {"temperature": 0, "max_new_tokens": PENALTY_TOKENS, **params})
        for name, params in PENALTIES.items()
        for ids in humaneval_ids[:PENALTY_PROMPTS]
    ]
    items += [(name, ids, {"temperature": 0, **params}) for name, params in MIN_NEW.items() for ids in short_chat_ids]
    return items


@pytest.fixture(scope="module")
def matrix_replies(jetspec_server, plain_server, humaneval_ids, short_chat_ids):
    items = _matrix(humaneval_ids, short_chat_ids)
    return items, generate_batch(plain_server.url, items), generate_batch(jetspec_server.url, items)


def test_penalties_and_min_new_tokens_give_plain_sglangs_tokens(matrix_replies, tokenizer):
    items, plain, spec = matrix_replies
    differ = [
        (name, i)
        for i, ((name, _, _), p, s) in enumerate(zip(items, plain, spec))
        if p["output_ids"] != s["output_ids"]
    ]
    assert not differ, differ
    assert max(s["meta_info"]["completion_tokens"] / s["meta_info"]["spec_verify_ct"] for s in spec) > 1.5, (
        "no request accepted drafts: the trees never put a penalised node below the root"
    )
    eos = tokenizer.eos_token_id
    for (name, _, params), reply in zip(items, plain):
        tokens = reply["output_ids"]
        if "min_new_tokens" in params:  # the minimum holds and nothing stops the decode short of it
            assert len(tokens) >= params["min_new_tokens"] and eos not in tokens[: params["min_new_tokens"]], (
                name,
                tokens,
            )
    early = [r for (name, _, _), r in zip(items, plain) if name == "min-below-max" and len(r["output_ids"]) < 40]
    assert early, (
        "no short answer ended between min_new_tokens and max_new_tokens: the minimum was never what stopped EOS"
    )


def _penalised_greedy_logprobs(
    hf_model, ids: list[int], n: int, frequency: float, repetition: float
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities under the penalised distribution they were chosen from
    (HF transformers, fp32): frequency per occurrence, then repetition scaling, as a plain decode applies them."""
    import torch

    out, logprobs = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = hf_model(torch.tensor([ids + out])).logits[0, -1]
            counts, scale = torch.zeros_like(logits), torch.ones_like(logits)
            for token in out:
                counts[token] += frequency
                scale[token] = repetition
            logits = logits - counts
            logits = torch.where(logits < 0, logits * scale, logits / scale)
            out.append(int(logits.argmax()))
            logprobs.append(float(torch.log_softmax(logits, -1)[out[-1]]))
    return out, logprobs


def test_penalties_with_logprobs_give_plain_sglangs_tokens_and_the_penalised_logprobs(
    jetspec_server, plain_server, humaneval_ids, hf_model
):
    """Tokens as plain SGLang's; each logprob is that of the penalised row the token was chosen from.
    (Plain SGLang's own logprobs depart from that row at some positions, by up to 0.04 here.)"""
    sampling = {"temperature": 0, "max_new_tokens": 24, "frequency_penalty": 1.0, "repetition_penalty": 1.2}
    for ids in humaneval_ids[4:6]:
        replies = []
        for url in (plain_server.url, jetspec_server.url):
            status, reply = post(
                f"{url}/generate",
                {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3, "sampling_params": sampling},
            )
            assert status == 200, reply
            replies.append(reply)
        plain, spec = replies
        assert spec["output_ids"] == plain["output_ids"]
        tokens, want = _penalised_greedy_logprobs(hf_model, ids, 24, 1.0, 1.2)
        assert spec["output_ids"] == tokens
        got = [lp for lp, _, _ in spec["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)


CRASHING = [
    ({"input_ids": [49252]}, "input_ids: token id 49252 is outside the model's vocabulary"),
    ({"input_ids": [5, -1]}, "input_ids: token id -1 is outside"),
    ({"input_ids": [2**40]}, f"input_ids: token id {2**40} is outside"),
    ({"text": ""}, "the prompt is empty"),
    ({"input_ids": [1, 2, 3], "sampling_params": {"top_k": 10**12}}, "sampling_params.top_k"),
    ({"input_ids": [1, 2, 3], "return_logprob": True, "top_logprobs_num": 100000}, "top_logprobs_num 100000"),
    (
        {"input_ids": [1, 2, 3], "sampling_params": {"stop_token_ids": [10**6], "min_new_tokens": 2}},
        "sampling_params.stop_token_ids: 1000000 is outside",
    ),
]


@pytest.mark.parametrize(
    "body, message",
    CRASHING,
    ids=["oov", "negative", "2^40", "empty-text", "top_k-10^12", "top_logprobs-100000", "stop-id-10^6"],
)
def test_inputs_that_crash_sglangs_scheduler_are_refused_and_serving_goes_on(
    jetspec_server, plain_server, humaneval_ids, body, message
):
    status, reply = post(f"{jetspec_server.url}/generate", {"sampling_params": {"max_new_tokens": 4}, **body})
    assert status == 400 and message in str(reply), (status, reply)
    after = generate(jetspec_server.url, humaneval_ids[1], 8)
    assert after["output_ids"] == generate(plain_server.url, humaneval_ids[1], 8)["output_ids"]
    assert jetspec_state(jetspec_server.url)["jetspec_live_draft_states"] == 0
