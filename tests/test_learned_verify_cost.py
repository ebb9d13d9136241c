"""The verify cost a server learns by timing its own verify passes (the SGLang worker's adaptive sizing)."""

import pytest
from test_tree_sizing import chain

from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.tree_sizing import TreeSizer, VerifyCost, size_trees


def test_the_ends_of_a_batch_curve_are_probed_first_then_sizing_takes_over():
    costs = LearnedVerifyCost()
    assert costs.probe(lanes=2, budget=16) == 1  # nothing timed: an ordinary step first
    costs.observe(2, 0.10)
    assert costs.probe(2, 16) == 16  # then the full tree of 2 x 16 rows
    costs.observe(32, 0.30)
    assert costs.probe(2, 16) is None
    assert costs.probe(1, 16) == 1  # below every timed count: one lane needs its own ordinary step
    assert costs.probe(4, 16) == 16  # 4 x 16 rows lie beyond the longest timed forward
    assert costs.probe(4, 8) is None  # 4 rows interpolate between 2 and 32; 32 rows were timed


def test_the_curve_is_relative_to_the_batch_ordinary_step_and_linear_between_timed_counts():
    costs = LearnedVerifyCost()
    for rows, seconds in ((2, 0.10), (32, 0.40), (8, 0.16)):
        costs.observe(rows, seconds)
    curve = costs.curve(lanes=2)
    assert curve.unit_s == pytest.approx(0.10) and curve(2) == pytest.approx(1.0)
    assert curve(8) == pytest.approx(1.6) and curve(20) == pytest.approx(2.8) and curve(64) == pytest.approx(7.2)
    # a batch of 4 has no timed ordinary step: its unit is interpolated (0.12 s), not probed
    four = costs.curve(lanes=4)
    assert (
        four.unit_s == pytest.approx(0.12) and four(4) == pytest.approx(1.0) and four(32) == pytest.approx(0.40 / 0.12)
    )
    with pytest.raises(ValueError, match="probe first"):
        costs.curve(lanes=1)


def test_repeated_timings_are_averaged_with_the_newest_weighted_by_one_minus_decay():
    costs = LearnedVerifyCost(decay=0.5)
    costs.observe(1, 0.2)
    costs.observe(1, 0.4)
    costs.observe(16, 0.8)
    assert costs.rows == [1, 16] and costs.seconds == pytest.approx([0.3, 0.8])
    for bad in ((0, 0.1), (4, 0.0)):
        with pytest.raises(ValueError, match="timed forward"):
            costs.observe(*bad)
    with pytest.raises(ValueError, match="decay"):
        LearnedVerifyCost(decay=1.0)


def test_a_learned_curve_sizes_trees_as_the_same_costs_measured_per_token_would():
    # one lane: the learned unit is the one-token forward, so sizing matches a curve measured up front
    costs = LearnedVerifyCost()
    for rows, seconds in ((1, 0.05), (4, 0.077), (16, 0.1085)):
        costs.observe(rows, seconds)
    tree = chain([0.95, 0.9, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05])
    learned = size_trees([tree], costs.curve(1), draft_steps=0.2)
    sizer = TreeSizer()  # no cost of its own: each step passes the learned one
    assert sizer.size([tree], spent_s=0.01, cost=costs.curve(1))[0].size == learned.trees[0].size
    assert 1 < learned.trees[0].size < tree.size
    with pytest.raises(ValueError, match="no verify cost"):
        TreeSizer().size([tree], spent_s=0.0)


def test_a_curve_started_from_a_measurement_is_it_until_timings_correct_it():
    measured = VerifyCost((1, 4, 16), (1.0, 1.5, 3.0), unit_s=0.02)
    costs = LearnedVerifyCost.starting_from(measured, decay=0.5)
    assert costs.probe(lanes=1, budget=16) is None  # both ends known: no probe step needed
    assert costs.curve(1)(4) == pytest.approx(1.5) and costs.curve(1).unit_s == pytest.approx(0.02)
    costs.observe(4, 0.02)  # warm, the 4-node verify costs what one token does
    assert costs.curve(1)(4) == pytest.approx(1.25) and costs.curve(1)(16) == pytest.approx(3.0)
