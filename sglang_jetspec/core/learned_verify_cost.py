"""The target's verify cost learned from the verify passes an engine times, for adaptive tree sizing.
The SGLang worker has no model of its own to time at start-up (its target runs in SGLang's model
runner, with SGLang's kernels, batch shapes and memory pools), so it starts empty and probes. The
reference engine starts from the curve it measures on its HF model (reference/verify_cost.py): a few
cold forwards, which its warm verify passes then correct.

Cost is keyed by the rows one verify forward computes (lanes x nodes): the matmuls grow with them on
a CPU, and stay flat on a GPU until they are compute bound; attention over each lane's own cache is
left out. Every row count keeps an exponential moving average of the seconds timed at it, and between
timed counts the cost is linear (core.tree_sizing.VerifyCost). A batch of `lanes` requests needs the
curve from `lanes` rows (an ordinary step, the unit) up to lanes x budget rows (the full tree); until
both ends are timed, `probe` names the node count the next step verifies to time the missing one.
Sizing then picks counts in between, and timing them refines the curve where it is used.
"""

from __future__ import annotations

import bisect

from .tree_sizing import VerifyCost


class LearnedVerifyCost:
    def __init__(self, decay: float = 0.8) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay={decay}: must be in [0, 1) (the weight of the older average)")
        self.decay = decay
        self.rows: list[int] = []  # timed row counts, increasing
        self.seconds: list[float] = []  # their moving averages

    @classmethod
    def starting_from(cls, cost: VerifyCost, decay: float = 0.8) -> "LearnedVerifyCost":
        """A curve that starts as `cost` (measured once, e.g. at engine start, with the unit one row)
        and then follows what observations say: a start-up measurement is a few cold forwards, and
        the engine's own verify passes, warm and at the sizes it uses, correct it."""
        learned = cls(decay)
        learned.rows, learned.seconds = list(cost.nodes), [r * cost.unit_s for r in cost.relative]
        return learned

    def observe(self, rows: int, seconds: float) -> None:
        """One verify forward over `rows` rows (lanes x nodes) took `seconds`."""
        if rows < 1 or seconds <= 0:
            raise ValueError(f"rows={rows}, seconds={seconds}: a timed forward has >= 1 row and takes > 0 s")
        i = bisect.bisect_left(self.rows, rows)
        if i < len(self.rows) and self.rows[i] == rows:
            self.seconds[i] = self.decay * self.seconds[i] + (1 - self.decay) * seconds
        else:
            self.rows.insert(i, rows)
            self.seconds.insert(i, seconds)

    def probe(self, lanes: int, budget: int) -> int | None:
        """The node count a step of `lanes` lanes at `budget` must verify to time a missing end of its
        curve: 1 (an ordinary step) when nothing at or below `lanes` rows was timed, `budget` when
        nothing at or above lanes x budget was; None once both ends are known."""
        if not self.rows or self.rows[0] > lanes:
            return 1
        if self.rows[-1] < lanes * budget:
            return budget
        return None

    def curve(self, lanes: int) -> VerifyCost:
        """Seconds by row count relative to an ordinary step of `lanes` lanes (its interpolated seconds
        are the unit); needs `probe(lanes, budget)` to be None first."""
        if not self.rows or self.rows[0] > lanes or len(self.rows) < 2:
            raise ValueError(f"no timed verify at or below {lanes} rows and one above it: probe first")
        unit = VerifyCost(tuple(self.rows), tuple(self.seconds), 1.0)(lanes)
        return VerifyCost(tuple(self.rows), tuple(s / unit for s in self.seconds), unit)
