"""Structured output through JETSPEC in the real SGLang server (fp32, greedy unless said): JSON-schema,
regex and EBNF requests, eight of each, in one batch with free-text requests, give plain SGLang's tokens;
every finished JSON answer is valid against its schema; sampled JSON stays valid, and the shadow checker
rescores constrained answers under their grammars clean (and finds errors without them); an invalid schema gets
plain SGLang's error; a grammar request aborted mid-stream leaves nothing behind. Grammar requests at
budget 0 (tests/sglang_cpu/test_real_sglang_control.py) and under retraction
(test_real_sglang_requests.py) run beside those servers' other tests; the negative control (no masks)
runs on the worker itself (tests/sglang/test_worker_forward.py)."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse

import jsonschema
import pytest
from e2e_client import (
    REPO,
    copy_spool,
    generate_batch,
    live_draft_states,
    post,
    shadow_run,
    wait_for_no_draft_state,
    wait_for_spooled,
)

from sglang_jetspec.reference.prompts import constraint_params, encode, read_prompt_file

MAX_NEW = 40
JSON_NEW = 64  # a tool call's arguments: most finish within it
REGEX = [
    ("What year did people first walk on the Moon? Answer with the year only.", r"[0-9]{4}"),
    ("Give a date in ISO format, for example 2024-01-31.", r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"),
    ("Is Python a compiled language? Answer yes or no, then explain briefly.", r"(Yes|No)\. [A-Za-z ,']{10,80}\."),
    ("Write a US phone number for a fictional pizza shop.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("Name a primary colour.", r"(red|blue|yellow)"),
    ("Write an email address for a support team at example.com.", r"[a-z]{3,12}@example\.com"),
    ("Rate the movie Inception from 1 to 10.", r"([1-9]|10)/10"),
    ("When does a typical office open? Answer as HH:MM.", r"[0-2][0-9]:[0-5][0-9]"),
]
EBNF = [
    ("Write an arithmetic expression that equals 12.", "root ::= term ([-+*/] term)*\nterm ::= [0-9]+"),
    ("Write a Python function header for adding two numbers.", 'root ::= "def " [a-z_]+ "(" [a-z_, ]* "):"'),
    ("List three fruits, comma separated.", 'root ::= item (", " item)*\nitem ::= [a-z]+'),
    (
        "Write a SQL query selecting name and age from users.",
        'root ::= "SELECT " col (", " col)* " FROM " col ";"\ncol ::= [a-z_]+',
    ),
    (
        "Write two settings of a config file as key=value lines.",
        'root ::= pair ("\\n" pair)*\npair ::= [a-z_]+ "=" [a-z0-9_.]+',
    ),
    ("Is 7 a prime number? Reply true or false.", 'root ::= "true" | "false"'),
    (
        "Make the word hello bold in HTML.",
        'root ::= "<" tag ">" [A-Za-z ]+ "</" tag ">"\ntag ::= "b" | "strong" | "em"',
    ),
    ("Show the shell command that lists all files, hidden ones too.", 'root ::= "ls" (" -" [a-z]+)* (" " [a-z/._]+)?'),
]


def _chat(tokenizer, question: str) -> list[int]:
    return encode({"messages": [{"role": "user", "content": question}]}, tokenizer)


@pytest.fixture(scope="module")
def items(tokenizer, humaneval_ids) -> list[tuple[str, list[int], dict]]:
    """(kind, prompt ids, sampling params): 8 tool calls under their JSON schemas (the benchmark's own
    prompts), 8 regex and 8 EBNF answers, and 2 free-text code completions in the same batch."""
    tools = read_prompt_file(REPO / "bench" / "prompts" / "json-tools.jsonl")[:8]
    greedy = {"temperature": 0, "max_new_tokens": MAX_NEW}
    out = [
        ("json", encode(r, tokenizer), {**greedy, "max_new_tokens": JSON_NEW, **constraint_params(r)}) for r in tools
    ]
    out += [("regex", _chat(tokenizer, q), {**greedy, "regex": pattern}) for q, pattern in REGEX]
    out += [("ebnf", _chat(tokenizer, q), {**greedy, "ebnf": grammar}) for q, grammar in EBNF]
    out += [("free", ids, greedy) for ids in humaneval_ids[:2]]
    return out


@pytest.fixture(scope="module")
def replies(jetspec_server, plain_server, items):
    return generate_batch(plain_server.url, items), generate_batch(jetspec_server.url, items)


def _finished(reply: dict) -> bool:
    return reply["meta_info"]["finish_reason"]["type"] == "stop"


def test_json_regex_and_ebnf_requests_give_plain_sglangs_tokens_beside_free_text(items, replies, tokenizer):
    plain, spec = replies
    differ = [
        (kind, i)
        for i, ((kind, _, _), p, s) in enumerate(zip(items, plain, spec))
        if p["output_ids"] != s["output_ids"]
    ]
    assert not differ, differ
    # speculation ran on the constrained requests: some verify step accepted drafted tokens
    constrained = [s["meta_info"] for (kind, _, _), s in zip(items, spec) if kind != "free"]
    assert max(m["completion_tokens"] / m["spec_verify_ct"] for m in constrained) > 1.5
    for (kind, _, params), reply in zip(items, spec):
        text = tokenizer.decode(reply["output_ids"], skip_special_tokens=True)
        if kind == "regex" and _finished(reply):
            assert re.fullmatch(params["regex"], text), (params["regex"], text)


def test_every_finished_json_answer_is_valid_against_its_schema(items, replies, tokenizer):
    _, spec = replies
    answers = [
        (json.loads(params["json_schema"]), reply) for (kind, _, params), reply in zip(items, spec) if kind == "json"
    ]
    finished = [(schema, reply) for schema, reply in answers if _finished(reply)]
    assert len(finished) >= 5, [r["meta_info"]["finish_reason"] for _, r in answers]
    for schema, reply in finished:
        jsonschema.validate(json.loads(tokenizer.decode(reply["output_ids"], skip_special_tokens=True)), schema)


def test_sampled_json_answers_stay_valid_and_shadow_check_clean(
    jetspec_server, items, replies, tokenizer, shadow_spool, smollm2_dir, tmp_path
):
    """Temperature 0.8 with seeds: drawn from the masked distribution, so every finished answer is valid
    JSON for its schema, and the draws are not the greedy answers. The shadow checker rescores them, and
    the greedy constrained answers, under their grammars rebuilt from the spool: clean. Negative control:
    the greedy records checked without their grammar show errors (the masks forced tokens)."""
    json_items = [(ids, params) for kind, ids, params in items if kind == "json"][:4]
    sampled = [
        {**params, "temperature": 0.8, "top_p": 0.95, "sampling_seed": 7 + i, "max_new_tokens": 96}
        for i, (_, params) in enumerate(json_items)
    ]
    out = generate_batch(jetspec_server.url, [("json", ids, params) for (ids, _), params in zip(json_items, sampled)])
    greedy = [reply["output_ids"] for (kind, _, _), reply in zip(items, replies[1]) if kind == "json"][:4]
    assert [r["output_ids"] for r in out] != greedy
    finished = [(params, r) for params, r in zip(sampled, out) if _finished(r)]
    assert len(finished) >= 2
    for params, reply in finished:
        jsonschema.validate(
            json.loads(tokenizer.decode(reply["output_ids"], skip_special_tokens=True)),
            json.loads(params["json_schema"]),
        )

    sampled_ids = {r["meta_info"]["id"] for r in out}
    greedy_ids = {r["meta_info"]["id"] for (kind, _, _), r in zip(items, replies[1]) if kind != "free"}
    wait_for_spooled(shadow_spool, sampled_ids | greedy_ids)
    spool = copy_spool(
        shadow_spool, tmp_path / "spool", lambda record: record["request_id"] in sampled_ids | greedy_ids
    )
    status, reports, output = shadow_run(spool, "local", tmp_path / "checked", smollm2_dir)
    assert status == 0 and reports and not any(r["alarm"] or r["failed"] for r in reports), output[-3000:]
    assert sum(r["requests"]["sampled"] for r in reports) == len(sampled_ids)
    assert sum(r["requests"]["greedy"] for r in reports) == len(greedy_ids)
    assert sum(r["mismatches"].get("error", 0) + r["mismatches"].get("impossible", 0) for r in reports) == 0

    free = copy_spool(
        shadow_spool,
        tmp_path / "unmasked",
        lambda record: record["request_id"] in greedy_ids,
        change=lambda record: {**record, "constraint": None},
    )
    _, reports, output = shadow_run(free, "local", tmp_path / "unmasked-checked", smollm2_dir)
    assert sum(r["mismatches"].get("error", 0) for r in reports) > 0, output[-3000:]


@pytest.mark.parametrize(
    "field, value",
    [
        ("json_schema", '{"type": "object", "properties": 5}'),
        ("json_schema", '{"type": '),
        ("regex", "([0-9]"),
        ("ebnf", 'root ::= "a" undefined_rule'),
    ],
)
def test_an_invalid_grammar_gets_plain_sglangs_error_and_serving_goes_on(
    jetspec_server, plain_server, items, replies, field, value
):
    answers = []
    for url in (plain_server.url, jetspec_server.url):
        answers.append(
            post(
                f"{url}/generate",
                {"input_ids": items[8][1], "sampling_params": {"temperature": 0, "max_new_tokens": 8, field: value}},
            )
        )
    (plain_status, plain_reply), (status, reply) = answers
    untimed = lambda r: re.sub(r"\[\d\d:\d\d:\d\d\] ", "", json.dumps(r))  # noqa: E731 (xgrammar stamps its errors)
    assert status == plain_status == 400 and untimed(reply) == untimed(plain_reply), answers
    kind, ids, params = items[8]
    status, again = post(f"{jetspec_server.url}/generate", {"input_ids": ids, "sampling_params": params})
    assert status == 200 and again["output_ids"] == replies[0][8]["output_ids"]


def test_a_grammar_request_aborted_mid_stream_leaves_no_state(jetspec_server, items, replies):
    url = urllib.parse.urlparse(jetspec_server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    body = {
        "input_ids": items[-1][1],
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True, "regex": r"[ -~\n\t]*"},
    }
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    response.readline()  # the first streamed chunk: the request is running
    assert live_draft_states(jetspec_server.url) >= 1
    conn.close()
    wait_for_no_draft_state(jetspec_server.url)
    kind, ids, params = items[0]
    status, again = post(f"{jetspec_server.url}/generate", {"input_ids": ids, "sampling_params": params})
    assert status == 200 and again["output_ids"] == replies[0][0]["output_ids"]
