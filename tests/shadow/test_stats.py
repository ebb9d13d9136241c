"""The statistics: Holm, rank buckets, the PIT's exactness and the betting monitor's error control."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_jetspec.core.sampling import SamplingParams, processed_probs
from shadow.checks import greedy_mismatches, sampled_transform
from shadow.stats import BettingMonitor, WindowTestResult, holm, merge_small, tokens_to_cross, window_tests


def test_holm_step_down():
    out = holm([WindowTestResult("a", 0, 0.01), WindowTestResult("b", 0, 0.04), WindowTestResult("c", 0, 0.03)])
    assert [r.p_holm for r in out] == pytest.approx([0.03, 0.06, 0.06])


def test_merge_small_folds_thin_buckets():
    obs, exp = merge_small(np.array([50, 30, 3, 1, 1, 0, 0]), np.array([48.0, 31.0, 2.5, 1.5, 1.0, 0.5, 0.5]))
    assert obs.tolist() == [50, 30, 5] and exp.tolist() == [48.0, 31.0, 6.0]


def test_randomized_pit_is_uniform_for_a_correct_sampler():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, 50, generator=gen) * 2
    params = SamplingParams(temperature=0.8, top_p=0.9)
    tokens = torch.multinomial(processed_probs(logits, params), 1, generator=gen)[:, 0].tolist()
    t = sampled_transform(logits, tokens, params, np.random.default_rng(0))
    assert not t.outside_support and len(t.pit) == 4000
    assert min(r.p_holm for r in window_tests(t.pit, t.rank_observed, t.rank_expected)) > 0.01
    # ...and skewed for one drawing at temperature 1.0 instead
    wrong = torch.multinomial(processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.9)), 1, generator=gen)[
        :, 0
    ].tolist()
    t = sampled_transform(logits, wrong, params, np.random.default_rng(0))
    assert min(r.p_holm for r in window_tests(t.pit, t.rank_observed, t.rank_expected)) < 1e-6


def test_greedy_margin_classifies_ties_and_errors():
    logits = torch.tensor([[5.0, 4.99, 0.0], [5.0, 3.0, 0.0], [1.0, 1.0, 0.0]])
    found = greedy_mismatches(logits, [1, 1, 1], tie_margin=0.05)
    assert [(m.position, m.kind) for m in found] == [(0, "tie"), (1, "error")]  # position 2: an exact tie for max
    assert found[1].margin == pytest.approx(2.0)


def test_betting_monitor_false_alarms_within_alpha_and_detects_shift():
    rng = np.random.default_rng(1)
    null = tokens_to_cross(rng.random((2000, 2000)), alpha=0.05)
    assert (null <= 2000).mean() <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 2000)
    shifted = tokens_to_cross(rng.random((50, 2000)) ** 1.3, alpha=0.001)
    assert np.median(shifted) < 1000


def test_monitor_state_round_trips_and_stays_crossed():
    monitor = BettingMonitor(0.01)
    monitor.update(np.random.default_rng(0).random(500) ** 2)
    assert monitor.crossed and monitor.p_value() <= 0.01
    again = BettingMonitor.from_json(monitor.to_json())
    again.update(np.random.default_rng(1).random(100))
    assert again.crossed_at == monitor.crossed_at and again.state.tokens == 600


@pytest.mark.parametrize(
    "params, inside, far",
    [
        # top_p 0.81: token 2 starts after mass 0.813 (0.805 with the band), or after 0.987
        (SamplingParams(temperature=1.0, top_p=0.81), [3.0, 2.5, 2.0, -3.0], [3.0, 2.5, -1.0, -3.0]),
        # top-k 2: token 2's logit is 0.01 below the second's, or 1.0 below
        (SamplingParams(temperature=1.0, top_k=2), [3.0, 2.5, 2.49, 0.0], [3.0, 2.5, 1.5, 0.0]),
        # min-p 0.5: p(token 2) / p(max) = exp(-0.7 - 0.01) just under 0.5, or exp(-2)
        (SamplingParams(temperature=1.0, min_p=0.5), [3.0, 2.9, 3.0 - 0.7031, 0.0], [3.0, 2.9, 1.0, 0.0]),
    ],
)
def test_a_token_just_outside_the_support_is_a_tie_and_far_outside_impossible(params, inside, far):
    logits = torch.tensor([inside, far])
    assert (processed_probs(logits, params)[:, 2] == 0).all()  # both emitted tokens are outside the support
    t = sampled_transform(logits, [2, 2], params, np.random.default_rng(0), tie_margin=0.05)
    assert [(m.position, m.kind) for m in t.outside_support] == [(0, "tie"), (1, "impossible")]
    assert t.outside_support[0].margin == pytest.approx(float(logits[0, 0] - logits[0, 2]))
    assert len(t.pit) == 0  # neither is scored
    # with no band, the edge token is impossible too
    t = sampled_transform(logits, [2, 2], params, np.random.default_rng(0), tie_margin=0.0)
    assert [m.kind for m in t.outside_support] == ["impossible", "impossible"]


def test_tie_band_mass_equals_a_token_by_token_count():
    from shadow.calibration import tie_band_mass
    from shadow.checks import in_tie_band

    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 2
    request, drawn = SamplingParams(temperature=0.8, top_p=0.7), SamplingParams(temperature=0.8)
    outside = band = 0.0
    for row in logits:
        q = processed_probs(row, drawn).double()
        for token in torch.nonzero(processed_probs(row, request) == 0).flatten().tolist():
            outside += float(q[token])
            band += float(q[token]) if in_tie_band(row, token, request, 0.5) else 0.0
    got = tie_band_mass(logits, request, drawn, 0.5)
    assert 0 < band < outside  # the margin is wide enough to catch some, not all
    assert got == pytest.approx((outside / 6, band / 6), rel=1e-9)
