"""bench/control_plane.py's reading of a run: which cohort a level is in, and what the polled decisions say."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from bench.control_plane import (
    Cell,
    Served,
    best_fixed,
    busy_rate,
    cohort_of,
    decision_summary,
    fixed_budget_policy,
    main,
    markdown,
    token_limits,
)
from bench.sglang_cpu_compare import policy_env
from policies.loader import load_policy

COHORTS = [
    SimpleNamespace(name="bs1", min_batch=1, max_batch=1),
    SimpleNamespace(name="bs2-6", min_batch=2, max_batch=6),
    SimpleNamespace(name="bs7-12", min_batch=7, max_batch=12),
]


def test_a_level_falls_in_its_cohort_and_beyond_the_last_in_the_last():
    assert [cohort_of(COHORTS, n) for n in (1, 4, 12, 64)] == ["bs1", "bs2-6", "bs7-12", "bs7-12"]


def _entry(mode, decided, gain=None):
    return {"mode": mode, "decided": decided, "gain": gain}


def test_the_decision_that_counts_is_the_first_decided_reading_in_the_final_mode():
    series = [
        (0.0, {"bs1": _entry("speculative", False)}),
        (5.0, {"bs1": _entry("speculative", True, 1.1)}),  # decided, but not what the cell ends in
        (9.0, {"bs1": _entry("native", False, 0.99)}),
        (20.0, {"bs1": _entry("native", True, 0.9)}),
        (70.0, {"bs1": _entry("speculative", False, 1.0)}),  # a change after the 60 s warm-up
        (80.0, {"bs1": _entry("native", True, 0.92)}),
    ]
    assert decision_summary(series, "bs1", warmup_s=60.0) == ("native", 20.0, 3, 2, 0.92)


def test_a_cohort_the_table_does_not_speculate_in_has_no_decision():
    series = [(0.0, None), (1.0, {"bs1": _entry(None, False), "bs2-6": _entry("speculative", True)})]
    assert decision_summary(series, "bs1", warmup_s=0.0) == (None, None, 0, 0, None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workloads", "poetry"], "--workloads poetry: choose from chat,code"),
        (["--concurrency", "0,4"], "--concurrency 0,4: give positive integers"),
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--fixed-budgets", "4,x"], "--fixed-budgets 4,x: give budgets >= 1"),
        (["--fixed-budgets", "0"], "--fixed-budgets 0: give budgets >= 1"),
        (["--head", "h", "--useless-head"], "not allowed with argument"),
        (["--length-spread", "64"], "--length-spread 64: give 0 up to --max-new-tokens - 1 (63)"),
    ],
)
def test_bad_arguments_name_the_flag(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main([*argv, "--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")])
    assert message in capsys.readouterr().err


def test_the_best_fixed_budget_is_the_one_with_the_best_median_ratio_to_plain():
    plain = [10.0, 20.0, 10.0]
    fixed = {"4": [11.0, 22.0, 11.0], "8": [15.0, 20.0, 14.0], "16": [30.0, 10.0, 9.0]}  # medians 1.1, 1.4, 0.9
    assert best_fixed(plain, fixed) == ("8", 1.4)
    assert best_fixed(plain, {}) == (None, None)


def test_a_fixed_budget_server_runs_fixed_trees_and_drops_the_control_only_when_asked():
    assert fixed_budget_policy(8, control=False) == {
        "default": 8,
        "tree_sizing": "fixed",
        "budgets": [0, 4, 8],  # off and the shipped gate's re-probe budget besides
        "same_allocation": {"enabled": False},
    }
    # the shipped control and the cohorts' own budgets, so that it may still turn the budget off
    assert fixed_budget_policy(16, control=True) == {"default": 16, "tree_sizing": "fixed"}


def test_a_fixed_budget_no_shipped_cohort_lists_makes_a_valid_policy(tmp_path):
    """32 is not among the shipped larger cohorts' budgets: the variant must list it there itself."""
    env = policy_env("fixed-32", tmp_path, {"fixed-32": fixed_budget_policy(32, control=False)})
    policy = load_policy(env["JETSPEC_POLICY"])
    assert {(cohort.default, cohort.tree_sizing) for cohort in policy.cohorts} == {(32, "fixed")}
    assert all(cohort.budgets == [0, 4, 32] for cohort in policy.cohorts)


def test_the_table_gives_the_ratio_to_the_best_fixed_budget_when_fixed_budgets_ran():
    cell = Cell("code", 1, "bs1", [10.0], [20.0], [2.0], 2.0, "speculative", 5.0, 0, 0, 1.9, {"8": [25.0]}, "8", 2.5)
    cell.measure, cell.whole_ratios = "busy", [1.8]
    meta = dict(command="x", cpu="cpu", dtype="bfloat16", sglang="0.5.23", torch="2", date="d", policy="p", head="h")
    meta["max_new_tokens"] = 64
    table = markdown([cell], {**meta, "controller": False, "warmup_s": 60, "rounds": 1, "fixed_budgets": [8]})
    assert table.splitlines()[-1].endswith("| 8 (2.50) | **0.80** |")
    assert table.splitlines()[-1].startswith("| code | 1 | bs1 | busy | 10.0 | 20.0 | 2.00 | **2.00** | 1.80 |")
    assert "best fixed" not in markdown([cell], {**meta, "controller": False, "warmup_s": 60, "rounds": 1})


def test_the_table_gives_the_ratio_to_jetspec_itself_with_the_cohort_native_when_the_self_baseline_ran():
    cell = Cell("chat", 16, "bs13-24", [10.0, 10.0], [8.0, 9.0], [0.8, 0.9], 0.85, "speculative", 40.0, 0, 0, 1.2)
    cell.self_native_tokens_per_s = [10.0, 7.5]
    meta = dict(command="x", cpu="cpu", dtype="bfloat16", sglang="0.5.23", torch="2", date="d", policy="p", head="h")
    meta.update(controller=False, warmup_s=60, rounds=2, max_new_tokens=64)
    table = markdown([cell], {**meta, "self_baseline": True})
    assert table.splitlines()[-1].endswith("| 8.8 | 0.80 / 1.20 | **1.00** |")
    assert "itself" not in markdown([cell], meta)


def test_the_busy_rate_times_the_pass_until_its_last_send_and_counts_the_running_share_of_open_requests():
    """Two clients, four prompts: sends at 0, 0, 4 (first reply), 6 (second reply: the last send). Until 6
    every client is busy; the requests still running then count their elapsed share."""
    served = [Served(0.0, 4.0, 40), Served(0.0, 6.0, 60), Served(4.0, 8.0, 40), Served(6.0, 16.0, 100)]
    # 40 + 60 done, the third half-way (20 of 40), the fourth just sent (0 of 100): 120 tokens in 6 s
    assert busy_rate(served, start=0.0, clients=2) == pytest.approx(20.0)
    # a drain that takes long changes nothing: the whole-pass rate would be 240 / 16 = 15
    assert busy_rate([*served[:3], Served(6.0, 60.0, 100)], start=0.0, clients=2) == pytest.approx(20.0)
    # one wave (no more prompts than clients): nothing to time
    assert busy_rate([Served(0.0, 4.0, 40), Served(0.0, 6.0, 60)], start=0.0, clients=2) is None


def test_token_limits_spread_evenly_around_the_mean_in_one_fixed_order_or_not_at_all():
    limits = token_limits(32, 64, 32)
    assert sorted(limits) == [32 + round(64 * k / 31) for k in range(32)] and limits == token_limits(32, 64, 32)
    assert limits != sorted(limits) and statistics.fmean(limits) == pytest.approx(64, abs=0.5)
    assert token_limits(16, 64, 0) == [64] * 16 and token_limits(1, 64, 32) == [64]


def test_every_server_started_is_stopped_when_a_later_one_fails_to_start(monkeypatch, tmp_path, smollm2_dir):
    """A run that dies starting its JETSPEC server (a bad policy, no memory) stops the plain server it had
    started: left running, it held gigabytes and both cores through whatever ran next."""
    import bench.control_plane as bench

    started = []

    class FakeServer:
        url = "http://127.0.0.1:1"

        def __init__(self, log):
            self.log, self.stopped = log, False

        def stop(self):
            self.stopped = True

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.stop()

    def fake_launch(args, log, env=None, **kw):
        if started:
            raise RuntimeError("SGLang exited with status 247 before /health answered")
        started.append(FakeServer(log))
        return started[-1]

    monkeypatch.setattr(bench, "launch", fake_launch)
    argv = ["--workloads", "code", "--concurrency", "1", "--rounds", "1", "--model", str(smollm2_dir)]
    argv += ["--log-dir", str(tmp_path), "--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")]
    with pytest.raises(RuntimeError, match="status 247"):
        main(argv)
    assert [s.log.name for s in started] == ["plain.log"] and started[0].stopped
