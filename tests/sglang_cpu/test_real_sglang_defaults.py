"""JETSPEC as shipped, inside the real SGLang server on this CPU (fp32): the packaged policy with nothing
pushed gives plain SGLang's greedy tokens one request at a time and four at a time, and its same-allocation
control keeps the useful head on; and a cohort that a YAML default gates off does no draft work and keeps
no draft context, while a speculating cohort holds one (the control that shows the measurement can fail)."""

from __future__ import annotations

import threading
import time

import pytest
from e2e_client import (
    MAX_NEW,
    generate,
    generate_all,
    jetspec_args,
    jetspec_state,
    load_until_decided,
    outputs_until_eos,
    samples,
    until_eos,
)


@pytest.fixture(scope="module")
def shipped_server(servers, smollm2_dir):
    """JETSPEC with no JETSPEC_POLICY: the packaged policies/default.yaml (its same-allocation control on),
    nothing pushed; metrics on, which change no step."""
    server = servers.start("jetspec-shipped", jetspec_args(smollm2_dir, "--enable-metrics"))
    yield server
    servers.stop(server)


def test_shipped_defaults_give_plain_sglangs_greedy_tokens_alone_and_four_at_a_time(
    shipped_server, humaneval_ids, hf_greedy, tokenizer
):
    eos = tokenizer.eos_token_id
    alone = generate_all(shipped_server.url, humaneval_ids[:4])
    assert outputs_until_eos(alone, eos) == hf_greedy[:4]
    # plain SGLang gives HF's tokens here (test_real_sglang_greedy.py), four at a time too
    four = generate_all(shipped_server.url, humaneval_ids, concurrency=4)
    assert outputs_until_eos(four, eos) == hf_greedy
    # the defaults speculate at both concurrencies: some step committed more than one token
    for replies in (alone, four):
        assert sum(r["meta_info"]["completion_tokens"] for r in replies) > sum(
            r["meta_info"]["spec_verify_ct"] for r in replies
        )


def test_the_shipped_control_keeps_a_useful_head_on(shipped_server, humaneval_ids):
    """The shipped head and policy on code (bs1: hybrid drafter, adaptive sizing up to 32 nodes), after the
    test above (its requests may have decided bs1 already: a decision does not flip back). On this harness
    fixed trees of 16 head-only nodes do not pay at batch 1 (the control measured 0.64x): that is what the
    useless head's server runs (test_real_sglang_same_allocation.py), so there the loss is the head's and
    the trees' alike."""
    state, seconds = load_until_decided(shipped_server.url, humaneval_ids)
    print(f"shipped head on code: {state} after {seconds:.0f} s of load")
    assert state["mode"] == "speculative" and state["gain_low"] > 1.03 and state["flips"] == 0


def _steps(url: str) -> float:
    return sum(samples(url, "jetspec_steps_total").values())


def _state_during(url: str, ids: list[int], max_new: int) -> tuple[dict, dict]:
    """/server_info's JETSPEC state read while one request is decoding (after its first decode step:
    the prefill stores the prompt's rows before any step plan is known), and the request's reply."""
    reply: dict = {}
    steps = _steps(url)
    worker = threading.Thread(target=lambda: reply.update(generate(url, ids, max_new)))
    worker.start()
    deadline = time.monotonic() + 120
    while _steps(url) < steps + 2 and worker.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    state = jetspec_state(url)
    assert worker.is_alive(), "the request finished before its state could be read mid-decode"
    worker.join()
    return state, reply


def test_a_cohort_the_yaml_default_gates_off_does_no_draft_work_and_keeps_no_context(
    controls_server, humaneval_ids, hf_greedy, tokenizer, jetspec_server
):
    url = controls_server.url
    prompt = humaneval_ids[2]

    def draft_s_and_off_steps() -> tuple[float, float]:  # the server's totals: other tests' requests count too
        steps = samples(url, "jetspec_steps_total").items()
        return sum(samples(url, "jetspec_draft_seconds_total").values()), sum(
            v for labels, v in steps if dict(labels)["budget"] == "0"
        )

    before = draft_s_and_off_steps()
    state, reply = _state_during(url, prompt, MAX_NEW)
    draft_s, off_steps = (after - earlier for after, earlier in zip(draft_s_and_off_steps(), before))
    # mid-decode the pool holds the prompt's context (the prefill writes it before a step plan is
    # known) and nothing of the decoded tokens: their steps kept none
    assert state["jetspec_live_draft_states"] == 1 and state["jetspec_context_pool"]["valid_slots"] == len(prompt)
    assert draft_s == 0 and off_steps == reply["meta_info"]["spec_verify_ct"] > 0
    assert until_eos(reply["output_ids"], tokenizer.eos_token_id) == hf_greedy[2]  # no tree: the ignored mask never bit
    # no radix cache on this server: the finished request's slots are free, and so is their context
    assert jetspec_state(url)["jetspec_context_pool"]["valid_slots"] == 0
    # a speculating server keeps context for the decoded tokens too: this measurement can fail
    state, _ = _state_during(jetspec_server.url, prompt, MAX_NEW)
    assert state["jetspec_context_pool"]["valid_slots"] > len(prompt)
