"""The server's own same-allocation control in real SGLang (policies/same_allocation.py): with no
controller attached, a head that cannot pay is turned native on the server's own measurements and stays
there, and the tokens are plain SGLang's throughout (native blocks are ordinary decode steps). That a head
that pays stays on is tested on the shipped server (test_real_sglang_defaults.py)."""

from __future__ import annotations

import pytest
from e2e_client import HEAD, bs1_control, generate, generate_all, jetspec_args, load_until_decided, outputs_until_eos

from harness.useless_head import make_useless_head

# Fixed trees of 16 nodes, no lookup: every speculative step pays for a full tree of the head's drafts.
FIXED_16_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 16, tree_sizing: fixed}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 16], default: 16, tree_sizing: fixed}
head: {max_budget: 16, max_draft_rounds: 0}
"""


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = tmp_path_factory.mktemp("same-allocation") / "policy.yaml"
    path.write_text(FIXED_16_YAML)
    return path


@pytest.fixture(scope="module")
def useless_head(tmp_path_factory):
    """The shipped head with every weight replaced by noise of the same scale: its drafts are random tokens."""
    return make_useless_head(HEAD, tmp_path_factory.mktemp("useless-head") / "head")


def test_a_useless_head_is_turned_native_and_stays_there_with_plain_tokens(
    servers, smollm2_dir, policy, useless_head, humaneval_ids, hf_greedy, tokenizer
):
    args = jetspec_args(smollm2_dir, "--enable-metrics", head=useless_head)
    server = servers.start("jetspec-useless-head", args, {"JETSPEC_POLICY": str(policy)})
    try:
        state, seconds = load_until_decided(server.url, humaneval_ids)
        print(f"useless head: {state} after {seconds:.0f} s of load")
        assert state["mode"] == "native" and state["gain_high"] < 1.03 and state["flips"] == 0
        # more load: it stays native (re-probing one block in 16), and the tokens are plain SGLang's
        replies = generate_all(server.url, humaneval_ids)
        assert outputs_until_eos(replies, tokenizer.eos_token_id) == hf_greedy
        for prompt in humaneval_ids[:4]:
            generate(server.url, prompt, max_new_tokens=128)
        after = bs1_control(server.url)
        assert after["mode"] == "native" and after["flips"] == 0
        assert after["blocks"]["speculative"] >= state["blocks"]["speculative"]  # still measured
    finally:
        servers.stop(server)
