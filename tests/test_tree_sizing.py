"""Adaptive tree sizing (core/tree_sizing.py): which nodes a step verifies, and that it stays lossless."""

import math
from types import SimpleNamespace

import pytest
import torch

from sglang_jetspec.core import tree_drafting
from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.tree import DraftTree, TreeSpec, build_tree
from sglang_jetspec.core.tree_drafting import FORCED_LOGPROB, headless_trees
from sglang_jetspec.core.tree_sizing import (
    AcceptCalibration,
    BandedCalibration,
    DraftDepth,
    DraftGate,
    TreeSizer,
    TreeStepOverhead,
    VerifyCost,
    calibrated_probabilities,
    conditional_probabilities,
    relative_costs,
    size_trees,
    truncate,
)
from sglang_jetspec.reference import engine as reference_engine
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.oracle import OracleDrafter
from sglang_jetspec.reference.prompts import humaneval_prompts


def chain(probabilities: list[float], root: int = 0) -> DraftTree:
    """A chain whose node i is accepted with path probability probabilities[i] (non-increasing)."""
    n = len(probabilities) + 1
    cums = [0.0] + [math.log(p) for p in probabilities]
    return DraftTree(
        torch.arange(root, root + n),
        torch.arange(-1, n - 1),
        torch.arange(n),
        torch.zeros(n, dtype=torch.long),
        torch.tensor(cums),
    )


LINEAR = VerifyCost((1, 2), (1.0, 2.0), unit_s=0.1)  # every extra node costs a whole step
FREE = VerifyCost((1, 64), (1.0, 1.0), unit_s=0.1)  # verifying is as cheap for 64 nodes as for one
# SmolLM2 fp32 on 2 CPU threads (issue 18's table): the engine tests size against this curve, not against
# one measured while other tests load the machine, so what they assert does not depend on the load
SMOLLM2_FP32 = VerifyCost((1, 4, 16, 64), (1.0, 1.54, 2.17, 4.35), unit_s=0.05)


def test_verify_cost_interpolates_and_extrapolates_linearly():
    cost = relative_costs({1: 0.1, 4: 0.15, 16: 0.3})
    assert cost.unit_s == 0.1 and cost.relative == pytest.approx((1.0, 1.5, 3.0))
    assert (
        cost(1) == 1.0
        and cost(4) == pytest.approx(1.5)
        and cost(10) == pytest.approx(2.25)
        and cost(28) == pytest.approx(4.5)
    )
    with pytest.raises(ValueError, match="count 1"):
        relative_costs({2: 0.1, 4: 0.2})


def test_when_verifying_is_free_every_node_that_can_be_accepted_is_kept():
    sized = size_trees([chain([0.9, 0.5, 0.01])], FREE, draft_steps=0.0)
    assert sized.trees[0].size == 4 and sized.expected == pytest.approx(1.41)


def test_when_each_node_costs_a_step_only_a_certain_node_pays():
    # rates: roots alone 1/1; + node p=0.9: 1.9/2 = 0.95 < 1, so nothing is verified beyond the root
    assert size_trees([chain([0.9, 0.8])], LINEAR, draft_steps=0.0).trees[0].size == 1
    # a sure node (p = 1) exactly pays for itself; ties keep the cheaper tree
    assert size_trees([chain([1.0])], LINEAR, draft_steps=0.0).trees[0].size == 1


def test_the_best_prefix_is_chosen_by_rate_including_the_draft_cost():
    cost = VerifyCost((1, 2, 4, 8), (1.0, 1.1, 1.3, 2.6), unit_s=0.1)
    probabilities = [0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05]
    rates = {m: (1 + sum(probabilities[:m])) / (cost(1 + m) + 0.5) for m in range(8)}
    best = max(rates, key=lambda m: (rates[m], -m))
    assert size_trees([chain(probabilities)], cost, draft_steps=0.5).trees[0].size == best + 1


def test_calibration_scales_the_draft_probabilities():
    cost = VerifyCost((1, 2, 4), (1.0, 1.2, 1.6), unit_s=0.1)
    assert size_trees([chain([0.6, 0.4, 0.3])], cost, 0.0).trees[0].size == 4
    assert size_trees([chain([0.6, 0.4, 0.3])], cost, 0.0, calibrate=lambda p, d: 0.25 * p).trees[0].size == 1


def test_a_node_is_scored_by_its_calibrated_probability_given_its_parent_times_its_parents_score():
    tree = chain([0.6, 0.3, 0.2])
    assert conditional_probabilities(tree).tolist() == pytest.approx([0.6, 0.5, 2 / 3])
    assert calibrated_probabilities(tree, lambda r, d: r) == pytest.approx([0.6, 0.3, 0.2])
    assert calibrated_probabilities(tree, lambda r, d: 0.5 * r) == pytest.approx([0.3, 0.075, 0.025])


def test_a_batch_verifies_one_node_count_chosen_over_all_lanes():
    spec = TreeSpec(budget=12, max_depth=4, width=3)
    logprobs = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.7, 0.2, 0.1], [0.9, 0.05, 0.05]]))
    confident = build_tree(0, torch.arange(12).view(4, 3), logprobs, spec)
    unsure = chain([0.05, 0.01])
    cost = VerifyCost((1, 2, 4, 16), (1.0, 1.05, 1.2, 2.0), unit_s=0.1)
    sized = size_trees([confident, unsure], cost, draft_steps=0.3)
    kept, other = sized.trees
    # a batched verify pads every lane to the longest tree: each lane keeps its first n nodes
    p = [tree.cum_logprobs[1:].exp().tolist() for tree in (confident, unsure)]
    rates = {n: (2 + sum(sum(lane[: n - 1]) for lane in p)) / (cost(2 * n) + 0.3) for n in range(1, confident.size + 1)}
    n = max(rates, key=lambda k: (rates[k], -k))
    assert 1 < n < confident.size and kept.size == n and other.size == min(n, unsure.size)
    assert torch.equal(kept.tokens, confident.tokens[:n])
    assert sized.expected == pytest.approx(sum(sum(lane[: n - 1]) for lane in p), rel=1e-5)


def test_a_step_pays_only_when_it_beats_an_ordinary_step_without_the_draft():
    cost = VerifyCost((1, 2, 4), (1.0, 1.2, 1.6), unit_s=0.1)
    assert size_trees([chain([0.9, 0.8])], cost, draft_steps=0.1).pays  # (1 + 1.7) / (1.4 + 0.1) = 1.8 > 1
    assert not size_trees([chain([0.9, 0.8])], cost, draft_steps=2.0).pays  # 2.7 / 3.4 < 1, though sizing kept nodes
    assert not size_trees([chain([0.01])], cost, draft_steps=0.0).pays  # roots alone at no draft cost: a tie is no gain


def test_what_a_tree_costs_after_its_verify_is_charged_to_every_tree_not_to_the_roots():
    cost = VerifyCost((1, 2, 4), (1.0, 1.2, 1.6), unit_s=0.1)
    tree = chain([0.9, 0.8])
    assert size_trees([tree], cost, draft_steps=0.1).trees[0].size == 3  # (1 + 1.7) / (1.4 + 0.1) = 1.8
    # 1 unit of acceptance and commit per tree step: 2.7 / 2.5 = 1.08 still beats the roots (1 / 1.1)...
    assert size_trees([tree], cost, draft_steps=0.1, tree_steps=1.0).trees[0].size == 3
    # ...2 units: 2.7 / 3.5 < 1 / 1.1, the roots alone; and the step did not pay
    sized = size_trees([tree], cost, draft_steps=0.1, tree_steps=2.0)
    assert sized.trees[0].size == 1 and not sized.pays


def test_what_every_step_pays_is_charged_to_the_roots_too_so_trees_grow():
    cost = VerifyCost((1, 2, 4), (1.0, 1.2, 1.6), unit_s=0.1)
    tree = chain([0.6, 0.2])
    # the verify alone: 2 nodes (1.6 / 1.2 = 1.33) beat 3 (1.8 / 1.4 = 1.29)
    assert size_trees([tree], cost, draft_steps=0.0).trees[0].size == 2
    # 2 units every step pays besides its verify: 1.6 / 3.2 = 0.50 < 1.8 / 3.4 = 0.53, the third node pays
    sized = size_trees([tree], cost, draft_steps=0.0, every_step=2.0)
    assert sized.trees[0].size == 3 and sized.pays
    # ...and the roots pay it as well: a draft that costs 1.5 units then still pays (2.8 / 4.9 > 1 / 3),
    # where next to the verify alone it does not (2.8 / 2.9 < 1 / 1)
    assert size_trees([tree], cost, draft_steps=1.5, every_step=2.0).pays
    assert not size_trees([tree], cost, draft_steps=1.5).pays


def test_sizing_charges_the_width_a_padded_verify_runs_at():
    cost = VerifyCost((1, 4, 16), (1.0, 1.3, 2.5), unit_s=0.1)
    tree = chain([0.9, 0.5, 0.05, 0.05, 0.05])  # path probabilities of nodes 1..5
    # unpadded: 3 nodes, 2.4 / 1.2 = 2.0 (4 nodes: 2.45 / 1.3)
    assert size_trees([tree], cost, draft_steps=0.0).trees[0].size == 3
    # padded to the ladder 4, 8, 16: 3 nodes cost what 4 do, so the fourth comes free (2.45 / 1.3 > 2.4 / 1.3)
    ladder = {1: 1, 2: 4, 3: 4, 4: 4, 5: 8, 6: 8}
    assert size_trees([tree], cost, draft_steps=0.0, width=ladder.__getitem__).trees[0].size == 4
    # a ladder of 8 and 16: any tree costs 8 rows, which (1 + 1.5) / 1.7 still beats the roots
    sized = size_trees([chain([0.9, 0.6])], cost, draft_steps=0.0, width=lambda n: 1 if n == 1 else 8)
    assert sized.trees[0].size == 3 and sized.pays
    # ...and 16 rows for any tree (cost 2.5): 2.5 / 2.5 does not beat the roots alone
    sized = size_trees([chain([0.9, 0.6])], cost, draft_steps=0.0, width=lambda n: 1 if n == 1 else 16)
    assert sized.trees[0].size == 1 and not sized.pays
    assert TreeSizer(cost, width=lambda n: 1 if n == 1 else 16).size([chain([0.9, 0.6])], spent_s=0.0)[0].size == 1


def test_a_sizer_learns_the_overhead_of_a_tree_step_over_a_roots_step():
    overhead = TreeStepOverhead(decay=0.5)
    overhead.observe(0.004, verified_tree=True)
    assert overhead.extra_s == 0.0  # no roots-alone step timed yet: nothing charged
    overhead.observe(0.001, verified_tree=False)
    assert overhead.extra_s == pytest.approx(0.003)
    overhead.observe(0.002, verified_tree=True)  # moving average: 0.004 + 0.5 (0.002 - 0.004)
    assert overhead.extra_s == pytest.approx(0.002)
    overhead.observe(0.009, verified_tree=False)  # roots dearer than trees: never a negative charge
    assert overhead.extra_s == 0.0
    # the sizer charges it in its own unit: 0.02 s over unit 0.1 s = tree_steps 0.2
    sizer = TreeSizer(VerifyCost((1, 2, 4), (1.0, 1.2, 1.6), unit_s=0.1))
    sizer.overhead_at(1).observe(0.03, verified_tree=True)
    sizer.overhead_at(1).observe(0.01, verified_tree=False)
    tree = chain([0.5, 0.1])
    # every step pays the roots' 0.01 s = 0.1 units; rates: roots 1 / 1.1; 2 nodes 1.5 / (1.2 + 0.1 + 0.2)
    # = 1.0; 3 nodes 1.6 / (1.4 + 0.1 + 0.2) = 0.94
    assert sizer.overhead_for(1).every_step_s == pytest.approx(0.01)
    assert sizer.size([tree], spent_s=0.0)[0].size == 2


def test_each_lane_count_is_charged_its_own_overhead_or_the_nearest_timed_one():
    sizer = TreeSizer()
    assert sizer.overhead_for(4).every_step_s == 0.0 and not sizer.overheads  # nothing timed: nothing charged
    sizer.overhead_at(1).observe(0.002, verified_tree=False)
    sizer.overhead_at(16).observe(0.040, verified_tree=False)
    assert sizer.overhead_for(1).every_step_s == pytest.approx(0.002)
    assert sizer.overhead_for(4).every_step_s == pytest.approx(0.002)  # nearer one lane than 16
    assert sizer.overhead_for(12).every_step_s == pytest.approx(0.040)
    sizer.overhead_at(4).observe(0.010, verified_tree=False)
    assert sizer.overhead_for(4).every_step_s == pytest.approx(0.010)  # its own, once timed
    assert sizer.overhead_for(1).every_step_s == pytest.approx(0.002)  # one lane's unchanged by 4 lanes'


def test_a_sizer_learns_what_every_step_pays_the_gap_between_steps_included():
    overhead = TreeStepOverhead(decay=0.5)
    assert overhead.every_step_s == 0.0
    overhead.observe(0.004, verified_tree=True)
    assert overhead.every_step_s == pytest.approx(0.004)  # trees alone timed: what each of them pays outside
    overhead.observe(0.001, verified_tree=False)
    assert overhead.every_step_s == pytest.approx(0.001)  # the roots' own, once timed
    overhead.observe_gap(0.010)
    overhead.observe_gap(0.020)  # moving average: 0.010 + 0.5 (0.020 - 0.010)
    assert overhead.every_step_s == pytest.approx(0.001 + 0.015)


def test_the_head_drafts_as_deep_as_recent_steps_kept_plus_headroom_per_lane_count():
    depth = DraftDepth(window=3, headroom=2, rungs=(3, 5, 7, 11))
    for kept in (4, 2, 3):
        assert depth.depth(lanes=4, bound=15) == 15  # until a window of drafted steps is seen: the whole bound
        depth.observe([chain([0.9] * kept), chain([0.5])] + [chain([])] * 2)
    assert depth.depth(4, bound=15) == 7  # deepest kept 4, + 2 = 6: the rung 7
    assert depth.depth(4, bound=3) == 3  # never deeper than the budget allows
    assert depth.depth(1, bound=15) == 15  # another lane count keeps its own evidence
    depth.observe([chain([0.9] * 7)] + [chain([])] * 3)  # a tree kept down to the bound: the next draft deepens
    assert depth.depth(4, bound=15) == 11
    for _ in range(3):
        depth.observe([chain([0.9])] * 4)
    assert depth.depth(4, bound=15) == 3  # the window moved on: shallow trees, shallow drafts
    depth.observe([chain([0.9] * 10)] * 4)
    assert depth.depth(4, bound=15) == 15  # 12 is past every rung: the bound
    for bad in ({"window": 0}, {"headroom": 0}, {"rungs": (5, 3)}, {"rungs": ()}):
        with pytest.raises(ValueError, match="rungs"):
            DraftDepth(**bad)


def test_a_sized_step_drafts_to_the_depth_its_sizer_names(monkeypatch):
    """step_trees passes the head the sizer's draft depth: after a window of steps keeping 4 depths the
    head is asked for 7 (4 + 2, the next rung), not the budget's 15."""
    asked = []

    def fake_draft_trees(drafter, lanes, spec, *args, **kwargs):
        asked.append(spec.max_depth)
        return [chain([0.95] * min(4, spec.max_depth)) for _ in lanes], tree_drafting.DraftTiming([], 0.0)

    monkeypatch.setattr(tree_drafting, "draft_trees", fake_draft_trees)
    sizer = TreeSizer(VerifyCost((1, 64), (1.0, 1.01), unit_s=0.1))  # next to free: every node is kept
    lanes = [SimpleNamespace(root_token=1)] * 2
    spec = tree_drafting.budget_spec(max_depth=15, budget=16, width=2)
    for _ in range(sizer.draft_depth.window + 1):
        trees, _ = tree_drafting.step_trees(None, lanes, spec, sizer=sizer)
        assert [tree.size for tree in trees] == [5, 5]
    assert asked == [15] * sizer.draft_depth.window + [7]
    assert tree_drafting.step_trees(None, lanes, spec)[0][0].size == 5 and asked[-1] == 15  # unsized: the budget's


def test_the_gate_backs_off_while_the_head_loses_and_returns_once_it_pays():
    gate = DraftGate(max_skip=4)
    pattern = []
    for _ in range(12):
        drafted = gate.should_draft()
        pattern.append(drafted)
        if drafted:
            gate.observe(pays=False)
    # draft, skip 1, draft, skip 2, draft, skip 4, draft, skip 4 (the cap)
    assert pattern == [True, False, True, False, False, True, False, False, False, False, True, False]
    gate.observe(pays=True)
    assert [gate.should_draft() for _ in range(3)] == [True, True, True]
    assert all(DraftGate(max_skip=0).should_draft() for _ in range(3))


class Committed:
    def __init__(self, ids):
        self.committed_ids, self.root_token = ids, ids[-1]


def test_headless_trees_are_the_lookup_guess_as_a_scored_chain_within_the_budget():
    lanes = [Committed([5, 6, 7, 8, 9, 5, 6]), Committed([1, 2, 3])]
    spec = TreeSpec(budget=3, max_depth=15, width=4)
    merge = LookupMerge(logprob=math.log(0.5))
    guessed, unmatched = headless_trees(lanes, spec, merge)
    assert guessed.tokens.tolist() == [6, 7, 8] and guessed.parents.tolist() == [-1, 0, 1]
    # "5 6" recurred: a 2-token match, trusted OWN_MATCH_FACTOR[2] times the merge's rate
    assert guessed.cum_logprobs.exp().tolist() == pytest.approx([1.0, 0.5 * 0.9, (0.5 * 0.9) ** 2])
    assert unmatched.tokens.tolist() == [3]
    assert [t.tokens.tolist() for t in headless_trees(lanes, spec, None)] == [[6], [3]]


def test_forced_tokens_join_as_a_trusted_chain_with_or_without_lookup():
    """A lane's forced tokens (a grammar's) are a chain from its root at FORCED_LOGPROB per token, merged
    with what lookup guesses; a lane without any keeps what it had."""
    lanes = [Committed([5, 6, 7, 8, 9, 5, 6]), Committed([1, 2, 3])]
    spec = TreeSpec(budget=4, max_depth=15, width=4)
    alone, chained = headless_trees(lanes, spec, None, forced=[[], [40, 41, 42, 43]])
    assert alone.tokens.tolist() == [6]  # no lookup and nothing forced: the root alone
    assert chained.tokens.tolist() == [3, 40, 41, 42] and chained.parents.tolist() == [-1, 0, 1, 2]
    assert chained.cum_logprobs.tolist() == pytest.approx([0.0, *(FORCED_LOGPROB * d for d in (1, 2, 3))])
    # beside a looked-up chain (7 8 9 ...: "5 6" recurred): where both guess 7 the evidence combines
    # (noisy-or); below it the forced 30 outranks lookup's 8
    merge = LookupMerge(logprob=math.log(0.5))
    (both,) = headless_trees(lanes[:1], spec, merge, forced=[[7, 30]])
    assert both.tokens.tolist() == [6, 7, 30, 8] and both.parents.tolist() == [-1, 0, 1, 1]
    assert both.cum_logprobs[1].exp() == pytest.approx(1 - (1 - 0.9) * (1 - 0.5 * 0.9))


def test_truncate_keeps_a_prefix():
    tree = chain([0.9, 0.8, 0.7])
    assert truncate(tree, 2).tokens.tolist() == [0, 1] and truncate(tree, 9) is tree


def test_calibration_follows_what_the_target_accepts_within_its_bounds():
    cal = AcceptCalibration(decay=0.5, prior=1.0, floor=0.1)
    assert cal.factor == 1.0
    for _ in range(20):
        cal.observe(predicted=4.0, accepted=1.0)
    assert cal.factor == pytest.approx(0.25, rel=1e-3)
    for _ in range(20):
        cal.observe(predicted=4.0, accepted=0.0)
    assert cal.factor == 0.1
    cal.observe(predicted=0.0, accepted=5.0)  # nothing verified beyond the roots: no evidence
    assert cal.factor == 0.1
    for _ in range(20):
        cal.observe(predicted=1.0, accepted=3.0)
    assert cal.factor == 1.0, "never trusts the draft more than its own probabilities"


def test_each_band_of_draft_probability_learns_its_own_factor():
    cal = BandedCalibration(edges=(0.5,), decay=0.0, prior=1.0)
    p = torch.tensor([0.9, 0.8, 0.3, 0.2, 0.1], dtype=torch.float64)
    cal.observe(p, torch.ones(5, dtype=torch.long), torch.tensor([True, True, False, False, False]))
    assert cal.factors == pytest.approx([1.0, 0.1])  # the sure band right (capped at 1), the unsure one wrong (floor)
    one = torch.ones(2, dtype=torch.long)
    assert cal.scale(torch.tensor([0.7, 0.4], dtype=torch.float64), one).tolist() == pytest.approx([0.7, 0.04])
    with pytest.raises(ValueError, match="descending"):
        BandedCalibration(edges=(0.2, 0.5))
    with pytest.raises(ValueError, match="depth class"):
        BandedCalibration(depths=0)


def test_each_depth_class_learns_its_own_factor_and_reads_the_pooled_one_until_it_has_evidence():
    """First-level guesses overconfident, deeper ones not (chat, issue 59): one factor per band averages
    them; a class with no evidence of its own (never tried) reads the band's pooled factor."""
    cal = BandedCalibration(edges=(0.5,), decay=0.0, prior=1.0, depths=3)
    p = torch.full((6,), 0.6, dtype=torch.float64)
    depth = torch.tensor([1, 1, 1, 1, 2, 2])
    cal.observe(p, depth, torch.tensor([False, False, False, True, True, True]))
    assert cal.factors == pytest.approx([3 / 3.6, 1.0])  # pooled: 3 accepted of 3.6 predicted
    depth_1, depth_2, depth_3 = cal.depth_factors
    # own sums plus one token of the pooled factor: (1 + 5/6) / (2.4 + 1), (2 + 5/6) / (1.2 + 1) capped at 1
    assert depth_1 == pytest.approx([(1 + 5 / 6) / 3.4, 1.0]) and depth_2 == pytest.approx([1.0, 1.0])
    assert depth_3 == pytest.approx([5 / 6, 1.0])  # never tried: the pooled factor
    scaled = cal.scale(torch.tensor([0.6, 0.6, 0.6], dtype=torch.float64), torch.tensor([1, 2, 7]))
    assert scaled.tolist() == pytest.approx([0.6 * (1 + 5 / 6) / 3.4, 0.6, 0.6 * 5 / 6])  # depth 7: the last class


def test_a_sizer_learns_from_the_nodes_the_target_accepted():
    sizer = TreeSizer(FREE, BandedCalibration(edges=(0.5,), decay=0.0, prior=1.0))
    sizer.size([chain([0.9, 0.3]), chain([0.4])], spent_s=0.0)
    sizer.observe([[0, 1], [0]])  # lane 0 accepted its r=0.9 node, not the next (r=1/3); lane 1 nothing (r=0.4)
    assert sizer.calibration.factors == pytest.approx([1.0, 0.1])


def test_a_node_whose_parent_was_rejected_teaches_nothing():
    sizer = TreeSizer(FREE, BandedCalibration(edges=(0.5,), decay=0.0, prior=1.0))
    sizer.size([chain([0.9, 0.3])], spent_s=0.0)
    sizer.observe([[0]])  # the r=0.9 node rejected; its child (r=1/3) was never really tried
    assert sizer.calibration.factors == pytest.approx([0.1, 1.0])


def test_headless_steps_learn_their_own_calibration():
    sizer = TreeSizer(
        FREE, BandedCalibration(decay=0.0, prior=1.0), headless_calibration=BandedCalibration(decay=0.0, prior=1.0)
    )
    sizer.size([chain([0.9, 0.9])], spent_s=0.0)
    sizer.observe([[0]])  # the head's two sure nodes: both rejected
    sizer.size([chain([0.9, 0.81])], spent_s=0.0, drafted=False)
    sizer.observe([[0, 1, 2]])  # lookup's chain: both accepted
    assert sizer.calibration.factors[0] == 0.1 and sizer.headless_calibration.factors[0] == 1.0


def test_an_unknown_sizing_is_refused():
    with pytest.raises(ValueError, match="fixed, adaptive"):
        EngineConfig(tree_sizing="sometimes")


@pytest.fixture(scope="module")
def workload(smollm2):
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    return [
        Request(smollm2.tokenizer(p)["input_ids"], params, str(i)) for i, p in enumerate(humaneval_prompts(range(3)))
    ]


@pytest.fixture(scope="module")
def autoregressive(smollm2, workload):
    return [
        o.output_ids
        for o in ReferenceEngine(smollm2, config=EngineConfig(max_batch_size=2)).generate(workload, budget=0)
    ]


def _fixed_step_costs(monkeypatch) -> None:
    """Size against the seeded SmolLM2 curve alone: no verify timing or tree overhead is learned. These
    tests are about confidence; under the suite's second worker (a real SGLang server on the other core)
    the timed verifies came out uneven enough to make wider trees look cheap (5.8 nodes a lane for a
    random head, checked with a 2-thread load beside it). The learning is tested on its own below."""
    monkeypatch.setattr(reference_engine, "verify_cost", lambda target, taps=(): SMOLLM2_FP32)
    monkeypatch.setattr(LearnedVerifyCost, "observe", lambda self, lanes, nodes, seconds: None)
    monkeypatch.setattr(TreeStepOverhead, "observe", lambda self, seconds, verified_tree: None)


@pytest.mark.parametrize("drafter", ["untrained", "oracle"])
def test_adaptive_sizing_is_greedy_exact_and_sizes_by_confidence(
    smollm2, untrained_drafter, workload, autoregressive, drafter, monkeypatch
):
    _fixed_step_costs(monkeypatch)
    if drafter == "oracle":
        draft = OracleDrafter(smollm2, max_depth=15)
        for request, output in zip(workload, autoregressive):
            draft.add_reference(request.prompt_ids, output)
    else:
        draft = untrained_drafter
    engine = ReferenceEngine(
        smollm2, draft, EngineConfig(tree_width=4, max_batch_size=2, tree_sizing="adaptive", check_invariants=True)
    )
    records = []
    outputs = engine.generate(workload, budget=16, on_step=records.append)
    assert [o.output_ids for o in outputs] == autoregressive
    skipped = sum(not r.draft_round_s for r in records)
    nodes_per_lane = sum(r.verified_nodes for r in records) / sum(r.batch_size for r in records)
    if drafter == "oracle":  # right about every top-1 node, with the target's own (under-)confidence:
        # calibration stays at 1 and trees stay deep until path probabilities fall below a node's cost (~6 here)
        assert (
            nodes_per_lane > 4.5 and engine.learners.sizer.calibration.factors[0] > 0.9 and skipped < len(records) / 4
        )
    else:  # a random head is unsure of everything and wrong: next to no node pays for its share of the verify,
        # and the gate soon stops paying for its drafts: most steps run without the head
        assert nodes_per_lane < 3 and skipped > len(records) / 2


def test_a_policy_step_can_size_adaptively_on_an_engine_started_fixed(
    smollm2, untrained_drafter, workload, autoregressive, monkeypatch
):
    """A cohort's tree_sizing reaches the reference engine per step (serving/engine_worker.py passes the
    plan's): its first adaptive step builds the sizer; output stays the autoregressive one."""
    _fixed_step_costs(monkeypatch)
    engine = ReferenceEngine(smollm2, untrained_drafter, EngineConfig(tree_width=4, max_batch_size=2))
    batch = engine.start_batch()
    for request in workload[:2]:
        assert batch.admit(request) is None
    record, _ = batch.step(16)
    assert engine.learners is None and record.verified_nodes == 2 * 16  # fixed: the whole budget
    with pytest.raises(ValueError, match="fixed, adaptive"):
        batch.step(16, tree_sizing="sometimes")
    outputs, records = {}, []
    while len(batch):
        record, finished = batch.step(16, tree_sizing="adaptive")
        records.append(record)
        outputs.update({request.request_id: output.output_ids for request, output in finished})
    assert engine.learners is not None and [outputs["0"], outputs["1"]] == autoregressive[:2]
    # a random head: next to nothing pays for its share of the verify (fixed sizing verifies 16; the sizer
    # reads measured draft times, and under two test workers it kept exactly 3 nodes a request once)
    assert sum(r.verified_nodes for r in records) / sum(r.batch_size for r in records) < 4


def test_the_engine_sizes_with_the_verify_cost_its_own_steps_teach(smollm2, untrained_drafter, workload, monkeypatch):
    """The start-up measurement only seeds the curve: every sized step's timed verify refines it, and
    sizing reads the refined curve (the sizer holds no cost of its own, so an unwired curve would raise)."""
    # absurdly slow, at odd row counts that two lanes' padded verifies never compute
    seeded = VerifyCost((1, 3, 63), (1.0, 1.5, 4.35), unit_s=10.0)
    monkeypatch.setattr(reference_engine, "verify_cost", lambda target, taps=(): seeded)
    engine = ReferenceEngine(
        smollm2, untrained_drafter, EngineConfig(tree_width=4, max_batch_size=2, tree_sizing="adaptive")
    )
    by_rows = engine.learners.verify_costs.by_rows
    assert engine.learners.sizer.cost is None and by_rows.seconds == pytest.approx([10.0, 15.0, 43.5])
    engine.generate(workload[:2], budget=16)
    learned = dict(zip(by_rows.counts, by_rows.seconds))
    timed = {rows: seconds for rows, seconds in learned.items() if rows % 2 == 0}
    assert timed and max(timed.values()) < 1.0  # two lanes' verify passes as timed, not the seconds the seed implies
    assert [learned[1], learned[3], learned[63]] == pytest.approx([10.0, 15.0, 43.5])  # never verified: still the seed
