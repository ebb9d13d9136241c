"""Same-allocation control: per cohort, whether speculation beats native decoding on this server, now.

The question an operator's "off where it does not pay" turns on cannot be answered from a model of the
costs or from a few isolated timings (one run on a 2-core CPU moves by +-10%): it is measured here, on
the server's own steps, under the load it is serving. A cohort whose table speculates runs its steps in
blocks of `block_steps` steps of one mode, *speculative* (the table's plan) or *native* (budget 0, an
ordinary decode step; the draft context is kept so that speculation can resume). One block in
`explore_every` (no decision yet) runs the mode the cohort is not in, so both modes are measured
interleaved, in the same allocation, under the same traffic. Once decided, one block in `steady_every`
to `steady_every_max` does, as few as keep what the other mode loses under `steady_cost` of throughput
(a block of it loses 1 - 1/gain where speculation wins, 1 - gain where it loses): the decision is
revisited for as long as the server runs (a machine that gets faster, a workload that changes), and a
big gain is not taxed by the blocks that keep checking it.

What a step counts: the tokens it served per request over the wall time since the previous served
decode step ended (`ServedRounds`), i.e. what a client sees, scheduler and host work included. A step
right after a prefill (or another interruption) counts its own time plus the usual gap between decode
steps, not the prefill's: at 16 concurrent requests of a few dozen tokens a prefill comes every few steps,
and dropping those steps would starve the decision. Dropped: the first step of a block after a switch (it
pays the switch), a step whose batch size is more than BURST_SHARE off its block's first (a burst of
arrivals; departures one at a time stay), and a step that took more than `stall_factor` x its block's median
seconds (a stall: a pause of the process, not a step's own work). A block yields one rate: the tokens per
request its kept steps served over their seconds, what a client sees over the block.

Why seconds and sums, not per-step rates: a speculative block mixes cheap steps (the roots alone, the head
sitting out) with tree steps that cost several of them (at 16 concurrent requests on a CPU, 3-5x). Judged
by its rate, a tree step that accepted little looks like a stall and is dropped, and a mean of per-step
rates weighs the cheap steps by count rather than by time: both lean toward speculation, and together
they measured it at 1.20x its native steps where it ran 0.69x (issue 59;
tests/policies/test_same_allocation.py::test_speculations_expensive_steps_count_by_their_time).

The decision reads both modes over the same stretch of traffic: the newest `window_blocks` block rates
of the mode a cohort is not in, and those of the mode it is in since the oldest of them (at least
`window_blocks`, at most `span_blocks`). Read over its own newest `window_blocks` alone, the mode a
cohort runs 31 blocks in 32 covered a few requests: at 1 concurrent chat request a stretch of hard ones
(blocks a little under native's rate) turned a cohort that ran 1.24x plain native for a round (issue 59,
bench/results/sglang_cpu/control-plane-chat1-fixed-bf16-zen4.md). Once each mode has `min_blocks`: the
gain (speculative / native) with a confidence interval of `confidence_z` standard errors (delta method on
the log ratio; Student-t with few blocks). A speculating cohort turns native when even the interval's top
is below 1 + margin (it cannot show a gain worth having); a native cohort turns speculative when the
interval's bottom clears 1 + margin (1 + 2 x margin once it turned native on its own evidence). In
between it holds its mode and keeps exploring. Once a cohort has decided, it changes its mode again only
on evidence gathered since its last change (`window_blocks` blocks of the other mode): no flapping near
break-even. A cohort with no evidence of its own follows the
nearest smaller cohort that has decided (monotone in batch size unless measured otherwise).

Pure logic with no engine imports: both engines drive it through policies/controlled_plans.py (the SGLang
worker by way of adapter.policy.PolicyControl, the reference engine's worker directly).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from policies.confidence import t_critical
from policies.schema import SameAllocationPolicy

SPECULATIVE = "speculative"
NATIVE = "native"
BURST_SHARE = 0.25  # a step whose batch is this share larger or smaller than its block's first is a burst
GAP_WEIGHT = 0.1  # the running mean of the gap between decode steps: this weight on each new one


def _other(mode: str) -> str:
    return NATIVE if mode == SPECULATIVE else SPECULATIVE


class ServedRounds:
    """Wall seconds a served decode step stands for: since the previous one ended; after an interruption
    (a prefill), its own time plus the running mean of the gap between uninterrupted steps (the scheduler's
    work between them); None while no such gap is known."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._gap: float | None = None

    def interrupted(self) -> None:
        """A prefill (or anything but a decode step) ran: the next decode step's interval is not its own."""
        self._last = None

    def served(self, now: float, started: float | None = None) -> float | None:
        """The step that began at `started` ended at `now` (one clock)."""
        if self._last is not None:
            seconds = now - self._last
            if started is not None and started >= self._last:
                gap = started - self._last
                self._gap = gap if self._gap is None else (1 - GAP_WEIGHT) * self._gap + GAP_WEIGHT * gap
        elif started is not None and self._gap is not None:
            seconds = now - started + self._gap
        else:
            seconds = None
        self._last = now
        return seconds if seconds is None or seconds > 0 else None


@dataclass
class _Block:
    mode: str
    switched: bool  # its mode differs from the previous block's: its first step pays the switch
    steps: int = 0
    batch_size: int | None = None
    served: list[tuple[float, float]] = field(default_factory=list)  # per kept step: (tokens per request, seconds)


@dataclass(frozen=True)
class Verdict:
    gain: float
    low: float
    high: float


@dataclass
class _Cohort:
    mode: str | None  # the mode most blocks run; None until the first block (then inherited or speculative)
    rates: dict[str, deque]  # per mode: (the cohort's block count when it closed, its rate), newest last
    decided: bool = False
    has_own_verdict: bool = False
    own_run: int = 0  # blocks of its own mode since the last of the other (whose share may change)
    flips: int = 0
    block: _Block | None = None
    verdict: Verdict | None = None
    dropped: int = 0
    fresh: int = 0  # blocks of the mode it is not in, measured since its mode last changed
    closed: int = 0  # blocks it has measured


class SameAllocationControl:
    """`cohorts`: the policy's cohort names, smallest batch first (the order monotonicity follows)."""

    def __init__(self, config: SameAllocationPolicy, cohorts: list[str]) -> None:
        self.config = config
        self.order = list(cohorts)
        self.closed_blocks = 0  # blocks measured so far: the state changes only when this moves
        span = config.span_blocks
        self._cohorts = {
            name: _Cohort(None, {SPECULATIVE: deque(maxlen=span), NATIVE: deque(maxlen=span)}) for name in cohorts
        }

    def mode(self, cohort: str) -> str:
        """The mode the next step of `cohort` runs (a speculating table's step; call `observe` after it)."""
        state = self._cohorts[cohort]
        if state.block is None or state.block.steps >= self.config.block_steps:
            self._close_block(cohort)
            self._open_block(cohort)
        state.block.steps += 1
        return state.block.mode

    def observe(self, cohort: str, batch_size: int, tokens: int, seconds: float | None) -> None:
        """The step `mode` planned served `tokens` tokens to `batch_size` requests, `seconds` after the previous
        served decode step (None: interrupted)."""
        block = self._cohorts[cohort].block
        if block is None:
            return
        first = block.steps == 1
        if block.batch_size is None:
            block.batch_size = batch_size
        burst = abs(batch_size - block.batch_size) > BURST_SHARE * block.batch_size
        if (first and block.switched) or seconds is None or burst or batch_size < 1:
            self._cohorts[cohort].dropped += 1
            return
        block.served.append((tokens / batch_size, seconds))

    def state(self) -> dict:
        """What each cohort runs and why (for /server_info and the metrics)."""
        return {name: self._cohort_state(self._cohorts[name]) for name in self.order}

    def _cohort_state(self, state: _Cohort) -> dict:
        verdict = state.verdict
        return {
            "mode": state.mode,  # None: no step of the cohort has speculated under its table yet
            "decided": state.decided,
            "gain": verdict and round(verdict.gain, 4),
            "gain_low": verdict and round(verdict.low, 4),
            "gain_high": verdict and round(verdict.high, 4),
            "blocks": {mode: len(rates) for mode, rates in self._read_rates(state).items()},  # what the gain read
            "flips": state.flips,
            "dropped_steps": state.dropped,
            # one block in this many runs the mode it is not in
            "other_mode_every": self._other_mode_every(state),
        }

    # ---- blocks ----

    def _open_block(self, cohort: str) -> None:
        state = self._cohorts[cohort]
        if not state.has_own_verdict:
            state.mode = self._inherited_mode(cohort)
        other = state.own_run >= self._other_mode_every(state) - 1
        mode = _other(state.mode) if other else state.mode
        state.own_run = 0 if other else state.own_run + 1
        previous = state.block.mode if state.block is not None else mode
        state.block = _Block(mode, switched=mode != previous)

    def _other_mode_every(self, state: _Cohort) -> int:
        """Blocks per block of the mode the cohort is not in: `explore_every` until it decides."""
        return self._steady_every(state) if state.decided else self.config.explore_every

    def _steady_every(self, state: _Cohort) -> int:
        """A decided cohort's blocks per block of the other mode: enough that measuring the other mode costs
        at most `steady_cost` of throughput (one block in `every` loses 1 - min(gain, 1/gain) of its
        time), within [steady_every, steady_every_max] (the most bounds how long a change goes unseen);
        `explore_every` while the gain favours the other mode (nothing is lost measuring a winner)."""
        gain = state.verdict.gain
        if (gain > 1.0) != (state.mode == SPECULATIVE):
            # the other mode is the one winning, its change held back for fresh evidence: gather it fast
            return self.config.explore_every
        loss = 1.0 - min(gain, 1.0 / gain)
        every = math.ceil(loss / self.config.steady_cost)
        return min(max(every, self.config.steady_every), self.config.steady_every_max)

    def _close_block(self, cohort: str) -> None:
        state = self._cohorts[cohort]
        block = state.block
        if block is None:
            return
        kept = block.served
        if kept:
            longest = self.config.stall_factor * statistics.median(seconds for _, seconds in kept)
            kept = [step for step in kept if step[1] <= longest]
            state.dropped += len(block.served) - len(kept)
        if len(kept) >= max(1, self.config.block_steps // 2):
            state.closed += 1
            rate = sum(tokens for tokens, _ in kept) / sum(seconds for _, seconds in kept)
            state.rates[block.mode].append((state.closed, rate))
            state.fresh += block.mode != state.mode
            self.closed_blocks += 1
            self._decide(state)

    def _inherited_mode(self, cohort: str) -> str:
        """No verdict of its own: the mode of the nearest smaller cohort that has one, else speculative."""
        for name in reversed(self.order[: self.order.index(cohort)]):
            smaller = self._cohorts[name]
            if smaller.has_own_verdict:
                return smaller.mode
        return SPECULATIVE

    # ---- the decision ----

    def _read_rates(self, state: _Cohort) -> dict[str, list[float]]:
        """The block rates a decision reads: the newest `window_blocks` of the mode the cohort is not in, and
        of the mode it is in those since the oldest of them, at least `window_blocks` (at most `span_blocks`,
        what its deque holds)."""
        window = self.config.window_blocks
        own = state.mode or SPECULATIVE
        other = list(state.rates[_other(own)])[-window:]
        held = list(state.rates[own])
        since = sum(closed >= other[0][0] for closed, _ in held) if other else 0
        read = {_other(own): other, own: held[-max(window, since) :]}
        return {mode: [rate for _, rate in rates] for mode, rates in read.items()}

    def _decide(self, state: _Cohort) -> None:
        rates = self._read_rates(state)
        verdict = gain_verdict(rates[SPECULATIVE], rates[NATIVE], self.config)
        if verdict is None:
            return
        state.verdict = verdict
        bar = 1.0 + self.config.margin
        # turned native on its own evidence, it comes back only on a clear gain (twice the margin): the
        # promise is never to lose, and a break-even cohort should not flap
        back = 1.0 + 2 * self.config.margin if state.has_own_verdict else bar
        mode = state.mode  # set when its first block opened
        if mode == SPECULATIVE and verdict.high < bar:
            new = NATIVE
        elif mode == NATIVE and verdict.low > back:
            new = SPECULATIVE
        else:
            new = mode
        state.decided = verdict.high < bar or verdict.low > bar
        if new != mode and state.has_own_verdict:
            # a flip back needs evidence gathered since the last change: the other mode's window refreshed
            if state.fresh < self.config.window_blocks:
                return
            state.flips += 1
        if state.decided or new != mode:
            state.has_own_verdict = True
        if new != mode:
            state.fresh = 0
        state.mode = new


def gain_verdict(speculative, native, config: SameAllocationPolicy) -> Verdict | None:
    """Speculative over native block rates with its confidence interval; None before `min_blocks` of each."""
    if min(len(speculative), len(native)) < config.min_blocks:
        return None
    s_mean, n_mean = statistics.fmean(speculative), statistics.fmean(native)
    rel_var = statistics.variance(speculative) / len(speculative) / s_mean**2
    rel_var += statistics.variance(native) / len(native) / n_mean**2
    spread = t_critical(config.confidence_z, min(len(speculative), len(native)) - 1) * math.sqrt(rel_var)
    gain = s_mean / n_mean
    return Verdict(gain, gain * math.exp(-spread), gain * math.exp(spread))
