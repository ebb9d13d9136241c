"""JETSPEC with `--tp-size 2` in the real SGLang server on CPU: two ranks, one core each.

The ranks reduce over gloo (launch.TP2_ENV says how and why).

A plain TP=2 server answers everything the tests compare with and stops, then one JETSPEC TP=2 server
serves the rest: one TP server at a time, since each holds two ranks' processes (memory) and both
cores. The first test (slow) starts a JETSPEC TP=2 server whose rank 1 alters every tree it receives
(JETSPEC_DEBUG_PERTURB_RANK): it must refuse to go on."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_client import (
    ADMIN_KEY,
    MAX_NEW,
    generate,
    generate_all,
    jetspec_args,
    jetspec_state,
    output_ids_four_at_a_time,
    post,
    retracted_under,
    server_args,
    until_eos,
)

from bench.sglang_cpu_compare import policy_env
from harness.sglang_cpu import TP2_ENV

TP2 = ("--tp-size", "2")
PROMPTS = 8
TIGHT_POOL = 700  # KV tokens per rank: the first four HumanEval prompts (440 tokens) growing by 96 each do not fit
RETRACTING_LENGTH = 96
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


CONCURRENT_LENGTHS = [MAX_NEW - 4 * (i % 4) for i in range(PROMPTS)]  # requests leave and join mid-batch
BUDGET_0_TOKENS = 16
NO_NATIVE_BLOCKS = {"same_allocation": {"enabled": False}}


def retracting_bodies(humaneval_ids) -> list[dict]:
    sampling = {"temperature": 0, "max_new_tokens": RETRACTING_LENGTH, "ignore_eos": True}
    return [{"input_ids": ids, "sampling_params": sampling} for ids in humaneval_ids[:4]]


@pytest.fixture(scope="module")
def plain_tp(servers, smollm2_dir, humaneval_ids, tokenizer) -> dict:
    """Plain TP=2 SGLang's outputs for every comparison below, from one server that stops before the JETSPEC
    one starts."""
    server = servers.start("plain-tp2", server_args(smollm2_dir, *TP2, "--disable-overlap-schedule"), TP2_ENV)
    eos, prompts = tokenizer.eos_token_id, humaneval_ids[:PROMPTS]
    try:
        return {
            "sequential": [until_eos(r["output_ids"], eos) for r in generate_all(server.url, prompts)],
            "concurrent": [
                until_eos(r["output_ids"], eos)
                for r in generate_all(server.url, prompts, concurrency=4, max_new=CONCURRENT_LENGTHS)
            ],
            "budget 0": generate(server.url, humaneval_ids[0], BUDGET_0_TOKENS, ignore_eos=True)["output_ids"],
            "retraction": output_ids_four_at_a_time(server.url, retracting_bodies(humaneval_ids)),
        }
    finally:
        servers.stop(server)


@pytest.fixture(scope="module")
def tp_jetspec(servers, smollm2_dir, plain_tp, tmp_path_factory):
    """Pushes need the admin key; a tight KV pool makes SGLang retract (a low initial new-token ratio admits
    four long requests at once, and the shipped policy's widths reserve the rest); retraction is lossless, so
    every test's outputs stay comparable. Starts once plain TP=2's outputs are in (`plain_tp`). The shipped
    policy runs without the same-allocation control's native blocks: two one-core ranks can make trees lose,
    and these tests need every step to verify one."""
    args = jetspec_args(smollm2_dir, *TP2, "--admin-api-key", ADMIN_KEY, max_total_tokens=TIGHT_POOL)
    policy = policy_env("jetspec", tmp_path_factory.mktemp("tp-policy"), {"jetspec": NO_NATIVE_BLOCKS})
    server = servers.start("jetspec-tp2", args, {**TP2_ENV, "SGLANG_INIT_NEW_TOKEN_RATIO": "0.1", **policy})
    yield server
    servers.stop(server)


def ranks(url: str) -> list[dict]:
    return jetspec_state(url)["jetspec_ranks"]


def wait_for_no_draft_state_on_any_rank(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (live := [rank["live_draft_states"] for rank in ranks(url)]) != [0, 0]:
        assert time.monotonic() < deadline, f"draft states left behind per rank: {live}"
        time.sleep(0.5)


@pytest.mark.slow  # the agreement check itself runs in the default suite: tests/sglang/test_rank_agreement.py
def test_a_rank_that_drafts_another_tree_is_refused_before_the_verify(servers, smollm2_dir, humaneval_ids):
    """The whole server stops when rank 1 alters its trees (a third TP server: minutes on 2 cores). The
    default suite proves the per-step check over two gloo processes (tests/sglang/test_rank_agreement.py)."""
    server = servers.start(
        "jetspec-tp2-desync", jetspec_args(smollm2_dir, *TP2), {**TP2_ENV, "JETSPEC_DEBUG_PERTURB_RANK": "1"}
    )
    try:
        try:
            status, reply = post(
                f"{server.url}/generate",
                {"input_ids": humaneval_ids[0], "sampling_params": {"max_new_tokens": 8}},
                timeout=120,
            )
        except OSError as exc:  # the connection dropped: the server went down mid-request
            status, reply = None, exc
        assert status != 200, reply
        deadline = time.monotonic() + 60
        while server.process.poll() is None:  # the scheduler's error takes the whole server down
            assert time.monotonic() < deadline, "the server kept running after its ranks disagreed"
            time.sleep(0.5)
        log = server.log.read_text()
        assert "JETSPEC tensor-parallel ranks disagree on this step's trees" in log
        assert "stopping before the KV cache diverges" in log
    finally:
        servers.stop(server)


def test_plain_tp2_on_the_standin_equals_hf(plain_tp, hf_greedy):
    assert plain_tp["sequential"] == hf_greedy[:PROMPTS]


def test_jetspec_tp2_equals_plain_tp2_and_hf_one_at_a_time(tp_jetspec, plain_tp, humaneval_ids, hf_greedy, tokenizer):
    replies = generate_all(tp_jetspec.url, humaneval_ids[:PROMPTS])
    assert [until_eos(r["output_ids"], tokenizer.eos_token_id) for r in replies] == plain_tp["sequential"]
    assert plain_tp["sequential"] == hf_greedy[:PROMPTS]
    steps = sum(r["meta_info"]["spec_verify_ct"] for r in replies)
    tokens = sum(r["meta_info"]["completion_tokens"] for r in replies)
    assert steps * 1.3 < tokens, (steps, tokens)  # rank 0's trees were verified and kept by both ranks


def test_jetspec_tp2_equals_plain_tp2_four_concurrent(tp_jetspec, plain_tp, humaneval_ids, hf_greedy, tokenizer):
    replies = generate_all(tp_jetspec.url, humaneval_ids[:PROMPTS], concurrency=4, max_new=CONCURRENT_LENGTHS)
    spec = [until_eos(r["output_ids"], tokenizer.eos_token_id) for r in replies]
    assert spec == plain_tp["concurrent"]
    assert spec == [ref[:n] for ref, n in zip(hf_greedy, CONCURRENT_LENGTHS)]


def push_budgets(url: str, budgets: dict[str, int], ttl_s: float) -> tuple[int, object]:
    flat = {"jetspec_policy.ttl_s": ttl_s, **{f"jetspec_policy.{c}.budget": b for c, b in budgets.items()}}
    return post(f"{url}/set_internal_state", {"server_args": flat}, AUTH)


def test_unseeded_sampled_requests_draw_alike_on_both_ranks(tp_jetspec, humaneval_ids):
    """Each rank accepts with the request's own generator; unseeded ones start from different random states
    per process unless rank 0's state travels with the trees. If it did not, the ranks' accepted tokens would
    differ and the per-step check would stop the server."""
    bodies = [
        {"input_ids": ids, "sampling_params": {"temperature": 0.8, "max_new_tokens": 24}} for ids in humaneval_ids[:4]
    ]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda body: post(f"{tp_jetspec.url}/generate", body), bodies))
    assert [status for status, _ in replies] == [200] * 4, replies
    assert sum(r["meta_info"]["spec_verify_ct"] for _, r in replies) < sum(
        r["meta_info"]["completion_tokens"] for _, r in replies
    )
    assert tp_jetspec.process.poll() is None


def test_a_pushed_table_reaches_both_ranks_and_budget_0_decodes_plainly(tp_jetspec, plain_tp, humaneval_ids):
    yaml = {c["name"]: c["budget"] for c in jetspec_state(tp_jetspec.url)["jetspec_policy"]["table"]["cohorts"]}
    status, reply = push_budgets(tp_jetspec.url, {**yaml, "bs1": 0}, ttl_s=120)
    assert status == 200 and all(reply), reply
    try:
        tables = [rank["policy_table"] for rank in ranks(tp_jetspec.url)]
        assert len(tables) == 2 and tables[0] == tables[1]
        assert {c["name"]: c["budget"] for c in tables[1]["cohorts"]}["bs1"] == 0
        spec = generate(tp_jetspec.url, humaneval_ids[0], BUDGET_0_TOKENS, ignore_eos=True)
        assert spec["meta_info"]["spec_verify_ct"] == spec["meta_info"]["completion_tokens"] - 1  # one token a step
        assert spec["output_ids"] == plain_tp["budget 0"]
    finally:  # a push that expires at once: the YAML's table again, on both ranks
        push_budgets(tp_jetspec.url, yaml, ttl_s=0.001)


def test_head_context_on_rank_0_alone_and_abort_leaves_no_draft_state_on_any_rank(tp_jetspec, humaneval_ids):
    long_request = threading.Thread(
        target=lambda: post(
            f"{tp_jetspec.url}/generate",
            {
                "input_ids": humaneval_ids[1],
                "rid": "tp-abort-me",
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
            },
        )
    )
    long_request.start()
    deadline = time.monotonic() + 60
    while (running := ranks(tp_jetspec.url))[1]["live_draft_states"] == 0:  # rank 1 holds it too while it runs
        assert time.monotonic() < deadline, "the request never reached rank 1"
        time.sleep(0.2)
    # the head's context lives on rank 0 alone (rank 1 does not even gather tap rows)
    assert [rank["context_valid_slots"] > 0 for rank in running] == [True, False], running
    status, _ = post(f"{tp_jetspec.url}/abort_request", {"rid": "tp-abort-me"}, AUTH)
    assert status == 200
    long_request.join(60)
    wait_for_no_draft_state_on_any_rank(tp_jetspec.url)


def test_retraction_keeps_output_exact_and_leaves_no_draft_state_on_any_rank(tp_jetspec, plain_tp, humaneval_ids):
    assert retracted_under(tp_jetspec, retracting_bodies(humaneval_ids)) == plain_tp["retraction"]
    wait_for_no_draft_state_on_any_rank(tp_jetspec.url)


def test_tp2_env_turns_sglangs_memory_balance_check_into_a_warning(monkeypatch):
    """The harness's TP=2 servers share one host's free memory with every other test's server, so SGLang's
    rank-balance check must only warn (TP2_ENV): this fails if SGLang renames the switch or stops reading
    the harness's value as off, which would bring back CI runs that lose every TP=2 test to it."""
    from sglang.srt.distributed import bootstrap
    from sglang.srt.environ import envs

    for name, value in TP2_ENV.items():
        monkeypatch.setenv(name, value)
    assert envs.SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK.get() is False
    bootstrap._check_tp_memory_balance(pre_model_load_memory=12.9, local_gpu_memory=15.9)  # warns, no raise
    monkeypatch.delenv("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK")
    with pytest.raises(RuntimeError, match="unbalanced"):
        bootstrap._check_tp_memory_balance(pre_model_load_memory=12.9, local_gpu_memory=15.9)
