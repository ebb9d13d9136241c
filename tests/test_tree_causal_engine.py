"""Tree-causal rounds in the reference engine on the real SmolLM2 target: greedy output identical to
autoregressive at batch 1 and 4, bookkeeping invariants, refusal of marginal-only heads, and the
rank-1 branch gap read from the verify logits."""

import pytest

from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.oracle import OracleDrafter
from sglang_jetspec.reference.prompts import encode, humaneval_prompts


def humaneval_requests(tokenizer, count, max_new_tokens):
    return [
        Request(encode(p, tokenizer), SamplingParams(max_new_tokens=max_new_tokens), str(i))
        for i, p in enumerate(humaneval_prompts()[:count])
    ]


@pytest.mark.parametrize("rounds, batch", [(1, 4), (2, 1)])
def test_greedy_output_with_draft_rounds_equals_autoregressive(smollm2, reveal_drafter, single_thread, rounds, batch):
    requests = humaneval_requests(smollm2.tokenizer, 4 if batch == 4 else 2, 16)
    rounds_seen = []
    engine = ReferenceEngine(
        smollm2, reveal_drafter, EngineConfig(max_batch_size=batch, draft_rounds=rounds, check_invariants=True)
    )
    spec = engine.generate(requests, budget=16, on_step=lambda r: rounds_seen.append(len(r.draft_round_s)))
    ar = ReferenceEngine(smollm2, None, EngineConfig(max_batch_size=4)).generate(requests, 0)
    assert [o.output_ids for o in spec] == [o.output_ids for o in ar]
    assert any(length > 1 for o in spec for length in o.accept_lengths)
    assert set(rounds_seen) == {1 + rounds}  # marginal pass + one entry per tree-causal round


def test_engine_refuses_draft_rounds_for_a_marginal_only_head(smollm2, untrained_drafter):
    with pytest.raises(ValueError, match="draft_reveal.*--reveal prefix"):
        ReferenceEngine(smollm2, untrained_drafter, EngineConfig(draft_rounds=1))
    with pytest.raises(ValueError, match="draft_rounds=-1"):
        EngineConfig(draft_rounds=-1)


def test_rank1_gap_is_zero_when_the_draft_is_the_target_itself(smollm2, single_thread):
    # the oracle drafts with the target's own logits along the greedy continuation: the rank-1 branch is
    # that continuation and its draft log-prob is the target's, so the gap read from verify logits is ~0
    requests = humaneval_requests(smollm2.tokenizer, 1, 24)
    reference = ReferenceEngine(smollm2, None).generate(
        [Request(r.prompt_ids, SamplingParams(max_new_tokens=40)) for r in requests], 0
    )
    oracle = OracleDrafter(smollm2, max_depth=7)
    oracle.add_reference(requests[0].prompt_ids, reference[0].output_ids)
    gaps = []
    ReferenceEngine(smollm2, oracle, EngineConfig(rank1_gap=True)).generate(
        requests, budget=8, on_step=lambda r: gaps.extend(r.rank1_gaps)
    )
    assert len(gaps) >= 3 and all(g.depth >= 1 for g in gaps) and max(g.depth for g in gaps) == 7
    assert all(abs(g.gap) < 1e-3 for g in gaps)
    assert min(g.target_logprob for g in gaps) < -0.5  # not trivially zero: the branches carry real uncertainty


def test_rank1_gap_of_a_learned_head_is_recorded_per_lane(smollm2, reveal_drafter, single_thread):
    records = []
    engine = ReferenceEngine(smollm2, reveal_drafter, EngineConfig(max_batch_size=2, draft_rounds=1, rank1_gap=True))
    engine.generate(humaneval_requests(smollm2.tokenizer, 2, 8), budget=16, on_step=records.append)
    assert all(len(r.rank1_gaps) == r.batch_size for r in records)
    gaps = [g for r in records for g in r.rank1_gaps]
    assert all(1 <= g.depth <= 15 and g.draft_logprob <= 0 and g.target_logprob <= 0 for g in gaps)
    assert ReferenceEngine(smollm2, reveal_drafter).config.rank1_gap is False  # off by default: no cost


def test_gap_command_writes_records_markdown_and_plot(
    tmp_path, smollm2_dir, code_prompt_file, jetspec_report, single_thread
):
    from sglang_jetspec.cli import main

    md, png = tmp_path / "gap.md", tmp_path / "gap.png"
    report = jetspec_report(
        "gap",
        "--prompts",
        str(code_prompt_file),
        "--draft-rounds",
        "0",
        "--budgets",
        "4,16",
        "--max-new-tokens",
        "10",
        "--threads",
        "1",
        "--markdown",
        str(md),
        "--plot",
        str(png),
    )
    assert [(r["method"], r["budget"]) for r in report["records"]] == [("jetspec", 4), ("jetspec", 16)]
    for r in report["records"]:
        assert r["steps"] == len(report["gaps"][f"jetspec@{r['budget']}"]) > 0
        assert r["greedy_mismatches"] == 0 and r["mean_accept_length"] >= 1
        assert r["gap_quantiles"]["p10"] <= r["gap_quantiles"]["p50"] <= r["gap_quantiles"]["p90"]
    assert "| jetspec | 4 |" in md.read_text() and png.stat().st_size > 0
    # rounds need a head trained with revealed tokens: the shipped head is refused, naming the flag
    refused = ["gap", "--target", str(smollm2_dir), "--prompts", str(code_prompt_file), "--draft-rounds", "0,1"]
    assert main([*refused, "--json", str(tmp_path / "refused.json")]) == 2


def test_a_step_takes_its_draft_rounds_from_the_caller(smollm2, reveal_drafter, untrained_drafter, single_thread):
    # the reference server's policy table sets rounds per step, over the engine config's default
    requests = humaneval_requests(smollm2.tokenizer, 1, 8)
    batch = ReferenceEngine(smollm2, reveal_drafter, EngineConfig(draft_rounds=0)).start_batch()
    batch.admit(requests[0])
    assert len(batch.step(16, draft_rounds=2)[0].draft_round_s) == 3
    assert len(batch.step(16)[0].draft_round_s) == 1
    marginal = ReferenceEngine(smollm2, untrained_drafter).start_batch()
    marginal.admit(requests[0])
    with pytest.raises(ValueError, match="draft_rounds=1 needs a head trained with revealed tokens"):
        marginal.step(16, draft_rounds=1)
