"""What clients and operators do to the real SGLang server with JETSPEC: an OpenAI client streaming
chat completions, seeded sampling re-checked by the shadow checker (against the reference engine and
against a plain SGLang server), a client that disconnects mid-generation, a server forced to retract
requests (and to abort retracted ones while they wait); no per-request draft state is left behind."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

import pytest
from e2e_client import (
    copy_spool,
    generate,
    jetspec_args,
    jetspec_state,
    live_draft_states,
    output_ids_four_at_a_time,
    post,
    retracted_under,
    server_info,
    shadow_run,
    until_eos,
    wait_for_no_draft_state,
    wait_for_spooled,
)

CHAT = [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]

GREEDY_CHECKED = 8  # greedy spool records the shadow checks re-score


def stream_chat(url: str, max_tokens: int = 48) -> tuple[str, int, int]:
    """(text, content chunks, completion tokens) of a streamed greedy chat completion via `openai`."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="default",
        messages=CHAT,
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    return "".join(parts), len(parts), usage.completion_tokens


def test_openai_client_streams_the_same_chat_text_with_multi_token_chunks(jetspec_server, plain_server):
    text, chunks, tokens = stream_chat(jetspec_server.url)
    plain_text, plain_chunks, plain_tokens = stream_chat(plain_server.url)
    assert text == plain_text and tokens == plain_tokens
    assert plain_chunks >= tokens - 2  # plain decoding: about one chunk per token
    assert chunks < tokens  # a step that accepted drafts streamed its tokens in one chunk


def sampled(url: str, ids: list[int], seed: int) -> dict:
    return generate(url, ids, 24, temperature=1.0, top_p=0.9, sampling_seed=seed)


def test_seeded_sampling_reproduces_and_shadow_checks_clean(
    jetspec_server, plain_server, confident_prompts, shadow_spool, smollm2_dir, tmp_path
):
    """The speculative steps draw from each request's own generator, seeded by sampling_seed, so a seed
    reproduces a request. Its first token comes from SGLang's prefill sampler, which honours seeds only
    under --enable-deterministic-inference (GPU backends): the prompts end where that token is certain
    under top-p 0.9, so every difference would come from the speculative steps."""
    prompts = confident_prompts[:4]
    assert len(prompts) >= 4
    first = [sampled(jetspec_server.url, ids, seed=100 + i) for i, ids in enumerate(prompts)]
    again = [sampled(jetspec_server.url, ids, seed=100 + i) for i, ids in enumerate(prompts)]
    other = [sampled(jetspec_server.url, ids, seed=200 + i) for i, ids in enumerate(prompts)]
    tokens = [[r["output_ids"] for r in run] for run in (first, again, other)]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]  # the seed matters: 4 x 24 sampled tokens do not all repeat under other seeds
    assert len({tuple(o) for o in tokens[0]}) == len(prompts)
    # the tee writes each finished request (rate 1.0)
    wait_for_spooled(shadow_spool, {r["meta_info"]["id"] for run in (first, again, other) for r in run})
    # the repeated runs are copies of the first ones: the uniformity tests assume independent draws.
    # alpha 0.001: a false alarm in one CI run in a thousand (the checker's power is tested in tests/shadow/)
    repeats = {r["meta_info"]["id"] for r in again}
    # Every sampled record and the first GREEDY_CHECKED greedy ones (earlier tests' requests; re-scoring
    # them all would take minutes) against the reference engine; those greedy ones also against the plain
    # server through SGLang's logprob API (a sampled record would ask it for the whole vocabulary at
    # every position: minutes on this CPU).
    greedy_kept = []

    def kept(record) -> bool:
        if record["request_id"] in repeats:
            return False
        if record["sampling"]["temperature"] != 0:
            return True
        greedy_kept.append(record["request_id"])
        return len(greedy_kept) <= GREEDY_CHECKED

    spool = copy_spool(shadow_spool, tmp_path / "spool", kept)
    greedy = copy_spool(spool, tmp_path / "greedy-spool", lambda record: record["sampling"]["temperature"] == 0)
    for name, checked, reference, least_sampled in (
        ("engine", spool, "local", 2 * len(prompts)),
        ("plain-sglang", greedy, plain_server.url, 0),
    ):
        status, reports, output = shadow_run(checked, reference, tmp_path / name, smollm2_dir)
        assert status == 0, output[-3000:]  # 0 = no alarm in the last window (3 = alarm)
        assert reports and not any(r["alarm"] for r in reports), output[-3000:]
        assert not any(r["failed"] for r in reports), output[-3000:]
        assert sum(r["requests"]["sampled"] for r in reports) >= least_sampled
        assert sum(r["requests"]["greedy"] for r in reports) >= 1
        assert sum(r["mismatches"].get("error", 0) + r["mismatches"].get("impossible", 0) for r in reports) == 0


def test_client_disconnect_mid_generation_leaves_no_state_and_serving_goes_on(
    jetspec_server, humaneval_ids, hf_greedy, tokenizer
):
    url = urllib.parse.urlparse(jetspec_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    body = {
        "input_ids": humaneval_ids[0],
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True},
    }
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    response.readline()  # the first streamed chunk: the request is running
    assert live_draft_states(jetspec_server.url) >= 1
    conn.close()  # the client goes away; SGLang aborts the request
    wait_for_no_draft_state(jetspec_server.url)
    reply = generate(jetspec_server.url, humaneval_ids[1])
    assert until_eos(reply["output_ids"], tokenizer.eos_token_id) == hf_greedy[1]


TIGHT_CONTEXT = 600
TIGHT_POOL = 1100  # KV tokens: one request at the context limit fits, four HumanEval prompts growing do not
RETRACTING_LENGTH = 160  # new tokens per request: four HumanEval prompts then outgrow the tight server's pool


def _unshared(prompts: list[list[int]]) -> list[list[int]]:
    """The prompts, each behind a token of its own: the radix cache then shares none of their header, and
    four of them growing outgrow the tight pool as they would without the cache."""
    return [[1000 + i] + ids for i, ids in enumerate(prompts)]


@pytest.fixture(scope="module")
def tight_server(servers, smollm2_dir, policy_file):
    """JETSPEC with a KV pool too small for four long requests at once (SGLang must retract) and a short
    context, for a request that runs up to the context limit; with the radix cache on, as production
    servers run (a retracted request's prefix stays cached, and its prefill again reads the head's context).
    A low initial new-token ratio makes the scheduler admit all four at once whatever their max_new_tokens,
    so the retraction comes early."""
    server = servers.start(
        "jetspec-tight",
        jetspec_args(
            smollm2_dir, "--context-length", str(TIGHT_CONTEXT), max_total_tokens=TIGHT_POOL, radix_cache=True
        ),
        {"JETSPEC_POLICY": str(policy_file), "SGLANG_INIT_NEW_TOKEN_RATIO": "0.1"},
    )
    yield server
    servers.stop(server)


# printable ASCII and line breaks: a code continuation decoded under a grammar all the way
CODE_REGEX = r"[ -~\n\t]*"


def test_retraction_keeps_output_exact_and_frees_draft_state(tight_server, plain_server, humaneval_ids):
    """Two of the four requests decode under a regex: a retracted request keeps its grammar state."""
    bodies = [
        {
            "input_ids": ids,
            "sampling_params": {
                "temperature": 0,
                "max_new_tokens": RETRACTING_LENGTH,
                "ignore_eos": True,
                **({"regex": CODE_REGEX} if i % 2 else {}),
            },
        }
        for i, ids in enumerate(_unshared(humaneval_ids[:4]))
    ]
    assert retracted_under(tight_server, bodies) == output_ids_four_at_a_time(plain_server.url, bodies)
    wait_for_no_draft_state(tight_server.url)


def test_aborting_retracted_requests_while_they_wait_frees_their_draft_state(tight_server, humaneval_ids):
    """Requests retracted to the waiting queue and aborted there never get a finish reason the worker sees;
    their draft state must still go (issue: leaked until restart). The same four requests as above:
    SGLang admits all four (a longer max_new_tokens would hold the fourth back: no retraction)."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [
        {
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": RETRACTING_LENGTH, "ignore_eos": True},
        }
        for ids in _unshared(humaneval_ids[:4])
    ]
    log = tight_server.log
    # a retraction is a scheduling event, not a certainty: up to three tries of the four requests
    for attempt in range(3):
        # counted before sending: a retraction logged before the first read would otherwise never count
        start = log.read_text().lower().count("retract")
        with ThreadPoolExecutor(4) as pool:
            replies = [pool.submit(post, f"{tight_server.url}/generate", body) for body in bodies]
            while log.read_text().lower().count("retract") == start and not all(r.done() for r in replies):
                time.sleep(0.05)
            retracted = log.read_text().lower().count("retract") > start
            if retracted:
                status, _ = post(f"{tight_server.url}/abort_request", {"rid": "", "abort_all": True})
                assert status == 200
            finish = [r.result() for r in replies]
        if retracted:
            break
    assert retracted, "three times the four requests finished without a retraction"
    assert any(status != 200 or reply["meta_info"]["finish_reason"]["type"] == "abort" for status, reply in finish), (
        finish
    )
    wait_for_no_draft_state(tight_server.url)
    assert server_info(tight_server.url)  # still serving
    pool = jetspec_state(tight_server.url)["jetspec_context_pool"]
    assert pool["valid_slots"] <= pool["target_held_slots"]  # no context left on a slot the target freed


def test_a_request_running_up_to_the_context_limit(tight_server, plain_server, humaneval_ids):
    """Near the limit SGLang's per-step KV reserve (2 x the largest budget beyond the committed length)
    reaches past context_len + 4 + budget, the req_to_token row width SGLang sizes by default: the
    plugin widens the row (kv_reserve hook), else the reservation is written outside the row."""
    new = 24
    # SGLang caps max_new_tokens at context_len - 1 - prompt - 1 (scheduler.py, max_req_len): this prompt
    # is the longest that still gets all `new` tokens, so the last step ends at the limit itself
    prompt = [t for ids in humaneval_ids for t in ids][: TIGHT_CONTEXT - 2 - new]
    spec = generate(tight_server.url, prompt, new, ignore_eos=True)
    plain = generate(plain_server.url, prompt, new, ignore_eos=True)
    assert spec["output_ids"] == plain["output_ids"] and len(spec["output_ids"]) == new
    assert spec["meta_info"]["spec_verify_ct"] < new  # speculated all the way to the limit
    wait_for_no_draft_state(tight_server.url)
