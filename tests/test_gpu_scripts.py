"""bench/gpu/reference.sh's pieces that run without a GPU: its shell syntax and bench.gpu.check on CPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.gpu import check

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize(
    "script",
    [
        "gpu/reference.sh",
        "gpu/stage.sh",
        "gpu/env.sh",
        "gpu/run.sh",
        "gpu/receive.sh",
        "gpu/train.sh",
        "gpu/rehearse.sh",
    ],
)
def test_shell_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True).returncode == 0


def test_first_divergence():
    first_divergence = check.first_divergence
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # a prefix diverges where it ends


def test_fp32_check_passes_strict_and_reports_every_budget(tmp_path, smollm2_dir, single_thread):
    out = tmp_path / "check.json"
    code = check.main(
        [
            "--target",
            str(smollm2_dir),
            "--device",
            "cpu",
            "--prompt-range",
            "0:2",
            "--budgets",
            "4,16",
            "--max-new-tokens",
            "6",
            "--batch-size",
            "2",
            "--strict",
            "--json",
            str(out),
            "--markdown",
            str(tmp_path / "check.md"),
        ]
    )
    report = json.loads(out.read_text())
    assert code == 0 and [c["budget"] for c in report["cells"]] == [4, 16]
    assert all(c["mismatches"] == [] and c["requests"] == 2 and c["mean_accept_length"] >= 1 for c in report["cells"])
    assert (report["dtype"], report["attention"], report["device"]) == ("fp32", "sdpa", "cpu")
    assert "| cpu | fp32 | sdpa | 16 | 2 | 0 (0%) |" in (tmp_path / "check.md").read_text()


def test_top2_margin_matches_the_engines_own_forward(smollm2, single_thread):
    """The margin comes from a plain model call; the engine's cached, masked forward must agree."""
    import torch

    from sglang_jetspec.reference.target import Segment

    ids = smollm2.tokenizer("The capital of France is")["input_ids"]
    out = smollm2.forward(smollm2.new_cache(), [Segment.chain(ids, 0)])
    top = torch.log_softmax(smollm2.logits(out.hidden)[0, len(ids) - 1], -1).topk(2).values
    margin = check.top2_margin(smollm2, ids)
    assert margin > 0.1 and margin == pytest.approx(float(top[0] - top[1]), abs=1e-4)
