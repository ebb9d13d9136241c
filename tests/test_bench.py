"""`jetspec bench`: a tiny grid on SmolLM2 with untrained heads, the summary logic, and bad input."""

import dataclasses
import json
from pathlib import Path

import pytest

from sglang_jetspec.cli import main
from sglang_jetspec.core.head_io import init_head, save_head
from sglang_jetspec.evaluation.report import summarize
from sglang_jetspec.reference.loading import untrained_head_config

RECORD_FIELDS = {
    "method",
    "budget",
    "batch_size",
    "temperature",
    "requests",
    "tokens",
    "seconds",
    "tokens_per_s",
    "mean_accept_length",
    "speedup_vs_ar",
    "greedy_mismatches",
    "divergences",
    "draft_round_s",
    "phase_ms",
    "draft_token_cost",
}


@pytest.fixture(scope="module")
def heads(smollm2, tmp_path_factory):
    """Two untrained heads on disk: causal (for --head) and bidirectional (for --dflash-head)."""
    root = tmp_path_factory.mktemp("heads")
    cfg = untrained_head_config(smollm2)
    causal = save_head(init_head(cfg), root / "causal")
    bidirectional = save_head(init_head(dataclasses.replace(cfg, causal_head=False), seed=1), root / "bidirectional")
    return causal, bidirectional


@pytest.fixture()
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"},
        {"messages": [{"role": "user", "content": "Count from 1 to 9."}]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def bench_args(smollm2_dir, heads, prompts, json_out, *extra):
    causal, bidirectional = heads
    return [
        "bench",
        "--target",
        str(smollm2_dir),
        "--head",
        str(causal),
        "--dflash-head",
        str(bidirectional),
        "--prompts",
        str(prompts),
        "--json",
        str(json_out),
        "--dtype",
        "fp32",
        *extra,
    ]


def test_bench_grid_writes_json_markdown_and_plot(tmp_path, smollm2_dir, heads, prompts_file, capsys, single_thread):
    out, md, png = tmp_path / "bench.json", tmp_path / "bench.md", tmp_path / "bench.png"
    code = main(
        bench_args(
            smollm2_dir,
            heads,
            prompts_file,
            out,
            "--budgets",
            "4,8",
            "--batch-sizes",
            "1",
            "--temperatures",
            "0",
            "--methods",
            "jetspec,dflash,chain,lookup",
            "--max-new-tokens",
            "8",
            "--threads",
            "1",
            "--markdown",
            str(md),
            "--plot",
            str(png),
        )
    )
    assert code == 0
    report = json.loads(out.read_text())
    records = report["records"]
    assert all(set(r) == RECORD_FIELDS for r in records)
    # draft seconds per verify step by round: none for autoregressive, the marginal pass only for every drafter here
    assert all(len(r["draft_round_s"]) == (0 if r["method"] == "autoregressive" else 1) for r in records)
    assert [(r["method"], r["budget"]) for r in records] == [("autoregressive", 0)] + [
        (m, b) for m in ("jetspec", "dflash", "chain", "lookup") for b in (4, 8)
    ]
    ar = records[0]
    # per-step phases: autoregressive drafts nothing; a head's draft time per node over verify time is c
    assert ar["phase_ms"]["draft"] == 0 and ar["phase_ms"]["verify"] > 0 and ar["draft_token_cost"] is None
    for r in records[1:]:
        phases = r["phase_ms"]
        assert (
            phases["draft"] > 0
            and phases["verify"] > 0
            and phases["draft"] == pytest.approx(1000 * sum(r["draft_round_s"]))
        )
        assert r["draft_token_cost"] == pytest.approx(phases["draft"] / r["budget"] / phases["verify"])
    assert ar["speedup_vs_ar"] == 1.0 and ar["mean_accept_length"] == 1.0
    for r in records:
        assert r["requests"] == 2 and r["tokens"] == ar["tokens"] and r["batch_size"] == 1 and r["temperature"] == 0
        assert r["greedy_mismatches"] == 0 and r["divergences"] == []
        assert r["tokens_per_s"] > 0 and r["mean_accept_length"] >= 1.0
        assert r["speedup_vs_ar"] == pytest.approx(r["tokens_per_s"] / ar["tokens_per_s"])
    header = report["header"]
    assert (
        header["machine"]["cpu"] and header["machine"]["threads"] == 1 and header["torch"] and header["dtype"] == "fp32"
    )
    assert header["dtype_choice"] == "requested"
    assert set(header["heads"]) == {"head", "dflash_head"}
    assert all(len(h["sha256"]["model.safetensors"]) == 64 for h in header["heads"].values())
    assert header["command_line"].startswith("jetspec bench --target")
    assert {(s["method"], s["batch_size"]) for s in report["summary"]} == {
        (m, 1) for m in ("jetspec", "dflash", "chain", "lookup")
    }
    table = md.read_text()
    assert "| batch | temperature | method | budget |" in table and "| 1 | 0 | lookup | 8 |" in table
    assert (
        "| batch | temperature | method | budget | draft ms (by round) | tree ms | verify ms | accept ms | c |" in table
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "best budget" in printed and ("stops paying above budget" in printed or "never pays" in printed)


def cell(method, budget, speedup):
    return {"method": method, "budget": budget, "batch_size": 1, "temperature": 0.0, "speedup_vs_ar": speedup}


def test_summary_finds_best_budget_and_where_speculation_stops_paying():
    records = [
        cell("autoregressive", 0, 1.0),
        cell("jetspec", 4, 1.2),
        cell("jetspec", 16, 1.5),
        cell("jetspec", 64, 1.0),
        cell("jetspec", 256, 0.6),
        cell("lookup", 4, 0.9),
        cell("lookup", 16, 0.8),
    ]
    by_method = {s["method"]: s for s in summarize(records)}
    assert set(by_method) == {"jetspec", "lookup"}
    assert by_method["jetspec"]["best_budget"] == 16 and by_method["jetspec"]["pays_up_to_budget"] == 64
    assert by_method["lookup"]["best_budget"] == 4 and by_method["lookup"]["pays_up_to_budget"] is None


def run_failing(argv, capsys):
    """Exit code and stderr of a bench call that must fail before loading anything."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code
    return code, capsys.readouterr().err


def test_dflash_without_dflash_head_names_the_flag(tmp_path, smollm2_dir, heads, prompts_file, capsys):
    argv = [
        "bench",
        "--target",
        str(smollm2_dir),
        "--head",
        str(heads[0]),
        "--prompts",
        str(prompts_file),
        "--methods",
        "jetspec,dflash",
        "--json",
        str(tmp_path / "o.json"),
    ]
    code, err = run_failing(argv, capsys)
    assert code == 2 and "--dflash-head is missing" in err


def test_unknown_method_names_the_flag(tmp_path, smollm2_dir, heads, prompts_file, capsys):
    code, err = run_failing(
        bench_args(smollm2_dir, heads, prompts_file, tmp_path / "o.json", "--methods", "jetspec,medusa"), capsys
    )
    assert code == 2 and "--methods" in err and "'medusa'" in err and "lookup" in err


def test_swapped_heads_are_refused_with_the_fix(tmp_path, smollm2_dir, heads, prompts_file, capsys):
    causal, bidirectional = heads
    code, err = run_failing(bench_args(smollm2_dir, (causal, causal), prompts_file, tmp_path / "o.json"), capsys)
    assert code == 2 and f"--dflash-head {causal}" in err and "causal_head true" in err and "--head" in err
    code, err = run_failing(
        bench_args(
            smollm2_dir, (bidirectional, bidirectional), prompts_file, tmp_path / "o.json", "--methods", "chain"
        ),
        capsys,
    )
    assert code == 2 and f"--head {bidirectional}" in err and "causal_head false" in err


def test_malformed_prompt_line_names_the_flag_and_line(tmp_path, smollm2_dir, heads, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "unterminated\n')
    code, err = run_failing(bench_args(smollm2_dir, heads, bad, tmp_path / "o.json"), capsys)
    assert code == 2 and "--prompts" in err and f"{bad}:2:" in err


def test_constrained_prompts_are_refused_by_the_reference_engine_naming_the_sglang_bench(
    tmp_path, smollm2_dir, heads, capsys
):
    shipped = Path(__file__).resolve().parents[1] / "bench" / "prompts" / "json-tools.jsonl"
    code, err = run_failing(bench_args(smollm2_dir, heads, shipped, tmp_path / "o.json"), capsys)
    assert (
        code == 2 and "--prompts" in err and "48 prompts carry a constraint" in err and "sglang_cpu_compare.py" in err
    )


def test_prompt_lines_carry_one_constraint_as_sglang_sampling_params(tmp_path):
    from sglang_jetspec.reference.prompts import PromptError, constraint_params, read_prompt_file

    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"prompt": "a", "json_schema": {"type": "integer"}}\n{"prompt": "b", "regex": "[0-9]+"}\n{"prompt": "c"}\n'
    )
    assert [constraint_params(r) for r in read_prompt_file(path)] == [
        {"json_schema": '{"type": "integer"}'},
        {"regex": "[0-9]+"},
        {},
    ]
    path.write_text('{"prompt": "a", "regex": "x", "ebnf": "root ::= \\"x\\""}\n')
    with pytest.raises(PromptError, match=r":1: carries \['ebnf', 'regex'\] -- give at most one"):
        read_prompt_file(path)


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--budgets", "4,0"),
        ("--budgets", "4,4"),
        ("--batch-sizes", "one"),
        ("--temperatures", "-1"),
        ("--prompt-range", "7"),
        ("--lookup-depth", "0"),
    ],
)
def test_bad_values_are_refused_at_parse_time_naming_the_flag(
    tmp_path, smollm2_dir, heads, prompts_file, capsys, flag, value
):
    code, err = run_failing(bench_args(smollm2_dir, heads, prompts_file, tmp_path / "o.json", flag, value), capsys)
    assert code == 2 and f"argument {flag}" in err


def test_prompt_range_selecting_nothing_says_how_many_prompts_there_are(
    tmp_path, smollm2_dir, heads, prompts_file, capsys
):
    code, err = run_failing(
        bench_args(smollm2_dir, heads, prompts_file, tmp_path / "o.json", "--prompt-range", "5:9"), capsys
    )
    assert code == 2 and "--prompt-range" in err and "2 prompts" in err


def test_bench_runs_jetspec_once_per_draft_rounds_value(
    tmp_path, smollm2, smollm2_dir, heads, prompts_file, single_thread
):
    cfg = dataclasses.replace(untrained_head_config(smollm2), draft_reveal={"scheme": "prefix", "all_mask_share": 0.5})
    reveal_head = save_head(init_head(cfg), tmp_path / "reveal")
    out = tmp_path / "bench.json"
    args = [
        "bench",
        "--target",
        str(smollm2_dir),
        "--head",
        str(reveal_head),
        "--prompts",
        str(prompts_file),
        "--json",
        str(out),
        "--budgets",
        "8",
        "--batch-sizes",
        "2",
        "--temperatures",
        "0",
        "--methods",
        "jetspec",
        "--draft-rounds",
        "0,2",
        "--max-new-tokens",
        "6",
        "--threads",
        "1",
        "--dtype",
        "fp32",
    ]
    assert main(args) == 0
    records = json.loads(out.read_text())["records"]
    assert [(r["method"], len(r["draft_round_s"])) for r in records] == [
        ("autoregressive", 0),
        ("jetspec", 1),
        ("jetspec-r2", 3),
    ]
    assert all(r["greedy_mismatches"] == 0 for r in records)
    # the shipped-style head without draft_reveal is refused before anything loads, naming the flag
    assert (
        main(
            bench_args(
                smollm2_dir, heads, prompts_file, tmp_path / "x.json", "--methods", "jetspec", "--draft-rounds", "1"
            )
        )
        == 2
    )


class RecordingEngine:
    """Stands in for a ReferenceEngine: logs which cell ran which requests, in order."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def generate(self, requests, budget, on_step):
        from sglang_jetspec.core.step_record import StepRecord
        from sglang_jetspec.reference.engine import RequestOutput

        self.log.append((self.name, budget, [r.request_id for r in requests]))
        for _ in requests:
            on_step(StepRecord(1, budget, 2, [2], 0.001, 0.0, 0.01, 0.0, 0.011, draft_round_s=[0.001]))
        return [RequestOutput(r.request_id, r.prompt_ids, [1, 2], "length", [2]) for r in requests]


def test_bench_cells_run_interleaved_round_by_round_and_sum_over_rounds(monkeypatch, capsys):
    """A machine's speed drifts: every round runs the next ROUND_BATCHES batches through every cell,
    autoregressive first, so drift weighs on all cells alike; each cell keeps one engine."""
    from types import SimpleNamespace

    from sglang_jetspec.evaluation import run as bench_run
    from sglang_jetspec.evaluation.setup import Contender, make_requests

    log, engines = [], []

    def engine(self, batch_size, contender=None):
        engines.append(RecordingEngine(log, contender.method if contender else "ar"))
        return engines[-1]

    monkeypatch.setattr(bench_run.GridRunner, "engine", engine)
    runner = bench_run.GridRunner(None, SimpleNamespace(budgets=[4, 8]))
    requests = make_requests([[5, 6]] * 5, 1.0, 2, 0)
    for i, r in enumerate(requests):
        r.request_id = str(i)
    records = runner.group([Contender("hybrid", None, 8)], requests, 1, 1.0)
    per_round = bench_run.ROUND_BATCHES  # batch size 1
    assert per_round < len(requests)  # the test needs two rounds
    first, second = [str(i) for i in range(per_round)], [str(i) for i in range(per_round, 5)]
    assert log == [
        ("ar", 0, first),
        ("hybrid", 4, first),
        ("hybrid", 8, first),
        ("ar", 0, second),
        ("hybrid", 4, second),
        ("hybrid", 8, second),
    ]
    assert len(engines) == 3  # one engine per cell, kept across rounds
    assert [(r.method, r.budget, r.requests, r.tokens) for r in records] == [
        ("autoregressive", 0, 5, 10),
        ("hybrid", 4, 5, 10),
        ("hybrid", 8, 5, 10),
    ]
    assert all(r.mean_accept_length == 2.0 and r.phase_ms["verify"] == pytest.approx(10.0) for r in records)
    printed = capsys.readouterr().out  # a long run says how far it is
    assert "round 1/2 done (3 cells x 4 requests)" in printed and "round 2/2 done (3 cells x 1 requests)" in printed


def test_bench_runs_each_method_once_per_sizing_and_acceptance_rule(
    tmp_path, smollm2_dir, heads, prompts_file, monkeypatch, single_thread
):
    """--tree-sizing and --acceptance lists put top-K and drawn children (and fixed and adaptive trees)
    side by side in one run: every combination is a cell, labelled by what differs from the default,
    and each cell's engine runs the rule its label names."""
    from sglang_jetspec.evaluation import run as bench_run

    built = {}
    make_engine = bench_run.GridRunner.engine

    def engine(self, batch_size, contender=None):
        made = make_engine(self, batch_size, contender)
        built[contender.method if contender else "autoregressive"] = (made.config.acceptance, made.config.tree_sizing)
        return made

    monkeypatch.setattr(bench_run.GridRunner, "engine", engine)
    out = tmp_path / "bench.json"
    code = main(
        bench_args(
            smollm2_dir,
            heads,
            prompts_file,
            out,
            "--budgets",
            "4",
            "--batch-sizes",
            "1",
            "--temperatures",
            "1",
            "--methods",
            "jetspec",
            "--tree-sizing",
            "fixed,adaptive",
            "--acceptance",
            "match,draw",
            "--max-new-tokens",
            "6",
            "--threads",
            "1",
        )
    )
    assert code == 0
    report = json.loads(out.read_text())
    labels = ["jetspec", "jetspec+adaptive", "jetspec+draw", "jetspec+adaptive+draw"]
    assert [r["method"] for r in report["records"]] == ["autoregressive", *labels]
    assert {label: built[label] for label in labels} == {
        "jetspec": ("match", "fixed"),
        "jetspec+adaptive": ("match", "adaptive"),
        "jetspec+draw": ("draw", "fixed"),
        "jetspec+adaptive+draw": ("draw", "adaptive"),
    }
    assert report["header"]["acceptance"] == ["match", "draw"]
    assert all(r["tokens"] == report["records"][0]["tokens"] for r in report["records"])


def test_unknown_acceptance_rule_is_refused_naming_the_flag(tmp_path, smollm2_dir, heads, prompts_file, capsys):
    code, err = run_failing(
        bench_args(smollm2_dir, heads, prompts_file, tmp_path / "o.json", "--acceptance", "match,sample"), capsys
    )
    assert code == 2 and "argument --acceptance" in err and "'sample'" in err and "match,draw" in err
