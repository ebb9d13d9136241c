"""Padded verify widths inside the real SGLang server (fp32): with JETSPEC_VERIFY_WIDTHS each step's trees
are padded to a rung of the ladder, as the verify graphs captured on a GPU need (core.verify_widths), and
the tokens stay plain SGLang's alone, four at a time and under the radix cache, and with grammars and
penalties in one batch. Alone, fixed trees of 6 nodes always pad to the rung 8 (adaptive sizing fills a
rung, as padding makes the rest of it free); four at a time, adaptive trees as the shipped policy sizes
them. The unpadded shipped server gives the same tokens (test_real_sglang_defaults.py), so padded and
unpadded JETSPEC agree through plain SGLang."""

from __future__ import annotations

import json

import pytest
from e2e_client import generate_all, generate_batch, jetspec_args, jetspec_state, outputs_until_eos

from sglang_jetspec.reference.prompts import encode

LADDER = "4,8,16,32,64"
# every step speculates (no native blocks of the same-allocation control); the largest budget, 24, caps
# the ladder: rungs 4, 8, 16, 24
PADDED_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 6, 24], default: 6, drafter: hybrid, tree_sizing: fixed}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 6, 24], default: 24, drafter: hybrid,
     tree_sizing: adaptive}
head: {max_budget: 24, max_draft_rounds: 0}
same_allocation: {enabled: false}
"""
RUNGS = (4, 8, 16, 24)


@pytest.fixture(scope="module")
def region_log(tmp_path_factory):
    return tmp_path_factory.mktemp("verify-region") / "region.jsonl"


@pytest.fixture(scope="module")
def padded_server(servers, smollm2_dir, region_log, tmp_path_factory):
    """JETSPEC with the ladder; its first verify forwards counted for host syncs (stub/verify_region.py)."""
    policy = tmp_path_factory.mktemp("padded") / "policy.yaml"
    policy.write_text(PADDED_YAML)
    server = servers.start(
        "jetspec-padded",
        jetspec_args(smollm2_dir, radix_cache=True),
        {
            "JETSPEC_VERIFY_WIDTHS": LADDER,
            "JETSPEC_TEST_VERIFY_REGION": str(region_log),
            "JETSPEC_POLICY": str(policy),
        },
    )
    yield server
    servers.stop(server)


def test_padded_trees_give_plain_sglangs_greedy_tokens_alone_and_four_at_a_time(
    padded_server, humaneval_ids, hf_greedy, tokenizer
):
    eos = tokenizer.eos_token_id
    alone = generate_all(padded_server.url, humaneval_ids[:4])
    assert outputs_until_eos(alone, eos) == hf_greedy[:4]  # plain SGLang gives HF's tokens (test_real_sglang_greedy.py)
    # the first four prompts again, now from the radix cache, beside four new ones
    four = generate_all(padded_server.url, humaneval_ids, concurrency=4)
    assert outputs_until_eos(four, eos) == hf_greedy
    assert sum(r["meta_info"]["cached_tokens"] for r in four[:4]) > 0
    widths = jetspec_state(padded_server.url)["jetspec_verify_widths"]
    assert widths["rungs"] == list(RUNGS)  # the policy's largest budget, 24, is the top rung
    steps = {int(width): n for width, n in widths["steps_by_width"].items()}
    assert set(steps) <= {1, *RUNGS} and steps.get(8, 0) > 0
    assert widths["padded_steps"] > 0  # 6-node trees alone were padded to 8


def test_padded_trees_with_grammars_and_penalties_in_one_batch_give_plain_sglangs_tokens(
    padded_server, plain_server, humaneval_ids, tokenizer
):
    def chat(question):
        return encode({"messages": [{"role": "user", "content": question}]}, tokenizer)

    greedy = {"temperature": 0, "max_new_tokens": 40}
    items = [
        (
            "regex",
            chat("Give a date in ISO format, for example 2024-01-31."),
            {**greedy, "regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"},
        ),
        (
            "regex",
            chat("Is Python a compiled language? Answer yes or no, then explain briefly."),
            {**greedy, "regex": r"(Yes|No)\. [A-Za-z ,']{10,80}\."},
        ),
        (
            "ebnf",
            chat("List three fruits, comma separated."),
            {**greedy, "ebnf": 'root ::= item (", " item)*\nitem ::= [a-z]+'},
        ),
        ("frequency", humaneval_ids[0], {**greedy, "frequency_penalty": 1.0}),
        ("repetition", humaneval_ids[1], {**greedy, "repetition_penalty": 1.3}),
        ("free", humaneval_ids[2], greedy),
    ]
    plain, padded = generate_batch(plain_server.url, items), generate_batch(padded_server.url, items)
    assert [r["output_ids"] for r in padded] == [r["output_ids"] for r in plain]
    assert sum(r["meta_info"]["completion_tokens"] for r in padded) > sum(
        r["meta_info"]["spec_verify_ct"] for r in padded
    )


def test_the_region_a_verify_graph_captures_reads_nothing_back_to_the_host(padded_server, region_log, humaneval_ids):
    """The target's verify forward (what SGLang's decode graph runner captures: its layers with the tap
    capture, the logits processor returning each verify row's hidden state), probed on its first verify
    steps: no `.item()`, `.tolist()`, `.cpu()`, data-dependent shape or other read of device data."""
    generate_all(padded_server.url, humaneval_ids[4:6])  # verify steps, whatever ran before
    records = [json.loads(line) for line in region_log.read_text().splitlines()]
    assert len(records) >= 4 and all(r["device_ops"] > 100 for r in records)  # the layers ran inside the probe
    padded_sizes = {bs * width for bs in range(1, 5) for width in RUNGS}
    assert {r["num_tokens"] for r in records} <= padded_sizes  # a rung's width per request
    assert [r["sync_sites"] for r in records if r["host_syncs"]] == []
