"""Breaks too weak for a few engine requests, on real SmolLM2 distributions at real positions
(shadow/calibration.py: sampled continuations scored once; tokens drawn from correct or broken samplers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_jetspec.core.sampling import SamplingParams
from shadow import calibration as cal
from shadow.checks import RANK_EDGES
from shadow.stats import tokens_to_cross, window_tests


@pytest.fixture(scope="module")
def logits(smollm2):
    from sglang_jetspec.reference.prompts import humaneval_prompts

    torch.set_num_threads(1)
    prompts = [smollm2.tokenizer(p)["input_ids"] for p in humaneval_prompts(range(3))]
    return cal.build_positions(smollm2, prompts, 24)


def alarm_rate(table, emitted, windows, tokens, alpha, rng) -> float:
    draws = cal.draw(table, emitted, windows, tokens, rng)
    hits = []
    for s in range(windows):
        if np.isnan(draws.pit[s]).any():
            hits.append(True)
            continue
        observed = np.bincount(draws.bucket[s], minlength=len(RANK_EDGES)).astype(float)
        hits.append(min(t.p_holm for t in window_tests(draws.pit[s], observed, draws.expected[s].sum(0))) < alpha)
    return float(np.mean(hits))


def test_positions_are_real_target_distributions(logits, smollm2):
    assert logits.shape == (72, smollm2.info.vocab_size)
    top = torch.softmax(logits.float(), -1).max(-1).values
    assert 0.05 < float(top.median()) < 1.0  # neither flat nor degenerate


def test_correct_sampler_false_alarms_at_most_nominal(logits):
    table, _ = cal.correct_table(logits, SamplingParams(temperature=0.8, top_p=0.95))
    rate = alarm_rate(table, table.probs, 400, 300, 0.01, np.random.default_rng(0))
    assert rate <= 0.01 + 3 * np.sqrt(0.01 * 0.99 / 400)


def test_residual_step_skipped_is_caught(logits):
    table, order = cal.correct_table(logits, SamplingParams(temperature=1.0))
    emitted = cal.residual_skipped(table, logits, order)
    assert alarm_rate(table, emitted, 20, 3000, 0.001, np.random.default_rng(1)) >= 0.9


def test_two_percent_bias_on_one_token_is_caught(logits):
    table, _ = cal.correct_table(logits, SamplingParams(temperature=1.0))
    token = int(torch.mode(torch.from_numpy(table.order[:, 0])).values)
    emitted = cal.single_token_bias(table, token)
    # the weakest break: ~5e4 tokens for 90% power (bench/results/shadow_calibration.md)
    assert alarm_rate(table, emitted, 10, 100_000, 0.001, np.random.default_rng(2)) >= 0.9
    crossing = tokens_to_cross(cal.draw(table, emitted, 10, 100_000, np.random.default_rng(3)).pit, 0.001)
    assert np.median(crossing) <= 100_000
