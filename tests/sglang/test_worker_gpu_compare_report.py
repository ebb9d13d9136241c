"""bench/gpu/sglang_compare.py's pure parts: first divergence, target logprob margin, results table."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "sglang_compare.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("sglang_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_first_divergence(bench):
    assert bench.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_divergence([1, 2, 3], [1, 2]) == 2  # a shorter output diverges where it stops


def test_margin_at_divergence_from_the_plain_servers_top_logprobs(bench):
    top = [{7: -0.1, 8: -2.5}, {4: -0.01, 9: -0.02, 3: -6.0}]
    assert bench.divergence_margin(top, 1, 4, 9) == pytest.approx(0.01)  # a near tie
    assert bench.divergence_margin(top, 1, 4, 99) == pytest.approx(5.99)  # outside the top list: a lower bound
    assert bench.divergence_margin(top, 5, 4, 9) is None


def test_identity_rows_and_table(bench, tmp_path):
    plain = [[1, 2, 3], [4, 5, 6], [7, 8]]
    jet = [[1, 2, 3], [4, 9, 6], [7]]
    tops = [[{}] * 3, [{4: -0.1}, {5: -0.3, 9: -0.35}, {6: -0.1}], [{7: -0.1}, {8: -0.2}]]
    rows = bench.identity_rows(plain, jet, tops)
    assert [(r.exact, r.first_divergence) for r in rows] == [(True, None), (False, 1), (False, 1)]
    assert rows[1].margin == pytest.approx(0.05) and rows[2].margin is None
    Speed = bench.Speed
    speeds = {
        "plain@bfloat16": {1: Speed(100.0), 4: Speed(300.0)},
        "jetspec@bfloat16": {1: Speed(250.0, 2.5, {"draft": 1.25, "verify": 3.0}), 4: Speed(450.0, 2.25)},
        "ngram@bfloat16": {1: Speed(120.0, 1.5)},
        "plain@float32": {1: Speed(50.0)},
        "jetspec@float32": {1: Speed(150.0, 3.0)},
    }
    path = bench.write_results(
        tmp_path, {"jetspec@bfloat16": rows}, speeds, {"device": "H100", "sglang": "0.5.23", "max_new_tokens": 3}
    )
    text = path.read_text()
    assert "Greedy identity jetspec@bfloat16 vs plain@bfloat16: 1/3 exact (33%)" in text
    assert "| 1 | 1 | 0.0500 |" in text
    assert "| jetspec@bfloat16 | 250.0 (2.50x), 2.50 | 450.0 (1.50x), 2.25 |" in text
    assert "| ngram@bfloat16 | 120.0 (1.20x), 1.50 | n/a |" in text
    assert "| jetspec@float32 | 150.0 (3.00x), 3.00 | n/a |" in text  # each dtype against its own plain server
    assert "| jetspec@bfloat16 | 1 | 1.25 | 0.00 | 3.00 | 0.00 | 0.00 |" in text  # only the step with phase counters
    saved = json.loads((tmp_path / "sglang_gpu_compare.json").read_text())
    assert saved["throughput"]["jetspec@bfloat16"]["1"] == {
        "tok_s": 250.0,
        "accept_length": 2.5,
        "phases_ms": {"draft": 1.25, "verify": 3.0},
    }
    assert saved["identity"]["jetspec@bfloat16"][1]["margin"] == pytest.approx(0.05)


def test_servers_parse_with_a_dtype_each_and_identity_pairs_plain_with_jetspec_of_that_dtype(bench):
    assert bench.parse_servers("plain@float32, jetspec,plain+defaults@bfloat16", "bfloat16") == [
        ("plain", "float32"),
        ("jetspec", "bfloat16"),
        ("plain+defaults", "bfloat16"),
    ]

    def response(ids):
        return {"output_ids": ids, "meta_info": {"output_top_logprobs": [[(-0.1, t, "")] for t in ids]}}

    greedy = {
        "plain@float32": [response([1, 2])],
        "jetspec@float32": [response([1, 2])],
        "plain@bfloat16": [response([3, 4])],
        "ngram@float32": [response([9])],
        "jetspec+graphs@float32": [response([1, 5])],
    }
    identity = bench.identity_of(greedy)
    # every JETSPEC server against plain of its dtype; bf16 has no JETSPEC server here
    assert list(identity) == ["jetspec@float32", "jetspec+graphs@float32"]
    assert identity["jetspec@float32"][0].exact and not identity["jetspec+graphs@float32"][0].exact


def test_every_pass_gets_prompts_no_earlier_pass_sent(bench):
    identity, passes = bench.pass_slices(164, 16, 16, [1, 4, 16])
    ranges = [range(164)[identity]] + [range(164)[passes[bs]] for bs in (1, 4, 16)]
    assert [len(r) for r in ranges] == [16, 16, 16, 16]
    seen = [i for r in ranges for i in r]
    assert len(seen) == len(set(seen)) == 64
    with pytest.raises(SystemExit, match="HumanEval has 164"):
        bench.pass_slices(164, 50, 50, [1, 4, 16])


def test_servers_launched_together_share_the_gpu_memory(bench):
    class Args:
        model, head, device, attention_backend, ngram_draft_tokens, together = "m", "h", "cuda", "triton", 8, True
        server_arg = ["--log-level=warning"]

    configs = bench.server_configs(
        [("plain", "float32"), ("jetspec", "float32"), ("plain+defaults", "bfloat16"), ("jetspec+phases", "bfloat16")],
        Args,
    )
    assert list(configs) == ["plain@float32", "jetspec@float32", "plain+defaults@bfloat16", "jetspec+phases@bfloat16"]
    for cmd in configs.values():  # SGLang's own fraction (its viability check), each KV cache capped
        assert cmd[cmd.index("--mem-fraction-static") + 1] == "0.6"
        assert cmd[cmd.index("--max-total-tokens") + 1] == str(bench.TOGETHER_MAX_TOTAL_TOKENS)
    # speed from a server that never waits for the device at phase boundaries; the split from another
    assert (
        "--enable-metrics" not in configs["jetspec@float32"]
        and "--enable-metrics" in configs["jetspec+phases@bfloat16"]
    )
    assert (
        "--disable-decode-cuda-graph" in configs["plain@float32"]
        and "--disable-decode-cuda-graph" not in configs["plain+defaults@bfloat16"]
    )
    assert configs["jetspec@float32"][configs["jetspec@float32"].index("--dtype") + 1] == "float32"
    assert all(cmd[-1] == "--log-level=warning" for cmd in configs.values())


def test_the_graph_config_keeps_decode_graphs_and_names_the_width_ladder(bench):
    class Args:
        model, head, device, attention_backend, ngram_draft_tokens, together = "m", "h", "cuda", "triton", 8, False
        server_arg = []

    cmd = bench.server_configs([("jetspec+graphs", "bfloat16")], Args)["jetspec+graphs@bfloat16"]
    assert "--disable-decode-cuda-graph" not in cmd and "--disable-overlap-schedule" in cmd
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "JETSPEC"
    assert bench.server_env("jetspec+graphs@bfloat16") == {"JETSPEC_VERIFY_WIDTHS": "4,8,16,32,64"}
    assert bench.server_env("jetspec@bfloat16") == {}


def test_phase_ms_per_verify_step_from_counter_deltas(bench):
    before = {"draft": 1.0, "verify": 2.0, "accept": 1.0, "commit": 0.5, "steps": 100.0}
    after = {"draft": 1.5, "verify": 3.0, "tree": 0.2, "accept": 1.3, "commit": 0.6, "steps": 200.0}
    # accept's counter runs to the step's end: 3 ms a step of which 1 ms is commit
    assert bench.phases_per_step(before, after) == pytest.approx(
        {"draft": 5.0, "tree": 2.0, "verify": 10.0, "accept": 2.0, "commit": 1.0}
    )
    assert bench.phases_per_step(after, after) == {}  # no steps in between: nothing to divide
