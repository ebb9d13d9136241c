"""The same-allocation decision on recorded traces: a cohort's steps timed as a server would time them."""

from __future__ import annotations

import random

import pytest

from policies.same_allocation import NATIVE, SPECULATIVE, SameAllocationControl, ServedRounds
from policies.schema import SameAllocationPolicy

CONFIG = SameAllocationPolicy()


def drive(control, cohort, steps, gain, noise=0.1, seed=0, batch_size=1, slow=None, batch=None):
    """`steps` steps of `cohort`: a native step serves 1 token per request in ~1 s, a speculative one `gain(i)`
    tokens per request in ~1 s (gain: a number or a function of the step index), each time scaled by up to
    +-`noise`; `slow(i, mode)` may multiply a step's seconds, `batch(i)` set its batch size. Returns the modes run."""
    rng = random.Random(seed)
    modes = []
    for i in range(steps):
        mode = control.mode(cohort)
        modes.append(mode)
        g = gain(i) if callable(gain) else gain
        tokens_per_request = g if mode == SPECULATIVE else 1.0
        seconds = 1.0 + rng.uniform(-noise, noise)
        if slow is not None:
            seconds *= slow(i, mode)
        size = batch(i) if batch is not None else batch_size
        control.observe(cohort, size, round(tokens_per_request * size * 1000), seconds * 1000)
    return modes


def native_share(modes):
    return modes.count(NATIVE) / len(modes)


def test_a_useful_head_stays_on_and_pays_a_small_steady_share_of_native_blocks():
    control = SameAllocationControl(CONFIG, ["bs1"])
    modes = drive(control, "bs1", 4000, gain=1.5)
    state = control.state()["bs1"]
    assert state["mode"] == SPECULATIVE and state["decided"] and state["flips"] == 0
    assert state["gain_low"] > 1.03 and 1.4 < state["gain"] < 1.6
    assert native_share(modes[:64]) == pytest.approx(0.25)  # exploring: one block in four
    # decided at a gain of 1.5: a native block loses a third of its time, so one in 32 (the most) keeps the
    # cost of checking near steady_cost (1 / 32 / 3 = 1%)
    assert state["other_mode_every"] == 32
    assert native_share(modes[-2048:]) == pytest.approx(1 / 32)


@pytest.mark.parametrize("gain, every", [(1.05, 16), (1.15, 16), (1.25, 20), (0.7, 30), (2.0, 32)])
def test_the_decided_share_of_the_other_mode_shrinks_as_it_loses_more(gain, every):
    """One block in `every` runs the other mode once decided: at least steady_every, at most steady_every_max,
    between them as many as keep its loss (1 - 1/gain, or 1 - gain where speculation loses) near 1%."""
    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 3000, gain=gain, noise=0.02)
    state = control.state()["bs1"]
    assert state["decided"] and state["mode"] == (SPECULATIVE if gain > 1 else NATIVE)
    assert state["other_mode_every"] == every, state


def test_a_useless_head_is_turned_native_within_a_few_blocks_and_stays_there():
    control = SameAllocationControl(CONFIG, ["bs1"])
    modes = drive(control, "bs1", 2000, gain=0.8)
    state = control.state()["bs1"]
    assert state["mode"] == NATIVE and state["decided"] and state["flips"] == 0
    first_native_majority = next(i for i in range(0, 2000, 8) if modes[i : i + 16].count(NATIVE) == 16)
    # 3 native blocks need 12 blocks of exploring: the turn comes within 13 blocks (104 steps)
    assert first_native_majority <= 13 * 8
    # a native block in 20 spends 1% checking speculation's loss of 20%
    assert native_share(modes[-1280:]) == pytest.approx(19 / 20)


def test_break_even_never_flaps():
    control = SameAllocationControl(CONFIG, ["bs1"])
    modes = drive(control, "bs1", 20000, gain=1.0, noise=0.2, seed=3)
    state = control.state()["bs1"]
    assert state["flips"] <= 1 and state["mode"] == NATIVE  # a gain worth having was never shown
    assert native_share(modes[-4000:]) >= 0.75  # at most the explore share of speculative blocks


def test_stalls_and_the_first_step_after_a_switch_are_not_counted():
    def slow(i, mode):  # every native block's first step and every 10th speculative step take 20x
        return 20.0 if (mode == NATIVE and i % 8 == 0) or (mode == SPECULATIVE and i % 10 == 3) else 1.0

    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 1000, gain=0.9, noise=0.05, slow=slow)
    state = control.state()["bs1"]
    # counted, the stalls would make speculation look 1.9x slower and native far slower still
    assert state["mode"] == NATIVE and 0.85 < state["gain"] < 0.95
    assert state["dropped_steps"] > 100


def test_speculations_expensive_steps_count_by_their_time():
    """Issue 59's finding at 16 concurrent chat requests on a CPU, as a trace: speculative blocks mix cheap
    steps (roots alone, the head sitting out: 1 token in 1 s) with tree steps of 4 s that accept 5 tokens
    or nothing (1 token). Over time speculation serves 8 tokens in 10 s, 0.8x native. Judged by per-step
    rates, the tree step that accepted nothing (a quarter of the median rate) is a stall, and the mean of
    the rest (1, 1, 1.25) shows speculation at 1.08x native: the control kept it on."""
    control = SameAllocationControl(CONFIG, ["bs13-24"])
    rng = random.Random(5)
    pattern = [(1.0, 1.0), (1.0, 1.0), (5.0, 4.0), (1.0, 4.0)]  # (tokens per request, seconds)
    for i in range(3000):
        mode = control.mode("bs13-24")
        tokens, seconds = pattern[i % 4] if mode == SPECULATIVE else (1.0, 1.0)
        control.observe("bs13-24", 16, round(tokens * 16), seconds * (1 + rng.uniform(-0.05, 0.05)))
    state = control.state()["bs13-24"]
    assert state["mode"] == NATIVE and state["decided"] and 0.75 < state["gain"] < 0.85, state


def test_a_step_whose_batch_size_changed_within_its_block_is_not_counted():
    control = SameAllocationControl(CONFIG, ["bs2-6"])
    # a burst: batch 5 for two steps of every block, where per-request rates would be off by 3x
    drive(control, "bs2-6", 400, gain=1.3, noise=0.05, batch=lambda i: 5 if i % 8 in (4, 5) else 2)
    state = control.state()["bs2-6"]
    assert state["dropped_steps"] >= 2 * 400 // 8 and 1.25 < state["gain"] < 1.35


def test_a_machine_that_gets_faster_changes_nothing_and_a_workload_that_stops_paying_is_noticed():
    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 1000, gain=1.4, slow=lambda i, mode: 1.0 if i < 500 else 0.5)  # both modes 2x faster
    assert control.state()["bs1"]["mode"] == SPECULATIVE and control.state()["bs1"]["flips"] == 0
    modes = drive(control, "bs1", 6000, gain=0.75, seed=1)  # the traffic changes: the head stops paying
    state = control.state()["bs1"]
    assert state["mode"] == NATIVE and state["flips"] == 1
    turned = next(i for i in range(0, 6000, 8) if modes[i : i + 32].count(NATIVE) == 32)
    assert turned < 3000  # noticed through the steady share of native blocks


def test_a_few_hard_requests_in_a_row_do_not_turn_a_paying_cohort_native():
    """Issue 59's chat cell at 1 concurrent request on Zen 4: a cohort that ran 1.24x plain went native for
    a whole round after two hard requests in a row (12 blocks a little under native's rate: a tree that
    accepts nothing costs more than a plain step). Its mode is now read over
    the stretch its native window covers (up to `span_blocks` blocks), so 12 hard blocks among 32 keep it
    on; a loss that lasts through that span still turns it, within the span."""
    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 3000, gain=1.5)
    assert control.state()["bs1"]["other_mode_every"] == 32
    modes = drive(control, "bs1", 3000, gain=lambda i: 0.9 if i < 96 else 1.5, seed=2)
    state = control.state()["bs1"]
    assert state["flips"] == 0 and native_share(modes) < 0.05, state
    assert state["blocks"] == {SPECULATIVE: CONFIG.span_blocks, NATIVE: CONFIG.window_blocks}
    modes = drive(control, "bs1", 1000, gain=0.75, seed=4)  # the head stops paying for good
    state = control.state()["bs1"]
    assert state["mode"] == NATIVE and state["flips"] == 1
    turned = next(i for i in range(0, 1000, 8) if modes[i : i + 32].count(NATIVE) == 32)
    assert turned <= (CONFIG.span_blocks + 4) * CONFIG.block_steps, turned


def test_a_change_held_back_for_fresh_evidence_measures_the_winning_mode_often():
    """Right after a flip a cohort needs `window_blocks` fresh blocks of the other mode before it flips again;
    when those blocks are the ones winning (the gain favours the other mode) it runs one in
    `explore_every`, not the steady share, so a workload that pays again is noticed quickly."""
    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 1500, gain=1.5)
    drive(control, "bs1", 3000, gain=0.75, seed=1)
    assert control.state()["bs1"]["mode"] == NATIVE and control.state()["bs1"]["flips"] == 1
    held = []
    for block in range(200):  # the head pays again
        drive(control, "bs1", 8, gain=1.5, seed=100 + block)
        state = control.state()["bs1"]
        if state["mode"] == NATIVE and state["decided"] and state["gain_low"] > 1.03:
            held.append(state["other_mode_every"])
    assert held and set(held) == {CONFIG.explore_every}, held
    assert control.state()["bs1"]["mode"] == SPECULATIVE and control.state()["bs1"]["flips"] == 2


def test_a_cohort_without_evidence_follows_the_nearest_smaller_decided_one_until_it_measures_otherwise():
    control = SameAllocationControl(CONFIG, ["bs1", "bs2-6", "bs7-12"])
    drive(control, "bs1", 400, gain=0.7)
    assert control.state()["bs1"]["mode"] == NATIVE
    assert control.mode("bs2-6") == NATIVE  # monotone in batch size: no evidence of its own yet
    modes = drive(control, "bs7-12", 16, gain=1.5)
    assert modes.count(NATIVE) >= 8
    drive(control, "bs2-6", 2000, gain=1.5, batch_size=4)  # measured otherwise: a clear gain at batch 4
    assert control.state()["bs2-6"]["mode"] == SPECULATIVE and control.state()["bs2-6"]["decided"]


def test_the_decision_needs_min_blocks_of_each_mode():
    control = SameAllocationControl(CONFIG, ["bs1"])
    drive(control, "bs1", 8 * 11, gain=0.5, noise=0.0)  # 11 blocks: only 2 of them native
    state = control.state()["bs1"]
    assert state["gain"] is None and state["mode"] == SPECULATIVE and state["blocks"][NATIVE] == 2


def test_served_rounds_time_decode_steps_and_forget_across_an_interruption():
    rounds = ServedRounds()
    assert rounds.served(10.0) is None  # nothing to measure from
    assert rounds.served(10.5) == pytest.approx(0.5)
    rounds.interrupted()  # a prefill ran
    assert rounds.served(11.5) is None  # no step start given, no gap known: nothing to stand for it
    assert rounds.served(11.75) == pytest.approx(0.25)
    assert rounds.served(11.75) is None  # no time passed: not a rate


def test_a_step_after_a_prefill_counts_its_own_time_plus_the_usual_gap_between_steps():
    rounds = ServedRounds()
    rounds.served(10.0, started=9.6)
    assert rounds.served(10.5, started=10.1) == pytest.approx(0.5)  # a gap of 0.1 s, then 0.4 s of step
    assert rounds.served(11.0, started=10.6) == pytest.approx(0.5)
    rounds.interrupted()  # a 2 s prefill ran between the steps
    assert rounds.served(13.4, started=13.0) == pytest.approx(0.5)  # 0.4 s of its own + the 0.1 s gap
    rounds.interrupted()
    assert ServedRounds().served(5.0, started=4.0) is None  # no gap measured yet


def test_departures_one_at_a_time_still_count_and_a_burst_of_arrivals_does_not():
    control = SameAllocationControl(CONFIG, ["bs13-24"])
    # 16 concurrent requests: one leaves every other step, the next arrives after it
    drive(control, "bs13-24", 400, gain=0.8, noise=0.05, batch=lambda i: 16 - (i % 4 > 1))
    state = control.state()["bs13-24"]
    assert state["mode"] == NATIVE and state["decided"] and 0.75 < state["gain"] < 0.85
    assert state["dropped_steps"] < 400 // 8  # only first steps after a switch


@pytest.mark.parametrize(
    "section, problem",
    [
        ("  min_blocks: 6\n  window_blocks: 4\n", r"same_allocation.window_blocks 4 holds fewer than min_blocks \(6\)"),
        ("  steady_every: 16\n  steady_every_max: 8\n", r"steady_every_max 8 is under steady_every \(16\).*>= 16"),
        ("  window_blocks: 8\n  span_blocks: 4\n", r"span_blocks 4 is under window_blocks \(8\).*>= 8"),
    ],
)
def test_inconsistent_block_counts_are_a_policy_problem(section, problem):
    from policies import PolicyError, parse_policy_text

    text = (
        "cohorts:\n  - name: all\n    min_batch: 1\n    max_batch: 8\n    budgets: [0, 4, 8]\n    default: 8\n"
        "same_allocation:\n" + section
    )
    with pytest.raises(PolicyError, match=problem):
        parse_policy_text(text)
