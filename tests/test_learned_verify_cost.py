"""The verify cost a server learns by timing its own verify passes (the SGLang worker's adaptive sizing)."""

import pytest
from test_tree_sizing import chain

from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.tree_sizing import TreeSizer, VerifyCost, size_trees


def test_the_ends_of_each_lane_counts_curve_are_probed_first_then_sizing_takes_over():
    costs = LearnedVerifyCost()
    assert costs.probe(lanes=2, budget=16) == 1  # nothing timed: an ordinary step first
    costs.observe(2, 1, 0.10)
    assert costs.probe(2, 16) == 16  # then the full tree of 16 nodes a lane
    costs.observe(2, 16, 0.30)
    assert costs.probe(2, 16) is None and costs.probe(2, 8) is None
    assert costs.probe(2, 32) == 32  # a larger budget's end was never timed
    # another lane count times its own ends: 1 lane x 32 nodes is not what 2 x 16 cost
    assert costs.probe(1, 16) == 1 and costs.probe(4, 4) == 1
    costs.observe(4, 1, 0.12)
    assert costs.probe(4, 4) == 4


def test_each_lane_count_reads_its_own_curve_by_rows_relative_to_its_ordinary_step():
    costs = LearnedVerifyCost()
    for lanes, nodes, seconds in ((2, 1, 0.10), (2, 16, 0.40), (2, 4, 0.16)):
        costs.observe(lanes, nodes, seconds)
    curve = costs.curve(lanes=2)
    assert curve.unit_s == pytest.approx(0.10) and curve(2) == pytest.approx(1.0)
    assert curve(8) == pytest.approx(1.6) and curve(20) == pytest.approx(2.8) and curve(64) == pytest.approx(7.2)
    with pytest.raises(ValueError, match="probe first"):
        costs.curve(lanes=1)  # nothing timed at or below one row


def test_rows_timed_at_one_lane_count_do_not_price_another():
    """The bug this keying fixes (issue 59): a server that served one request at a time has timed 32-row
    verifies that cost 1.3 ordinary steps of one lane; a batch of 4 reading them by rows would price 4 x 8
    nodes at 1.05 of its own ordinary step, where it costs 2."""
    costs = LearnedVerifyCost()
    for nodes, seconds in ((1, 0.050), (8, 0.056), (16, 0.058), (32, 0.063)):
        costs.observe(1, nodes, seconds)
    for nodes, seconds in ((1, 0.060), (16, 0.160)):  # 4 lanes' probes: an ordinary step, the full tree
        costs.observe(4, nodes, seconds)
    four = costs.curve(4)
    assert four.unit_s == pytest.approx(0.060) and four(4 * 16) == pytest.approx(0.160 / 0.060)
    assert four(4 * 8) == pytest.approx((0.060 + 0.100 * 7 / 15) / 0.060)  # its own slope, not one lane's
    one = costs.curve(1)
    assert one.unit_s == pytest.approx(0.050) and one(16) == pytest.approx(0.058 / 0.050)  # not 4 x 4 nodes' seconds
    # what one curve by rows would have said: 4 x 8 nodes at 1.05 of the 4 lanes' ordinary step
    pooled = costs.by_rows.cost(unit_at=4)
    assert pooled.unit_s == pytest.approx(0.060) and pooled(32) == pytest.approx(0.063 / 0.060)


def test_repeated_timings_are_averaged_with_the_newest_weighted_by_one_minus_decay():
    costs = LearnedVerifyCost(decay=0.5)
    costs.observe(1, 1, 0.2)
    costs.observe(1, 1, 0.4)
    costs.observe(1, 16, 0.8)
    own = costs.by_lanes[1]
    assert own.counts == [1, 16] and own.seconds == pytest.approx([0.3, 0.8])
    for bad in ((0, 1, 0.1), (1, 0, 0.1), (4, 1, 0.0)):
        with pytest.raises(ValueError, match="timed forward"):
            costs.observe(*bad)
    with pytest.raises(ValueError, match="decay"):
        LearnedVerifyCost(decay=1.0)


def test_a_learned_curve_sizes_trees_as_the_same_costs_measured_per_token_would():
    # one lane: the learned unit is the one-token forward, so sizing matches a curve measured up front
    costs = LearnedVerifyCost()
    for nodes, seconds in ((1, 0.05), (4, 0.077), (16, 0.1085)):
        costs.observe(1, nodes, seconds)
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
    costs.observe(1, 4, 0.02)  # warm, the 4-node verify costs what one token does
    assert costs.curve(1)(4) == pytest.approx(1.25) and costs.curve(1)(16) == pytest.approx(3.0)
    # the reference engine never probes: 2 lanes read every timed forward by rows, their unit at 2 rows
    two = costs.curve(2)
    assert two.unit_s == pytest.approx(0.02 * (1.0 + 0.25 / 3)) and two(4) * two.unit_s == pytest.approx(0.025)
    costs.observe(2, 8, 0.05)  # a sized 2-lane step (no ordinary one of its own yet): still by rows,
    assert costs.curve(2)(16) * costs.curve(2).unit_s == pytest.approx(0.055)  # averaged with the 16-token seed
