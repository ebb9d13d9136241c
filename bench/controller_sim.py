"""Run every simulator scenario through the real controller and print the goal table.

    python -m bench.controller_sim [SCENARIO ...]

Exits 1 when any goal check fails.
"""

from __future__ import annotations

import sys
import time

from controller.sim.goals import format_scores, score_run
from controller.sim.scenarios import SCENARIOS
from controller.sim.simulator import run_scenario


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown} -- choose from {sorted(SCENARIOS)}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    scores = [score_run(run_scenario(SCENARIOS[name])) for name in names]
    print(format_scores(scores))
    simulated_h = sum(SCENARIOS[n].duration_s for n in names) / 3600
    print(f"simulated {simulated_h:.0f} h of serving in {time.perf_counter() - started:.1f} s")
    return 0 if all(s.passed for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
