"""`--drafter head|lookup` on the commands that run one drafter (generate, serve): prompt lookup on the
real SmolLM2, and drafter flags that do not go together refused with the flag named, before the load."""

from pathlib import Path

import pytest

from sglang_jetspec.cli import main

COPY_PROMPTS = Path(__file__).parent / "data" / "copy_prompts.jsonl"


def test_generate_with_the_lookup_drafter_copies_the_prompt_losslessly(jetspec_report, capsys):
    report = jetspec_report(
        "generate",
        "--drafter",
        "lookup",
        "--prompts",
        str(COPY_PROMPTS),
        "--num-prompts",
        "1",
        "--max-new-tokens",
        "24",
        "--budget",
        "16",
    )
    assert report["head"].startswith("prompt lookup (n-grams 1-4")
    assert report["tree"]["width"] == 1 and report["tree"]["max_depth"] == 15
    assert report["greedy_outputs_differing"] == 0
    # "Repeat the following text exactly": the answer is the prompt's text, so lookup's chains are accepted
    # far beyond the one token a verify always commits.
    assert report["jetspec"]["mean_accept_length"] > 4, report["jetspec"]
    assert report["jetspec"]["mode"] == "lookup"
    printed = capsys.readouterr().out
    assert "prompt lookup" in printed
    # the speculative row is labelled by the drafter that ran, not "jetspec"
    assert any(line.startswith("lookup ") for line in printed.splitlines()) and "\njetspec " not in printed, printed


def run_failing(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses at parse time
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--drafter", "lookup", "--head", "untrained"], "--head untrained is for --drafter head"),
        (["--drafter", "lookup", "--draft-rounds", "1"], "--draft-rounds 1 needs a head"),
        (
            ["--drafter", "lookup", "--lookup-min-ngram", "5", "--lookup-max-ngram", "3"],
            "--lookup-min-ngram 5 is above --lookup-max-ngram 3",
        ),
        (["--drafter", "ngram"], "argument --drafter: invalid choice: 'ngram'"),
        (["--drafter", "lookup", "--lookup-depth", "0"], "argument --lookup-depth"),
    ],
)
def test_generate_refuses_drafter_flags_that_do_not_go_together(smollm2_dir, capsys, extra, named):
    code, err = run_failing(["generate", "--target", str(smollm2_dir), "--num-prompts", "1", *extra], capsys)
    assert code == 2 and named in err, err


def serve_args(smollm2_dir, policy: Path, *extra) -> list[str]:
    return ["serve", "--target", str(smollm2_dir), "--policy", str(policy), "--port", "0", *extra]


def test_serve_checks_the_policy_against_the_lookup_chain_before_loading(tmp_path, smollm2_dir, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("cohorts:\n  - {name: all, min_batch: 1, max_batch: 8, budgets: [0, 4, 32], default: 4}\n")
    code, err = run_failing(serve_args(smollm2_dir, policy, "--drafter", "lookup"), capsys)
    # a chain of at most --lookup-depth 15 tokens fills 16 nodes, root included
    assert code == 2 and "budget 32" in err and "prompt lookup (--lookup-depth 15)" in err and "at most 16" in err, err
    code, err = run_failing(serve_args(smollm2_dir, policy, "--drafter", "lookup", "--lookup-depth", "7"), capsys)
    assert code == 2 and "budget 32" in err and "at most 8" in err, err


def test_serve_refuses_a_head_with_the_lookup_drafter_before_loading(tmp_path, smollm2_dir, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("cohorts:\n  - {name: all, min_batch: 1, max_batch: 8, budgets: [0, 4], default: 4}\n")
    code, err = run_failing(serve_args(smollm2_dir, policy, "--drafter", "lookup", "--head", "untrained"), capsys)
    assert code == 2 and "--head untrained is for --drafter head" in err, err
