"""The target's verify cost learned from the verify passes an engine times, for adaptive tree sizing.
The SGLang worker has no model of its own to time at start-up (its target runs in SGLang's model
runner, with SGLang's kernels, batch shapes and memory pools), so it starts empty and probes. The
reference engine starts from the curve it measures on its HF model (reference/verify_cost.py): a few
cold forwards, which its warm verify passes then correct.

Cost is learned per lane count (the requests one verify forward serves), by nodes per lane. The same
rows (lanes x nodes) do not cost the same at every lane count: each lane attends over its own cache
under its own tree mask, so on the CPU harness 4 lanes x 16 nodes cost about 2.7 ordinary steps of 4
lanes where 1 lane x 64 nodes cost 1.55 of one lane (bench/results/sglang_cpu/verify-cost-bf16.md,
step-overhead-kept-candidates-bf16.md). One curve keyed by rows let a batch of 4 read the cheap slope
batches of one had timed, and a batch of one the dear slope of batches of 4, on the same server: sizing
overshot at 4 concurrent requests and cut short alone (issue 59). Every timed point keeps an
exponential moving average of its seconds, and between timed points the cost is linear
(core.tree_sizing.VerifyCost). A batch of `lanes` requests needs its curve from 1 node (an ordinary
step, the unit) up to its budget (the full tree); until both ends are timed, `probe` names the node
count the next step verifies to time the missing one. Sizing then picks counts in between, and timing
them refines the curve where it is used.

The reference engine never probes: a lane count without both ends of its own reads the curve of every
timed forward by rows (its start-up measurement is one lane's, by new tokens), as before.
"""

from __future__ import annotations

import bisect

from .tree_sizing import VerifyCost


class TimedPoints:
    """Seconds timed at increasing counts, an exponential moving average at each (`decay`: the older
    average's weight)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.counts: list[int] = []
        self.seconds: list[float] = []

    def observe(self, count: int, seconds: float) -> None:
        i = bisect.bisect_left(self.counts, count)
        if i < len(self.counts) and self.counts[i] == count:
            self.seconds[i] = self.decay * self.seconds[i] + (1 - self.decay) * seconds
        else:
            self.counts.insert(i, count)
            self.seconds.insert(i, seconds)

    def cost(self, unit_at: int, scale: int = 1) -> VerifyCost:
        """Seconds by count x `scale` relative to those at `unit_at` (interpolated: the unit)."""
        counts = tuple(c * scale for c in self.counts)
        unit = VerifyCost(counts, tuple(self.seconds), 1.0)(unit_at)
        return VerifyCost(counts, tuple(s / unit for s in self.seconds), unit)


class LearnedVerifyCost:
    def __init__(self, decay: float = 0.8) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay={decay}: must be in [0, 1) (the weight of the older average)")
        self.decay = decay
        self.by_rows = TimedPoints(decay)  # every timed forward, by rows
        self.by_lanes: dict[int, TimedPoints] = {}  # each lane count's timed forwards, by nodes per lane

    @classmethod
    def starting_from(cls, cost: VerifyCost, decay: float = 0.8) -> "LearnedVerifyCost":
        """A curve that starts as `cost` (measured once, e.g. at engine start, one lane, the unit one
        token) and then follows what observations say: a start-up measurement is a few cold forwards,
        and the engine's own verify passes, warm and at the sizes it uses, correct it."""
        learned = cls(decay)
        for nodes, relative in zip(cost.nodes, cost.relative):
            learned._record(1, nodes, relative * cost.unit_s)
        return learned

    def observe(self, lanes: int, nodes: int, seconds: float) -> None:
        """One verify forward over `lanes` lanes of `nodes` nodes each took `seconds`."""
        if lanes < 1 or nodes < 1 or seconds <= 0:
            raise ValueError(
                f"lanes={lanes}, nodes={nodes}, seconds={seconds}: a timed forward has >= 1 lane of >= 1 node "
                "and takes > 0 s"
            )
        self._record(lanes, nodes, seconds)

    def _record(self, lanes: int, nodes: int, seconds: float) -> None:
        self.by_rows.observe(lanes * nodes, seconds)
        self.by_lanes.setdefault(lanes, TimedPoints(self.decay)).observe(nodes, seconds)

    def probe(self, lanes: int, budget: int) -> int | None:
        """The node count a step of `lanes` lanes at `budget` must verify to time a missing end of its
        own curve: 1 (an ordinary step) when that lane count never ran one, `budget` when it never
        verified that many nodes; None once both ends are known."""
        own = self.by_lanes.get(lanes)
        if own is None or own.counts[0] > 1:
            return 1
        if own.counts[-1] < budget:
            return budget
        return None

    def curve(self, lanes: int) -> VerifyCost:
        """Seconds by rows (lanes x nodes) relative to an ordinary step of `lanes` lanes (the unit): its
        own curve once it has timed an ordinary step and a tree; until then every timed forward's, by
        rows (needs one at or below `lanes` rows and another)."""
        own = self.by_lanes.get(lanes)
        if own is not None and own.counts[0] == 1 and len(own.counts) >= 2:
            return own.cost(unit_at=lanes, scale=lanes)
        pooled = self.by_rows
        if not pooled.counts or pooled.counts[0] > lanes or len(pooled.counts) < 2:
            raise ValueError(f"no timed verify of {lanes} lanes at 1 node and above, nor by rows: probe first")
        return pooled.cost(unit_at=lanes)
