"""JETSPEC with SGLang's radix (prefix) cache on: the head's context of a cached prefix comes from the
context pool beside the KV (sglang_jetspec/adapter/context_pool_memory.py), so cache hits speculate as well as
a request computed from scratch, and greedy output equals plain SGLang's with the cache on.

One plain and one JETSPEC server, both with the radix cache and a KV pool small enough that later
requests evict earlier prefixes. Retraction with the radix cache on: test_real_sglang_requests.py's
tight server runs with it."""

from __future__ import annotations

import pytest
from e2e_client import (
    MAX_NEW,
    REPO,
    generate,
    generate_all,
    get,
    jetspec_args,
    jetspec_state,
    server_args,
    wait_for_no_draft_state,
)

RADIX_POOL = 1536  # KV tokens: the shared prefix and four requests fit; everything the module sends does not

# A long shared system prompt (~300 tokens), as agents and chat front-ends send with every request;
# bench/sglang_cpu_compare.py --shared-prefix measures the same workload.
SYSTEM = (REPO / "bench" / "prompts" / "system-prompt.txt").read_text()

TURN_END = "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
QUESTIONS = ["Now write the same function without recursion.", "Add a test for the empty input."]


@pytest.fixture(scope="module")
def radix_servers(servers, smollm2_dir, policy_file):
    plain = servers.start(
        "plain-radix",
        server_args(smollm2_dir, "--disable-overlap-schedule", radix_cache=True, max_total_tokens=RADIX_POOL),
    )
    spec = servers.start(
        "jetspec-radix",
        jetspec_args(smollm2_dir, radix_cache=True, max_total_tokens=RADIX_POOL),
        {"JETSPEC_POLICY": str(policy_file)},
    )
    yield plain, spec
    servers.stop(plain)
    servers.stop(spec)


@pytest.fixture(scope="module")
def system_ids(tokenizer) -> list[int]:
    ids = tokenizer(SYSTEM, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 280
    return ids


def _turns(replies):
    return [(r["output_ids"], r["meta_info"]["cached_tokens"], r["meta_info"]["spec_verify_ct"]) for r in replies]


@pytest.fixture(scope="module")
def shared_prompt_replies(radix_servers, system_ids, humaneval_ids):
    """Eight requests sharing the system prompt: four one at a time, then four concurrent, on each server."""
    prompts = [system_ids + ids for ids in humaneval_ids]
    out = {}
    for name, server in zip(("plain", "jetspec"), radix_servers):
        out[name] = generate_all(server.url, prompts[:4]) + generate_all(server.url, prompts[4:], concurrency=4)
    return prompts, out


def test_shared_system_prompt_hits_the_cache_and_equals_plain_alone_and_concurrent(shared_prompt_replies, system_ids):
    _, replies = shared_prompt_replies
    assert [r["output_ids"] for r in replies["jetspec"]] == [r["output_ids"] for r in replies["plain"]]
    cached = [r["meta_info"]["cached_tokens"] for r in replies["jetspec"]]
    assert all(c >= len(system_ids) for c in cached[1:]), cached  # every later request hit the shared prefix
    # speculation ran on the hits: their steps kept more than the bonus token
    steps = sum(r["meta_info"]["spec_verify_ct"] for r in replies["jetspec"][1:])
    tokens = sum(r["meta_info"]["completion_tokens"] for r in replies["jetspec"][1:])
    assert 0 < steps < tokens / 1.3, (steps, tokens)


def test_a_multi_turn_chat_reuses_a_prefix_written_by_speculative_steps(
    radix_servers, jetspec_server, system_ids, humaneval_ids, tokenizer
):
    """Turn 2 extends turn 1's prompt and answer: the answer's KV and head context were written by
    JETSPEC's verify steps. Output equals plain SGLang's (cache on), and the cache hit speculates exactly
    as the same request does on a JETSPEC server without the cache (same steps, same tokens)."""
    plain, spec = radix_servers
    for conversation, question in enumerate(QUESTIONS):
        first = system_ids + humaneval_ids[conversation]
        answers = [generate(server.url, first) for server in radix_servers]
        assert answers[0]["output_ids"] == answers[1]["output_ids"]
        follow = tokenizer(TURN_END.format(question), add_special_tokens=False)["input_ids"]
        second = first + answers[1]["output_ids"] + follow
        hit, plain_reply, no_cache = (generate(url, second) for url in (spec.url, plain.url, jetspec_server.url))
        assert hit["meta_info"]["cached_tokens"] >= len(first) + len(answers[1]["output_ids"]) - 1
        assert hit["output_ids"] == plain_reply["output_ids"] == no_cache["output_ids"]
        assert no_cache["meta_info"]["cached_tokens"] == 0
        assert hit["meta_info"]["spec_verify_ct"] == no_cache["meta_info"]["spec_verify_ct"] < MAX_NEW


def test_an_evicted_prefix_is_computed_again_and_stays_exact(radix_servers, shared_prompt_replies, humaneval_ids):
    """Unrelated prompts (each HumanEval prompt reversed) push more than the pool holds through the
    server; the least recently used prefixes go, among them the third request's own part (the
    multi-turn test reused only the first two). Sent again, it is computed again and stays exact."""
    prompts, replies = shared_prompt_replies
    spec = radix_servers[1]
    generate_all(spec.url, [ids[::-1] for ids in humaneval_ids], concurrency=4)
    again = generate(spec.url, prompts[2])
    assert again["meta_info"]["cached_tokens"] < len(prompts[2]) - 1  # evicted (the system prompt may remain)
    assert again["output_ids"] == replies["plain"][2]["output_ids"]


def test_after_the_server_drains_context_is_held_only_for_cached_tokens(
    radix_servers, shared_prompt_replies, system_ids
):
    spec = radix_servers[1]
    wait_for_no_draft_state(spec.url)
    pool = jetspec_state(spec.url)["jetspec_context_pool"]
    assert pool["slots"] == RADIX_POOL + 1  # one per KV slot, slot 0 (SGLang's padding slot) included
    assert len(system_ids) <= pool["valid_slots"] <= pool["target_held_slots"]  # only cached tokens keep theirs
    assert "Cache flushed" in get(f"{spec.url}/flush_cache")
    assert jetspec_state(spec.url)["jetspec_context_pool"]["valid_slots"] == 0  # every slot free: no context left
