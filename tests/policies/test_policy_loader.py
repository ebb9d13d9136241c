"""Policy files: shipped examples load; every error class is reported as file:line: problem -- fix."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from policies.cli import add_subcommands, main
from policies.head import read_head_capacity
from policies.loader import load_policy, parse_policy_text
from policies.problems import PolicyError
from policies.table import default_table

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
REPO_ROOT = POLICIES_DIR.parent

GOOD = """\
cohorts:
  - name: bs1
    min_batch: 1
    max_batch: 1
    budgets: [0, 4, 16, 64]
    default: 16
  - name: bs2-8
    min_batch: 2
    max_batch: 8
    budgets: [0, 4, 8]
    default: 4
"""


def problems_of(text: str, source: str = "p.yaml", **kwargs) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy_text(text, source, **kwargs)
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize("name", ["default.yaml", "latency.yaml", "throughput.yaml"])
def test_shipped_examples_load_cleanly(name):
    policy = load_policy(POLICIES_DIR / name)
    assert policy.cohorts[0].min_batch == 1
    for cohort in policy.cohorts:
        assert cohort.default in cohort.budgets
        assert max(cohort.budgets) <= policy.head.max_budget


def test_every_shipped_key_is_commented():
    # Operators read these files: each key line carries an explanation (inline or just above).
    for name in ("default.yaml", "latency.yaml", "throughput.yaml"):
        lines = (POLICIES_DIR / name).read_text().splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or ":" not in stripped or stripped.startswith("- name"):
                continue
            documented = "#" in line or any(lines[j].strip().startswith("#") for j in range(max(0, i - 3), i))
            key = stripped.split(":")[0]
            if key not in ("min_batch", "max_batch", "budgets", "default", "name"):
                assert documented, f"{name}:{i + 1}: key '{key}' has no comment"


def test_good_policy_parses_with_defaults_for_omitted_sections():
    policy = parse_policy_text(GOOD)
    assert [c.name for c in policy.cohorts] == ["bs1", "bs2-8"]
    assert policy.head.max_budget == 256
    assert policy.gate.reprobe_budget == 4


def test_malformed_yaml_reports_line():
    text = GOOD.replace("budgets: [0, 4, 8]", "budgets: [0, 4, 8")
    (problem,) = problems_of(text)
    assert problem.startswith("p.yaml:11: malformed YAML")
    assert " -- fix the YAML syntax" in problem


def test_overlapping_cohorts_point_at_min_batch():
    (problem,) = problems_of(GOOD.replace("min_batch: 2", "min_batch: 1"))
    assert problem.startswith("p.yaml:8: ")
    assert "overlaps cohorts[0] 'bs1'" in problem and "-- start it at 2" in problem


def test_gap_between_cohorts():
    (problem,) = problems_of(GOOD.replace("min_batch: 2", "min_batch: 4"))
    assert problem.startswith("p.yaml:8: ")
    assert "batch sizes 2..3 in no cohort (gap)" in problem


def test_cohorts_must_start_at_batch_one():
    problems = problems_of(
        GOOD.replace("min_batch: 1\n    max_batch: 1", "min_batch: 2\n    max_batch: 2").replace(
            "min_batch: 2\n    max_batch: 8", "min_batch: 3\n    max_batch: 8"
        )
    )
    assert problems == [
        "p.yaml:3: cohorts[0] 'bs1' starts at batch 2, leaving batch sizes 1..1 in no cohort "
        "(gap) -- start it at 1 or add a cohort for the gap"
    ]


def test_unknown_key_suggests_the_right_one():
    text = GOOD + "controller:\n  interval_s: 10\n  windw_s: 60\n"
    (problem,) = problems_of(text)
    assert problem.startswith("p.yaml:14: unknown key 'windw_s' in controller -- did you mean 'window_s'?")


def test_wrong_types_are_reported_per_field():
    text = GOOD.replace("max_batch: 8", 'max_batch: "8"') + "gate:\n  min_gain: yes\n"
    problems = problems_of(text)
    assert "p.yaml:9: cohorts[1].max_batch must be a whole number, got '8' -- write an integer such as 16" in problems
    assert any(p.startswith("p.yaml:13: gate.min_gain must be a number, got True") for p in problems)


def test_budget_above_max_budget():
    (problem,) = problems_of(GOOD.replace("[0, 4, 16, 64]", "[0, 4, 16, 512]"))
    assert problem == (
        "p.yaml:5: cohorts[0] 'bs1' budget 512 is above head.max_budget 256 -- "
        "lower it to at most 256 or raise head.max_budget"
    )


def test_negative_budget_is_out_of_range():
    (problem,) = problems_of(GOOD.replace("[0, 4, 8]", "[-1, 4, 8]"))
    assert problem.startswith("p.yaml:10: cohorts[1].budgets[0] = -1 is out of range -- use a value >= 0")


def test_empty_candidate_list():
    problems = problems_of(GOOD.replace("[0, 4, 8]", "[]"))
    assert problems == ["p.yaml:10: cohorts[1].budgets is empty -- list at least 1 item(s)"]


def test_default_must_be_a_candidate_and_reprobe_budget_listed():
    problems = problems_of(GOOD.replace("budgets: [0, 4, 8]\n    default: 4", "budgets: [0, 8]\n    default: 4"))
    assert "p.yaml:11: cohorts[1] 'bs2-8' default 4 is not one of its budgets [0, 8]" in problems[0]
    assert problems[1].startswith("p.yaml:10: cohorts[1] 'bs2-8' can be gated off but gate.reprobe_budget 4")


def test_missing_required_key_points_at_its_cohort():
    (problem,) = problems_of(GOOD.replace("    default: 4\n", ""))
    assert problem == "p.yaml:7: cohorts[1].default is missing -- add the key 'default' (see policies/README.md)"


def test_duplicate_key_is_an_error():
    (problem,) = problems_of(GOOD + "gate:\n  dwell_s: 30\ngate:\n  dwell_s: 60\n")
    assert problem == "p.yaml:14: key 'gate' appears twice in the top level -- keep one of them"


def test_ttl_must_leave_room_for_renewals():
    (problem,) = problems_of(GOOD + "controller:\n  interval_s: 10\n  ttl_s: 20\n")
    assert problem.startswith("p.yaml:14: controller.ttl_s 20.0 is under 3 x interval_s")


def test_all_problems_reported_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("[0, 4, 16, 64]", "[0, 4, 16, 512]").replace("min_batch: 2", "min_batch: 3"))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert [p.line for p in caught.value.problems] == [8, 5]
    assert all(str(p).startswith(f"{path}:") for p in caught.value.problems)


def _head(tmp_path: Path, config: dict) -> Path:
    head = tmp_path / "head"
    head.mkdir(parents=True)
    (head / "config.json").write_text(json.dumps(config))
    return head


def test_head_capacity_counts_a_full_tree(tmp_path):
    capacity = read_head_capacity(_head(tmp_path, {"block_size": 3, "jetspec_config": {"tree_width": 4}}))
    assert capacity.max_nodes == 1 + 4 + 16


def test_head_block_size_from_nested_config_and_default_width(tmp_path):
    capacity = read_head_capacity(_head(tmp_path, {"dflash_config": {"block_size": 2}}))
    assert (capacity.block_size, capacity.tree_width, capacity.max_nodes) == (2, 8, 9)


def test_head_without_block_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        read_head_capacity(_head(tmp_path, {"hidden_size": 576}))


def test_budget_above_what_the_head_can_use(tmp_path):
    head = read_head_capacity(_head(tmp_path, {"block_size": 3, "tree_width": 4}))
    (problem,) = problems_of(GOOD, head=head)
    assert problem.startswith("p.yaml:5: cohorts[0] 'bs1' budget 64 is more nodes than head")
    assert problem.endswith("(block_size 3, tree width 4: at most 21) -- lower it to at most 21")


def test_check_command_exit_codes_and_output(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(GOOD)
    bad.write_text(GOOD.replace("min_batch: 2", "min_batch: 5"))
    assert main(["check", str(good)]) == 0
    assert capsys.readouterr().out.strip() == f"{good}: ok"
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{bad}:8: ") and " -- " in err[0]


def test_check_command_with_head(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text(GOOD)
    head = _head(tmp_path, {"block_size": 3, "tree_width": 4})
    assert main(["check", str(policy), "--head", str(head)]) == 1
    assert "at most 21" in capsys.readouterr().err


def test_show_renders_the_table(tmp_path, capsys):
    assert main(["show", str(POLICIES_DIR / "default.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["cohort", "batch", "sizes", "budgets", "(*", "=", "default,", "0", "=", "off)"]
    assert out[1].split() == ["bs1", "1..1", "0", "4", "8", "16", "32*", "64"]


def test_subcommands_plug_into_a_parent_parser(tmp_path):
    parser = argparse.ArgumentParser(prog="jetspec")
    add_subcommands(parser.add_subparsers(dest="command"))
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    args = parser.parse_args(["policy", "check", str(path)])
    assert args.func(args) == 0


def test_python_dash_m_policies_check():
    done = subprocess.run(
        [sys.executable, "-m", "policies", "check", str(POLICIES_DIR / "default.yaml")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("default.yaml: ok")


ROUNDS = GOOD.replace("    default: 16\n", "    default: 16\n    draft_rounds: 2\n") + "head:\n  max_draft_rounds: 1\n"


def test_cohort_draft_rounds_above_the_limit_point_at_their_line():
    (problem,) = problems_of(ROUNDS)
    assert problem == (
        "p.yaml:7: cohorts[0] 'bs1' draft_rounds 2 is above head.max_draft_rounds 1 -- "
        "lower it to at most 1 or raise head.max_draft_rounds"
    )


def test_draft_rounds_need_a_head_trained_with_revealed_tokens(tmp_path):
    text = ROUNDS.replace("draft_rounds: 2", "draft_rounds: 1")
    marginal = read_head_capacity(_head(tmp_path / "m", {"block_size": 8}))
    (problem,) = problems_of(text, head=marginal)
    assert problem.startswith("p.yaml:14: head.max_draft_rounds is 1 but head ") and "--reveal prefix" in problem
    reveal = read_head_capacity(
        _head(tmp_path / "r", {"dflash_config": {"block_size": 8, "draft_reveal": {"scheme": "prefix"}}})
    )
    assert reveal.reads_tree_tokens and parse_policy_text(text, head=reveal).cohorts[0].draft_rounds == 1


def test_a_narrower_cohort_tree_width_lowers_what_budgets_the_head_can_use(tmp_path):
    head = read_head_capacity(_head(tmp_path, {"block_size": 3, "tree_width": 8}))  # 1 + 8 + 64 = 73 nodes
    assert parse_policy_text(GOOD, head=head).cohorts[0].tree_width == 0  # 0: the head's width
    narrow = GOOD.replace("    default: 16\n", "    default: 16\n    tree_width: 4\n")  # 1 + 4 + 16 = 21 nodes
    (problem,) = problems_of(narrow, head=head)
    assert "budget 64 is more nodes than head" in problem and "(block_size 3, tree width 4: at most 21)" in problem


def test_cohort_drafter_and_lookup_calibration(tmp_path):
    policy = parse_policy_text(
        GOOD.replace("    default: 4\n", "    default: 4\n    drafter: hybrid\n") + "lookup: {accept: 0.7}\n"
    )
    assert [c.drafter for c in policy.cohorts] == ["head", "hybrid"]  # head unless a cohort says otherwise
    assert (policy.lookup.accept, policy.lookup.min_ngram, policy.lookup.max_ngram) == (0.7, 1, 4)
    (problem,) = problems_of(GOOD.replace("    default: 4\n", "    default: 4\n    drafter: lookahead\n"))
    assert problem.startswith("p.yaml:12: cohorts[1].drafter") and "'head'" in problem and "'hybrid'" in problem
    assert [c.tree_sizing for c in policy.cohorts] == [None, None]  # unset: the server's own sizing
    sized = parse_policy_text(GOOD.replace("    default: 4\n", "    default: 4\n    tree_sizing: adaptive\n"))
    assert [c.tree_sizing for c in sized.cohorts] == [None, "adaptive"]
    assert [c.tree_sizing for c in default_table(sized).cohorts] == [None, "adaptive"]
    (problem,) = problems_of(GOOD.replace("    default: 4\n", "    default: 4\n    tree_sizing: sometimes\n"))
    assert problem.startswith("p.yaml:12: cohorts[1].tree_sizing") and "'fixed'" in problem and "'adaptive'" in problem
    (problem,) = problems_of(GOOD + "lookup:\n  min_ngram: 5\n  max_ngram: 3\n")
    assert problem == "p.yaml:13: lookup.min_ngram 5 is above lookup.max_ngram 3 -- lower min_ngram or raise max_ngram"
    (problem,) = problems_of(GOOD + "lookup:\n  accept: 1.0\n")
    assert problem.startswith("p.yaml:13: lookup.accept")
