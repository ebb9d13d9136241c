"""Adaptive tree sizing: each step verifies only the drafted nodes that pay for themselves.

A tree is built best-first, so its nodes come in non-increasing draft path probability and every
prefix of them is itself a tree. If the draft's probabilities were calibrated, node i would be
accepted with probability p_i = exp(cum_logprob_i), and a step over B lanes would commit B + sum(p_i)
tokens on average. Verifying T nodes costs V(T) one-token steps of the target (measured: a CPU pays
almost linearly, a GPU almost nothing until it is compute bound) and the draft cost D of them. Sizing
keeps each tree's first n nodes, n common to the batch (a batched verify pads every lane to the
longest tree, so a lane cut shorter than the others saves nothing) and chosen to maximise

    (B + sum of the kept nodes' q_i) / (V(B n) + D),

where q_i = q_parent x c(r_i, d_i) r_i, r_i the draft's probability of node i given its parent, rescales
the draft by what the target actually accepted of verified nodes whose parent it accepted, in the same
band of r and, where it has evidence, the same class of depth d_i (BandedCalibration: a head is
overconfident by a different factor at r = 0.9 than at r = 0.1, and at depth 1 than deeper; a
prompt-lookup guess is scored by its own tuned rate). n = 1 verifies the roots alone:
an ordinary decoding step, what a step whose drafts are all unsure should cost. Lossless: the set of
nodes verified never changes what the target accepts among them.

Sizing cannot give back the draft's own cost, though: a head that keeps losing (chat on a CPU) would
still be run every step. `DraftGate` skips the head on the steps after one whose best sizing did not
beat an ordinary step without any draft, backing off exponentially while that repeats; prompt lookup,
which costs next to nothing, still proposes on skipped steps. Nor can it give back the depths the
head drafted beyond what it keeps: `DraftDepth` bounds the next drafts by the deepest node recent
steps kept.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch

from .tree import DraftTree

SIZINGS = ("fixed", "adaptive")


@dataclass(frozen=True)
class VerifyCost:
    """Seconds of one target forward over n new tokens relative to `unit_s` seconds (one token, or the
    batch's ordinary step for a cost learned while serving), at measured counts; linear between them
    and beyond the last."""

    nodes: tuple[int, ...]
    relative: tuple[float, ...]
    unit_s: float

    def __post_init__(self) -> None:
        if len(self.nodes) < 2 or len(self.nodes) != len(self.relative) or list(self.nodes) != sorted(set(self.nodes)):
            raise ValueError(
                f"nodes={self.nodes}, relative={self.relative}: need >= 2 increasing node counts, one cost each"
            )
        if self.unit_s <= 0:
            raise ValueError(f"unit_s={self.unit_s}: must be > 0")

    def __call__(self, n: int) -> float:
        i = min(max(bisect.bisect_left(self.nodes, n), 1), len(self.nodes) - 1)
        n0, n1, c0, c1 = self.nodes[i - 1], self.nodes[i], self.relative[i - 1], self.relative[i]
        return max(c0 + (c1 - c0) * (n - n0) / (n1 - n0), 1e-9)


Calibrate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (conditional p, depths) -> calibrated p


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
        if self.predicted <= 0:  # no prior and no evidence yet
            return 1.0
        return min(1.0, max(self.floor, self.accepted / self.predicted))

    def factor_toward(self, mean: float, weight: float) -> float:
        """The factor with `weight` tokens of a prior whose factor is `mean` added to its own sums: a
        subset of the evidence (one depth) read as the whole's (`mean`) until it has evidence of its own."""
        return min(1.0, max(self.floor, (self.accepted + weight * mean) / (self.predicted + weight)))

    def observe(self, predicted: float, accepted: float) -> None:
        if predicted <= 0:
            return  # nothing was verified beyond the roots: no evidence about the draft
        self.predicted = self.decay * self.predicted + predicted
        self.accepted = self.decay * self.accepted + accepted


class BandedCalibration:
    """One AcceptCalibration per band of a draft probability (band edges `edges`, descending), pooled over
    depths, and under each band one per depth class (1, 2, ..., `depths`, the last holding every deeper
    node): p -> p x the factor of its node's band and depth class, that class's own evidence shrunk toward
    the band's pooled factor by `prior` tokens. A head's first-level guesses and its deeper ones are
    miscalibrated differently: on chat at 4 lanes (reference engine, hybrid drafter, bf16) the target
    accepted depth-1 nodes at about 0.6 of their r and depth-3+ ones at about 1.0, so one factor per band
    over-predicted the first and under-predicted the rest (issue 59). A class never tried (a wrong head's
    depth 2: no parent accepted) reads its band's pooled factor, as if there were no classes."""

    def __init__(
        self,
        edges: tuple[float, ...] = (0.8, 0.5, 0.2),
        decay: float = 0.95,
        prior: float = 2.0,
        floor: float = 0.1,
        depths: int = 3,
    ) -> None:
        if list(edges) != sorted(edges, reverse=True) or not all(0 < e < 1 for e in edges):
            raise ValueError(f"edges={edges}: need descending probabilities in (0, 1)")
        if depths < 1:
            raise ValueError(f"depths={depths}: need at least one depth class")
        self.edges = torch.tensor(edges, dtype=torch.float64)
        self.prior, self.depths = prior, depths
        self.bands = [AcceptCalibration(decay, prior, floor) for _ in range(len(edges) + 1)]
        # each class's own moving sums, no prior: factor_toward supplies the pooled one
        self.by_depth = [[AcceptCalibration(decay, 0.0, floor) for _ in self.bands] for _ in range(depths)]

    @property
    def factors(self) -> list[float]:
        """Each band's factor pooled over depths, the most probable band first."""
        return [band.factor for band in self.bands]

    @property
    def depth_factors(self) -> list[list[float]]:
        """Each depth class's band factors (the shallowest class first), as `scale` applies them."""
        pooled = self.factors
        return [[cell.factor_toward(f, self.prior) for cell, f in zip(row, pooled)] for row in self.by_depth]

    def _cells(self, probabilities: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """Each node's (depth class, band) as one index into the flattened classes."""
        bands = (probabilities.double().unsqueeze(-1) < self.edges).sum(-1)
        return (depths.clamp(1, self.depths) - 1) * len(self.bands) + bands

    def scaler(self) -> Calibrate:
        """`scale` with the factors read once: a step sizes every lane's tree with the same ones."""
        table = torch.tensor([f for row in self.depth_factors for f in row], dtype=torch.float64)
        return lambda probabilities, depths: (
            probabilities * table.to(probabilities.dtype)[self._cells(probabilities, depths)]
        )

    def scale(self, probabilities: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """Non-root nodes' conditional draft probabilities and their depths (>= 1) -> calibrated ones."""
        return self.scaler()(probabilities, depths)

    def observe(self, probabilities: torch.Tensor, depths: torch.Tensor, accepted: torch.Tensor) -> None:
        """Verified non-root nodes' draft probabilities, their depths, and whether each was accepted."""
        width = len(self.bands)
        cells = self._cells(probabilities, depths)
        pooled: dict[int, list[float]] = {}
        for cell in cells.unique().tolist():
            mask = cells == cell
            predicted, hits = float(probabilities[mask].sum()), float(accepted[mask].sum())
            self.by_depth[cell // width][cell % width].observe(predicted, hits)
            band = pooled.setdefault(cell % width, [0.0, 0.0])
            band[0] += predicted
            band[1] += hits
        for band, (predicted, hits) in pooled.items():  # once per band and call: one decay per call, as the classes
            self.bands[band].observe(predicted, hits)


def truncate(tree: DraftTree, size: int) -> DraftTree:
    """The tree's first `size` nodes (a tree: parents precede their children)."""
    if size >= tree.size:
        return tree
    return DraftTree(
        tree.tokens[:size],
        tree.parents[:size],
        tree.depths[:size],
        tree.ranks[:size],
        tree.cum_logprobs[:size],
        tree.drawn,
    )


def conditional_probabilities(tree: DraftTree) -> torch.Tensor:
    """[N - 1] each non-root node's draft probability given its parent's token (cum_logprob differences)."""
    cums = tree.cum_logprobs.double()
    return (cums[1:] - cums[tree.parents[1:]]).exp().clamp(max=1.0)


def calibrated_probabilities(tree: DraftTree, calibrate: Calibrate) -> list[float]:
    """[N - 1] each non-root node's calibrated acceptance probability q: its parent's q times its own
    calibrated conditional probability (a node is accepted only if its parent is)."""
    conditional = calibrate(conditional_probabilities(tree), tree.depths[1:]).tolist()
    parents = tree.parents.tolist()
    q = []
    for i, c in enumerate(conditional):
        parent = parents[i + 1]
        q.append(c * (q[parent - 1] if parent > 0 else 1.0))
    return q


@dataclass(frozen=True)
class SizedTrees:
    trees: list[DraftTree]
    expected: float  # expected accepted draft tokens of the kept nodes (sum of their q_i)
    pays: bool  # the kept trees' expected rate, draft cost included, beats roots alone with no draft at all


def size_trees(
    trees: list[DraftTree],
    cost: VerifyCost,
    draft_steps: float,
    calibrate: Calibrate = lambda p, depths: p,
    tree_steps: float = 0.0,
    width: Callable[[int], int] = lambda n: n,
    every_step: float = 0.0,
) -> SizedTrees:
    """Every tree cut to its first n nodes (a smaller tree keeps all of its own), n common to the batch
    because a batched verify pads every lane to the longest tree (the reference engine's forward and
    SGLang's verify alike): n maximises expected committed tokens per unit of step cost,
    (B + sum of the kept nodes' q) / (V(B W(n)) + D + C + T [n > 1]). `draft_steps`: D, what the step has
    spent before sizing (head and tree building) in one-token forwards (cost.unit_s); `every_step`: C, what
    every step costs besides its draft and its verify forward, the roots alone included (the scheduler's
    turn between steps, binding, acceptance, commit), same unit: left out, it makes every node look dearer
    than it is next to the whole step and sizing cuts trees short; `tree_steps`: T, what verifying a tree
    adds to C (binding, accepting and committing more rows), same unit; `width`: W, the nodes per lane a
    verify of n nodes runs (padded to a rung of the verify widths, core.verify_widths); `calibrate`: p -> q."""
    lanes = len(trees)
    q = [calibrated_probabilities(tree, calibrate) for tree in trees]
    roots = cost(lanes) + every_step  # an ordinary step's cost, without a draft
    best_n, best_rate, best_expected, expected = 1, lanes / (roots + draft_steps), 0.0, 0.0
    for n in range(2, max(tree.size for tree in trees) + 1):
        expected += sum(lane_q[n - 2] for lane_q in q if len(lane_q) >= n - 1)
        rate = (lanes + expected) / (cost(lanes * width(n)) + every_step + draft_steps + tree_steps)
        if rate > best_rate:
            best_n, best_rate, best_expected = n, rate, expected
    pays = best_rate > lanes / roots
    return SizedTrees([truncate(tree, best_n) for tree in trees], best_expected, pays)


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


class TreeStepOverhead:
    """Seconds a step spends outside its draft and its verify forward (binding the verify's inputs,
    acceptance, commit, bookkeeping), learned separately for steps that verified a tree and steps that
    verified the roots alone, and the gap between one step's end and the next one's start (the engine's
    scheduler: SGLang's result processing, streaming, batch planning), all exponential moving averages
    (`decay` the weight of the older average, as LearnedVerifyCost's). The roots-alone steps' seconds plus
    the gap are what every step pays (`every_step_s`); the difference of the two kinds of step is what a
    tree costs beyond its verify rows (`extra_s`, 0 until both kinds of step are timed)."""

    def __init__(self, decay: float = 0.8) -> None:
        self.decay = decay
        self.mean_s: dict[bool, float] = {}
        self.gap_s: float | None = None

    def _mean(self, old: float | None, seconds: float) -> float:
        return seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def observe(self, seconds: float, verified_tree: bool) -> None:
        self.mean_s[verified_tree] = self._mean(self.mean_s.get(verified_tree), seconds)

    def observe_gap(self, seconds: float) -> None:
        """Seconds from the previous step's commit to this step's start."""
        self.gap_s = self._mean(self.gap_s, seconds)

    @property
    def every_step_s(self) -> float:
        """The roots-alone steps' outside seconds (a tree step's, until a roots-alone step is timed: a
        sizer that never cuts to the roots still charges what each of its steps pays) plus the gap."""
        outside = self.mean_s.get(False, self.mean_s.get(True, 0.0))
        return outside + (self.gap_s or 0.0)

    @property
    def extra_s(self) -> float:
        if len(self.mean_s) < 2:
            return 0.0
        return max(0.0, self.mean_s[True] - self.mean_s[False])


class DraftDepth:
    """How deep the head drafts for a batch of `lanes` lanes once sizing has shown what it keeps. The head's
    pass costs by the depths it drafts (a causal head computes depth + 1 rows and their logits over the
    vocabulary), and sizing cuts whatever it does not keep: at 4 concurrent requests on a CPU it kept
    about 8 nodes a lane of the 15 depths drafted for a 16-node budget, and fixed 4-node trees (3 depths)
    ran 10% faster (issue 59). After `window` drafted steps of a lane count it drafts the deepest node
    they kept plus `headroom` (room for the trees to grow back: a tree kept down to the bound lifts the
    next draft at once), rounded up to a rung of `rungs` (few depths, so a captured draft graph serves
    each), never deeper than the budget's own bound. Lossless: only which nodes are proposed changes."""

    def __init__(self, window: int = 16, headroom: int = 2, rungs: tuple[int, ...] = (3, 5, 7, 11)) -> None:
        if window < 1 or headroom < 1 or list(rungs) != sorted(set(rungs)) or not rungs or rungs[0] < 1:
            raise ValueError(
                f"window={window}, headroom={headroom}, rungs={rungs}: need window >= 1, headroom >= 1 and "
                "increasing rungs >= 1"
            )
        self.window, self.headroom, self.rungs = window, headroom, rungs
        self.kept: dict[int, deque[int]] = {}  # per lane count: the deepest kept node of each recent drafted step

    def observe(self, trees: list[DraftTree]) -> None:
        """The trees sizing kept on a step the head drafted."""
        deepest = int(torch.cat([tree.depths for tree in trees]).max())  # one reduction, flat in batch size
        self.kept.setdefault(len(trees), deque(maxlen=self.window)).append(deepest)

    def depth(self, lanes: int, bound: int) -> int:
        """The depth to draft for `lanes` lanes whose budget allows `bound`."""
        kept = self.kept.get(lanes)
        if kept is None or len(kept) < self.window:
            return bound
        need = max(kept) + self.headroom
        return min(bound, next((rung for rung in self.rungs if rung >= need), bound))


class TreeSizer:
    """Adaptive sizing for one engine: its target's verify cost, the gate that skips the head while it
    does not pay, the depth the head drafts to (DraftDepth), and one calibration per kind of step:
    drafted trees (head, with any lookup guess merged in) and headless ones (prompt lookup alone)."""

    def __init__(
        self,
        cost: VerifyCost | None = None,
        calibration: BandedCalibration | None = None,
        gate: DraftGate | None = None,
        headless_calibration: BandedCalibration | None = None,
        width: Callable[[int], int] = lambda n: n,
    ) -> None:
        self.cost = cost
        self.width = width  # nodes per lane a verify of n nodes runs (the verify widths' padding)
        self.calibration = calibration or BandedCalibration()
        self.headless_calibration = headless_calibration or BandedCalibration()
        self.gate = gate or DraftGate()
        self.draft_depth = DraftDepth()
        # what a step pays besides its draft and verify, per lane count: binding, accepting and committing
        # 16 lanes costs several times one lane's, and a server moves between loads (as LearnedVerifyCost)
        self.overheads: dict[int, TreeStepOverhead] = {}
        self._kept: list[DraftTree] = []
        self._last = self.calibration

    def size(
        self, trees: list[DraftTree], spent_s: float, drafted: bool = True, cost: VerifyCost | None = None
    ) -> list[DraftTree]:
        """The trees cut to what pays; `spent_s`: the step's seconds so far (head and tree building);
        `drafted`: the head ran for them (only such steps teach the gate); `cost`: this step's verify
        cost when it is learned while serving (else the sizer's own)."""
        cost = cost or self.cost
        if cost is None:
            raise ValueError("no verify cost: build the TreeSizer with one or pass this step's")
        self._last = self.calibration if drafted else self.headless_calibration
        overhead = self.overhead_for(len(trees))
        sized = size_trees(
            trees,
            cost,
            spent_s / cost.unit_s,
            self._last.scaler(),
            tree_steps=overhead.extra_s / cost.unit_s,
            width=self.width,
            every_step=overhead.every_step_s / cost.unit_s,
        )
        self._kept = sized.trees
        if drafted:
            self.gate.observe(sized.pays)
            self.draft_depth.observe(sized.trees)
        return sized.trees

    def overhead_at(self, lanes: int) -> TreeStepOverhead:
        """The overhead `lanes` lanes' steps teach."""
        return self.overheads.setdefault(lanes, TreeStepOverhead())

    def overhead_for(self, lanes: int) -> TreeStepOverhead:
        """The overhead sizing charges `lanes` lanes: their own once any of their steps was timed, else
        the nearest lane count's (the fewer lanes on a tie), else nothing."""
        timed = [n for n, overhead in self.overheads.items() if overhead.mean_s]
        if not timed:
            return TreeStepOverhead()
        return self.overheads[min(timed, key=lambda n: (abs(n - lanes), n))]

    def observe(self, paths: list[list[int]]) -> None:
        """After acceptance of the last sized step: each lane's accepted node indices (root first)."""
        for tree, path in zip(self._kept, paths):
            if tree.size > 1:
                accepted = torch.zeros(tree.size, dtype=torch.bool)
                accepted[path] = True
                # a node tells about its conditional probability only if its parent was accepted
                tried = accepted[tree.parents[1:]]
                self._last.observe(conditional_probabilities(tree)[tried], tree.depths[1:][tried], accepted[1:][tried])


def relative_costs(seconds: dict[int, float]) -> VerifyCost:
    """A VerifyCost from measured seconds per node count (the count 1 must be among them)."""
    if 1 not in seconds:
        raise ValueError(
            f"measured node counts {sorted(seconds)}: the count 1 (one ordinary step) is the unit and must be measured"
        )
    unit = seconds[1]
    nodes = tuple(sorted(seconds))
    return VerifyCost(nodes, tuple(seconds[n] / unit for n in nodes), unit)
