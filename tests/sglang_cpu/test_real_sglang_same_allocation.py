"""The server's own same-allocation control in real SGLang (policies/same_allocation.py): with no
controller attached, a head that cannot pay is turned native on the server's own measurements and stays
there, and the tokens are plain SGLang's throughout (native blocks are ordinary decode steps). That a head
that pays stays on is tested on the shipped server (test_real_sglang_defaults.py)."""

from __future__ import annotations

import pytest
from e2e_client import HEAD, bs1_control, generate_all, jetspec_args, load_until_decided, outputs_until_eos, steps_at

from harness.useless_head import make_useless_head

# Fixed trees of 16 nodes, no lookup: every speculative step pays for a full tree of the head's drafts.
# Once decided, one block in 4 re-measures speculation (shipped: 16 to 32), so that the load after the
# decision re-probes it several times in a minute of CI.
STEADY_EVERY = 4
FIXED_16_YAML = f"""\
cohorts:
  - {{name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 16, tree_sizing: fixed}}
  - {{name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 16], default: 16, tree_sizing: fixed}}
head: {{max_budget: 16, max_draft_rounds: 0}}
same_allocation: {{steady_every: {STEADY_EVERY}, steady_every_max: {STEADY_EVERY}}}
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
        assert state["other_mode_every"] == STEADY_EVERY
        # more load: it stays native while re-probing speculation, and the tokens are plain SGLang's
        probed = steps_at(server.url, "bs1", 16)
        replies = generate_all(server.url, humaneval_ids)
        assert outputs_until_eos(replies, tokenizer.eos_token_id) == hf_greedy
        after = bs1_control(server.url)
        assert after["mode"] == "native" and after["flips"] == 0
        assert steps_at(server.url, "bs1", 16) > probed  # speculative blocks ran after the decision: still measured
    finally:
        servers.stop(server)
