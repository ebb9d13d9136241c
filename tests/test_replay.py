"""`jetspec replay`: replayed greedy accept lengths equal the engine's, step by step."""

import pytest
import torch

from sglang_jetspec.cli import main
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.tree import TreeSpec, build_tree
from sglang_jetspec.evaluation.replay import DraftMemo, ReplayLane, matched_depth, replay_request, tapped_rows
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.loading import load_drafter
from sglang_jetspec.reference.prompts import encode, humaneval_prompts


def test_matched_depth_follows_the_matching_branch():
    # depth 1: tokens 5 (rank 0), 6 (rank 1); depth 2: 7, 8
    tree = build_tree(
        1, torch.tensor([[5, 6], [7, 8]]), torch.log(torch.tensor([[0.6, 0.4], [0.7, 0.3]])), TreeSpec(7, 2, 2)
    )
    assert matched_depth(tree, [6, 8, 9]) == 2
    assert matched_depth(tree, [6, 9]) == 1
    assert matched_depth(tree, [9]) == 0
    assert matched_depth(tree, []) == 0


@pytest.mark.parametrize("budget, rounds", [(4, 0), (32, 0), (16, 1)])
def test_replay_reproduces_the_engines_accept_lengths(smollm2, reveal_drafter, single_thread, budget, rounds):
    # the shipped head (accepts vary, so the check has teeth); flagged as reveal-trained for tree-causal rounds
    drafter = reveal_drafter if rounds else load_drafter(smollm2, None)[0]
    prompt_ids = [encode(p, smollm2.tokenizer) for p in humaneval_prompts()[:2]]
    requests = [Request(ids, SamplingParams(max_new_tokens=24), str(i)) for i, ids in enumerate(prompt_ids)]
    engine_outputs = ReferenceEngine(smollm2, drafter, EngineConfig(max_batch_size=1, draft_rounds=rounds)).generate(
        requests, budget
    )
    ar_outputs = ReferenceEngine(smollm2, None, EngineConfig(max_batch_size=2)).generate(requests, 0)
    assert any(length > 1 for o in engine_outputs for length in o.accept_lengths)
    for spec, ar in zip(engine_outputs, ar_outputs):
        assert spec.output_ids == ar.output_ids  # greedy identity, with tree-causal rounds too
        rows = tapped_rows(smollm2, ar.prompt_ids + ar.output_ids, drafter.tap_layers)
        memo = DraftMemo(drafter, 8, ReplayLane(ar.prompt_ids, ar.output_ids, rows), budget - 1)
        assert replay_request(memo, ar, budget, "uniform", rounds) == spec.accept_lengths


def test_replay_command_writes_one_record_per_method_and_budget(
    tmp_path, code_prompt_file, jetspec_report, single_thread
):
    md = tmp_path / "replay.md"
    records = jetspec_report(
        "replay",
        "--prompts",
        str(code_prompt_file),
        "--methods",
        "jetspec,chain,lookup",
        "--budgets",
        "2,16",
        "--max-new-tokens",
        "12",
        "--threads",
        "1",
        "--markdown",
        str(md),
    )["records"]
    assert [(r["method"], r["budget"]) for r in records] == [
        (m, b) for m in ("jetspec", "chain", "lookup") for b in (2, 16)
    ]
    for r in records:
        # 12 new tokens, the first from the prefill: 11 committed by verify steps
        assert r["requests"] == 1 and r["tokens"] == 11 and 1 <= r["steps"] <= 11
        assert r["mean_accept_length"] == pytest.approx(r["tokens"] / r["steps"])
    # a budget-2 tree is a single drafted token: at most 2 tokens per step
    assert all(r["mean_accept_length"] <= 2 for r in records if r["budget"] == 2)
    assert "| jetspec |" in md.read_text()


def test_replay_refuses_draft_rounds_with_a_marginal_only_head(tmp_path, smollm2_dir, capsys):
    code = main(
        [
            "replay",
            "--target",
            str(smollm2_dir),
            "--methods",
            "jetspec",
            "--budgets",
            "16",
            "--draft-rounds",
            "0,1",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--draft-rounds 0,1" in err and "--reveal prefix" in err and not (tmp_path / "r.json").exists()
