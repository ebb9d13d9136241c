"""Adaptive tree sizing: each step verifies only the drafted nodes that pay for themselves.

A tree is built best-first, so its nodes come in non-increasing draft path probability and every
prefix of them is itself a tree. If the draft's probabilities were calibrated, node i would be
accepted with probability p_i = exp(cum_logprob_i), and a step over B lanes would commit B + sum(p_i)
tokens on average. Verifying T nodes costs V(T) one-token steps of the target (measured: a CPU pays
almost linearly, a GPU almost nothing until it is compute bound) and the draft cost D of them. Sizing
keeps the m best nodes over the whole batch, m chosen to maximise

    (B + c * sum of the m best p_i) / (V(B + m) + D),

where c rescales the draft's probabilities by what the target actually accepted (AcceptCalibration).
m = 0 verifies the roots alone: an ordinary decoding step, what a step whose drafts are all unsure
should cost. Lossless: the set of nodes verified never changes what the target accepts among them.

Sizing cannot give back the draft's own cost, though: a head that keeps losing (chat on a CPU) would
still be run every step. `DraftGate` skips the head on the steps after one whose best sizing did not
beat an ordinary step without any draft, backing off exponentially while that repeats; prompt lookup,
which costs next to nothing, still proposes on skipped steps.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from .tree import DraftTree

SIZINGS = ("fixed", "adaptive")


@dataclass(frozen=True)
class VerifyCost:
    """Seconds of one target forward over n new tokens, relative to n = 1 (`unit_s` seconds), at
    measured node counts; linear between them and beyond the last."""

    nodes: tuple[int, ...]
    relative: tuple[float, ...]
    unit_s: float

    def __post_init__(self) -> None:
        if len(self.nodes) < 2 or len(self.nodes) != len(self.relative) or list(self.nodes) != sorted(set(self.nodes)):
            raise ValueError(f"nodes={self.nodes}, relative={self.relative}: need >= 2 increasing node counts, one cost each")
        if self.unit_s <= 0:
            raise ValueError(f"unit_s={self.unit_s}: must be > 0")

    def __call__(self, n: int) -> float:
        i = min(max(bisect.bisect_left(self.nodes, n), 1), len(self.nodes) - 1)
        n0, n1, c0, c1 = self.nodes[i - 1], self.nodes[i], self.relative[i - 1], self.relative[i]
        return max(c0 + (c1 - c0) * (n - n0) / (n1 - n0), 1e-9)


class AcceptCalibration:
    """c = accepted draft tokens / predicted (the sum of p_i over verified nodes), as exponential
    moving sums over recent steps. It starts at 1 with a prior worth `prior` tokens of each, and is
    kept within [floor, 1]: sizing never trusts a draft more than its own probabilities, and a
    floor keeps very confident drafts (a long prompt-lookup match) verifiable, so c keeps learning."""

    def __init__(self, decay: float = 0.95, prior: float = 4.0, floor: float = 0.1) -> None:
        self.decay, self.floor = decay, floor
        self.predicted = self.accepted = prior

    @property
    def factor(self) -> float:
        return min(1.0, max(self.floor, self.accepted / self.predicted))

    def observe(self, predicted: float, accepted: float) -> None:
        if predicted <= 0:
            return  # nothing was verified beyond the roots: no evidence about the draft
        self.predicted = self.decay * self.predicted + predicted
        self.accepted = self.decay * self.accepted + accepted


def node_probabilities(tree: DraftTree) -> torch.Tensor:
    """[N - 1] the draft's probability that each non-root node is accepted (its path probability)."""
    return tree.cum_logprobs[1:].double().exp().clamp(max=1.0)


def truncate(tree: DraftTree, size: int) -> DraftTree:
    """The tree's first `size` nodes (a tree: parents precede their children)."""
    if size >= tree.size:
        return tree
    return DraftTree(tree.tokens[:size], tree.parents[:size], tree.depths[:size], tree.ranks[:size], tree.cum_logprobs[:size])


@dataclass(frozen=True)
class SizedTrees:
    trees: list[DraftTree]
    predicted: float  # c-free expected accepted draft tokens of the kept nodes (sum of their p_i)
    pays: bool  # the kept trees' expected rate, draft cost included, beats roots alone with no draft at all


def size_trees(trees: list[DraftTree], cost: VerifyCost, draft_steps: float, calibration: float = 1.0) -> SizedTrees:
    """Each tree cut to the prefix that maximises expected committed tokens per unit of step cost.
    `draft_steps`: this step's draft time in one-token forwards (cost.unit_s)."""
    lanes = len(trees)
    gains = [(-float(p), lane, i + 1) for lane, tree in enumerate(trees) for i, p in enumerate(node_probabilities(tree).tolist())]
    gains.sort()  # best first; ties keep each lane's node order, so every lane's pick is a prefix
    best_m, best_rate, total = 0, lanes / (cost(lanes) + draft_steps), 0.0
    for m, (neg_p, _, _) in enumerate(gains, start=1):
        total -= neg_p
        rate = (lanes + calibration * total) / (cost(lanes + m) + draft_steps)
        if rate > best_rate:
            best_m, best_rate = m, rate
    keep = [1] * lanes
    predicted = 0.0
    for neg_p, lane, node in gains[:best_m]:
        keep[lane] = max(keep[lane], node + 1)
        predicted -= neg_p
    pays = best_rate > lanes / cost(lanes)
    return SizedTrees([truncate(tree, k) for tree, k in zip(trees, keep)], predicted, pays)


class DraftGate:
    """Whether the next step runs the draft head: after a drafted step that did not pay, the head
    sits out 1, 2, 4, ... up to `max_skip` steps (doubling while drafts keep failing, back to every
    step once one pays), so a losing head costs about 1/max_skip of its draft time, and still gets
    probed often enough to notice when the text turns predictable."""

    def __init__(self, max_skip: int = 8) -> None:
        if max_skip < 0:
            raise ValueError(f"max_skip={max_skip}: must be >= 0 (0 = draft every step)")
        self.max_skip = max_skip
        self.backoff = 0  # steps skipped after the latest failure
        self.skip_left = 0

    def should_draft(self) -> bool:
        if self.skip_left:
            self.skip_left -= 1
            return False
        return True

    def observe(self, pays: bool) -> None:
        self.backoff = 0 if pays else min(max(1, 2 * self.backoff), self.max_skip)
        self.skip_left = self.backoff


class TreeSizer:
    """Adaptive sizing for one engine: its target's verify cost, the gate that skips the head while it
    does not pay, and one calibration per kind of step: drafted trees (head, with any lookup guess
    merged in) and headless ones (prompt lookup alone). The two are kept apart because a head's
    probabilities and lookup's calibrated guess scores are wrong by different factors: one shared c
    would cut long lookup chains by the head's overconfidence."""

    def __init__(self, cost: VerifyCost, calibration: AcceptCalibration | None = None, gate: DraftGate | None = None,
                 headless_calibration: AcceptCalibration | None = None) -> None:
        self.cost = cost
        self.calibration = calibration or AcceptCalibration()
        self.headless_calibration = headless_calibration or AcceptCalibration()
        self.gate = gate or DraftGate()
        self._predicted = 0.0
        self._last = self.calibration

    def size(self, trees: list[DraftTree], draft_s: float, drafted: bool = True) -> list[DraftTree]:
        """The trees cut to what pays; `drafted`: the head ran for them (only such steps teach the gate)."""
        self._last = self.calibration if drafted else self.headless_calibration
        sized = size_trees(trees, self.cost, draft_s / self.cost.unit_s, self._last.factor)
        self._predicted = sized.predicted
        if drafted:
            self.gate.observe(sized.pays)
        return sized.trees

    def observe(self, accept_lengths: list[int]) -> None:
        """After acceptance of the last sized step: accept lengths include each lane's bonus token."""
        self._last.observe(self._predicted, float(sum(accept_lengths) - len(accept_lengths)))


def relative_costs(seconds: dict[int, float]) -> VerifyCost:
    """A VerifyCost from measured seconds per node count (the count 1 must be among them)."""
    if 1 not in seconds:
        raise ValueError(f"measured node counts {sorted(seconds)}: the count 1 (one ordinary step) is the unit and must be measured")
    unit = seconds[1]
    nodes = tuple(sorted(seconds))
    return VerifyCost(nodes, tuple(seconds[n] / unit for n in nodes), unit)
