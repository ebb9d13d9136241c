"""The CPU-harness comparison's own logic: fresh prompts per concurrency pass, argument errors, and the
per-iteration phase split (bench.sglang_cpu_compare); the servers themselves run only in the bench."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bench.sglang_cpu_compare
import bench.sglang_cpu_verify_cost


@pytest.fixture
def compare():
    return bench.sglang_cpu_compare


def test_each_pass_gets_prompts_no_earlier_pass_sent(compare):
    slices = compare.pass_slices(64, 8, [1, 2, 4, 8, 16])
    assert [(s.start, s.stop) for s in slices] == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 48)]
    seen = [i for s in slices for i in range(s.start, s.stop)]
    assert len(seen) == len(set(seen))  # disjoint: a server never sees a prompt twice


def test_too_few_prompts_is_a_clear_error(compare):
    with pytest.raises(compare.BenchArgsError, match=r"--prompts: 24 prompts.*need 48"):
        compare.pass_slices(24, 8, [1, 2, 4, 8, 16])


@pytest.mark.parametrize("text", ["", "0,4", "a,b", "4,-1"])
def test_bad_concurrency_names_the_flag(compare, text):
    with pytest.raises(compare.BenchArgsError, match="--concurrency"):
        compare.parse_concurrency(text)


def test_single_concurrency_value_still_works(compare):
    assert compare.parse_concurrency("4") == [4]
    assert compare.parse_concurrency("1,2,4,8,16") == [1, 2, 4, 8, 16]


def test_phase_split_of_a_jetspec_iteration(compare):
    sched = {"iterations": 10, "requests": 20, "pre_s": 0.010, "run_s": 0.500, "worker_s": 0.480, "post_s": 0.005}
    worker = {"draft": 0.05, "tree": 0.02, "verify": 0.30, "accept": 0.06, "commit": 0.04, "steps": 10}
    row = compare.phase_ms(sched, worker)
    assert row["sched_pre"] == pytest.approx(1.0) and row["sched_run"] == pytest.approx(2.0)
    assert row["output"] == pytest.approx(0.5) and row["iteration"] == pytest.approx(51.5)
    assert row["accept"] == pytest.approx(2.0)  # the accept counter includes commit: split out
    assert row["commit"] == pytest.approx(4.0) and row["verify"] == pytest.approx(30.0)
    # what the worker spent outside its named phases
    assert row["worker_other"] == pytest.approx(48.0 - 5 - 2 - 30 - 2 - 4)


def test_phase_split_of_a_plain_iteration_puts_the_worker_in_one_column(compare):
    sched = {"iterations": 4, "requests": 4, "pre_s": 0.004, "run_s": 0.2, "worker_s": 0.18, "post_s": 0.002}
    row = compare.phase_ms(sched, {})
    assert row["verify"] == pytest.approx(45.0) and row["draft"] == 0.0 and row["worker_other"] == 0.0
    assert compare.phase_ms({"iterations": 0}, {}) == {}


def test_profile_differences_between_passes(compare, tmp_path):
    path = tmp_path / "profile.json"
    assert compare.read_profile(path) == {}  # before the scheduler's first flush
    path.write_text(json.dumps({"decode": {"iterations": 5, "pre_s": 1.0}, "extend": {"iterations": 2}}))
    before = compare.read_profile(path)
    path.write_text(json.dumps({"decode": {"iterations": 12, "pre_s": 1.5}}))
    assert compare.diff(compare.read_profile(path), before) == {"iterations": 7, "pre_s": 0.5}


def test_speedups_are_per_concurrency_against_plain(compare):
    def result(config, rates):
        passes = [compare.PassResult(c, 8, int(r * 10), 10.0, None, None, {}, None, {}, 0, 0.0) for c, r in rates]
        return compare.ConfigResult(config, passes, 30.0)

    plain, spec = result("plain", [(1, 10.0), (4, 30.0)]), result("jetspec", [(1, 15.0), (4, 27.0)])
    compare.summarise([plain, spec], "plain")
    assert spec.tokens_per_s_by_concurrency == {"1": 15.0, "4": 27.0}
    assert spec.speedup_vs_plain_by_concurrency == pytest.approx({"1": 1.5, "4": 0.9})
    assert spec.tokens_per_s == 15.0 and spec.tokens_per_s_concurrent == 27.0


def test_rounds_combine_into_the_median_paired_ratio_and_keep_every_rounds_prompts(compare):
    """--repeats: each round's ratio is taken within the round; the median of those is reported, tokens
    and exact matches add up, phases weigh by iterations, and divergences keep their round's prompt."""

    def result(config, rate, exact, divergence, verify_ms, iterations):
        phases = {c: 0.0 for c in compare.PHASE_COLUMNS} | {"verify": verify_ms}
        passes = [compare.PassResult(1, 8, int(rate * 10), 10.0, 2.0, exact, divergence, None, phases, iterations, 1.0)]
        return compare.ConfigResult(config, passes, 30.0)

    rounds = []
    for plain_rate, spec_rate, divergence in ((10.0, 13.0, {}), (12.0, 18.0, {3: 7}), (10.0, 14.0, {})):
        pair = [
            result("plain", plain_rate, 8, {}, 50.0, 10),
            result("jetspec", spec_rate, 8 - len(divergence), divergence, 70.0 if divergence else 60.0, 10),
        ]
        compare.summarise(pair, "plain")
        rounds.append(pair)
    plain, spec = (compare.combine_rounds(list(r)) for r in zip(*rounds))
    assert spec.speedup_by_round == {"1": pytest.approx([1.3, 1.5, 1.4])}
    assert spec.speedup_vs_plain_by_concurrency == {"1": pytest.approx(1.4)}  # the median round, not 45/32
    assert spec.tokens_per_s == pytest.approx(45.0 / 3) and plain.tokens_per_s == pytest.approx(32.0 / 3)
    (q,) = spec.passes
    assert (q.prompts, q.exact_match_vs_plain, q.first_divergence_vs_plain) == (24, 23, {8 + 3: 7})
    assert q.phases_ms["verify"] == pytest.approx(190.0 / 3) and q.decode_iterations == 30
    assert "## x plain in each round" in compare.markdown([plain, spec], _meta(repeats=3))

    single = compare.combine_rounds([rounds[0][1]])
    assert single.speedup_by_round == {} and single.passes[0].phases_ms == rounds[0][1].passes[0].phases_ms
    assert "in each round" not in compare.markdown([compare.combine_rounds([rounds[0][0]]), single], _meta(repeats=1))


def _meta(repeats: int) -> dict:
    return {
        "cpu": "cpu",
        "dtype": "bfloat16",
        "command": "c",
        "source": "s",
        "prompt_range": "0:8",
        "prompts_per_pass": [8],
        "max_new_tokens": 64,
        "sglang": "0",
        "torch": "0",
        "threads": 2,
        "date": "d",
        "baseline": "plain",
        "shared_prefix": "",
        "repeats": repeats,
    }


def test_a_radix_config_runs_its_server_with_the_radix_cache_and_its_base_policy(compare, tmp_path, monkeypatch):
    args = lambda config: compare.server_args(config, "m", "float32", 4, 8, 1)  # noqa: E731
    assert "--disable-radix-cache" in args("jetspec") and "--disable-radix-cache" in args("plain")
    radix = args("jetspec-hybrid+radix")
    assert "--disable-radix-cache" not in radix and radix[radix.index("--speculative-algorithm") + 1] == "JETSPEC"
    assert "--speculative-algorithm" not in args("plain+radix")
    env = compare.policy_env("jetspec-hybrid+radix", tmp_path)
    assert "drafter: hybrid" in Path(env["JETSPEC_POLICY"]).read_text()


def test_a_variant_replaces_whole_policy_sections_and_sets_cohort_fields(compare, tmp_path):
    from bench.step_overhead import VARIANTS
    from policies import load_policy

    env = compare.policy_env("jetspec-16", tmp_path, VARIANTS)
    policy = load_policy(Path(env["JETSPEC_POLICY"]))
    assert not policy.same_allocation.enabled  # every step speculates: the ops it reports are a tree step's
    assert {(c.default, c.tree_sizing) for c in policy.cohorts} == {(16, "fixed")}


def test_each_config_gets_the_harness_arguments_it_needs(compare):
    args = lambda config: compare.server_args(config, "m", "bfloat16", 16, 6, 1234)  # noqa: E731
    value = lambda argv, flag: argv[argv.index(flag) + 1]  # noqa: E731
    jetspec = args("jetspec+tp2")
    assert {"--disable-overlap-schedule", "--disable-decode-cuda-graph", "--enable-metrics"} <= set(jetspec)
    assert value(jetspec, "--speculative-draft-model-path").endswith("heads/smollm2-135m-instruct")
    assert [value(jetspec, f) for f in ("--tp-size", "--port", "--dtype", "--max-running-requests")] == [
        "2",
        "1234",
        "bfloat16",
        "16",
    ]
    assert value(jetspec, "--max-total-tokens") == "32768" and value(jetspec, "--device") == "cpu"
    ngram = args("ngram")
    assert value(ngram, "--speculative-algorithm") == "NGRAM" and value(ngram, "--speculative-num-draft-tokens") == "6"
    assert "--disable-overlap-schedule" in ngram and "--enable-metrics" not in ngram and "--tp-size" not in ngram
    assert "--speculative-algorithm" not in args("plain") and "--disable-overlap-schedule" in args("plain")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--configs", "plain,jetspec+cache"], "--configs: unknown ['jetspec+cache']"),
        (["--configs", "jetspec+radix", "--baseline", "plain"], "--baseline plain: not among --configs"),
        (["--shared-prefix", "no/such/file.txt"], "--shared-prefix no/such/file.txt: no such file"),
        (["--repeats", "0"], "--repeats 0: give at least 1"),
    ],
)
def test_bad_radix_and_prefix_flags_name_the_flag(compare, argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        compare.main([*argv, "--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")])
    assert message in capsys.readouterr().err


def test_the_verify_cost_bench_sends_each_prompt_as_the_compare_bench_does(tmp_path, monkeypatch):
    """bench/sglang_cpu_verify_cost.py drives a server through the compare bench's `generate`, whose prompts
    are (ids, constraint) pairs: a bare id list broke it once without any test noticing."""
    vc, compare = bench.sglang_cpu_verify_cost, bench.sglang_cpu_compare
    sent, steps = [], {"n": 0}

    def fake_post(url, body, *args, **kwargs):
        sent.append(body)
        steps["n"] += 1
        return {"output_ids": [1] * body["sampling_params"]["max_new_tokens"]}

    class FakeServer:
        url = "http://127.0.0.1:9"

        def stop(self):
            return 0

    def fake_counters(url):
        n = float(steps["n"])  # one step per request, 10 ms and 3 nodes each, credited to every budget
        return {(name, str(b)): n * k for b in vc.BUDGETS for name, k in zip(vc.COUNTERS, (0.01, 1.0, 3.0))}

    monkeypatch.setattr(compare, "post_ok", fake_post)
    monkeypatch.setattr(vc, "launch", lambda *a, **k: FakeServer())
    monkeypatch.setattr(vc, "push_budget", lambda url, budget: None)
    monkeypatch.setattr(vc, "counters", fake_counters)
    curve = vc.harness_curve("model", "bfloat16", [[5, 6, 7], [8, 9]], 4, tmp_path)
    assert curve == {b: (pytest.approx(10.0), pytest.approx(3.0)) for b in vc.BUDGETS}
    assert sent[1]["input_ids"] == [5, 6, 7] and sent[1]["sampling_params"] == {"temperature": 0, "max_new_tokens": 4}


class _FakeServer:
    def __init__(self, log: list, config: str) -> None:
        self.log, self.config, self.start_s, self.url = log, config, 1.0, f"http://{config}"

    def stop(self) -> None:
        self.log.append(("stop", self.config))


def _fake_runner(compare, log):
    start = lambda config: (log.append(("start", config)), compare.Running(config, _FakeServer(log, config), None))[1]  # noqa: E731
    run = lambda running, part, level: (log.append(("run", running.config, part.start, level)), running.config)[1]  # noqa: E731
    return start, run


def test_interleaved_rounds_alternate_configs_on_shared_new_prompts_with_servers_up_throughout(compare):
    """--interleave: all servers start first and stop last; at each level the configs run the same slice
    back to back, the order rotating per round; round k sends its own slices."""
    log = []
    start, run = _fake_runner(compare, log)
    levels = [1, 4]
    slices = compare.pass_slices(32, 8, levels * 2)
    round_slices = [slices[0:2], slices[2:4]]
    rounds = compare.interleaved_rounds(["plain", "jetspec"], 2, levels, round_slices, start, run)
    assert log == [
        ("start", "plain"), ("start", "jetspec"),
        ("run", "plain", 0, 1), ("run", "jetspec", 0, 1), ("run", "plain", 8, 4), ("run", "jetspec", 8, 4),
        ("run", "jetspec", 16, 1), ("run", "plain", 16, 1), ("run", "jetspec", 24, 4), ("run", "plain", 24, 4),
        ("stop", "plain"), ("stop", "jetspec"),
    ]  # fmt: skip
    assert [raws for raws, _ in rounds] == [{"plain": ["plain"] * 2, "jetspec": ["jetspec"] * 2}] * 2


def test_sequential_rounds_restart_every_server_on_the_same_prompts(compare):
    log = []
    start, run = _fake_runner(compare, log)
    slices = compare.pass_slices(16, 8, [1, 4])
    compare.sequential_rounds(["plain", "jetspec"], 2, [1, 4], slices, start, run)
    one_round = [
        ("start", "plain"), ("run", "plain", 0, 1), ("run", "plain", 8, 4), ("stop", "plain"),
        ("start", "jetspec"), ("run", "jetspec", 0, 1), ("run", "jetspec", 8, 4), ("stop", "jetspec"),
    ]  # fmt: skip
    assert log == one_round * 2


def test_interleaved_servers_stop_when_a_pass_fails(compare):
    log = []
    start, _ = _fake_runner(compare, log)

    def failing(running, part, level):
        raise RuntimeError("server died")

    with pytest.raises(RuntimeError, match="server died"):
        compare.interleaved_rounds(["plain", "jetspec"], 1, [1], [compare.pass_slices(8, 8, [1])], start, failing)
    assert log[-2:] == [("stop", "plain"), ("stop", "jetspec")]


def test_interleave_asks_for_every_rounds_prompts_by_name(compare, capsys):
    argv = ["--prompts", "bench/prompts/chat.jsonl", "--prompt-range", "48:64", "--num-prompts", "16",
            "--concurrency", "16", "--repeats", "3", "--interleave", "--json", "x", "--markdown", "x"]  # fmt: skip
    with pytest.raises(SystemExit):
        compare.main(argv)
    err = capsys.readouterr().err
    assert "new prompts need 48" in err and "--interleave: each of the 3 rounds sends new prompts" in err


def _fake_checkout(root: Path) -> Path:
    """A checkout whose launcher announces where it runs from and whose plugin module exists."""
    from harness.sglang_cpu import READY_PREFIX

    (root / "sglang_jetspec").mkdir(parents=True)
    (root / "sglang_jetspec" / "sglang_plugin.py").write_text("")
    (root / "harness").mkdir()
    (root / "harness" / "__init__.py").write_text("")
    (root / "harness" / "sglang_cpu.py").write_text(
        f"import time\nprint({READY_PREFIX!r} + __file__, flush=True)\ntime.sleep(60)\n"
    )
    return root


def test_a_config_from_another_checkout_runs_that_checkouts_code_and_head(compare, tmp_path):
    """`jetspec@before` launches its server from the checkout `--checkout before=DIR` names: that
    checkout's launcher (and so its plugin and policy) wins over this install's, and its head is served."""
    from harness.sglang_cpu import launch

    root = _fake_checkout(tmp_path / "before")
    checkouts = compare.parse_checkouts([f"before={root}"])
    assert checkouts == {"before": root.resolve()}
    env, cwd, head = compare.checkout_launch(checkouts["before"])
    assert cwd == root.resolve() and env["PYTHONPATH"].split(os.pathsep)[0] == str(root.resolve())
    assert head == root.resolve() / "sglang_jetspec" / "heads" / "smollm2-135m-instruct"
    with launch(["--port", "1"], tmp_path / "before.log", env, timeout_s=60, cwd=cwd) as server:
        assert server.url == str(root.resolve() / "harness" / "sglang_cpu.py")  # not this checkout's launcher
    assert compare.checkout_launch(None)[:2] == ({}, None)  # this checkout's configs launch as before

    argv = compare.server_args("jetspec+radix@before", "m", "float32", 4, 8, 1, head=head)
    assert argv[argv.index("--speculative-draft-model-path") + 1] == str(head)
    assert "--disable-radix-cache" not in argv  # the suffixes before the label still apply
    assert compare.base_config("jetspec+radix@before") == "jetspec" and compare.checkout_label("jetspec") is None
    said = compare.checkouts_sentence({"before": {"dir": str(root), "commit": "7b87310"}})
    assert f"`@before` from {root} at commit 7b87310" in said and compare.checkouts_sentence({}) == ""


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--configs", "plain,jetspec@before"], "--configs jetspec@before: no --checkout before=DIR"),
        (["--checkout", "before"], "--checkout 'before': give LABEL=DIR"),
        (["--checkout", "before=/nonexistent"], "is not a checkout of this repository"),
        (["--configs", "plain,plain@old", "--checkout", "old=."], "only JETSPEC configs run from another checkout"),
        (["--configs", "plain,jetspec-off@old", "--checkout", "old=."], "this checkout's shipped policy"),
    ],
)
def test_bad_checkout_flags_name_the_flag_and_the_fix(compare, extra, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        compare.main([*extra, "--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")])
    assert message in capsys.readouterr().err
