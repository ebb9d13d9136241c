"""The verify widths a step may use: a short ladder of node counts per request, so that a captured verify
(one CUDA graph per batch-size bucket and width) serves every tree of a step.

A step's trees are padded to the smallest width of the ladder that holds them; the padding nodes are
the ones `adapter.verify_inputs` already lays out for a batch's shorter trees (the mask isolates them
and no retrieve link reaches them, so acceptance never reads their rows). A step of roots alone
(budget 0, or sizing keeping no node) stays at width 1: an ordinary decode forward, which replays the
plain decode graph.

The ladder is capped by what SGLang reserved KV for per request (`reserved`, the policy's largest
budget): a width past it would write KV slots the step does not own, so `reserved` is always the top
rung and no rung exceeds it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

WIDTHS_ENV = "JETSPEC_VERIFY_WIDTHS"
# the ladder CUDA graphs are captured for when the operator names none (EAGLE-sized trees up to 64 nodes)
DEFAULT_LADDER = (4, 8, 16, 32, 64)


class VerifyWidthsError(ValueError):
    pass


@dataclass(frozen=True)
class VerifyWidths:
    """`rungs`: ascending widths, the last one `reserved`; empty means no padding (each step verifies
    exactly the nodes it drafted, the eager path's behaviour)."""

    rungs: tuple[int, ...] = ()

    @classmethod
    def ladder(cls, widths: tuple[int, ...] | list[int], reserved: int) -> VerifyWidths:
        """The rungs of `widths` below `reserved`, then `reserved` itself."""
        if reserved < 1:
            raise VerifyWidthsError(f"reserved verify width {reserved}: must be at least 1")
        below = sorted({w for w in widths if 1 < w < reserved})
        return cls((*below, reserved))

    @classmethod
    def parse(cls, text: str | None, reserved: int) -> VerifyWidths:
        """`text` as the environment variable holds it ("4,8,16,32,64"); empty or None: no padding.
        Raises VerifyWidthsError naming the variable and the fix."""
        if text is None or not text.strip():
            return cls()
        widths = []
        for part in text.split(","):
            part = part.strip()
            if not part.isdigit() or int(part) < 2:
                raise VerifyWidthsError(
                    f"{WIDTHS_ENV}={text!r}: {part!r} is not a width; give comma-separated node counts of at "
                    "least 2 per request, e.g. 4,8,16,32,64, or leave it unset for no padding"
                )
            widths.append(int(part))
        return cls.ladder(widths, reserved)

    @property
    def pads(self) -> bool:
        return bool(self.rungs)

    def width_for(self, nodes: int) -> int:
        """The verify width of a step whose largest tree has `nodes` nodes: 1 stays 1 (a decode forward),
        anything else the smallest rung that holds it."""
        if nodes < 1:
            raise ValueError(f"a step verifies at least its roots: nodes={nodes}")
        if not self.rungs or nodes == 1:
            return nodes
        at = bisect.bisect_left(self.rungs, nodes)
        if at == len(self.rungs):
            raise ValueError(f"{nodes} nodes exceed the widest verify width {self.rungs[-1]} (the KV reserved)")
        return self.rungs[at]
